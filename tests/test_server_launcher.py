"""Locating the tritonserver binary, reading its log, and its temporary folders (the stubs' Python environment:
tests/test_stub_environment.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_vit.server.runtime import triton_log, workspace
from hub_vit.server.runtime.triton_install import ServerError, find_triton


def test_finds_the_wheel_binary_and_this_interpreters_stub():
    install = find_triton()
    assert install.binary.name == "tritonserver" and install.binary.is_file()
    assert install.stub is not None and install.stub.is_file()
    assert (install.python_backend / "libtriton_python.so").is_file()


def test_load_failure_summarises_tritons_own_log_line():
    # Verbatim from Triton 2.51 (nvidia-pytriton 0.7.0) serving a repository whose model.onnx was truncated.
    line = (
        """E1123 06:09:28.412527 4209 model_lifecycle.cc:642] "failed to load 'vit_classifier' version 1: Internal: """
        """InvalidProtobuf: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from /tmp/rp/vit_classifier/1/"""
        """model.onnx failed:Protobuf parsing failed.\\n\\nAt:\\n  /work/main/.venv/lib/python3.11/site-packages/"""
        """onnxruntime/capi/onnxruntime_inference_collection.py(753): _create_inference_session\\n"""
    )
    assert triton_log.load_failure(line) == (
        "model 'vit_classifier' (version 1) failed to load: Internal: InvalidProtobuf: [ONNXRuntimeError] : 7 : "
        "INVALID_PROTOBUF : Load model from /tmp/rp/vit_classifier/1/model.onnx failed:Protobuf parsing failed."
    )
    follow_up = 'I1123 06:09:28.412568 4209 model_lifecycle.cc:777] "failed to load \'vit_classifier\'"'
    assert triton_log.load_failure(follow_up) is None  # the line after it, without a reason
    assert triton_log.load_failure('I1123 06:09:10.415730 model_lifecycle.cc:472] "loading: vit_classifier:1"') is None


def test_cuda_complaints_of_a_cpu_host_are_told_apart_from_real_errors():
    # Verbatim from Triton 2.51 (nvidia-pytriton 0.7.0) starting on a host without a GPU: logged as errors, harmless
    harmless = ['E1127 08:29:02.797449 11916 server.cc:241] "CudaDriverHelper has not been initialized."',
                'E1127 08:29:10.918970 11916 ensemble_scheduler.cc:1468] "unable to create stream for vit: CUDA driver '
                'version is insufficient for CUDA runtime version"']
    assert all(triton_log.harmless_on_cpu(line) for line in harmless)
    assert triton_log.message_of(harmless[0]) == 'server.cc:241] "CudaDriverHelper has not been initialized."'
    real = ['E1123 06:09:28.412527 4209 model_lifecycle.cc:642] "failed to load \'vit_classifier\' version 1: '
            'Internal: CUDA driver version is insufficient\\n',
            'E1123 06:09:28.4 1 grpc_server.cc] "failed to start GRPC service: Unavailable - Socket '
            '\'127.0.0.1:8001\' already in use "',
            'I1127 08:29:10.921286 11916 http_server.cc:4713] "Started HTTPService at 127.0.0.1:48881"',
            'I1127 08:29:02.796281 11916 pinned_memory_manager.cc:283] "Pinned memory pool disabled"']  # not an error
    assert not any(triton_log.harmless_on_cpu(line) for line in real)


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu host", "gpu host"])
def test_serve_verbose_shows_a_cuda_complaint_as_harmless_only_where_there_is_no_gpu(gpu, tmp_path, monkeypatch,
                                                                                       capsys):
    """`serve --verbose` streams Triton's log; the same CUDA line is noise on a CPU host and a real error on a GPU
    host (shown verbatim there). The log file keeps the line as Triton wrote it either way."""
    from hub_vit.cli import serve_screen
    from hub_vit.server.runtime import triton_install
    from hub_vit.server.serving import LogFile

    monkeypatch.setattr(triton_install, "has_gpu", lambda: gpu)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    log_file = LogFile(http_port=1)
    screen = serve_screen.Screen(log_file, verbose=True)
    line = 'E1127 08:29:02.797449 11916 server.cc:241] "CudaDriverHelper has not been initialized."'
    screen.log(line)
    log_file.close(remove=False)
    shown = capsys.readouterr().err.strip()
    if gpu:
        assert shown == line
    else:
        assert shown == 'note (no GPU here, harmless): server.cc:241] "CudaDriverHelper has not been initialized."'
    assert log_file.path.read_text() == line + "\n"


