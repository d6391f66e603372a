"""Start the real `tritonserver` (shipped in the nvidia-pytriton wheel, or on PATH) on a generated repository.

What it takes to run the wheel's binary outside PyTriton:
* a backend directory holding the Python backend *and the stub built for the running interpreter's version*
  (`pytriton/tritonserver/python_backend_stubs/<X.Y>/triton_python_backend_stub`), assembled in a temp workspace;
* `LD_LIBRARY_PATH` with the wheel's bundled libraries and this interpreter's `LIBDIR` (the stub links libpython,
  and a system libpython of another patch release breaks model init);
* this interpreter's `bin/` first on `PATH`, so the stub's embedded Python imports numpy/Pillow/onnxruntime from
  the same environment.
The server binds to 127.0.0.1 unless told otherwise, and SIGTERM makes it drain in-flight requests
(`--exit-timeout-secs`) before exiting.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hub_vit.ports import PortError, check_ports, ipv4_address

PR_SET_PDEATHSIG = 1
# Triton logs one line per model version that fails to load; the reason's traceback follows as escaped newlines:
#   E1123 06:09:28.412527 4209 model_lifecycle.cc:642] "failed to load 'vit_classifier' version 1: Internal:
#   InvalidProtobuf: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from ... failed:Protobuf parsing failed.
#   \n\nAt:\n  .../onnxruntime_inference_collection.py(753): _create_inference_session\n ..."
# Triton's words when a port was taken between our check and its bind (HTTP, gRPC and metrics alike):
#   E1123 ... grpc_server.cc] "failed to start GRPC service: Unavailable - Socket '127.0.0.1:8001' already in use "
# Triton's words once a client can reach it (models loaded):
#   I1127 05:11:33.007673 11532 grpc_server.cc:2558] "Started GRPCInferenceService at 127.0.0.1:34373"
#   I1127 05:11:33.008040 11532 http_server.cc:4713] "Started HTTPService at 127.0.0.1:49259"
ENDPOINT_STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService) at ")
PORT_IN_USE = re.compile(r"Socket '[^']*:(?P<port>\d+)' already in use")
LOAD_FAILURE = re.compile(r"failed to load '(?P<model>[^']+)' version (?P<version>\d+): (?P<reason>.*)")


def load_failure(line: str) -> str | None:
    """A one-line summary of a model that failed to load, from one line of Triton's log; None for other lines."""
    match = LOAD_FAILURE.search(line)
    if match is None:
        return None
    reason = match["reason"].split("\\n")[0].rstrip('"').strip()  # up to the traceback
    return f"model {match['model']!r} (version {match['version']}) failed to load: {reason}"


# Control APIs any client could otherwise call. Triton 2.51 crashed (SIGSEGV) when a client registered a stub's own
# /dev/shm region through the system shared-memory API and asked for an output into it; the logging API lets anyone
# raise the verbosity (heap addresses in the log) or switch error logging off; trace writes files; the repository API
# lists (and, outside --model-control-mode=none, loads) models. Health, metadata, model config, inference and
# statistics stay open: clients, probes, `hub-vit loadtest` and perf_analyzer need them, and none changes the server.
RESTRICTED_APIS = ("shared-memory", "logging", "trace", "model-repository")
CONTROL_HEADER = "hub-vit-control-key"


def restricted_api_args(header: str, key: str) -> tuple[str, str]:
    """Triton's flags restricting `RESTRICTED_APIS` to requests carrying `header: key`, on HTTP and gRPC (gRPC
    metadata keys are lower case, as `header` is). The Dockerfile passes the same two flags."""
    apis = ",".join(RESTRICTED_APIS)
    return f"--http-restricted-api={apis}:{header}={key}", f"--grpc-restricted-protocol={apis}:{header}={key}"


def exposure_warning(host: str) -> str | None:
    """Why serving on `host` reaches beyond this machine is unsafe with the local Triton 2.51, or None for loopback."""
    if ipaddress.ip_address(ipv4_address(host)).is_loopback:
        return None
    return (f"--host {host} serves beyond this machine, and the local tritonserver is 2.51 (from nvidia-pytriton): "
            "it predates the fixes for CVE-2025-23310/23311 (a chunked HTTP request overflows its stack) and "
            "CVE-2025-23319/23320/23334 (Python-backend shared memory), and it has no request body cap (one gzip "
            "body can take gigabytes), and some single requests crash it (serve restarts it). Serve other machines "
            "from the Dockerfile's container (Triton 25.07+, body caps set) behind a proxy; keep this server on "
            "127.0.0.1")


