"""The command lines tests start hub-vit's programs with, in a process of their own, and `hub-vit serve` run as a
user runs it: `Serve` (on free ports, its output read as it comes) and `serving` (a `with` block, once its summary
says it is ready)."""

from __future__ import annotations

import os
import queue
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from hub_vit.catalog import default_model_folder
from hub_vit.server.runtime.launcher import free_port
from hub_vit.server.runtime.processes import is_stub, live_processes
from hub_vit.server.serving import log_path

# The `hub-vit` program, as its script runs it; -P: the working folder is not on sys.path, as for the script
HUB_VIT = [sys.executable, "-P", "-c", "from hub_vit.cli import run; run()"]
# The last line of serve's summary, naming tritonserver's log file: the server is ready
LOG_LINE = re.compile(r"^  log +(\S+) \(tritonserver's own", re.MULTILINE)
# The default model's sample images, named <digit>_<n>.png
SAMPLES = sorted((default_model_folder() / "samples").glob("*.png"))


def expected_digits() -> list[str]:
    """The labels of the first four samples, which `Serve.classify` sends."""
    return [path.name.split("_")[0] for path in SAMPLES[:4]]


def children_of(parent: int, state: str | None = None) -> dict[int, str]:
    """pid -> command line of `parent`'s child processes in `state` (`Z`: zombies), else of its live ones (/proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            its_state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
            if int(ppid) == parent and (its_state == state if state else its_state != "Z"):
                found[int(entry.name)] = command
    return found


def live_stubs(group: int) -> dict[int, str]:
    """pid -> command line of the live Python-backend stubs in process group `group` (a tritonserver's), recognised
    as the server's own watch recognises them."""
    return {pid: cmd for pid, cmd in live_processes(group).items() if is_stub(cmd)}


class Serve:
    """`hub-vit serve *args` (the default model unless args name one) in a subprocess on free ports; its output lines
    read as they come, and all of them in `text`. `quiet`: with --quiet (no summary); `env`: its whole environment,
    else this process's; `open_files`: its (soft, hard) limit on open files (RLIMIT_NOFILE), else this process's;
    `preexec`: run in the child before serve starts (it may place it in a cgroup); `new_session`: in a session and
    process group of its own (a test sends Ctrl-C's SIGINT to the group); `wrapper`: a command that runs serve, as its
    only child or by exec (`unshare ...`); `cwd`: the folder it runs in."""

    def __init__(self, *args: str, quiet: bool = True, env: Mapping[str, str] | None = None,
                 open_files: tuple[int, int] | None = None, preexec: Callable[[], None] | None = None,
                 new_session: bool = False, wrapper: tuple[str, ...] = (), cwd: Path | None = None) -> None:
        self.ports = [free_port() for _ in range(3)]
        self.http_port, self.grpc_port, _ = self.ports
        command = [*wrapper, *HUB_VIT, "serve", *(["--quiet"] if quiet else []),
                   "--http-port", str(self.ports[0]), "--grpc-port", str(self.ports[1]), "--metrics-port",
                   str(self.ports[2]), "--exit-timeout", "10", *args]
        self.wrapped = bool(wrapper)

        def before_exec() -> None:
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, open_files)
            if preexec is not None:
                preexec()

        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        preexec_fn=before_exec, start_new_session=new_session, cwd=cwd)
        self.lines: queue.Queue[str] = queue.Queue()
        self.text = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str | re.Pattern[str], timeout_s: float = 180) -> str:
        """Everything printed until a line holding `text` (or matching it), else an AssertionError with the output
        once serve ended or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.text += line
            if (text.search(line) if isinstance(text, re.Pattern) else text in line):
                return self.text
        raise AssertionError(f"{text!r} never printed; output:\n{self.text}")

    def finish(self, timeout_s: float = 60) -> int:
        """serve's exit status, once it ended, with all it printed read into `text`."""
        self.process.wait(timeout_s)
        time.sleep(0.2)  # the reader thread takes the last lines
        while not self.lines.empty():
            self.text += self.lines.get()
        return self.process.returncode

    @property
    def log_file(self) -> Path:
        """tritonserver's log file, as the summary names it (not with `quiet`)."""
        found = LOG_LINE.search(self.text)
        assert found is not None, self.text
        return Path(found[1])

    def tritonserver_pid(self) -> int:
        """The tritonserver this serve started (its child, and the leader of its own process group)."""
        for pid, cmd in live_processes(self._child_group()).items():
            if "tritonserver --id=" in cmd:
                return pid
        raise AssertionError("no tritonserver found")

    @property
    def pid(self) -> int:
        """serve's process id: the wrapper's only child where it has one, else the process started (a wrapper that
        execs serve)."""
        if not self.wrapped or Path(f"/proc/{self.process.pid}/cmdline").read_bytes().startswith(
                sys.executable.encode() + b"\0"):
            return self.process.pid
        found = children_of(self.process.pid)
        assert len(found) == 1, f"the wrapper has children {found}"
        return next(iter(found))

    def children(self) -> dict[int, str]:
        """pid -> command line of serve's live child processes, from /proc (a zombie's command line is empty: it
        could not be told by it anyway)."""
        return children_of(self.pid)

    def zombies(self) -> list[int]:
        """serve's children that have ended and that it has not waited for."""
        return sorted(children_of(self.pid, state="Z"))

    def _child_group(self) -> int:
        for pid, command in self.children().items():
            if "tritonserver" in command:
                return pid
        raise AssertionError("serve has no tritonserver child")

    def front_pids(self) -> list[int]:
        """The front's worker processes (serve's children)."""
        return [pid for pid, command in self.children().items() if "hub_vit.server.front.worker" in command]

    def stubs(self) -> dict[int, str]:
        return live_stubs(self.tritonserver_pid())

    def triton_grpc_port(self) -> int | None:
        """The gRPC port of the tritonserver serve runs now, from its command line (None between two servers): serve's
        gRPC gate refuses the requests that crash Triton, so a test that needs the crash sends it there."""
        try:
            command = Path(f"/proc/{self.tritonserver_pid()}/cmdline").read_bytes().split(b"\0")
        except (AssertionError, OSError):
            return None
        return next(int(arg.split(b"=")[1]) for arg in command if arg.startswith(b"--grpc-port="))

    def classify(self) -> list[str]:
        from hub_vit.server.client.classifier import Classifier

        with Classifier(f"127.0.0.1:{self.ports[0]}", timeout_s=30) as client:
            return [p.labels[0] for p in client.classify(SAMPLES[:4])]

    def stop(self) -> None:
        """Kill serve if it still runs, and its server's whole process group with it: a serve killed midway cannot
        clean up, and a test must not leave a tritonserver or its stubs running (a stub left so ran for 30 min). The
        Triton log a killed, failed or restarted serve keeps is removed (a test that wants it reads it before)."""
        killed = self.process.poll() is None
        if killed:
            try:
                group = self._child_group()
            except (AssertionError, OSError):  # no tritonserver child (not started yet, or between two servers)
                group = None
            self.process.kill()
            self.process.wait(30)
            if group is not None:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # a clean stop without a replaced server removes its own (a test checks it does); one that replaced a server
        # keeps it, as a failed one does
        log_path(self.ports[0]).unlink(missing_ok=True)


@contextmanager
def serving(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
            timeout_s: float = 240) -> Iterator[Serve]:
    """`hub-vit serve *args` with its summary, yielded once the summary's last line is printed (an AssertionError with
    what it printed if it ends or `timeout_s` passes first); stopped with Ctrl-C (SIGINT) at the end of the block, and
    all it printed then in `text`."""
    serve = Serve(*args, quiet=False, env=env, cwd=cwd)
    try:
        serve.wait_for(LOG_LINE, timeout_s)
        yield serve
        serve.process.send_signal(signal.SIGINT)
        serve.finish(60)
    finally:
        serve.stop()