@pytest.fixture()
def listening_port():
    """A port something already listens on (another server, as far as Triton could tell)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_ports_are_checked_before_anything_starts(tmp_path, listening_port):
    from hub_vit.server.runtime.launcher import TritonServer, free_port

    with pytest.raises(ServerError, match=r"http_port 70000 is not a TCP port \(1-65535\)"):
        TritonServer(tmp_path, http_port=70000)
    with pytest.raises(ServerError, match=r"http_port and grpc_port are both 9000"):
        TritonServer(tmp_path, http_port=9000, grpc_port=9000)
    server = TritonServer(tmp_path, http_port=free_port(), grpc_port=listening_port, metrics_port=free_port())
    with pytest.raises(ServerError, match=rf"grpc_port {listening_port}: 127.0.0.1:{listening_port} is already in use"):
        server.start()
    assert server.process is None  # refused before tritonserver was started


@pytest.mark.parametrize("command", [["serve", "--quiet", "--http-port"], ["serve", "--quiet", "--demo", "--demo-port"],
                                     ["demo", "--port"]])
def test_cli_refuses_a_taken_port_before_building(listening_port, command):
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, [*command, str(listening_port)])
    assert result.exit_code == 2
    assert f"{command[-1]} {listening_port}: 127.0.0.1:{listening_port} is already in use" in result.output
    assert "building the Triton repository" not in result.output


def test_cli_demo_refuses_an_impossible_port():
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, ["demo", "--port", "99999"])  # was a traceback from uvicorn's bind()
    assert result.exit_code == 2 and "--port 99999 is not a TCP port (1-65535)" in result.output


def test_cli_names_every_taken_port_at_once(listening_port):
    # was: only the first (`make serve` run twice: four reruns to find four taken ports)
    import socket

    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    with socket.socket() as second:
        second.bind(("127.0.0.1", 0))
        second.listen()
        other = second.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--quiet", "--http-port", str(listening_port), "--grpc-port",
                                          str(other)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert f"--http-port {listening_port}, --grpc-port {other}: all already in use on 127.0.0.1 (another server, or " \
           "an earlier run of this command?); choose other ports" in said, said


@pytest.mark.parametrize(("host", "message"), [
    # the first two were reported as "--port 7931: ... is already in use (another server?)"
    ("no-such-host.invalid", "host 'no-such-host.invalid': cannot resolve this name to an address"),
    ("10.9.8.7", "host '10.9.8.7' is not an address of this machine to listen on (Cannot assign requested address)"),
    ("::1", "--host '::1': IPv6 addresses are not supported by the demo"),  # was Gradio's "Invalid port: ':1:7931'"
])
def test_cli_demo_names_a_host_it_cannot_listen_on(host, message):
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, ["demo", "--host", host, "--port", "7931"])
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_a_repository_path_the_python_backend_stub_cannot_take_is_refused(tmp_path):
    # Triton launches each stub as `bash -c "exec <stub> <repository>/<model>/1/model.py ..."`, unquoted: from such a
    # path the model never loaded and the server waited out its whole start timeout (120 s)
    from hub_vit.server.runtime.launcher import TritonServer, free_port

    repo = tmp_path / "my models" / "repo ü (1)"
    repo.mkdir(parents=True)
    with pytest.raises(ServerError, match=r"breaks at space 'ü' '\(' '\)'; use a path without spaces"):
        TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    # served for real: the stub fails on non-ASCII letters (UnicodeEncodeError) but takes these
    assert workspace.shell_unsafe("/tmp/a+b,c=d@e%f:g~h#i^j!k-1.2_") == ""
    assert workspace.shell_unsafe(tmp_path / "Zürich") == "'ü'"


def test_workspaces_avoid_a_tmpdir_the_stub_cannot_take(tmp_path, monkeypatch):
    import tempfile

    unsafe = tmp_path / "tmp dir"
    unsafe.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(unsafe))
    folder = workspace.shell_safe_tempdir("hub-vit-test-")
    try:
        assert folder.is_dir() and unsafe not in folder.parents and not workspace.shell_unsafe(folder)
    finally:
        folder.rmdir()
    safe = tmp_path / "tmp_ok"
    safe.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(safe))
    folder = workspace.shell_safe_tempdir("hub-vit-test-")
    assert folder.parent == safe  # $TMPDIR is used whenever it can be


def test_the_servers_workspace_avoids_a_noexec_tmpdir(tmp_path, monkeypatch):
    import subprocess
    import tempfile

    noexec = tmp_path / "noexec"
    noexec.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,noexec", "tmpfs", str(noexec)],
                             capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(noexec))
        backends = workspace.shell_safe_tempdir("hub-vit-test-", runs_programs=True)  # Triton's backends run there
        repository = workspace.shell_safe_tempdir("hub-vit-test-")  # files read, never run: noexec will do
        try:
            assert noexec not in backends.parents and repository.parent == noexec
        finally:
            backends.rmdir()
            repository.rmdir()
    finally:
        subprocess.run(["umount", "-l", str(noexec)], check=True)


def test_readiness_is_never_taken_from_another_server_on_our_port(tmp_path):
    """Two `hub-vit serve` started at once both passed the port check; the second then took the first server's
    answers for its own readiness, printed 'serving', and died with a raw Triton log."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from hub_vit.server.runtime.launcher import TritonServer, free_port

    class OtherTriton(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"name": "triton", "version": "2.51.0"}).encode() if self.path == "/v2" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), OtherTriton)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port = other.server_address[1]
        server = TritonServer(tmp_path, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
        server.http_port = server.metrics_port = port  # what the first server's ports look like to the second
        assert not server.is_ready()
        server.server_id = "triton"
        assert server.is_ready()  # the same answers with our own id: ready
    finally:
        other.shutdown()
        other.server_close()


def test_a_port_taken_while_triton_starts_is_one_line(tmp_path, listening_port, monkeypatch):
    from hub_vit.server.runtime.launcher import TritonServer, free_port

    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(TritonServer, "_check_ports", lambda self, in_use: None)  # taken after our check
    server = TritonServer(tmp_path / "empty", http_port=free_port(), grpc_port=listening_port,
                          metrics_port=free_port())
    with pytest.raises(ServerError) as info:
        server.start(timeout_s=60)
    assert str(info.value).startswith(f"grpc_port {listening_port}: already in use on 127.0.0.1"), info.value
    assert "log tail" not in str(info.value)



@pytest.mark.parametrize("taken", ["before the start", "while tritonserver loads"])
def test_a_port_serve_picked_and_found_taken_is_picked_again(tmp_path, listening_port, monkeypatch, taken):
    # `serve` picks Triton's private HTTP and gRPC ports itself; another process can take one before Triton binds it
    # (its endpoints come last, after every model loaded), and serve then failed to start over a port no user chose
    import threading

    from hub_vit.server.runtime.launcher import TritonServer, free_port
    from hub_vit.server.runtime.supervisor import RestartPolicy, Supervisor

    (tmp_path / "empty").mkdir()  # Triton is ready with no model
    if taken == "while tritonserver loads":
        monkeypatch.setattr(TritonServer, "_check_ports", lambda self, in_use: None)  # so Triton's bind finds it
    first_picks = iter([listening_port])

    def new_server() -> TritonServer:
        return TritonServer(tmp_path / "empty", http_port=next(first_picks, None) or free_port(), grpc_port=free_port(),
                            metrics_port=free_port(), picked_ports=("http_port", "grpc_port"))

    def serving(server: TritonServer, restarted: bool) -> None:
        served.append(server.http_port)
        supervisor.terminate()

    served: list[int] = []
    events: list[str] = []
    supervisor = Supervisor(new_server, RestartPolicy(max_failed_starts=0), threading.Event(), serving=serving,
                            event=events.append)
    supervisor.run().stop()
    assert len(served) == 1 and served[0] != listening_port
    assert events == [f"tritonserver's private http_port {listening_port} was taken by another process before "
                      "tritonserver bound it; starting it on other free ports"]


def test_a_taken_port_serve_did_not_pick_stays_an_error(tmp_path, listening_port):
    # the metrics port is the user's (--metrics-port): taken, it is the user's to change, not serve's to move
    import threading

    from hub_vit.server.runtime.launcher import PortTaken, TritonServer, free_port
    from hub_vit.server.runtime.supervisor import RestartPolicy, Supervisor

    def new_server() -> TritonServer:
        return TritonServer(tmp_path, http_port=free_port(), grpc_port=free_port(), metrics_port=listening_port,
                            picked_ports=("http_port", "grpc_port"))

    supervisor = Supervisor(new_server, RestartPolicy(), threading.Event())
    with pytest.raises(PortTaken, match=rf"^metrics_port {listening_port}: 127.0.0.1:{listening_port} is already in"):
        supervisor.run()
    assert supervisor.server.process is None


def test_a_host_name_is_bound_as_its_address(tmp_path):
    # Triton 2.51 binds `--http-address=localhost` as 255.255.255.255: `serve --host localhost` was never ready
    import urllib.request

    from hub_vit.server.runtime.launcher import TritonServer, free_port

    (tmp_path / "empty").mkdir()  # Triton is ready with no model
    with TritonServer(tmp_path / "empty", host="localhost", http_port=free_port(), grpc_port=free_port(),
                      metrics_port=free_port()).start(timeout_s=60) as server:
        assert "--http-address=127.0.0.1" in server.command(find_triton(), Path("backends"))
        for port, path in ((server.http_port, "/v2/health/ready"), (server.metrics_port, "/metrics")):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                assert answer.status == 200


def test_regions_of_servers_whose_process_is_gone_are_removed(tmp_path):
    # a process killed before `stop` (SIGKILL, a crash) left its stubs' /dev/shm regions for good (1 MB or more each)
    import subprocess
    import sys

    from hub_vit.atomic import pid_namespace
    from hub_vit.server.runtime.workspace import remove_orphaned_regions

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead_pid = int(gone.stdout)
    here, elsewhere = pid_namespace(), pid_namespace() + 1
    regions = {name: tmp_path / name for name in (
        f"hub-vit-{dead_pid}-n{here}-0123abcd_5a56b7e7-f1a7-4981-adea-dc5ffc0526ed",  # its process is gone: removed
        f"hub-vit-{dead_pid}-0123abcd_5a56b7e7-f1a7-4981-adea-dc5ffc0526ed",  # named without its namespace: removed
        f"hub-vit-{os.getpid()}-n{here}-0123abcd_18f220cf-b91c-4e4c-8c55-17d5d7748421",  # this live process's: kept
        # another container's, sharing /dev/shm (docker run --ipc=host): its pid means nothing here: kept
        f"hub-vit-{dead_pid}-n{elsewhere}-0123abcd_18f220cf",
        "hub-vit-1-0123abcd_18f220cf",  # init's (alive, maybe not ours to signal): kept
        "hub-vit-notes",  # not a region name: kept
        "triton_python_backend_shm_region_1",  # another program's: kept
    )}
    for path in regions.values():
        path.write_bytes(b"\0" * 16)
    remove_orphaned_regions(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(list(regions)[2:])


def test_temporary_folders_of_processes_that_are_gone_are_removed(tmp_path):
    # a SIGKILLed `hub-vit serve` left its repository (a whole model.onnx) and the backend copy in /tmp for good
    import subprocess
    import sys

    from hub_vit.atomic import pid_namespace
    from hub_vit.server.runtime.workspace import remove_orphaned_workspaces, shell_safe_tempdir

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead_pid = int(gone.stdout)
    here, elsewhere = pid_namespace(), pid_namespace() + 1
    folders = [f"hub-vit-serve-{dead_pid}-n{here}-abc123", f"hub-vit-triton-{dead_pid}-n{here}-x_9",
               f"hub-vit-serve-{dead_pid}-abc123"]  # removed (the last named without its namespace)
    kept = [f"hub-vit-serve-{os.getpid()}-n{here}-abc123", "hub-vit-serve-1-abc", "hub-vit-serve-xk2j",
            "hub-vit-notes",
            # another container's serve sharing this folder: its pid means nothing in this PID namespace
            f"hub-vit-serve-{dead_pid}-n{elsewhere}-abc123"]
    for name in folders + kept:
        (tmp_path / name / "repository").mkdir(parents=True)
        (tmp_path / name / "repository" / "model.onnx").write_bytes(b"onnx")
    remove_orphaned_workspaces((str(tmp_path),))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    mine = shell_safe_tempdir("hub-vit-serve-")  # named by this process and its namespace, so a later start can tell
    try:
        assert mine.name.startswith(f"hub-vit-serve-{os.getpid()}-n{here}-")
    finally:
        mine.rmdir()


def test_free_ports_taken_together_are_distinct(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The kernel may give a closed port again to the next bind (a test took HTTP and metrics ports of 41543 and
    serve refused them as one port); free_port never hands a port out twice in a process."""
    import socket

    from hub_vit.server.runtime import launcher, port_claims

    monkeypatch.setattr(port_claims, "claims_file", lambda: tmp_path / "claims")  # this process's rule alone

    given = iter([50001, 50001, 50002, *[50003] * 65])

    class Socket(socket.socket):
        def bind(self, address: object) -> None:
            pass

        def getsockname(self) -> tuple[str, int]:
            return "127.0.0.1", next(given)

    monkeypatch.setattr(launcher, "_HANDED_OUT", set())
    monkeypatch.setattr(launcher.socket, "socket", Socket)
    assert [launcher.free_port(), launcher.free_port(), launcher.free_port()] == [50001, 50002, 50003]
    with pytest.raises(OSError, match="64 ports in a row that had already been handed out"):
        launcher.free_port()


@pytest.mark.parametrize("gpu", [True, False])
def test_the_pinned_memory_pool_and_gpu_metrics_stay_on_only_where_there_is_a_gpu(tmp_path, monkeypatch, gpu):
    """Without an NVIDIA driver Triton's pinned-memory pool and GPU metrics only fail (CUDA errors at start); with
    one they are Triton's defaults, kept: the command, built without starting anything, on a host with and without
    /dev/nvidiactl (stood in)."""
    from hub_vit.server.runtime import launcher

    monkeypatch.setattr(launcher, "has_gpu", lambda: gpu)
    command = launcher.TritonServer(tmp_path, http_port=18501, grpc_port=18502, metrics_port=18503).command(
        find_triton(), Path("backends"))
    off = {"--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"}
    assert off.isdisjoint(command) if gpu else off <= set(command), command


def test_cli_demo_refuses_an_empty_triton_url():
    # was taken as "no server": the labels then came from the model in process without a word
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, ["demo", "--triton-url", "", "--port", "7931"])
    assert result.exit_code == 2 and "server URL must be host:port" in result.output, result.output


ADOPTING = r'''
import ctypes, json, os, signal, subprocess, sys, time
from hub_vit.server.runtime.processes import reap_adopted

def zombies():
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
            if state == "Z" and int(ppid) == os.getpid():
                found.append(int(entry))
    return sorted(found)

def settle():
    time.sleep(0.5)

ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans come here, as to a PID 1
# a server (own session, as tritonserver) with two workers (as its stubs); it dies and leaves them to this process
server = subprocess.Popen([sys.executable, "-c", "import subprocess; [subprocess.Popen(['sleep', '60']) for _ in "
                           "range(2)]"], start_new_session=True)
server.wait()
other = subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True)  # this process's own child, ended
settle()
os.killpg(server.pid, signal.SIGKILL)
settle()
before = zombies()
reap_adopted(server.pid)
after = zombies()
print(json.dumps({"before": len(before), "after": after, "other": other.pid, "other_code": other.wait()}))
'''


def test_processes_adopted_from_a_dead_server_are_waited_for_and_own_children_left_to_their_popen():
    # serve as a container's PID 1 adopts the stubs of a tritonserver that died; a subreaper adopts orphans the same way
    done = subprocess.run([sys.executable, "-c", ADOPTING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["before"] == 3, found  # the two workers, and the other child not yet waited for
    assert found["after"] == [found["other"]], found  # only the workers were waited for
    assert found["other_code"] == 3, found  # its Popen still reads its real exit status


EMULATED_TRITON = r'''
import os, signal, sys, time
for line in sys.argv[1:]:
    print(line, flush=True)
time.sleep(0.3)
os.kill(os.getpid(), signal.SIGFPE)  # a request's crash (Triton 2.51's classification of a STRING output)
'''
MODELS_LOADED = ["| vit            | 1       | READY  |", 'I1201 10:47:03.604790 25840 metrics.cc:770] "Collecting CPU '
                 'metrics"']
OPTIONS_TABLE = ["| server_id                        | hub-vit-1-n1-17a8382c |", "| server_version | 2.51.0 |"]


@pytest.mark.parametrize(("printed", "reachable"), [
    (MODELS_LOADED, False),  # died before its endpoints: a failed start (a model that crashes it, say)
    (MODELS_LOADED + OPTIONS_TABLE, True),  # killed once its endpoints opened, before their "Started ..." line
])
def test_a_server_killed_once_its_endpoints_opened_counts_as_reachable(tmp_path, monkeypatch, printed, reachable):
    # was: a crash request landing between the gRPC port's opening and Triton's "Started GRPCInferenceService" line
    # counted as a start that never answered: two of them in a row ended serve under --max-restarts 1 (seen in CI)
    from hub_vit.server.runtime.launcher import TritonServer, free_port

    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(TritonServer, "command", lambda self, install, backends: [sys.executable, "-c",
                                                                                  EMULATED_TRITON, *printed])
    server = TritonServer(tmp_path / "empty", http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    with pytest.raises(ServerError, match="tritonserver was killed by SIGFPE"):
        server.start(timeout_s=60)
    assert server.reachable is reachable


@pytest.mark.triton
@pytest.mark.slow
def test_the_python_backends_folder_of_a_killed_server_is_removed(tmp_path):
    # was: libtriton_python.so's /tmp/python_env_XXXXXX (made at start whatever $TMPDIR says, removed at a clean stop)
    # stayed behind every SIGKILLed server: 926 of them on a host whose servers were replaced under tests
    import signal

    from hub_vit.catalog import default_model_folder
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.writer import write_repository
    from hub_vit.server.runtime.launcher import TritonServer, free_port, python_env_folders

    repo = write_repository(resolve_model(default_model_folder()), tmp_path / "models")
    for _ in range(5):  # another test's server started at the same moment: which folder is whose is not known, and
        server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()).start()
        if server._python_env is not None:  # ... both are left; this one starts again, alone
            break
        server.stop()
    try:
        made = server._python_env
        assert made is not None and made in python_env_folders(), made  # the one that appeared while it started
        os.killpg(server.process.pid, signal.SIGKILL)  # the OOM killer, a crash
        server.process.wait(30)
        assert made.is_dir()  # left by the server itself
    finally:
        server.stop()
    assert not made.exists()


@pytest.mark.triton
@pytest.mark.slow
def test_two_servers_started_at_once_each_know_and_remove_their_python_backends_folder(tmp_path):
    # was: each of two servers starting at the same moment saw two new folders, could not tell which was its own, and
    # left it behind when killed
    import signal
    import threading

    from hub_vit.catalog import default_model_folder
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.writer import write_repository
    from hub_vit.server.runtime.launcher import TritonServer, free_port, python_env_folders

    repo = write_repository(resolve_model(default_model_folder()), tmp_path / "models")
    servers = [TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
               for _ in range(2)]
    go = threading.Barrier(2)
    failures: list[BaseException] = []

    def start(server: TritonServer) -> None:
        go.wait()
        try:
            server.start()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(server,)) for server in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    try:
        assert not failures, failures
        made = [server._python_env for server in servers]
        assert None not in made and made[0] != made[1], made
        assert all(path in python_env_folders() for path in made), made
        for server in servers:
            os.killpg(server.process.pid, signal.SIGKILL)  # the OOM killer: the server cannot remove its own
            server.process.wait(30)
        assert all(path.is_dir() for path in made)
    finally:
        for server in servers:
            server.stop()
    assert not any(path.exists() for path in made), made


def test_the_python_env_claim_is_held_by_one_at_a_time_and_skipped_when_it_cannot_be_opened(tmp_path):
    import subprocess
    import sys

    from hub_vit.server.runtime.launcher import python_env_claim

    lock, released = tmp_path / "claim.lock", tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", "import pathlib, time\n"
                               "from hub_vit.server.runtime.launcher import python_env_claim\n"
                               f"with python_env_claim({str(lock)!r}):\n"
                               "    print('held', flush=True); time.sleep(1)\n"
                               f"    pathlib.Path({str(released)!r}).touch()"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with python_env_claim(str(lock)) as claimed:
            assert claimed and released.exists()  # granted only once the holder was about to let go
    finally:
        holder.kill()
        holder.wait()
    with python_env_claim(str(tmp_path / "no such folder" / "claim.lock")) as claimed:
        assert claimed is False


@pytest.mark.triton
@pytest.mark.slow
def test_the_python_backends_folder_of_a_server_killed_while_it_loads_is_removed(tmp_path):
    # was: a server that died before it was ready (a crash loop during warm-up) left its /tmp/python_env_XXXXXX, one
    # per start: the folder was looked for only once the server was ready
    import signal
    import threading
    import time

    from hub_vit.catalog import default_model_folder
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.writer import write_repository
    from hub_vit.server.runtime.launcher import TritonServer, free_port, python_env_folders

    repo = write_repository(resolve_model(default_model_folder()), tmp_path / "models")
    for _ in range(5):  # another test's server started at the same moment, or this one was ready first: again
        before = python_env_folders()
        server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
        seen: list[set] = []

        def kill_once_its_folder_is_made(server: TritonServer = server, before: set = before,
                                         seen: list[set] = seen) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                made = python_env_folders() - before
                if made and server.process is not None:
                    seen.append(made)
                    os.killpg(server.process.pid, signal.SIGKILL)  # the OOM killer while it loads
                    return
                time.sleep(0.01)

        killer = threading.Thread(target=kill_once_its_folder_is_made)
        killer.start()
        try:
            server.start()
        except Exception:  # died before it was ready: what this test is about
            killer.join()
            if len(seen[0]) == 1:
                assert not any(path.exists() for path in seen[0]), seen
                return
        else:
            killer.join()
            server.stop()
    pytest.skip("no start was killed alone before it was ready")


def test_a_chosen_port_taken_while_tritonserver_restarts_is_named_by_its_flag(tmp_path):
    # was "metrics_port 18002: ... is already in use (another server?); choose another port" on every restart: the
    # field's name, and advice for a start; the metrics port is tritonserver's own and free between its runs
    import signal
    import socket
    import threading

    from hub_vit.server.runtime.launcher import TritonServer, free_port
    from hub_vit.server.runtime.supervisor import GaveUp, RestartPolicy, Supervisor

    (tmp_path / "empty").mkdir()  # Triton is ready with no model
    metrics_port = free_port()
    taker = socket.socket()

    def new_server() -> TritonServer:
        return TritonServer(tmp_path / "empty", http_port=free_port(), grpc_port=free_port(), metrics_port=metrics_port,
                            picked_ports=("http_port", "grpc_port"))

    def serving(server: TritonServer, restarted: bool) -> None:  # it dies, and another program takes the port
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(30)
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taker.bind(("127.0.0.1", metrics_port))
        taker.listen(1)

    events: list[str] = []
    supervisor = Supervisor(new_server, RestartPolicy(max_failed_starts=1, first_backoff_s=0.1), threading.Event(),
                            serving=serving, event=events.append)
    try:
        with pytest.raises(GaveUp) as gave_up:
            supervisor.run()
    finally:
        taker.close()
        supervisor.server.stop()
    assert (f"--metrics-port {metrics_port} was taken by another process while tritonserver restarted (the port is "
            "tritonserver's own, free between its runs); free it, or start serve with another --metrics-port"
            ) in str(gave_up.value), (gave_up.value, events)
