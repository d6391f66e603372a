"""Is a Triton server serving its repository? Ready, and every Python-backend model instance has a live stub.

`/v2/health/ready` alone is not enough: Triton (2.51 here, and the GPU image's) does not restart a Python-backend stub
that dies (the OOM killer, a crash in a decoder) and keeps answering ready, while every request routed to that model
instance fails (HTTP 500 "Stub process ... is not healthy"). `hub-vit serve` watches its own stubs and replaces such
a server; a server started otherwise (the Dockerfile's CMD, a Kubernetes pod) needs its probe to see it.

The stubs are found in /proc, so the check runs where the server runs (inside its container): each stub's command line
names the model file under the repository and the model instance (`processes.STUB`). The expected instances come from
the repository's `config.pbtxt` files. When no stub of the repository is alive, a `tritonserver` process started with
`--model-repository=<that repository>` tells "all stubs died" from "not the server's host".

Readiness is taken from Triton's HTTP endpoint only: Triton's metrics port answers 200 with an empty body to any path,
`/v2/health/ready` included, so a ready answer is confirmed by the server metadata `GET /v2` returns there.

No inference request is sent: a probe must not fail because the server is busy (an overloaded server rejects
requests by design, and restarting it then would make things worse).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from hub_vit.ports import GRPC_PORT, HTTP_PORT, METRICS_PORT
from hub_vit.server import protocol
from hub_vit.server.client import addresses as client
from hub_vit.server.runtime.processes import STUB_MODEL_FILE_ARG, live_processes, stub_args, stub_instance


@dataclass(frozen=True)
class Health:
    """What one check found. `healthy` when the server is ready and no expected stub is missing."""

    url: str
    not_ready: str | None  # why the server is not ready; None when it is
    expected: dict[str, str] = field(default_factory=dict)  # Python-backend model instance -> its model
    alive: dict[str, int] = field(default_factory=dict)  # model instance -> pid of its live stub
    stubs_checked: bool = False  # False: no repository given, readiness only
    # pids of the tritonserver processes serving the repository here; looked for only when no stub is alive
    servers: list[int] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return sorted(set(self.expected) - set(self.alive))

    @property
    def healthy(self) -> bool:
        return self.not_ready is None and not self.missing

    def problems(self) -> list[str]:
        """One line per problem found, for a person reading a probe's output."""
        if self.not_ready is not None:  # a server that is down has no stubs either: that is not news
            return [self.not_ready]
        if self.missing and not self.alive and self.servers:
            pids = ", ".join(str(pid) for pid in self.servers)
            return [f"every Python-backend stub of this repository has died ({', '.join(self.missing)}), while "
                    f"tritonserver (pid {pids}) still serves it on this host: the OOM killer or a crash; Triton does "
                    "not restart them and fails every request routed to them while still answering ready, so restart "
                    "the server"]
        if self.missing and not self.alive:
            return [f"no Python-backend stub of this repository runs on this host (expected {len(self.expected)}: "
                    f"{', '.join(sorted(self.expected))}); run the check where the server runs (inside its "
                    "container), with the repository path the server was started with"]
        if self.missing:
            names = ", ".join(f"'{name}' (model {self.expected[name]})" for name in self.missing)
            return [f"no live Python-backend stub for model instance {names}: it died (the OOM killer, a crash); "
                    "Triton does not restart it and fails every request routed to it while still answering ready, "
                    "so restart the server"]
        return []


