"""Start the real `tritonserver` (shipped in the nvidia-pytriton wheel, or on PATH) on a generated repository.

What it takes to run the wheel's binary outside PyTriton:
* a backend directory holding the Python backend *and the stub built for the running interpreter's version*
  (`pytriton/tritonserver/python_backend_stubs/<X.Y>/triton_python_backend_stub`), assembled in a temp workspace;
* `LD_LIBRARY_PATH` with the wheel's bundled libraries and this interpreter's `LIBDIR` (the stub links libpython,
  and a system libpython of another patch release breaks model init);
* this interpreter's `bin/` first on `PATH`, so the stub's embedded Python imports numpy/Pillow/onnxruntime from
  the same environment.
The server binds to 127.0.0.1 unless told otherwise, and SIGTERM makes it drain in-flight requests
(`--exit-timeout-secs`) before exiting. Finding the binary is `triton_install.py`, its temporary folders
`workspace.py`, its processes `processes.py`, reading its log `triton_log.py`, its restricted APIs `api_access.py`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from hub_vit.atomic import owner_tag
from hub_vit.cgroup_limits import oom_kills
from hub_vit.ports import (
    GRPC_PORT,
    HTTP_PORT,
    LOOPBACK,
    METRICS_PORT,
    PortError,
    PortInUse,
    check_ports,
    ipv4_address,
)
from hub_vit.server.runtime.api_access import CONTROL_HEADER, restricted_api_args
from hub_vit.server.runtime.port_claims import recent_claims
from hub_vit.server.runtime.processes import (
    exit_description,
    is_stub,
    kill_process_group,
    live_processes,
    oom_killed,
    reap_adopted,
    server_child_setup,
    stub_instance,
)
from hub_vit.server.runtime.stub_env import StubEnvironment, stub_environment
from hub_vit.server.runtime.triton_install import ServerError, TritonInstall, find_triton, has_gpu
from hub_vit.server.runtime.triton_log import ENDPOINT_STARTED, ENDPOINTS_NEXT, PORT_IN_USE, load_failure
from hub_vit.server.runtime.workspace import (
    remove_orphaned_regions,
    remove_orphaned_workspaces,
    shell_safe_tempdir,
    unservable_path_message,
)

__all__ = ["PortTaken", "ServerError", "TritonServer", "free_port"]


_HANDED_OUT: set[int] = set()  # the ports free_port returned in this process
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A loopback port free now that this process has not been handed before, nor another process on this host
    lately (port_claims.py): the kernel may give the same port to two binds in a row once the first is closed, callers
    take several at once (HTTP, gRPC, metrics), and their servers bind them only later."""
    with _HANDED_OUT_LOCK, recent_claims() as claimed:
        for _ in range(64):
            port = _kernel_port()
            if port not in _HANDED_OUT and port not in claimed:
                _HANDED_OUT.add(port)
                claimed[port] = time.time()
                return port
    raise OSError("the kernel gave 64 ports in a row that had already been handed out")


def _kernel_port() -> int:
    """A port the kernel says is free now on loopback (bind to port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    """GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _server_id(url: str) -> str | None:
    """The `name` of Triton's server metadata (GET /v2): its `--id`."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.loads(reply.read()).get("name")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None


class PortTaken(ServerError):
    """A port of the server's was taken: found listening before the start, or taken by another process while
    tritonserver loaded its models (it binds its endpoints last). `setting` names it (`http_port`, `grpc_port`,
    `metrics_port`), so a caller that picked that port itself can pick another (`TritonServer.picked_ports`)."""

    def __init__(self, message: str, setting: str, port: int) -> None:
        super().__init__(message)
        self.setting, self.port = setting, port


# The Python backend's own temporary folder: libtriton_python.so makes /tmp/python_env_XXXXXX at start (whatever
# $TMPDIR says) and removes it at a clean stop; a server killed with SIGKILL (the OOM killer, a crash, a supervised
# restart) left it, empty, for good: hundreds of them on a host whose servers get replaced.
PYTHON_ENV_FOLDERS = "/tmp/python_env_??????"
# Held by a starting hub-vit server until its Python backend has made that folder, so that the one folder appearing
# meanwhile is known to be its own (two servers starting at once could not tell them apart, and each left its own)
PYTHON_ENV_CLAIM = "/tmp/hub-vit-python-env.lock"
PYTHON_ENV_WAIT_S = 30.0  # the longest a start holds the claim: a repository without Python models makes no folder


def python_env_folders() -> set[Path]:
    return {Path(path) for path in glob.glob(PYTHON_ENV_FOLDERS)}


@contextlib.contextmanager
def python_env_claim(lock_file: str = PYTHON_ENV_CLAIM) -> Iterator[bool]:
    """Hold the claim (an exclusive `flock` on `lock_file`, released when the file is closed, also by a process that
    dies): other hub-vit servers wait to launch until it is released. Yields False, holding nothing, when the lock
    file cannot be opened (another user's under a protected /tmp, a read-only /tmp): the folder is then found as
    before, by its time."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:
        try:  # fs.protected_regular refuses O_CREAT on another user's file in a sticky folder, not a plain open
            fd = os.open(lock_file, os.O_RDONLY)
        except OSError:
            yield False
            return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)


