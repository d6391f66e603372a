"""`hub-vit health`, the Dockerfile's HEALTHCHECK: ready *and* every Python-backend stub alive.

The case it exists for is reproduced against the real Triton 2.51: a stub killed with SIGKILL (as the OOM killer does)
leaves `/v2/health/ready` answering 200 while the requests routed to that instance fail; the probe must say unhealthy
and name the instance."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub_vit.catalog import default_model_folder
from hub_vit.resolve import resolve_model
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository
from hub_vit.server.runtime.health import Health, http_base, python_instances, served_repositories
from hub_vit.server.runtime.launcher import TritonServer, free_port
from hub_vit.server.runtime.processes import is_stub, stub_instance
from tests.polling import wait_until
from tests.programs import HUB_VIT
from tests.test_dockerfile import _instructions


def _health(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HUB_VIT, "health", *args],
                          capture_output=True, text=True, timeout=60)


def _config(folder: Path, name: str, text: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "config.pbtxt").write_text(text)


def test_expected_instances_are_named_as_triton_names_them(tmp_path):
    # Triton's naming (core, backend_model.cc / model_config_utils.cc): a group's name, default "<model>_<index>",
    # then "_<n>" for each of its `count`; a config without instance_group gets one group named after the model.
    _config(tmp_path, "decode", 'backend: "python"\ninstance_group { count: 2 kind: KIND_CPU }\n'
                                'instance_group { name: "spare" kind: KIND_CPU }\n')
    _config(tmp_path, "rank", 'backend: "python"\n')
    _config(tmp_path, "net", 'backend: "onnxruntime"\ninstance_group { count: 4 kind: KIND_GPU }\n')
    _config(tmp_path, "vit", 'platform: "ensemble"\n')
    assert python_instances(tmp_path) == {"decode_0_0": "decode", "decode_0_1": "decode", "spare_0": "decode",
                                          "rank_0": "rank"}


def test_the_instance_is_read_from_a_stubs_command_line():
    # Verbatim from Triton 2.51 (/proc/<pid>/cmdline, NULs as spaces), and the argument order of the GPU image's
    # python_backend (stub_launcher.cc: a runtime model folder in place of DEFAULT), with a named instance group.
    local = ("/tmp/hub-vit-triton-c4w3ewm_/backends/python/triton_python_backend_stub /tmp/hc/run/vit_classifier/1/"
             "model.py hub-vit-23575-03de56de_c3f6987f-1905-4d4f-a01f-59d9910adc3f 1048576 1048576 23583 "
             "/tmp/hub-vit-triton-c4w3ewm_/backends/python 336 vit_classifier_0_1 DEFAULT ")
    image = ("/opt/tritonserver/backends/python/triton_python_backend_stub /models/vit_preprocess/1/model.py "
             "triton_python_backend_shm_region_4f1c 1048576 1048576 41 /opt/tritonserver/backends/python 336 "
             "decoders_2 /models/vit_preprocess")
    assert stub_instance(local) == "vit_classifier_0_1" and stub_instance(image) == "decoders_2"
    assert stub_instance("python3 -m something else entirely") == "python3 -m something else entirely"
    # the server's own watch and this probe recognise a stub the same way: by its program, not by a mention
    assert is_stub(local) and is_stub(image)
    assert not is_stub("bash -c exec /opt/tritonserver/backends/python/triton_python_backend_stub x")
    assert not is_stub("")


def test_the_gpu_flavour_expects_its_decoding_and_top_k_stubs(tmp_path):
    repo = write_repository(resolve_model(default_model_folder()), tmp_path / "models",
                            ServingOptions(flavour="gpu", preprocess_instances=3))
    expected = python_instances(repo)
    assert expected == {f"{model}_0_{n}": model for model in ("vit_preprocess", "vit_postprocess") for n in range(3)}


def test_a_bad_repository_or_address_is_refused_by_name(tmp_path):
    result = _health("--repository", str(tmp_path / "nope"))
    assert result.returncode == 2 and "nope' does not exist" in result.stderr  # was: "is not a folder"
    (tmp_path / "file").write_text("")
    result = _health("--repository", str(tmp_path / "file"))
    assert result.returncode == 2 and "file' is not a folder" in result.stderr
    (tmp_path / "file").unlink()
    result = _health("--repository", str(tmp_path))
    assert result.returncode == 2 and "holds no model" in result.stderr
    _config(tmp_path, "broken", "backend: python\ninstance_group {")
    result = _health("--repository", str(tmp_path))
    assert result.returncode == 2 and "cannot read" in result.stderr and "config.pbtxt" in result.stderr
    result = _health("--url", "grpc://127.0.0.1:8001")
    assert result.returncode == 2 and "gRPC address" in result.stderr and "8000" in result.stderr
    result = _health("--url", "127.0.0.1:8000/v2")
    assert result.returncode == 2 and "has a path; give host:port only" in result.stderr
    result = _health("--url", "foo")  # was: an example of a gRPC address too, for a check that speaks HTTP only
    flat = " ".join(result.stderr.split())
    assert result.returncode == 2 and "--url: server URL must be host:port (e.g. 127.0.0.1:8000 for HTTP), got 'foo'" \
        in flat, flat
    assert http_base("http://h:1/") == "http://h:1" and http_base("h:1") == "http://h:1"
    assert http_base("https://h:1") == "https://h:1"


def test_the_served_repository_is_read_from_a_tritonservers_command_line():
    # The Dockerfile's CMD, hub-vit's launcher (verbatim from /proc, NULs as spaces), the flag's other spelling, and
    # a relative repository taken from the server's working folder
    assert served_repositories("tritonserver --model-repository=/models --model-control-mode=none") == ["/models"]
    launcher = ("/work/.venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver --id=hub-vit-1-ab "
                "--model-repository=/tmp/hub-vit-serve-x/repository --backend-directory=/tmp/b/backends")
    assert served_repositories(launcher) == ["/tmp/hub-vit-serve-x/repository"]
    assert served_repositories("tritonserver --model-repository /a --model-store=b", cwd="/w") == ["/a", "/w/b"]
    # a program merely naming tritonserver serves nothing; a flag without its value names nothing
    assert served_repositories("bash -c tritonserver --model-repository=/models") == []
    assert served_repositories("tritonserver --model-repository") == []


@pytest.mark.parametrize("timeout", ["inf", "1e300", "nan", "0", "-1", "3601"])
def test_a_timeout_no_socket_or_probe_can_use_is_refused_naming_the_flag(timeout):
    # inf and 1e300 overflowed inside the socket (a traceback), nan was "Invalid value NaN" without the flag's name
    result = _health("--timeout", timeout, "--url", f"127.0.0.1:{free_port()}")
    assert result.returncode == 2, result.stderr
    assert "--timeout must be a positive number of seconds (at most 3600), got" in result.stderr
    assert "Traceback" not in result.stderr and "no answer" not in result.stderr  # refused before asking


def test_the_longest_timeout_is_taken():
    port = free_port()
    result = _health("--timeout", "3600", "--url", f"127.0.0.1:{port}")
    assert result.returncode == 1 and "no answer from" in result.stderr  # asked: the port is free, so refused
    # as the clients say it (was the refusal alone)
    assert f"is a server running there (hub-vit serve), and is 127.0.0.1:{port} its HTTP port?" in result.stderr


def test_a_down_server_is_one_line_about_the_address():
    port = free_port()
    result = _health("--url", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert result.stderr.count("unhealthy:") == 1 and f"127.0.0.1:{port}/v2/health/ready" in result.stderr
    report = Health("http://x", "no answer", {"a_0_0": "a"}, {}, stubs_checked=True)
    assert report.problems() == ["no answer"]  # a server that is down has no stubs: not a second problem


def test_serves_front_without_a_server_is_named_by_its_state():
    # was: "answered HTTP 503 (starting, stopping, or a model failed to load; the server's log says which)", while the
    # front's answer says which (the `server state=` fact, hub_vit.server.protocol)
    from hub_vit.server.front.limits import FrontLimits
    from hub_vit.server.front.workers import FrontProcesses

    http = free_port()
    front = FrontProcesses("127.0.0.1", http, free_port(), FrontLimits(processes=1)).start()  # no server behind it
    try:
        result = _health("--url", f"127.0.0.1:{http}")
    finally:
        front.close()
    said = " ".join(result.stderr.split())
    assert result.returncode == 1, said
    assert f"not ready: http://127.0.0.1:{http}/v2/health/ready answered HTTP 503: the server is starting or " \
           "restarting; retry shortly" in said, said


def _ready_status(url: str) -> int:
    with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=10) as reply:
        return reply.status


def _dockerfile_healthcheck() -> str:
    """The HEALTHCHECK's command, as the Dockerfile writes it."""
    healthcheck = next(text for kind, text in _instructions() if kind == "HEALTHCHECK")
    return healthcheck.split(" CMD ", 1)[1].strip()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[TritonServer, Path]]:
    """One real server, and its repository, for this module's probes. Only the last test kills its stubs; the ports
    the others probe answer the same either way."""
    repo = write_repository(resolve_model(default_model_folder()), tmp_path_factory.mktemp("health") / "models")
    with TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()) as server:
        yield server, repo