class ServerError(RuntimeError):
    """tritonserver could not be found, did not become ready, or died."""


# Triton's Python backend starts each stub as `bash -c "exec <stub> <repository>/<model>/1/model.py ..."` without
# quoting, so a space or a shell character in the repository path splits or breaks that command, and its stub fails
# on any non-ASCII character (UnicodeEncodeError, even under a UTF-8 locale): the model never loads and the server
# waits out its whole start timeout. Tried with the real server: + , = @ % : ~ # ^ ! serve; glob and brace
# characters (* ? [ ] { }) serve only while they match no file, so they are refused too.
SHELL_UNSAFE = re.compile(r"""[\s'"\\$`&;|<>()*?\[\]{}]|[^\x00-\x7f]""")


def shell_unsafe(path: str | Path) -> str:
    """The characters of `path` that Triton's stub command line cannot take ('' when it is safe)."""
    found = dict.fromkeys(SHELL_UNSAFE.findall(str(path)))
    return " ".join("space" if c == " " else repr(c) for c in found)


def unservable_path_message(path: str | Path) -> str | None:
    """Why the Python backend could not start from `path`, or None when it can."""
    bad = shell_unsafe(path)
    if not bad:
        return None
    return (f"Triton's Python backend cannot start models from {str(path)!r}: it launches them through a shell "
            f"command line (and an ASCII-only stub) that breaks at {bad}; use a path without spaces, shell "
            "characters or non-ASCII letters")


def _temp_bases() -> tuple[str, ...]:  # computed when asked: $TMPDIR may change
    return (tempfile.gettempdir(), "/tmp", "/var/tmp")


# `<prefix><pid>-<random>`: the pid of the process that made it, so a later start can remove what a killed one left
_WORKSPACE = re.compile(r"hub-vit-[a-z]+-(?P<pid>\d+)-")


def shell_safe_tempdir(prefix: str) -> Path:
    """`tempfile.mkdtemp`, in $TMPDIR when its path is safe for the stub command line, else in /tmp or /var/tmp; its
    name carries this process's id (`remove_orphaned_workspaces`)."""
    for base in _temp_bases():
        if not shell_unsafe(base) and os.access(base, os.W_OK | os.X_OK):
            return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
    raise ServerError(f"no writable temporary folder whose path Triton's Python backend can use: $TMPDIR is "
                      f"{tempfile.gettempdir()!r} ({shell_unsafe(tempfile.gettempdir()) or 'not writable'}); "
                      "point TMPDIR at a writable folder without spaces, shell characters or non-ASCII letters")


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    python_backend: Path  # folder with libtriton_python.so + triton_python_backend_utils.py
    stub: Path | None  # the stub for this interpreter (None: the backend folder already has one)
    libs: tuple[Path, ...]