def _made_by_this_start(new: set[Path], started_at: float) -> Path | None:
    """The one Python-backend folder that appeared while this server started, or None when it is not known which (two
    servers started at once: each leaves its folder rather than remove the other's)."""
    with contextlib.suppress(OSError):
        new = {path for path in new if path.stat().st_mtime >= started_at - 1}
        return next(iter(new)) if len(new) == 1 else None
    return None


class TritonServer:
    """One tritonserver process. `with TritonServer(repo) as server:` starts, waits until ready and stops it."""

    def __init__(self, repository: str | Path, *, host: str = LOOPBACK, http_port: int = HTTP_PORT,
                 grpc_port: int = GRPC_PORT, metrics_port: int = METRICS_PORT, exit_timeout_s: int = 30,
                 log: Callable[[str], None] | None = None, log_verbose: int = 0,
                 extra_args: tuple[str, ...] = (), http_host: str | None = None,
                 grpc_host: str | None = None, metrics_host: str | None = None,
                 picked_ports: Collection[str] = ()) -> None:
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise ServerError(f"model repository {str(self.repository)!r} "
                              + ("is not a folder" if self.repository.exists() else "does not exist"))
        unservable = unservable_path_message(self.repository)
        if unservable:
            raise ServerError(unservable)
        self.host, self.http_port, self.grpc_port, self.metrics_port = host, http_port, grpc_port, metrics_port
        self.http_host = http_host or host  # `hub-vit serve` keeps HTTP on loopback, behind its front (front/)
        self.grpc_host = grpc_host or host  # ... and gRPC
        self.metrics_host = metrics_host or host  # ... and metrics (its front: front/metrics_front.py)
        # the settings whose port the caller picked (free_port), not a user: when one is taken before this server
        # binds it (PortTaken), the caller may start another server on other ports (supervisor.py)
        self.picked_ports = frozenset(picked_ports)
        self._check_ports(in_use=False)
        self.exit_timeout_s = exit_timeout_s
        self.log, self.log_verbose, self.extra_args = log, log_verbose, extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = False  # `terminate` was called, perhaps before there was a process to signal
        self.log_tail: deque[str] = deque(maxlen=400)
        self.load_failures: list[str] = []  # `load_failure` summaries, kept even when the tail has moved on
        self._workspace: Path | None = None
        self._python_env: Path | None = None  # the Python backend's own temporary folder, once known (`start`)
        self._reader: threading.Thread | None = None
        # `--id`: GET /v2 answers it, so readiness is never taken from another server that got our port first
        self.server_id = f"hub-vit-{owner_tag()}{secrets.token_hex(4)}"  # its /dev/shm regions' prefix too
        self.shm_prefix = f"{self.server_id}_"
        # The control APIs (RESTRICTED_APIS) answer only requests carrying this header; hub-vit's own calls send it
        self.control_key = secrets.token_hex(16)
        self.reachable = False  # it opened its HTTP or gRPC endpoint: clients could reach it (supervisor.py)
        self._endpoints_next = False  # its log reached the options table printed right before its endpoints open
        self.stub_environment: StubEnvironment | None = None  # the stubs' Python environment, once started
        self.oom_kills_at_start: int | None = None  # this cgroup's OOM kills when it started (`wait` names a new one)

    # -- endpoints ------------------------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{self.http_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.grpc_host}:{self.grpc_port}"

    def endpoint(self, protocol: str) -> tuple[str, int]:
        """(host, port) of this server's "http", "grpc" or "metrics" endpoint."""
        endpoints = {"http": (self.http_host, self.http_port), "grpc": (self.grpc_host, self.grpc_port),
                     "metrics": (self.metrics_host, self.metrics_port)}
        if protocol not in endpoints:
            raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(endpoints)}")
        return endpoints[protocol]

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_host}:{self.metrics_port}/metrics"

    @property
    def control_headers(self) -> dict[str, str]:
        """The header that opens this server's restricted APIs (repository index, logging, trace, shared memory)."""
        return {CONTROL_HEADER: self.control_key}

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def command(self, install: TritonInstall, backends: Path) -> list[str]:
        return [
            str(install.binary),
            f"--id={self.server_id}",
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            "--model-control-mode=none",  # no repository changes over the API (arbitrary code execution risk)
            "--strict-readiness=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            # addresses, not names: `localhost` would be bound as 255.255.255.255 by Triton 2.51
            f"--http-address={ipv4_address(self.http_host)}", f"--http-port={self.http_port}",
            f"--grpc-address={ipv4_address(self.grpc_host)}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={ipv4_address(self.metrics_host)}", f"--metrics-port={self.metrics_port}",
            *(("--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0") if not has_gpu() else ()),
            f"--log-verbose={self.log_verbose}",
            *restricted_api_args(CONTROL_HEADER, self.control_key),
            # the stubs' /dev/shm regions carry this server's id, so `stop` can remove what a SIGKILL leaves behind
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *self.extra_args,
        ]

    def _check_ports(self, in_use: bool) -> None:
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        try:
            check_ports(self.host, ports, in_use=in_use)
        except PortInUse as err:
            raise PortTaken(str(err), err.setting, ports[err.setting]) from None
        except PortError as err:
            raise ServerError(str(err)) from None

    def start(self, timeout_s: float = 120.0) -> TritonServer:
        self._check_ports(in_use=True)  # Triton would say so only deep in its log, after loading every model
        remove_orphaned_regions()
        remove_orphaned_workspaces()
        install = find_triton()
        self._workspace = shell_safe_tempdir("hub-vit-triton-", runs_programs=True)  # the backends run from it
        try:
            backends, env = self._prepare(install, self._workspace)
        except BaseException:  # no stub environment (numpy 2 here, none for the stubs), a full disk: nothing is left
            shutil.rmtree(self._workspace, ignore_errors=True)
            self._workspace = None
            raise
        self.oom_kills_at_start = oom_kills()
        envs_before, started_at = python_env_folders(), time.time()
        try:
            with python_env_claim() as claimed:
                envs_before, started_at = python_env_folders(), time.time()  # again: after waiting for the claim
                self.process = subprocess.Popen(
                    self.command(install, backends), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                    cwd=self._workspace, preexec_fn=server_child_setup,
                    start_new_session=True,  # Ctrl-C reaches only us; we forward one SIGTERM, so the drain starts once
                )
                self._reader = threading.Thread(target=self._read_log, name="tritonserver-log", daemon=True)
                self._reader.start()
                if self._stopping:  # a Ctrl-C while the workspace was prepared: stop now, not after loading all
                    self.process.send_signal(signal.SIGTERM)
                if claimed:
                    self._python_env = self._await_python_env(envs_before, started_at)
            self.wait_ready(timeout_s)
        except BaseException:
            # a server that died (or was stopped) while it loaded made its folder too: found first, so `stop` removes
            # it (a crash loop during warm-up left one empty /tmp/python_env_* per start)
            self._python_env = self._python_env or _made_by_this_start(python_env_folders() - envs_before, started_at)
            self.stop()
            raise
        self._python_env = self._python_env or _made_by_this_start(python_env_folders() - envs_before, started_at)
        return self

    def _await_python_env(self, before: set[Path], started_at: float) -> Path | None:
        """The Python backend's folder this start makes (the caller holds the claim, so no other hub-vit server's can
        appear meanwhile), once it is there or the server has ended; None when the server is ready without one or
        `PYTHON_ENV_WAIT_S` passes first, or when two appear (a server hub-vit did not start)."""
        deadline, next_ready_check = time.monotonic() + PYTHON_ENV_WAIT_S, time.monotonic() + 0.2
        while time.monotonic() < deadline and self.process is not None and self.process.poll() is None:
            if python_env_folders() - before:
                break
            if time.monotonic() >= next_ready_check:  # ready without one: no Python model in the repository
                if self.is_ready():
                    return None
                next_ready_check = time.monotonic() + 0.2
            time.sleep(0.02)
        return _made_by_this_start(python_env_folders() - before, started_at)  # also one made just before it ended

    def _prepare(self, install: TritonInstall, workspace: Path) -> tuple[Path, dict[str, str]]:
        """The backend folder (the Python backend with this interpreter's stub) and the server's environment."""
        backends = workspace / "backends"
        python_dir = backends / "python"
        shutil.copytree(install.python_backend, python_dir, ignore=shutil.ignore_patterns("__pycache__"))
        if install.stub is not None:
            shutil.copy2(install.stub, python_dir / "triton_python_backend_stub")
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [*(str(p) for p in install.libs), libdir, env.get("LD_LIBRARY_PATH", "")]
        ).strip(os.pathsep)
        # the stubs' Python takes its environment from the `python3` first on PATH, not from PYTHONPATH (stub_env.py)
        self.stub_environment = stub_environment(workspace)
        env["PATH"] = os.pathsep.join([str(self.stub_environment.bin_dir), env.get("PATH", "")])
        return backends, env

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            self.log_tail.append(line)
            if ENDPOINT_STARTED.search(line):  # from the log: a crash right after it is too quick for any poll
                self.reachable = True
            elif ENDPOINTS_NEXT.search(line):
                self._endpoints_next = True
            failure = load_failure(line)
            if failure is not None:
                self.load_failures.append(failure)
            if self.log is not None:
                self.log(line)

    def is_ready(self) -> bool:
        """Every model ready and every endpoint answering, *this* server's. Triton starts its metrics service last,
        after HTTP already reports ready (a metrics read right after readiness was once refused in CI), so that is
        checked too. Another server on our port (two `serve` started at once both passed the port check) answers
        /v2 with its own id."""
        return (_answers(f"http://{self.http_url}/v2/health/ready") and _answers(self.metrics_url)
                and _server_id(f"http://{self.http_url}/v2") == self.server_id)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                self._reap()  # the process is gone: the reader takes in its last lines
                if code is not None and code < 0 and self._endpoints_next:
                    # killed by a signal once its endpoints were opening: a client's request can crash it there before
                    # the "Started ..." line is read (seen with the SIGFPE request), so it was reachable, not a failed
                    # start (supervisor.py counts only those against --max-restarts)
                    self.reachable = True
                taken = self._port_taken()
                if taken is not None:
                    raise taken
                ended = "ended" if code is None else exit_description(code)
                raise ServerError(f"tritonserver {ended} before it was ready{self._failures()}\n"
                                  f"log tail:\n{self.tail()}")
            if self.is_ready():
                return
            time.sleep(0.2)
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s{self._failures()}\nlog tail:\n{self.tail()}")

    def _port_taken(self) -> PortTaken | None:
        """A one-line error when Triton died because a port was taken after our check (another server starting at
        the same time), from its log: `failed to start GRPC service: Unavailable - Socket '127.0.0.1:8001' already
        in use` (HTTP and metrics: `failed to start HTTP service` / `... Metrics service ...`)."""
        names = {self.http_port: "http_port", self.grpc_port: "grpc_port", self.metrics_port: "metrics_port"}
        for line in self.log_tail:
            match = PORT_IN_USE.search(line)
            if match is None:
                continue
            port = int(match["port"])
            setting = names.get(port, "port")
            return PortTaken(f"{setting} {port}: already in use on {self.host} (taken by another process while "
                             "tritonserver was loading its models, e.g. a second server started at the same time)",
                             setting, port)
        return None

    def _failures(self) -> str:
        return "".join(f"\n  {failure}" for failure in self.load_failures)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(list(self.log_tail)[-lines:])

    def terminate(self) -> None:
        """Ask the server to shut down gracefully (SIGTERM: stop accepting, finish in-flight requests); called before
        `start` has a process, it makes `start` stop the server as soon as it is launched."""
        self._stopping = True
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Stop at once (SIGKILL to the server and its backend stubs): in-flight requests get no answer."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            kill_process_group(self.process.pid)

    def wait(self, timeout_s: float | None = None) -> int:
        assert self.process is not None
        code = self.process.wait(timeout_s)
        self._reap()
        return code

    def _reap(self) -> None:
        """Once tritonserver has exited: SIGKILL what is left of its process group, then let the log reader take in
        the last lines. A clean shutdown leaves nothing; a server that died or failed to load leaves its Python-backend
        stubs, which run on (one was seen alive 30 minutes later) and hold the log pipe open, so the reader waited out
        its timeout first (`hub-vit serve` spent 12 s cleaning up a dead server, instead of 1-2 s)."""
        if self.process is not None:  # None: stopped before `start` launched it
            kill_process_group(self.process.pid)
            reap_adopted(self.process.pid)  # serve as a container's init: the stubs are its to wait for
        if self._reader is not None:
            self._reader.join(timeout=5)

    def stop(self) -> int | None:
        """SIGTERM, wait for the drain (exit timeout + margin), SIGKILL as a last resort; remove the workspace."""
        code = None
        if self.process is not None:
            self.terminate()
            try:
                code = self.wait(self.exit_timeout_s + 15)  # wait() also reaps the stubs a dead server left behind
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.wait(10)
            self._remove_shm_regions()
        if self._workspace is not None:
            shutil.rmtree(self._workspace, ignore_errors=True)
            self._workspace = None
        if self._python_env is not None:  # a clean stop removes it; a killed server left it (empty) for good
            with contextlib.suppress(OSError):  # not empty: not only the backend's, kept
                self._python_env.rmdir()
            self._python_env = None
        return code

    def _remove_shm_regions(self) -> None:
        """Unlink this server's shared-memory regions: a clean drain removes them, a SIGKILL of the server or its
        stubs does not, and each holds what its stub's pool grew to (hundreds of MB after large requests)."""
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            try:
                region.unlink()
            except OSError:
                pass

    # -- supervision ----------------------------------------------------------------------------------------------
    def stubs(self) -> dict[int, str]:
        """pid -> model instance of the server's live Python-backend stubs (they run in its process group)."""
        if self.process is None:
            return {}
        return {pid: stub_instance(cmd) for pid, cmd in live_processes(self.process.pid).items()
                if pid != self.process.pid and is_stub(cmd)}

    def watch(self, stopping: threading.Event, interval_s: float = 1.0) -> str | None:
        """Block while the server runs. None once it exits after `stopping` was set (a shutdown); else the failure,
        one line: tritonserver died, or one of its Python-backend stubs did. Triton 2.51 does not restart a dead stub
        and keeps reporting ready, while every request routed to that instance fails (HTTP 500 "Stub process ... is
        not healthy"): such a server must be replaced, not kept."""
        assert self.process is not None
        stubs = self.stubs()  # those of a ready server: one per Python-backend model instance
        while True:
            try:
                code = self.process.wait(interval_s)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                self._reap()
                if stopping.is_set():
                    return None
                oom = oom_killed(self.oom_kills_at_start) if code == -signal.SIGKILL else None
                return f"tritonserver was ended: {oom}" if oom else f"tritonserver {exit_description(code)}"
            if stopping.is_set():
                continue  # draining: stubs end on their own
            alive = self.stubs()
            dead = sorted(set(stubs) - set(alive))
            if dead and not stopping.is_set():
                names = ", ".join(f"'{stubs[pid]}' (pid {pid})" for pid in dead)
                how = oom_killed(self.oom_kills_at_start) or "killed, e.g. by the OOM killer, or crashed"
                return (f"the Python-backend stub of model instance {names} died ({how}); Triton does not restart "
                        "it and fails every request sent to that instance")

    def __enter__(self) -> TritonServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