@pytest.mark.triton
@pytest.mark.slow
def test_the_grpc_port_is_one_line_not_a_traceback(served):
    server, repo = served
    result = _health("--url", server.grpc_url, "--repository", str(repo))  # host:port, as a person mistypes it
    assert result.returncode == 1, result.stderr
    # was a rich traceback ending in http.client.BadStatusLine and the HTTP/2 frame's binary bytes
    assert len(result.stderr.strip().splitlines()) == 1 and "\x00" not in result.stderr, result.stderr
    assert f"unhealthy: no HTTP answer from http://{server.grpc_url}/v2/health/ready: BadStatusLine" in result.stderr
    assert "(is this Triton's HTTP port? gRPC is usually 8001, metrics 8002)" in result.stderr


@pytest.mark.triton
@pytest.mark.slow
def test_the_metrics_port_is_not_taken_for_a_ready_server(served):
    server, repo = served
    metrics = f"{server.host}:{server.metrics_port}"
    assert _ready_status(metrics) == 200  # Triton's metrics port answers 200 to any path: readiness alone passes
    result = _health("--url", metrics, "--repository", str(repo))
    assert result.returncode == 1, result.stdout
    assert result.stderr.count("unhealthy:") == 1
    assert (f"http://{metrics} answered /v2/health/ready but is not Triton's HTTP endpoint (the metrics port?)"
            in result.stderr)
    assert _health("--url", server.http_url, "--repository", str(repo)).returncode == 0  # the same on the HTTP port


