"""The command lines tests start hub-vit's programs with, in a process of their own, and `hub-vit serve` run until
its summary says it is ready."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HUB_VIT = [sys.executable, "-c", "from hub_vit.cli import run; run()"]  # the `hub-vit` program, as its script runs it
# The last line of serve's summary, naming tritonserver's log file: the server is ready
LOG_LINE = re.compile(r"^  log +(\S+) \(tritonserver's own", re.MULTILINE)


@dataclass
class Serving:
    """A `hub-vit serve` process: its public ports and what it printed (`text` until ready; `rest` once stopped)."""

    process: subprocess.Popen
    http_port: int
    grpc_port: int
    text: str = ""
    rest: str = ""

    @property
    def log_file(self) -> Path:
        """tritonserver's log file, as the summary names it."""
        found = LOG_LINE.search(self.text)
        assert found is not None, self.text
        return Path(found[1])


@contextmanager
def serving(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
            timeout_s: float = 240) -> Iterator[Serving]:
    """`hub-vit serve *args` on free ports, yielded once its summary's last line is printed (an AssertionError with
    what it printed if it ends or `timeout_s` passes first); stopped with Ctrl-C (SIGINT) at the end of the block."""
    from hub_vit.server.runtime.launcher import free_port

    ports = [free_port() for _ in range(3)]
    command: Sequence[str] = [*HUB_VIT, "serve", "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
                              "--metrics-port", str(ports[2]), "--exit-timeout", "10", *args]
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    served = Serving(process, ports[0], ports[1])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            served.text += line
            if LOG_LINE.search(line):
                break
        assert LOG_LINE.search(served.text), served.text
        yield served
        process.send_signal(signal.SIGINT)
        served.rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