def find_triton() -> TritonInstall:
    """Locate tritonserver: the nvidia-pytriton wheel first, then a system install (`/opt/tritonserver`)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # Find the wheel's files without importing `pytriton`: its __init__ imports PyTriton's own client stack (zmq,
    # sh, wrapt, ...), which serving the binary does not need and which may be missing or broken.
    spec = importlib.util.find_spec("pytriton")
    if spec is not None and spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations)))
        root = package / "tritonserver"
        stubs = root / "python_backend_stubs"
        binary, stub = root / "bin" / "tritonserver", stubs / version / "triton_python_backend_stub"
        if binary.is_file():
            if not stub.is_file():
                found = sorted(p.parent.name for p in stubs.glob("*/triton_python_backend_stub"))
                raise ServerError(f"nvidia-pytriton has no Python backend stub for Python {version}; "
                                  f"stubs exist for: {', '.join(found) or 'none'}")
            check_stub_numpy()
            libs = package.parent / "nvidia_pytriton.libs"
            return TritonInstall(binary, root / "backends" / "python", stub, (libs,))
    system = Path("/opt/tritonserver")
    binary = Path(shutil.which("tritonserver") or system / "bin" / "tritonserver")
    if binary.is_file():
        return TritonInstall(binary, system / "backends" / "python", None, (system / "lib",))
    raise ServerError("tritonserver not found: install the serve extra (pip install 'hub-vit[serve]', which brings "
                      "nvidia-pytriton) or run inside an nvcr.io/nvidia/tritonserver container")


# Folders put first on the Python path of the server's stubs only: where hub-vit's own environment must keep numpy 2
# (a GPU host's torch), a numpy<2 for the stubs goes into a folder of its own, named here (scripts/gpu_check.sh).
STUB_PYTHONPATH = "HUB_VIT_STUB_PYTHONPATH"


def stub_path() -> list[Path]:
    return [Path(p) for p in os.environ.get(STUB_PYTHONPATH, "").split(os.pathsep) if p]


def installed_numpy() -> str | None:
    """The numpy the stubs import: the first one in $HUB_VIT_STUB_PYTHONPATH's folders, else this environment's."""
    for folder in stub_path():
        found = importlib.metadata.distributions(name="numpy", path=[str(folder)])
        version = next((dist.version for dist in found), None)
        if version is not None:
            return version
    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_stub_numpy() -> None:
    """nvidia-pytriton's stubs (Triton 2.51's Python backend) misread TYPE_STRING tensors, the encoded images, under
    numpy 2: the stub dies on the first image with "unpack_from requires a buffer of at least 1701143913 bytes" and
    the model never loads (reproduced with Python 3.12 + numpy 2.5). The stub imports numpy from this environment,
    so say so before starting rather than after a crashed warmup. nvidia-pytriton itself declares numpy<2."""
    version = installed_numpy()
    if version is not None and int(version.split(".")[0]) >= 2:
        raise ServerError(f"numpy {version} is installed, but the Triton Python-backend stub shipped in "
                          f"nvidia-pytriton (Triton 2.51) misreads encoded-image (TYPE_STRING) inputs under numpy 2 "
                          f"and crashes; nvidia-pytriton requires numpy<2: pip install 'numpy<2' (or, to keep numpy 2 "
                          f"here, install numpy<2 into a folder of its own and name it in ${STUB_PYTHONPATH})")


def has_gpu() -> bool:
    """An NVIDIA driver is present (device nodes exist); without one, skip the pinned-memory pool and GPU metrics."""
    return Path("/dev/nvidiactl").exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _kill_process_group(pgid: int) -> None:
    """SIGKILL what is left of the server's session (it was started with `start_new_session`, so its process group
    id is its pid): Triton's Python-backend stub processes, orphaned when tritonserver exits without reaping them."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left: the normal case after a clean drain


def _die_with_parent() -> None:  # runs in the child before exec: no orphaned server if the parent is killed
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def exit_description(code: int) -> str:
    """How a process ended, for a message: `exited with code 1`, `was killed by SIGKILL (the OOM killer?)`."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    hint = {"SIGKILL": " (the OOM killer, or kill -9)",
            "SIGFPE": " (a crash inside Triton; Triton 2.51 crashes so when a request asks its classification "
                      "extension for the STRING output `labels`)",
            "SIGSEGV": " (a crash inside Triton or a backend)"}.get(name, "")
    return f"was killed by {name}{hint}"


def live_processes(pgid: int | None = None) -> dict[int, str]:
    """pid -> command line of the live processes (zombies count as dead) in process group `pgid`, or of every one
    this user may read when `pgid` is None, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'
            state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
            if (pgid is not None and int(pgrp) != pgid) or state in ("Z", "X"):
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return found


# /dev/shm/<server id>_<uuid>: the Python-backend stubs' regions, named after `TritonServer.server_id`
_REGION = re.compile(r"hub-vit-(?P<pid>\d+)-[0-9a-f]{8}_")


def remove_orphaned_regions(shm: Path = Path("/dev/shm")) -> None:
    """Remove the shared-memory regions of hub-vit servers whose starting process is gone: `stop` removes a server's
    own, but a process killed before it could (SIGKILL, a crash, a power cut) leaves them, 1 MB or what the stub's pool
    grew to, until reboot. A region whose process is alive, or not ours to signal, is left alone. (A /dev/shm shared
    between PID namespaces would make a live server of another container look gone; Docker gives each its own.)"""
    for region in shm.glob("hub-vit-*"):
        match = _REGION.match(region.name)
        if match is None or not _gone(int(match["pid"])):
            continue
        try:
            region.unlink()
        except OSError:
            pass