@pytest.mark.triton
@pytest.mark.slow
def test_a_dead_stub_makes_a_ready_server_unhealthy(served, tmp_path):
    server, repo = served
    # The Dockerfile's own probe, pointed at this server and repository instead of 127.0.0.1:8000 and /models
    probe = (_dockerfile_healthcheck().replace("127.0.0.1:8000", server.http_url)
             .replace("/models", shlex.quote(str(repo))))
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert "2 of 2 Python-backend stubs alive (vit_classifier_0_0, vit_classifier_0_1)" in result.stdout

    # A copy of the repository's configs served by no one: the check is not fooled by the names alone
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(repo, elsewhere, ignore=lambda folder, names: [n for n in names if n.endswith(".onnx")])
    result = _health("--url", server.http_url, "--repository", str(elsewhere))
    assert result.returncode == 1 and "no Python-backend stub of this repository runs on this host" in \
        result.stderr

    pid, instance = next(iter(server.stubs().items()))
    os.kill(pid, signal.SIGKILL)  # what the OOM killer does
    assert wait_until(lambda: pid not in server.stubs(), timeout_s=10)
    assert _ready_status(server.http_url) == 200  # Triton still says ready: the old probe would pass
    result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    assert f"no live Python-backend stub for model instance '{instance}' (model vit_classifier)" in result.stderr
    assert _health("--url", server.http_url).returncode == 0  # readiness alone cannot see it

    # Every stub dead, tritonserver alive: "no stub runs on this host, run the check where the server runs" would
    # send the reader elsewhere. Asked through a symlink, as a container's /models may be: paths compare resolved.
    for pid in server.stubs():
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not server.stubs(), timeout_s=10)
    link = tmp_path / "models-link"
    link.symlink_to(repo)
    result = _health("--url", server.http_url, "--repository", str(link))
    assert result.returncode == 1
    assert ("every Python-backend stub of this repository has died (vit_classifier_0_0, vit_classifier_0_1), "
            f"while tritonserver (pid {server.process.pid}) still serves it on this host") in result.stderr
    assert "restart the server" in result.stderr and "run the check where" not in result.stderr
    # the copy no tritonserver serves is still "not this host"
    result = _health("--url", server.http_url, "--repository", str(elsewhere))
    assert result.returncode == 1 and "run the check where the server runs" in result.stderr


def test_wait_asks_again_until_the_server_is_ready():
    # a script that has just started a server waited for it with a loop of its own (health asked once)
    import http.server
    import threading
    import time

    class Ready(http.server.BaseHTTPRequestHandler):  # Triton's two answers the probe reads
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = b'{"name": "triton", "version": "2.51.0", "extensions": []}' if self.path == "/v2" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    port = free_port()
    probe = subprocess.Popen([*HUB_VIT, "health", "--url", f"127.0.0.1:{port}", "--wait", "60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)  # it has asked, and nothing answered
        assert probe.poll() is None, probe.communicate()
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ready)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        out, err = probe.communicate(timeout=30)
        server.shutdown()
    finally:
        probe.kill()
    assert probe.returncode == 0 and f"healthy: http://127.0.0.1:{port} is ready" in out, out + err
    result = _health("--url", f"127.0.0.1:{free_port()}", "--wait", "1")  # gives up after the wait
    assert result.returncode == 1 and result.stderr.count("unhealthy:") == 1, result.stderr
    result = _health("--wait", "-1")
    assert result.returncode == 2 and "--wait must be 0 to 3600 seconds, got -1.0" in result.stderr, result.stderr