def python_instances(repository: str | Path) -> dict[str, str]:
    """Model instance -> model, for every Python-backend model in `repository`, named as Triton names them: an
    instance group's `name` (default `<model>_<group index>`), `_`, the instance's index within its `count`."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from hub_vit.server.repository.manifest import model_configs  # the repository writer's imports: only when asked

    configs = model_configs(Path(repository))
    instances: dict[str, str] = {}
    for path in configs:
        try:
            config = text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())
        except (text_format.ParseError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read {path}: {err}") from None
        if config.backend != "python":
            continue
        model = path.parent.name  # Triton requires the config's name, when given, to be the folder's
        groups = config.instance_group or [mc.ModelInstanceGroup(name=model)]  # Triton's default: one, named so
        for index, group in enumerate(groups):
            group_name = group.name or f"{model}_{index}"
            for number in range(max(group.count, 1)):
                instances[f"{group_name}_{number}"] = model
    return instances


def live_stubs(repository: str | Path) -> dict[str, int]:
    """Model instance -> pid of each live Python-backend stub serving a model of `repository` on this host."""
    root = os.path.realpath(repository)
    found = {}
    for pid, cmdline in live_processes().items():
        args = stub_args(cmdline)
        if args is None or len(args) <= STUB_MODEL_FILE_ARG:
            continue
        model_dir = os.path.dirname(os.path.dirname(args[STUB_MODEL_FILE_ARG]))  # <repo>/<model>/<version>/model.py
        if os.path.realpath(os.path.dirname(model_dir)) == root:
            found[stub_instance(cmdline)] = pid
    return found


# Triton's flags naming a model repository (`tritonserver --help`: --model-store is "equivalent to --model-repository")
REPOSITORY_FLAGS = ("--model-repository", "--model-store")


def served_repositories(cmdline: str, cwd: str = "/") -> list[str]:
    """The model repositories a tritonserver command line (as `processes.live_processes` reads it) serves, as real
    paths (a relative one taken from `cwd`, the process's working folder); [] when the program is not tritonserver:
    a shell or an editor merely naming it does not serve anything. Both `--model-repository=X` (hub-vit's launcher,
    the Dockerfile's CMD) and `--model-repository X` are read; Triton takes the flag more than once."""
    args = cmdline.split()
    if not args or os.path.basename(args[0]) != "tritonserver":
        return []
    found = []
    for index, arg in enumerate(args[1:], start=1):
        name, equals, value = arg.partition("=")
        if name not in REPOSITORY_FLAGS:
            continue
        if not equals:
            if index + 1 >= len(args):
                continue
            value = args[index + 1]
        found.append(os.path.realpath(os.path.join(cwd, value)))
    return found


def live_servers(repository: str | Path) -> list[int]:
    """Pids of the live tritonserver processes on this host that serve `repository`."""
    root = os.path.realpath(repository)
    found = []
    for pid, cmdline in live_processes().items():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")  # only matters for a relative --model-repository
        except OSError:  # gone meanwhile, or another user's: an absolute path is still read right
            cwd = "/"
        if root in served_repositories(cmdline, cwd):
            found.append(pid)
    return sorted(found)


def http_base(url: str) -> str:
    """`127.0.0.1:8000` or `http://127.0.0.1:8000` -> `http://127.0.0.1:8000` (`https://` kept); a gRPC address, or
    anything but host:port, is refused as the clients refuse it (`client.server_address`)."""
    if client.resolve_protocol(url) == "grpc":
        raise ValueError(f"{url!r} is a gRPC address; the health check asks Triton's HTTP endpoint (default port "
                         f"{HTTP_PORT})")
    address, tls = client.server_address(url, ("http",))
    return f"{'https' if tls else 'http'}://{address}"


MAX_TIMEOUT_S = 3600.0  # a probe waiting longer is a mistake (and sockets refuse nan, and overflow on inf or 1e300)
NOT_READY_CODES = (400, 503)  # Triton not ready; hub-vit serve's front while it replaces the server
NOT_HTTP_HINT = f"is this Triton's HTTP port? gRPC is usually {GRPC_PORT}, metrics {METRICS_PORT}"


def check_timeout(timeout_s: float, name: str = "timeout_s") -> None:
    """A probe's timeout: the clients' rule (`client.check_timeout`), and at most an hour."""
    client.check_timeout(timeout_s, name=name, most=MAX_TIMEOUT_S)


class NoAnswer(Exception):
    """No HTTP answer at all: why, in one line."""


def _get(address: str, timeout_s: float) -> bytes:
    """The body of `GET address` answering 200 (its first 64 KiB); HTTPError for another status; NoAnswer when no
    HTTP answer came."""
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as reply:
            return reply.read(1 << 16)  # server metadata is a few hundred bytes; never read an endless stream
    except urllib.error.HTTPError:  # an answer with a status, the caller's to read (HTTPError is a URLError too)
        raise
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        scheme, netloc, *_ = urllib.parse.urlsplit(address)
        hint = client.plain_port_hint(f"{scheme}://{netloc}", reason)  # the server's address, as the user gave it
        if not hint and isinstance(reason, ConnectionRefusedError):  # nothing listens: as the clients say it
            hint = f"is a server running there (hub-vit serve), and is {netloc} its HTTP port?"
        raise NoAnswer(f"no answer from {address}: {reason}" + (f"\n{hint}" if hint else "")) from None
    except http.client.HTTPException as err:  # something answered, not in HTTP/1 (gRPC's HTTP/2 frames, say)
        # the class name, not the message: BadStatusLine's message is the binary bytes the other end sent
        raise NoAnswer(f"no HTTP answer from {address}: {type(err).__name__} ({NOT_HTTP_HINT})") from None


def is_server_metadata(body: bytes) -> bool:
    """Whether `body` is a KServe v2 server-metadata answer (`GET /v2`), as Triton's HTTP endpoint gives it:
    `{"name": ..., "version": ..., "extensions": [...]}`."""
    try:
        metadata = json.loads(body)
    except ValueError:  # not JSON (the metrics port's empty body), or not UTF-8
        return False
    return (isinstance(metadata, dict) and isinstance(metadata.get("name"), str)
            and ("version" in metadata or "extensions" in metadata))


def readiness(url: str, timeout_s: float = 3.0) -> str | None:
    """None when `GET /v2/health/ready` answers 200 and the answer came from Triton's HTTP endpoint; else why not, in
    one line. The second request (`GET /v2`, server metadata: cheap, no inference, so a busy server still passes) is
    what tells Triton's HTTP endpoint from its metrics port, which answers 200 with an empty body to any path."""
    check_timeout(timeout_s)
    deadline = time.monotonic() + timeout_s  # both requests share the caller's timeout (a HEALTHCHECK has its own)
    base = http_base(url)
    ready = f"{base}/v2/health/ready"
    try:
        _get(ready, timeout_s)
    except urllib.error.HTTPError as err:
        message = _error_message(err)
        spoken = protocol.read_port_speaks(message)
        if spoken is not None and spoken.speaks != "http":  # serve's front, at its gRPC or metrics port
            port = spoken.ports.get("http_port")
            kind = {"grpc": "gRPC"}.get(spoken.speaks, spoken.speaks)
            return (f"{ready} answered that this is hub-vit serve's {kind} port: give the server's HTTP port"
                    + (f" ({port})" if port else f", usually {HTTP_PORT}"))
        if err.code not in NOT_READY_CODES:  # 404, 405, ...: no such endpoint there, so no Triton
            return (f"{ready} answered HTTP {err.code}: not Triton's HTTP endpoint (Triton answers 200 when ready, "
                    f"400 when not); give the HTTP port of a Triton server, usually {HTTP_PORT}")
        state = _server_state(message)
        if state is not None:  # hub-vit serve's front, for a server it is replacing or stopping
            return f"not ready: {ready} answered HTTP {err.code}: {state}"
        return (f"not ready: {ready} answered HTTP {err.code} (starting, stopping, or a model failed to load; "
                "the server's log says which)")
    except NoAnswer as err:
        return str(err)
    try:
        # at least 0.1 s: a server that took the whole timeout to say ready still gets asked, not failed unasked
        body = _get(f"{base}/v2", max(deadline - time.monotonic(), 0.1))
    except urllib.error.HTTPError:  # an answer, but not server metadata: not Triton's inference endpoint
        body = b""
    except NoAnswer as err:
        return str(err)
    if not is_server_metadata(body):
        return (f"{base} answered /v2/health/ready but is not Triton's HTTP endpoint (the metrics port?): its /v2 "
                "gave no server metadata (JSON with name and version); give the HTTP port, usually "
                f"{HTTP_PORT}")
    return None


def _error_message(err: urllib.error.HTTPError) -> str:
    """The `error` of an answer's JSON body (Triton's and hub-vit serve's front's errors), or "" without one."""
    try:
        message = json.loads(err.read(64 * 1024)).get("error", "")
    except (OSError, ValueError, AttributeError):  # no body, not JSON, not an object
        return ""
    return message if isinstance(message, str) else ""


def _server_state(message: str) -> str | None:
    """The sentence of a `server state=` fact in a not-ready answer's error (hub-vit serve's front: restarting,
    shutting down), or None."""
    if protocol.read_server_state(message) is None:
        return None
    fact = protocol.read(message)
    return fact.sentence if fact is not None else None


def check(url: str, repository: str | Path | None = None, timeout_s: float = 3.0) -> Health:
    """Readiness of the server at `url`, and, given the `repository` it serves, its Python-backend stubs."""
    base = http_base(url)  # a bad address or path is refused before anything is asked
    expected = python_instances(repository) if repository is not None else {}
    not_ready = readiness(base, timeout_s)
    if repository is None:
        return Health(base, not_ready)
    alive = {name: pid for name, pid in live_stubs(repository).items() if name in expected}
    servers = live_servers(repository) if expected and not alive else []  # only needed to explain no stub at all
    return Health(base, not_ready, expected, alive, stubs_checked=True, servers=servers)


WAIT_INTERVAL_S = 0.5  # how often `wait_until_healthy` asks again


def check_wait(wait_s: float, name: str = "wait_s") -> None:
    """How long `wait_until_healthy` may ask: 0 (once) to an hour."""
    if not 0 <= wait_s <= MAX_TIMEOUT_S:  # also NaN
        raise ValueError(f"{name} must be 0 to {MAX_TIMEOUT_S:g} seconds, got {wait_s}")


def wait_until_healthy(url: str, repository: str | Path | None = None, timeout_s: float = 3.0,
                       wait_s: float = 0.0) -> Health:
    """`check` until the server is healthy or `wait_s` seconds have passed (0: ask once): a script that has just
    started a server waits for it with one command. Returns the last report."""
    check_wait(wait_s)
    deadline = time.monotonic() + wait_s
    while True:
        report = check(url, repository, timeout_s)
        if report.healthy or time.monotonic() + WAIT_INTERVAL_S > deadline:
            return report
        time.sleep(WAIT_INTERVAL_S)