def remove_orphaned_workspaces(bases: tuple[str, ...] | None = None) -> None:
    """Remove the temporary folders (`shell_safe_tempdir`) of hub-vit processes that are gone: `hub-vit serve`'s
    repository (a whole model.onnx: hundreds of MB for a ViT-B) and the server's backend copy are removed on every
    stop, but not after a SIGKILL. Folders of live processes, other users' and older unnamed ones are left alone."""
    for base in bases or _temp_bases():
        for folder in Path(base).glob("hub-vit-*"):
            match = _WORKSPACE.match(folder.name)
            if match is not None and folder.is_dir() and not folder.is_symlink() and _gone(int(match["pid"])):
                shutil.rmtree(folder, ignore_errors=True)


def _gone(pid: int) -> bool:
    """No process `pid` (a live one, also another user's that we may not signal, is not gone)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return False
    except (ProcessLookupError, OverflowError):
        return True
    return False


# A Python-backend stub's command line, the same in Triton 2.51 and the GPU image's (python_backend stub_launcher.cc):
#   triton_python_backend_stub <repo>/<model>/<version>/model.py <shm region> <shm size> <shm growth> <server pid>
#   <backend dir> <ipc handle> <model instance> [DEFAULT | <runtime model dir>]
STUB = "triton_python_backend_stub"
STUB_MODEL_FILE_ARG, STUB_INSTANCE_ARG = 1, 8


def stub_args(cmdline: str) -> list[str] | None:
    """A Python-backend stub's arguments (its program first), from a command line as `live_processes` reads it; None
    when the command line is not a stub's: its program, not some argument (a shell's `-c "... triton_python_backend_stub
    ..."`), must be the stub."""
    args = cmdline.split()
    return args if args and args[0].endswith(STUB) else None


def is_stub(cmdline: str) -> bool:
    return stub_args(cmdline) is not None


def stub_instance(cmdline: str) -> str:
    """The model instance a Python-backend stub serves (`vit_classifier_0_1`), from its command line (above), else
    the command line's start."""
    args = stub_args(cmdline)
    return args[STUB_INSTANCE_ARG] if args is not None and len(args) > STUB_INSTANCE_ARG else cmdline[:80]


