"""`hub-vit serve`'s run: a repository built in a temporary folder, the front's processes before Triton, the
supervisor that keeps a tritonserver serving (supervisor.py), stop signals drained, Triton's own log kept in a file.

The caller (the CLI) only chooses the options and shows what happens: `ServeHooks` are its callbacks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from hub_vit.atomic import DISK_REFUSED_ERRNOS
from hub_vit.server.front.exposition import Family
from hub_vit.server.front.limits import FrontLimits
from hub_vit.server.front.metrics_front import MetricsFront
from hub_vit.server.front.refusals import since
from hub_vit.server.front.workers import FrontProcesses
from hub_vit.server.repository.config import takes_queue_timeouts
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.runtime.launcher import ServerError, TritonServer, free_port
from hub_vit.server.runtime.supervisor import GaveUp, RestartPolicy, Supervisor, stop_on_signals
from hub_vit.server.runtime.workspace import shell_safe_tempdir


def temporary_workdir() -> Path:
    """A new temporary folder for `write_temporary_repository`, in a place the Python-backend stub can take ($TMPDIR
    unless its path has spaces or shell characters, or is mounted noexec); ServerError: no usable one. Whoever made it
    removes it (`remove_workdir`), whatever happened to the writing."""
    return shell_safe_tempdir("hub-vit-serve-")


def write_temporary_repository(source: Any, options: ServingOptions, workdir: Path) -> Path:
    """The Triton repository of `source` written as `workdir/repository` (whoever made `workdir` removes it, after a
    failure too). ValueError: a bad model; OSError naming the temporary folder it was written in (`filename`) when its
    disk refused the files (full, over quota)."""
    from hub_vit.server.repository.writer import write_repository

    try:
        return write_repository(source, workdir / "repository", options)
    except OSError as exc:
        if exc.errno in DISK_REFUSED_ERRNOS:
            # a write() refused for a full disk names no file: name the folder the user can make room in (or move
            # TMPDIR)
            raise OSError(exc.errno, exc.strerror, str(workdir.parent)) from exc
        raise


def remove_workdir(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class Endpoints:
    """Where `serve` listens: HTTP and gRPC through the front on `http_port` / `grpc_port`, metrics (Triton's and
    serve's own) on `metrics_port`."""

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


@dataclass(frozen=True)
class ServeHooks:
    """What the caller is told. `serving(server, restarted)`: a server became ready (it may raise to stop);
    `event(line)`: a server died and is replaced; `say(line)`: a stop signal arrived; `log(line)`: each line of
    Triton's own log (None: not shown); `refused(counts, seconds)`: what the front answered itself in the last
    `seconds` (`{protocol: {code: count}}`, server/front/refusals.py), when it answered any."""

    serving: Callable[[TritonServer, bool], None]
    event: Callable[[str], None]
    say: Callable[[str], None]
    log: Callable[[str], None] | None = None
    refused: Callable[[dict[str, dict[str, int]], float], None] | None = None


@dataclass(frozen=True)
class StopReport:
    """How a run ended without failing: `ready` False when stopped while still loading; `drain_code` Triton's exit
    status when it is not 0 (its stop outlasted the exit timeout), else None; `answered_all`: whether the front had
    answered every request it took when Triton was told to stop (if so, a `drain_code` is Triton unloading its models
    slowly, and no client lost an answer)."""

    ready: bool
    drain_code: int | None = None
    answered_all: bool = True


class CannotStart(ValueError):
    """The front or the first server could not be set up (a port taken, a repository the server cannot take): nothing
    ran."""


def serve_repository(repository: Path, endpoints: Endpoints, hooks: ServeHooks, *, exit_timeout_s: int,
                     max_restarts: int, limits: FrontLimits, refusal_report_s: float = 0) -> StopReport:
    """Serve `repository` until Ctrl-C / SIGTERM / SIGHUP (drained) or a failure the restart policy does not cover
    (ServerError, with the server's own last lines); CannotStart when nothing could start. Every `refusal_report_s`
    seconds (0: never), and at the end, `hooks.refused` hears what the front answered itself meanwhile."""
    def new_server() -> TritonServer:  # Triton's endpoints on private loopback ports; the fronts take the public ones
        private = [free_port() for _ in range(3)]  # never one port twice (free_port keeps what it gave)
        return TritonServer(repository, host=endpoints.host, http_port=private[0], grpc_port=private[1],
                            metrics_port=private[2], exit_timeout_s=exit_timeout_s, log=hooks.log,
                            http_host="127.0.0.1", grpc_host="127.0.0.1", metrics_host="127.0.0.1",
                            picked_ports=("http_port", "grpc_port", "metrics_port"))

    # the front refuses per-request queue timeouts a repository without a queue policy would silently ignore, and
    # tells clients whether a server it cannot reach is being replaced
    limits = replace(limits, queue_timeouts=takes_queue_timeouts(repository), restarts=max_restarts > 0)
    front = FrontProcesses(endpoints.host, endpoints.http_port, endpoints.grpc_port, limits)
    supervisors: list[Supervisor] = []  # the one below, once made: the metrics read its restarts
    metrics = MetricsFront(endpoints.host, endpoints.metrics_port, endpoints.http_port,
                           lambda: serve_families(front, supervisors, metrics))
    try:  # the public HTTP and gRPC ports, each checking requests before Triton; the metrics port, relayed
        front.start()
        metrics.start()
        supervisor = Supervisor(new_server, RestartPolicy(max_failed_starts=max_restarts), threading.Event(),
                                serving=hooks.serving, event=hooks.event,
                                gates=(front.front("http"), front.front("grpc"), metrics))
    except (ServerError, OSError, ValueError) as err:
        metrics.close()
        front.close()
        raise CannotStart(str(err)) from None
    supervisors.append(supervisor)
    reporter = RefusalReporter(front, hooks.refused, refusal_report_s).start()
    with stop_on_signals(supervisor, hooks.say) as forced:
        try:
            return _outcome(supervisor, forced)
        finally:
            supervisor.server.stop()
            reporter.stop()  # the requests refused while draining counted too
            metrics.close()
            front.close()


SCRAPE_ASK_S = 2.0  # a scrape's wait for the front processes' counts (Prometheus's own scrape timeout is 10 s)


def serve_families(front: FrontProcesses, supervisors: list[Supervisor], metrics: MetricsFront) -> list[Family]:
    """serve's own metric families, added after Triton's on the metrics port (docs/serving.md, "Metrics")."""
    answered = front.answered(SCRAPE_ASK_S)
    restarts = supervisors[0].restarts if supervisors else 0
    return [
        Family("hub_vit_server_ready", "gauge", "1 while a ready tritonserver is behind the front, 0 while one starts, "
               "is replaced or stops (Triton's own metrics are missing then)", [({}, int(metrics.ready))]),
        Family("hub_vit_server_restarts_total", "counter", "tritonservers started to replace one that died",
               [({}, restarts)]),
        Family("hub_vit_front_answers_total", "counter", "requests the front answered itself, never reaching Triton: "
               "refused (HTTP status or gRPC status name; GOAWAY: a broken HTTP/2 connection; OVER_CAP: a gRPC "
               "connection reset at --max-connections), or no server to relay "
               "them to", [({"protocol": protocol, "code": code}, count)
                           for protocol, counts in answered.items() for code, count in counts.items()]),
        Family("hub_vit_front_processes_replaced_total", "counter", "front processes that died and were replaced",
               [({}, front.replaced)]),
    ]


class RefusalReporter:
    """Asks the front every `every_s` seconds what it answered itself, and tells `refused` when that was anything; a
    last time at `stop` (for the time since the last ask). Without `refused`, or with `every_s` 0, it does nothing."""

    def __init__(self, front: FrontProcesses, refused: Callable[[dict[str, dict[str, int]], float], None] | None,
                 every_s: float) -> None:
        self.front, self.refused, self.every_s = front, refused, every_s
        self._reported: dict[str, dict[str, int]] = {}  # the front's running totals at the last report
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = time.monotonic()

    def start(self) -> RefusalReporter:
        if self.refused is not None and self.every_s > 0:
            self._since = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="hub-vit-refusals", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._report()

    def _report(self) -> None:
        now = time.monotonic()
        try:
            totals = self.front.answered()
        except (OSError, TimeoutError):  # a front process that does not answer: the watcher replaces it
            return
        counts, self._reported = since(totals, self._reported), totals
        seconds, self._since = now - self._since, now
        if counts and self.refused is not None:
            self.refused(counts, seconds)

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._report()


def _outcome(supervisor: Supervisor, forced: threading.Event) -> StopReport:
    try:
        server = supervisor.run()
    except ServerError as err:
        if supervisor.stop.is_set() and not isinstance(err, GaveUp):  # interrupted while still loading
            return StopReport(ready=False)
        raise
    if not supervisor.served:  # stopped while the first server was still loading or warming up
        return StopReport(ready=False)
    code = server.process.returncode if server.process is not None else None
    # Triton's "Exit timeout expired": its stop outlasted the exit timeout. The front waited for the requests it took
    # before Triton got its SIGTERM, so unless that wait ran out too (`answered_all` False: requests got no answer),
    # what held Triton was unloading its models (the Python-backend stubs take a few seconds). A requested stop either
    # way: the caller says which, and exits with the status of a requested stop.
    failed_drain = bool(code) and not forced.is_set() and supervisor.stopped_serving
    return StopReport(ready=True, drain_code=code if failed_drain else None, answered_all=supervisor.answered_all)


def not_served(http_url: str, name: str, headers: dict[str, str]) -> str | None:
    """Why `name` cannot be called on a server that reports ready (Triton is ready with no model at all: an empty or
    foreign `--repository`), or None when it can."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/models/{name}/ready", timeout=10):
            return None
    except urllib.error.HTTPError:
        pass
    try:
        request = urllib.request.Request(f"http://{http_url}/v2/repository/index", data=b"{}", method="POST",
                                         headers=headers)  # a restricted API: the server's control key opens it
        with urllib.request.urlopen(request, timeout=10) as reply:
            models = sorted({m["name"] for m in json.loads(reply.read()) if m.get("state") == "READY"})
    except (urllib.error.URLError, ValueError, KeyError, TypeError):
        models = []
    return (f"the server is up but serves no model {name!r}; models it serves: {', '.join(models) or 'none'} "
            "(an empty or foreign --repository? pass --name, or build one with hub-vit repository)")


def log_path(http_port: int) -> Path:
    """Where the serve on HTTP port `http_port` writes Triton's log (`LogFile`)."""
    return Path(tempfile.gettempdir()) / f"hub-vit-serve-{http_port}.log"


class LogFile:
    """Triton's own log, line by line, into a file (`$TMPDIR/hub-vit-serve-<http port>.log`, replaced at each start,
    so the log of a run is where the user expects it). A file that cannot be replaced safely (a symbolic link
    planted in a shared /tmp, another user's file) gives way to a new file of a unique name. `close(remove=True)`
    after a clean stop: only the log of a failed run is kept (the temporary folder stays clean). The file is made at
    the first line, once the ports are this run's: a second serve on the same ports, refused, emptied and then removed
    the running one's log."""

    def __init__(self, http_port: int) -> None:
        self.path = log_path(http_port)
        self._file: IO[str] | None = None
        self._closed = False

    def _open(self) -> IO[str]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError:
            fd, name = tempfile.mkstemp(prefix=f"{self.path.stem}-", suffix=".log")
            self.path = Path(name)
        return os.fdopen(fd, "w", encoding="utf-8", errors="replace")

    def write(self, line: str) -> None:
        """One line, flushed: the file is read while the server runs (`tail -f`) and after a crash."""
        if self._closed:  # a stub's last words after the run ended are dropped, not an error
            return
        if self._file is None:
            self._file = self._open()
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except ValueError:  # closed: a stub's last words after the run ended are dropped, not an error
            pass

    def close(self, *, remove: bool = False) -> None:
        self._closed = True
        if self._file is None:  # nothing was written: no file of this run's to keep or remove
            return
        self._file.close()
        if remove:
            self.path.unlink(missing_ok=True)
