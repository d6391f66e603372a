"""`hub-vit serve`'s first screen: a short summary, not tritonserver's log. The log goes to a file the summary names;
`--verbose` shows it too, with the CUDA complaints every host without a GPU gets shown as harmless, not as errors; a
server that fails still has its own last lines printed."""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_vit.catalog import default_model_folder
from hub_vit.server.runtime.launcher import free_port
from hub_vit.server.runtime.triton_install import has_gpu
from tests.programs import HUB_VIT, LOG_LINE, Serve, serving

pytestmark = [pytest.mark.triton, pytest.mark.slow]

# The start of every line tritonserver logs: `I1127 08:29:10.919255 11916 metrics.cc:770] "Collecting CPU metrics"`
TRITON_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ", re.MULTILINE)
CUDA_ERROR = re.compile(r"^E\d{4} .*(CUDA|Cuda|cuda)", re.MULTILINE)


def _serve_until_ready(*flags: str) -> tuple[str, str]:
    """(everything `hub-vit serve` (the shipped model) prints from its start to its stop on Ctrl-C once ready, the
    log file the summary names as it is once the server is ready)."""
    with serving(*flags, timeout_s=180) as served:
        written = served.log_file.read_text()
    return served.text, written


def test_the_default_screen_is_a_summary_and_names_the_log_file():
    text, written = _serve_until_ready()
    assert "serving model vit" in text and "  try:     hub-vit classify --url" in text, text
    assert TRITON_LINE.search(text) is None, text  # not one raw line of Triton's log
    assert CUDA_ERROR.search(text) is None, text
    assert "tritonserver stopped" in text, text
    assert "Started GRPCInferenceService" in written and TRITON_LINE.search(written), written  # Triton's own log
    assert not Path(LOG_LINE.search(text)[1]).exists()  # a clean stop leaves nothing in the temporary folder


def test_a_second_serve_refused_its_ports_leaves_the_running_ones_log_alone():
    # was: two serves started together on the same ports both pass the early port check and build; the one refused
    # the ports had already opened their log file (emptying it) and removed it on its way out: the running serve's
    # summary named a log that was gone
    from hub_vit.server.serving import log_path

    first = Serve(quiet=False)
    ports = [f"--{name}-port={port}" for name, port in zip(("http", "grpc", "metrics"), first.ports, strict=True)]
    second = Serve(*ports, quiet=False)  # the last of a flag given twice wins: the first serve's ports
    try:
        refused = None
        deadline = time.monotonic() + 240
        while refused is None and time.monotonic() < deadline:
            refused = next((serve for serve in (first, second) if serve.process.poll() is not None), None)
            time.sleep(0.2)
        assert refused is not None, "neither serve was refused the ports"
        assert refused.finish() == 2, refused.text
        assert "is already served by another hub-vit serve" in " ".join(refused.text.split()), refused.text
        running = second if refused is first else first
        running.wait_for("serving model", timeout_s=240)
        log = log_path(first.ports[0])
        assert log.exists() and "Started GRPCInferenceService" in log.read_text(), "the running serve's log is gone"
    finally:
        first.stop()
        second.stop()


def test_the_summarys_health_line_checks_the_stubs_of_the_repository_served():
    """`hub-vit health` sees a dead stub only given the repository, which for `serve MODEL` is a temporary folder
    the summary did not name (its parent, the one a user could find, was refused: "holds no model")."""
    with serving() as served:
        line = next(line for line in served.text.splitlines() if line.startswith("  health:  hub-vit health "))
        args = shlex.split(line.partition("hub-vit ")[2])  # as a shell would split the pasted line
        done = subprocess.run([*HUB_VIT, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is ready; 2 of 2 Python-backend stubs alive" in " ".join(done.stdout.split()), done.stdout


def test_verbose_shows_tritons_log_and_no_cuda_complaint_as_an_error():
    text, _ = _serve_until_ready("--verbose")
    assert "Started GRPCInferenceService" in text and TRITON_LINE.search(text), text
    assert CUDA_ERROR.search(text) is None, text
    if not has_gpu():  # Triton 2.51 logs "CudaDriverHelper has not been initialized." on every CPU host
        assert "note (no GPU here, harmless): server.cc" in text, text
    assert LOG_LINE.search(text), text


def test_a_server_that_fails_still_prints_its_own_last_lines(tmp_path):
    """A model that cannot load: the error names it and shows the log's tail, without --verbose."""
    from hub_vit.cli import _load_commands, app
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.options import ServingOptions
    from hub_vit.server.repository.writer import write_repository

    repo = write_repository(resolve_model(str(default_model_folder())), tmp_path / "repository", ServingOptions())
    onnx = repo / "vit_classifier" / "1" / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[:2000])  # a truncated copy
    _load_commands()
    result = CliRunner().invoke(app, ["serve", "--repository", str(repo), "--max-restarts", "0", "--http-port",
                                      str(free_port()), "--grpc-port", str(free_port()), "--metrics-port",
                                      str(free_port())])
    assert result.exit_code == 1, result.output
    assert "model 'vit_classifier' (version 1) failed to load" in result.output, result.output
    assert "log tail:" in result.output and TRITON_LINE.search(result.output), result.output
    kept = Path(re.search(r"tritonserver's whole log: (\S+)", result.output)[1])  # a failed run's log is kept
    assert "failed to load" in kept.read_text()
    kept.unlink()
    shutil.rmtree(repo)


def test_quiet_and_verbose_together_are_refused():
    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, ["serve", "--quiet", "--verbose", "--http-port", str(free_port()), "--grpc-port",
                                      str(free_port()), "--metrics-port", str(free_port())])
    assert result.exit_code == 2
    assert "--quiet and --verbose contradict each other" in " ".join(result.output.split()), result.output


class _Server:
    exit_timeout_s = 30


class _Supervisor:
    """What `stop_on_signals` drives: a stop event, the current server, the drain and the hard stop."""

    def __init__(self) -> None:
        import threading

        self.stop, self.server, self.calls = threading.Event(), _Server(), []

    def terminate(self) -> None:
        self.stop.set()
        self.calls.append("terminate")

    def kill(self) -> None:
        self.calls.append("kill")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_only_ctrl_c_is_told_to_press_ctrl_c_again(signum: int) -> None:
    # was: "SIGTERM: draining in-flight requests (up to 30 s), then exiting; press Ctrl-C again to stop at once" in
    # the log of a `hub-vit serve` that systemd or `kill` stopped, where nobody can press anything
    import os

    from hub_vit.server.runtime.supervisor import stop_on_signals

    said: list[str] = []
    supervisor = _Supervisor()
    with stop_on_signals(supervisor, said.append):
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # Python runs the handler between bytecodes of this, the main thread
    name = signal.Signals(signum).name
    assert supervisor.calls == ["terminate"]
    assert said[0].startswith(f"{name}: draining in-flight requests (up to 30 s), then exiting"), said
    assert ("press Ctrl-C again to stop at once" in said[0]) == (signum == signal.SIGINT), said