class TritonServer:
    """One tritonserver process. `with TritonServer(repo) as server:` starts, waits until ready and stops it."""

    def __init__(self, repository: str | Path, *, host: str = "127.0.0.1", http_port: int = 8000,
                 grpc_port: int = 8001, metrics_port: int = 8002, exit_timeout_s: int = 30,
                 log: Callable[[str], None] | None = None, log_verbose: int = 0,
                 extra_args: tuple[str, ...] = (), http_host: str | None = None,
                 grpc_host: str | None = None) -> None:
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise ServerError(f"model repository {str(self.repository)!r} is not a folder")
        unservable = unservable_path_message(self.repository)
        if unservable:
            raise ServerError(unservable)
        self.host, self.http_port, self.grpc_port, self.metrics_port = host, http_port, grpc_port, metrics_port
        self.http_host = http_host or host  # `hub-vit serve` keeps HTTP on loopback, behind its gate (gate.py)
        self.grpc_host = grpc_host or host  # ... and gRPC, behind its gRPC gate (grpc_gate.py)
        self._check_ports(in_use=False)
        self.exit_timeout_s = exit_timeout_s
        self.log, self.log_verbose, self.extra_args = log, log_verbose, extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = False  # `terminate` was called, perhaps before there was a process to signal
        self.log_tail: deque[str] = deque(maxlen=400)
        self.load_failures: list[str] = []  # `load_failure` summaries, kept even when the tail has moved on
        self._workspace: Path | None = None
        self._reader: threading.Thread | None = None
        # `--id`: GET /v2 answers it, so readiness is never taken from another server that got our port first
        self.server_id = f"hub-vit-{os.getpid()}-{secrets.token_hex(4)}"
        self.shm_prefix = f"{self.server_id}_"
        # The control APIs (RESTRICTED_APIS) answer only requests carrying this header; hub-vit's own calls send it
        self.control_key = secrets.token_hex(16)
        self.reachable = False  # it opened its HTTP or gRPC endpoint: clients could reach it (supervisor.py)

    # -- endpoints ------------------------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{self.http_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.grpc_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def control_headers(self) -> dict[str, str]:
        """The header that opens this server's restricted APIs (repository index, logging, trace, shared memory)."""
        return {CONTROL_HEADER: self.control_key}

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def command(self, install: TritonInstall, backends: Path) -> list[str]:
        address = ipv4_address(self.host)  # a name (`localhost`) would be bound as 255.255.255.255 by Triton 2.51
        return [
            str(install.binary),
            f"--id={self.server_id}",
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            "--model-control-mode=none",  # no repository changes over the API (arbitrary code execution risk)
            "--strict-readiness=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--http-address={ipv4_address(self.http_host)}", f"--http-port={self.http_port}",
            f"--grpc-address={ipv4_address(self.grpc_host)}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={address}", f"--metrics-port={self.metrics_port}",
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
        except PortError as err:
            raise ServerError(str(err)) from None

    def start(self, timeout_s: float = 120.0) -> TritonServer:
        self._check_ports(in_use=True)  # Triton would say so only deep in its log, after loading every model
        remove_orphaned_regions()
        remove_orphaned_workspaces()
        install = find_triton()
        self._workspace = shell_safe_tempdir("hub-vit-triton-")
        backends = self._workspace / "backends"
        python_dir = backends / "python"
        shutil.copytree(install.python_backend, python_dir, ignore=shutil.ignore_patterns("__pycache__"))
        if install.stub is not None:
            shutil.copy2(install.stub, python_dir / "triton_python_backend_stub")
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [*(str(p) for p in install.libs), libdir, env.get("LD_LIBRARY_PATH", "")]
        ).strip(os.pathsep)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        if stub_path():  # the stubs inherit the server's environment
            env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in stub_path()), env.get("PYTHONPATH", "")]).strip(
                os.pathsep)
        self.process = subprocess.Popen(
            self.command(install, backends), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            cwd=self._workspace, preexec_fn=_die_with_parent,
            start_new_session=True,  # Ctrl-C reaches only us; we forward one SIGTERM, so the drain starts once
        )
        self._reader = threading.Thread(target=self._read_log, name="tritonserver-log", daemon=True)
        self._reader.start()
        if self._stopping:  # a Ctrl-C while the workspace was prepared: stop now, not after loading every model
            self.process.send_signal(signal.SIGTERM)
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            self.log_tail.append(line)
            if ENDPOINT_STARTED.search(line):  # from the log: a crash right after it is too quick for any poll
                self.reachable = True
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
                taken = self._port_taken()
                if taken:
                    raise ServerError(taken)
                ended = "ended" if code is None else exit_description(code)
                raise ServerError(f"tritonserver {ended} before it was ready{self._failures()}\n"
                                  f"log tail:\n{self.tail()}")
            if self.is_ready():
                return
            time.sleep(0.2)
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s{self._failures()}\nlog tail:\n{self.tail()}")

    def _port_taken(self) -> str | None:
        """A one-line error when Triton died because a port was taken after our check (another server starting at
        the same time), from its log: `failed to start GRPC service: Unavailable - Socket '127.0.0.1:8001' already
        in use` (HTTP and metrics: `failed to start HTTP service` / `... Metrics service ...`)."""
        names = {self.http_port: "http_port", self.grpc_port: "grpc_port", self.metrics_port: "metrics_port"}
        for line in self.log_tail:
            match = PORT_IN_USE.search(line)
            if match is None:
                continue
            port = int(match["port"])
            return (f"{names.get(port, 'port')} {port}: already in use on {self.host} (taken by another process "
                    "while tritonserver was loading its models, e.g. a second server started at the same time)")
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
            _kill_process_group(self.process.pid)

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
            _kill_process_group(self.process.pid)
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
                return None if stopping.is_set() else f"tritonserver {exit_description(code)}"
            if stopping.is_set():
                continue  # draining: stubs end on their own
            alive = self.stubs()
            dead = sorted(set(stubs) - set(alive))
            if dead and not stopping.is_set():
                names = ", ".join(f"'{stubs[pid]}' (pid {pid})" for pid in dead)
                return (f"the Python-backend stub of model instance {names} died (killed, e.g. by the OOM killer, or "
                        "crashed); Triton does not restart it and fails every request sent to that instance")

    def __enter__(self) -> TritonServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
