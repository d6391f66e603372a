"""`hub-vit serve` replaces a server that cannot serve any more, instead of keeping a half-working one.

Two real ways the local Triton 2.51 stops serving, both reproduced here against the real binary:
* one request asking Triton's classification extension for the STRING output `labels` kills tritonserver with
  SIGFPE (a Triton bug: `classification` / `class_count` is meant for numeric outputs);
* a Python-backend stub that dies (the OOM killer, a decoder crash; here `kill -9`) is not restarted by Triton, which
  keeps answering ready while every request routed to that instance fails with HTTP 500.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hub_vit.server.runtime.processes import live_processes
from hub_vit.server.serving import log_path
from tests.polling import wait_until
from tests.programs import HUB_VIT, SAMPLES, Serve, expected_digits, live_stubs

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def classification_of_labels(grpc_port: int) -> None:
    """The request that kills Triton 2.51: the classification extension asked of the STRING output, sent to Triton's
    own gRPC port (`Serve.triton_grpc_port`: serve's gates refuse it, tests/test_serve_limits.py)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    image = grpcclient.InferInput("image", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([[SAMPLES[0].read_bytes()]], dtype=object))
    with pytest.raises(Exception):  # noqa: B017 (the connection drops: whatever tritonclient makes of that)
        client.infer("vit", [image], outputs=[grpcclient.InferRequestedOutput("labels", class_count=3)],
                     client_timeout=30)


def test_a_crashed_server_and_a_dead_stub_are_replaced(tmp_path: Path) -> None:
    serve = Serve()
    try:
        serve.wait_for("metrics")
        assert serve.classify() == expected_digits()

        classification_of_labels(serve.triton_grpc_port())
        text = serve.wait_for("serving again")
        assert "tritonserver was killed by SIGFPE" in " ".join(text.split()), text
        assert serve.classify() == expected_digits()

        stubs = serve.stubs()
        assert len(stubs) == 2, stubs  # two classifier instances (each decodes too)
        victim = next(pid for pid, cmd in stubs.items() if "vit_classifier_0_0" in cmd)
        os.kill(victim, signal.SIGKILL)
        text = serve.wait_for("serving again")
        assert "stub of model instance 'vit_classifier_0_0'" in " ".join(text.split()), text
        for _ in range(3):  # before: every second request failed "Stub process ... is not healthy", for good
            assert serve.classify() == expected_digits()

        server_id = f"hub-vit-{serve.process.pid}-"
        serve.process.send_signal(signal.SIGTERM)
        assert serve.finish() == 0, serve.text
        assert "tritonserver stopped" in serve.text
        # was: a clean stop removed Triton's log, and with it the only account of why the two servers died; now it
        # is kept, each replacement marked in it between the dead server's lines and the next one's
        log = log_path(serve.ports[0])
        assert f"tritonserver's log, with the 2 servers that died and were replaced, is kept: {log}" in " ".join(
            serve.text.split()), serve.text
        marks = [line for line in log.read_text().splitlines() if line.startswith("hub-vit serve: ")]
        log.unlink()
        assert len(marks) == 2 and "killed by SIGFPE" in marks[0] and "vit_classifier_0_0" in marks[1], marks
        # every server's shared-memory regions are gone, the killed ones' included
        assert not list(Path("/dev/shm").glob(f"{server_id}*"))
    finally:
        serve.stop()


def test_a_dead_front_process_is_replaced_and_the_ports_keep_serving() -> None:
    """A front process killed (the OOM killer's way) is replaced with the current upstream; meanwhile and after, new
    connections are served by the processes listening."""
    serve = Serve("--front-processes", "2")
    try:
        serve.wait_for("metrics")
        before = serve.front_pids()
        assert len(before) == 2, before
        os.kill(before[0], signal.SIGKILL)
        # its listener closes when it has died (a zombie until serve reaps it): a connection the kernel handed it in
        # that window is reset, as SO_REUSEPORT does for any listener that closes with connections queued on it
        assert wait_until(lambda: before[0] not in live_processes(), 10), f"front process {before[0]} still alive"
        assert serve.classify() == expected_digits()  # the other process took the port's new connections
        assert wait_until(lambda: len(serve.front_pids()) == 2 and before[0] not in serve.front_pids(), 30), \
            f"no replacement front process: {serve.front_pids()}"
        for _ in range(6):  # new connections each time: the kernel spreads them over both processes
            assert serve.classify() == expected_digits()
        serve.process.send_signal(signal.SIGTERM)
        assert serve.finish() == 0, serve.text
    finally:
        serve.stop()


def test_without_restarts_a_crash_is_an_error_naming_it() -> None:
    serve = Serve("--max-restarts", "0")
    try:
        serve.wait_for("metrics")
        server_id = f"hub-vit-{serve.process.pid}-"
        classification_of_labels(serve.triton_grpc_port())
        assert serve.finish() == 1, serve.text
        flat = " ".join(serve.text.split())
        assert "tritonserver was killed by SIGFPE" in flat and "not restarting (--max-restarts 0)" in flat, flat
        kept = log_path(serve.ports[0])  # the log of a failed run is kept, and named
        assert f"tritonserver's whole log: {kept}" in flat and "Started Metrics Service" in kept.read_text(), flat
        assert not list(Path("/dev/shm").glob(f"{server_id}*"))
    finally:
        serve.stop()


def test_without_restarts_clients_are_not_told_to_wait_for_a_restart() -> None:
    # was: with --max-restarts 0, the front answered "[hub-vit server state=restarting]" until serve exited, and
    # `hub-vit classify` waited up to its --timeout for a server that was not coming back
    import http.client

    from hub_vit.server.protocol import RESTARTING, read_server_state

    serve = Serve("--max-restarts", "0")
    states: list[str | None] = []
    try:
        serve.wait_for("metrics")
        os.kill(serve.tritonserver_pid(), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the front stops taking connections
            connection = http.client.HTTPConnection("127.0.0.1", serve.ports[0], timeout=10)
            try:
                connection.request("GET", "/v2/health/ready")
                reply = connection.getresponse()
                body = reply.read()
            except (OSError, http.client.HTTPException):
                break
            finally:
                connection.close()
            if reply.status == 503:
                states.append(read_server_state(json.loads(body)["error"]))
            time.sleep(0.005)
        assert serve.finish(30) == 1, serve.text
    finally:
        serve.stop()
    assert RESTARTING not in states, states


def test_max_restarts_must_not_be_negative() -> None:
    result = subprocess.run([*HUB_VIT, "serve", "--max-restarts",
                             "-1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--max-restarts must be >= 0, got -1" in result.stderr + result.stdout


# -- hub-vit loadtest against a server that stops, and a user who stops it -------------------------------------------
def _loadtest(port: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*HUB_VIT, "loadtest", "--url",
                             f"127.0.0.1:{port}", "--concurrency", "4", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_loadtest_interrupted_reports_what_it_measured(tmp_path: Path) -> None:
    # was: Ctrl-C printed nothing and wrote no --json: a long run's numbers were lost
    import json

    serve = Serve()
    try:
        serve.wait_for("metrics")
        out_json = tmp_path / "run.json"
        load = _loadtest(serve.ports[0], "--duration", "120", "--json", str(out_json))
        time.sleep(6)
        load.send_signal(signal.SIGINT)
        out, err = load.communicate(timeout=60)
        assert load.returncode == 130, out + err
        assert "interrupted (Ctrl-C)" in err and " answered, 0 failed, in " in out, out + err
        saved = json.loads(out_json.read_text())
        assert saved["interrupted"] is True and saved["requests"] > 0 and saved["seconds"] < 60
        assert saved["batching"]["vit_classifier"]["inferences"] >= saved["requests"]
    finally:
        serve.stop()


def test_loadtest_keeps_its_numbers_when_the_server_goes_away() -> None:
    # was: reading Triton's statistics after the run raised, and the run's measurements were discarded
    serve = Serve("--max-restarts", "0")
    try:
        serve.wait_for("metrics")
        load = _loadtest(serve.ports[0], "--duration", "8", "--allow-errors")
        time.sleep(4)
        killed = serve.tritonserver_pid()
        os.kill(killed, signal.SIGKILL)
        # serve gives up on it (--max-restarts 0) and reaps its stubs, which requests kept busy, before the load ends
        assert serve.finish(30) == 1
        assert "not restarting (--max-restarts 0)" in " ".join(serve.text.split()), serve.text
        assert wait_until(lambda: not live_stubs(killed), timeout_s=10), live_stubs(killed)  # room for a busy host
        out, err = load.communicate(timeout=120)
        flat = " ".join((out + err).split())
        assert load.returncode == 0, flat
        assert "no server batching statistics: reading them after the run failed" in flat, flat
        answered = int(out.split(" answered, ")[0].split()[-1])
        assert answered > 0, out
        # the attempts after the server went away are told apart from requests a server failed
        said = flat.split(" of them reached no server, each worker trying again every 50 ms")
        unreached = int(said[0].split("(")[-1])
        assert 0 < unreached <= int(flat.split(" answered, ")[1].split()[0]), flat
    finally:
        serve.stop()


def test_loadtest_across_a_restart_reports_no_wrong_batching() -> None:
    # was: the table showed the new server's counts minus the old one's (3,782 inferences for 7,196 answers), and the
    # workers retried refused connections in a tight loop (66,585 errors in 10 s) while the new server loaded
    serve = Serve()
    try:
        serve.wait_for("metrics")
        load = _loadtest(serve.ports[0], "--duration", "30", "--allow-errors")  # a restart takes 5-15 s here
        time.sleep(8)  # past its start and warm-up: the statistics it reads before the run need a server
        classification_of_labels(serve.triton_grpc_port())
        serve.wait_for("serving again")
        out, err = load.communicate(timeout=120)
        flat = " ".join((out + err).split())
        assert load.returncode == 0, flat
        assert "no server batching statistics: the server restarted during the run" in flat, flat
        errors = int(out.split(" answered, ")[1].split()[0])
        assert 0 < errors < 4 * 30 / 0.05, flat  # 4 workers backing off 50 ms: at most 2,400 in 30 s
    finally:
        serve.stop()


def test_a_signal_sent_twice_at_once_is_one_stop_request() -> None:
    # `kill -TERM -- -PGID` of `make serve` (systemd stops a unit the same way) reaches serve directly and again through
    # GNU make, which forwards SIGTERM to its child: serve took the second copy for "again: stop now" and dropped the
    # requests in flight, instead of draining them
    import http.client

    serve = Serve()
    connection = None
    try:
        serve.wait_for("metrics")
        connection = http.client.HTTPConnection("127.0.0.1", serve.ports[0], timeout=5)
        connection.request("GET", "/v2/health/ready")
        connection.getresponse().read()  # an open keep-alive connection holds the drain open for --exit-timeout
        serve.process.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        serve.process.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert serve.process.poll() is None, serve.text  # still draining
        serve.process.send_signal(signal.SIGTERM)  # a real second request, later: now it stops at once
        assert serve.finish(30) == 0
        flat = " ".join(serve.text.split())
        assert flat.count("SIGTERM: draining") == 1 and flat.count("SIGTERM again: stopping now") == 1, flat
    finally:
        if connection is not None:
            connection.close()
        serve.stop()


def test_a_stop_while_the_server_loads_is_a_normal_stop() -> None:
    # was: a SIGTERM / Ctrl-C while Triton loaded the models warned "tritonserver was killed by SIGTERM while stopping:
    # its drain did not finish within --exit-timeout" (no drain had run, and it took 2 s, not the exit timeout)
    serve = Serve()
    try:
        assert wait_until(lambda: _has_tritonserver(serve), 60), serve.text
        serve.process.send_signal(signal.SIGTERM)  # loading the models takes seconds: well before ready
        assert serve.finish(60) == 0, serve.text
        flat = " ".join(serve.text.split())
        assert "stopped before the server was ready" in flat and "warning" not in flat, flat
    finally:
        serve.stop()


def test_the_stop_note_tells_a_slow_unload_a_teardown_crash_and_lost_requests_apart() -> None:
    # was: a tritonserver that aborted in its own teardown after the last answer was said not to have unloaded its
    # models within --exit-timeout
    from hub_vit.cli.serve_run import stop_note

    assert stop_note(1, True, 30) == (False, "tritonserver exited with code 1 while stopping: it did not unload its "
                                             "models within --exit-timeout 30 s (every request had been answered; a "
                                             "longer --exit-timeout lets it finish)")
    assert stop_note(-signal.SIGABRT, True, 30) == (False, "tritonserver was killed by SIGABRT while stopping, after "
                                                           "every request had been answered (a crash in its own "
                                                           "teardown; nothing was lost)")
    warns, line = stop_note(1, False, 30)
    assert warns and line.endswith("requests still running when --exit-timeout 30 s ran out got no answer"), line


def test_a_short_exit_timeout_on_an_idle_server_is_a_note_not_a_lost_requests_warning() -> None:
    # was: "warning: tritonserver exited with code 1 while stopping: its drain did not finish within --exit-timeout
    # 1 s (requests still running got no answer; ...)" with no request in flight: Triton's exit timeout also covers
    # unloading its models, which takes its Python-backend stubs about 3 s
    serve = Serve("--exit-timeout", "1")
    try:
        serve.wait_for("metrics")
        serve.process.send_signal(signal.SIGTERM)
        assert serve.finish(60) == 0, serve.text
        flat = " ".join(serve.text.split())
        assert "warning" not in flat and "got no answer" not in flat, flat
        if "while stopping" in flat:  # Triton took longer than 1 s to unload (as a rule on 2 cores)
            assert ("while stopping: it did not unload its models within --exit-timeout 1 s (every request had been "
                    "answered; a longer --exit-timeout lets it finish)") in flat, flat
    finally:
        serve.stop()


def _has_tritonserver(serve: Serve) -> bool:
    try:
        return bool(serve.tritonserver_pid())
    except AssertionError:
        return False


def _live(http_port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


def _grpc_live(grpc_port: int | None, live: list[int]) -> bool:
    """Whether a gRPC endpoint answers live at `grpc_port` (None: no server yet); the port is appended to `live`."""
    import tritonclient.grpc as grpcclient

    if grpc_port is None:
        return False
    try:
        answered = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}").is_server_live(client_timeout=1)
    except Exception:  # noqa: BLE001 (not up yet: whatever tritonclient raises for that)
        return False
    if answered:
        live.append(grpc_port)
    return answered


def test_crash_requests_sent_while_the_new_server_starts_do_not_end_the_service() -> None:
    # was: Triton answered and served ~2 s before serve saw it ready; a second crash request in that window made serve
    # exit ("killed ... before it was ready"), and four such requests in 10 s exhausted --max-restarts: one client
    # ended the service. Now a server that answered is always replaced; only starts that never answer count.
    serve = Serve("--max-restarts", "1")
    try:
        serve.wait_for("metrics")
        classification_of_labels(serve.triton_grpc_port())
        live: list[int] = []  # each new server's own gRPC port, once it answers (long before serve calls it ready)
        for _ in range(3):  # the race, three times: each crash lands as soon as the new server answers at all
            serve.wait_for("restarting tritonserver")
            assert wait_until(lambda: _grpc_live(serve.triton_grpc_port(), live), timeout_s=120), serve.text
            classification_of_labels(live[-1])
        # the last crash's own restart: awaiting "serving again" alone could end on the line of the server before it,
        # when that server became ready just before the crash landed
        serve.wait_for("restarting tritonserver")
        text = serve.wait_for("serving again")
        assert serve.process.poll() is None, text
        flat = " ".join(text.split())
        assert flat.count("tritonserver was killed by SIGFPE") >= 4, flat
        assert serve.classify() == expected_digits()
        serve.process.send_signal(signal.SIGTERM)
        assert serve.finish() == 0, serve.text
    finally:
        serve.stop()


def test_control_apis_are_closed_to_clients_and_statistics_stay_open() -> None:
    # was: any client could register a stub's /dev/shm region (then crash Triton with SIGSEGV), change log verbosity
    # or switch error logging off
    import json
    import urllib.error
    import urllib.request

    serve = Serve()
    base = f"http://127.0.0.1:{serve.ports[0]}"
    try:
        serve.wait_for("metrics")
        attempts = {"/v2/logging": {"log_verbose_level": 1, "log_error": False},
                    "/v2/systemsharedmemory/region/x/register": {"key": "/x", "offset": 0, "byte_size": 64},
                    "/v2/repository/index": {}, "/v2/trace/setting": {"trace_level": ["TIMESTAMPS"]}}
        for path, body in attempts.items():
            request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 403, path
            assert "This API is restricted" in refused.value.read().decode(), path
        import tritonclient.grpc as grpcclient

        grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{serve.ports[1]}")
        with pytest.raises(Exception, match="restricted"):
            grpc_client.update_log_settings({"log_verbose_level": 1})
        with urllib.request.urlopen(f"{base}/v2/models/vit/stats", timeout=10) as reply:  # loadtest reads them
            assert reply.status == 200
        assert _live(serve.ports[0]) and serve.classify() == expected_digits()
    finally:
        serve.stop()


def test_without_the_queue_policy_a_request_s_queue_timeout_is_refused_and_the_rest_served() -> None:
    """`serve --no-queue-policy`: Triton's batcher prefetches (no queue policy in any config), so it would ignore a
    client's per-request queue timeout. hub-vit's clients refuse one before sending (the ensemble's parameters say
    so); the front refuses one sent by any other client, over HTTP and gRPC, naming why; the demo sends none; the
    rest is served."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from hub_vit.demo.backends import TritonLabels
    from hub_vit.server.client.classifier import Classifier
    from hub_vit.server.client.errors import NoQueueTimeouts
    from hub_vit.server.client.loadtest import load_test

    serve = Serve("--no-queue-policy")
    why = r"applies no per-request queue timeout.*--no-queue-policy"
    try:
        serve.wait_for("metrics")
        for protocol, port, module in (("http", serve.ports[0], httpclient), ("grpc", serve.ports[1], grpcclient)):
            with Classifier(f"127.0.0.1:{port}", protocol=protocol, timeout_s=30) as client:
                assert not client.takes_queue_timeouts()
                with pytest.raises(NoQueueTimeouts, match=why):
                    client.classify(SAMPLES[:1], queue_timeout_s=0.5)
                assert [p.labels[0] for p in client.classify(SAMPLES[:4])] == expected_digits(), protocol
            with pytest.raises(NoQueueTimeouts, match=why):
                load_test(f"127.0.0.1:{port}", [SAMPLES[0].read_bytes()], protocol=protocol, requests=4,
                          queue_timeout_s=0.5)
            raw = module.InferenceServerClient(f"127.0.0.1:{port}")
            image = module.InferInput("image", [1, 1], "BYTES")
            image.set_data_from_numpy(np.array([[SAMPLES[0].read_bytes()]], dtype=object))
            with pytest.raises(Exception, match=why):  # noqa: B017 (tritonclient's error for the front's 400)
                raw.infer("vit", [image], timeout=500_000)
            assert raw.infer("vit", [image]).as_numpy("labels") is not None
            raw.close()
        pairs, status = TritonLabels(f"127.0.0.1:{serve.ports[0]}").top_k(None, source=SAMPLES[0])
        assert pairs and pairs[0][0] == expected_digits()[0], status
        # the command line: one line naming its flag, not the refusal once per file as if each file were at fault
        from hub_vit.cli import _load_commands, app

        _load_commands()
        result = CliRunner().invoke(app, ["classify", "--url", f"127.0.0.1:{serve.ports[0]}", "--queue-timeout-ms",
                                          "100", *map(str, SAMPLES)])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output  # bad input, as loadtest says (it was 1)
        assert "applies no per-request queue timeout" in lines[0] and "--queue-timeout-ms)" in lines[0], lines
    finally:
        serve.stop()


class _ServerDiesAfterFirstAnswer:
    """A real Classifier whose server's tritonserver is SIGKILLed right after the first answer, the next request
    sent once serve has seen the death: serve's gate then answers "restarting" until the new server is ready."""

    def __init__(self, serve: Serve, real: type) -> None:
        self.serve, self.answers, self.real = serve, 0, real  # `real`: the Classifier class this stands in for

    def __call__(self, *args: object, **kwargs: object) -> object:
        outer = self

        class Dying(self.real):  # type: ignore[name-defined]
            def classify(self, *args: object, **kwargs: object) -> list:  # type: ignore[override]
                if outer.answers == 1:
                    os.kill(outer.serve.tritonserver_pid(), signal.SIGKILL)
                    outer.serve.wait_for("restarting tritonserver")
                outer.answers += 1
                return super().classify(*args, **kwargs)

        return Dying(*args, **kwargs)


def test_classify_waits_through_a_restart_and_keeps_its_answers_when_the_server_does_not_come_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # was: a server that died halfway through a folder discarded every answer already received (one error line for
    # 1,500 classified photos), and a restarting server ended the run at once
    from hub_vit.cli import _load_commands, app
    from hub_vit.server.client import classifier

    _load_commands()
    real = classifier.Classifier
    files = [tmp_path / f"{index:02d}_{SAMPLES[index % len(SAMPLES)].name}" for index in range(40)]  # 3 requests
    for index, path in enumerate(files):
        path.write_bytes(SAMPLES[index % len(SAMPLES)].read_bytes())
    serve = Serve()
    try:
        serve.wait_for("metrics")
        url = f"127.0.0.1:{serve.ports[0]}"
        monkeypatch.setattr(classifier, "Classifier", _ServerDiesAfterFirstAnswer(serve, real))
        waited = CliRunner().invoke(app, ["classify", "--url", url, "--top", "1", "--concurrency", "1", str(tmp_path)])
        text = " ".join(waited.output.split())
        assert waited.exit_code == 0, text
        assert f"note: {url} says its server is starting or restarting; waiting up to 60 s (--timeout) for it" \
            in text, text
        assert all(path.name in text for path in files), text
        serve.wait_for("serving again")

        monkeypatch.setattr(classifier, "Classifier", _ServerDiesAfterFirstAnswer(serve, real))
        stopped = CliRunner().invoke(app, ["classify", "--url", url, "--top", "1", "--timeout", "1", "--concurrency",
                                           "1", str(tmp_path)])
        text = " ".join(stopped.output.split())
        assert stopped.exit_code == 1, text
        assert all(path.name in text for path in files[:16]), text  # the first request's answers stand
        assert files[16].name not in text.split("error:")[0], text
        assert (f"the server is starting or restarting; retry shortly 24 of 40 files were not classified (the first: "
                f"{files[16]}); the answers above stand") in text, text
        serve.wait_for("serving again")

        monkeypatch.setattr(classifier, "Classifier", _ServerDiesAfterFirstAnswer(serve, real))
        as_json = CliRunner().invoke(app, ["classify", "--url", url, "--json", "--timeout", "1", "--concurrency", "1",
                                           str(tmp_path)])
        assert as_json.exit_code == 1, as_json.output
        lines = [json.loads(line) for line in as_json.stdout.splitlines()]
        # every file has its line, the ones never sent too (they had none: a `select(.error)` pipeline missed them)
        assert [line["file"] for line in lines] == [str(p) for p in files]
        assert all("labels" in line for line in lines[:16]), lines[:16]
        assert {line.get("error") for line in lines[16:]} == {"not classified: http " + url + ": [503] the server is "
                                                              "starting or restarting; retry shortly"}, lines[16:]
        assert "24 of 40 files were not classified" in " ".join(as_json.stderr.split()), as_json.stderr
        serve.wait_for("serving again")

        # started while the server restarts: its first request, for the model's config, was refused at once (exit 1)
        monkeypatch.setattr(classifier, "Classifier", real)
        os.kill(serve.tritonserver_pid(), signal.SIGKILL)
        serve.wait_for("restarting tritonserver")
        late = CliRunner().invoke(app, ["classify", "--url", url, "--top", "1", str(tmp_path)])
        text = " ".join(late.output.split())
        assert late.exit_code == 0, text
        assert f"note: {url} says its server is starting or restarting; waiting up to 60 s (--timeout) for it" \
            in text, text
        assert all(path.name in text for path in files), text
    finally:
        serve.stop()
