"""Is a Triton server serving its repository? Ready, and every Python-backend model instance has a live stub.

`/v2/health/ready` alone is not enough: Triton (2.51 here, and the GPU image's) does not restart a Python-backend stub
that dies (the OOM killer, a crash in a decoder) and keeps answering ready, while every request routed to that model
instance fails (HTTP 500 "Stub process ... is not healthy"). `hub-vit serve` watches its own stubs and replaces such
a server; a server started otherwise (the Dockerfile's CMD, a Kubernetes pod) needs its probe to see it.

The stubs are found in /proc, so the check runs where the server runs (inside its container): each stub's command line
names the model file under the repository and the model instance (`launcher.STUB`). The expected instances come from
the repository's `config.pbtxt` files.

No inference request is sent: a probe must not fail because the server is busy (an overloaded server rejects
requests by design, and restarting it then would make things worse).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from hub_vit.server.client import resolve_protocol, server_address
from hub_vit.server.launcher import STUB_MODEL_FILE_ARG, live_processes, stub_args, stub_instance


@dataclass(frozen=True)
class Health:
    """What one check found. `healthy` when the server is ready and no expected stub is missing."""

    url: str
    not_ready: str | None  # why the server is not ready; None when it is
    expected: dict[str, str] = field(default_factory=dict)  # Python-backend model instance -> its model
    alive: dict[str, int] = field(default_factory=dict)  # model instance -> pid of its live stub
    stubs_checked: bool = False  # False: no repository given, readiness only

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

    root = Path(repository)
    if not root.is_dir():
        raise ValueError(f"repository {str(root)!r} is not a folder")
    configs = sorted(root.glob("*/config.pbtxt"))
    if not configs:
        raise ValueError(f"repository {str(root)!r} holds no model (no <model>/config.pbtxt)")
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


def http_base(url: str) -> str:
    """`127.0.0.1:8000` or `http://127.0.0.1:8000` -> `http://127.0.0.1:8000` (`https://` kept); a gRPC address, or
    anything but host:port, is refused as the clients refuse it (`client.server_address`)."""
    if resolve_protocol(url) == "grpc":
        raise ValueError(f"{url!r} is a gRPC address; the health check asks Triton's HTTP endpoint (default port 8000)")
    address, tls = server_address(url)
    return f"{'https' if tls else 'http'}://{address}"


def readiness(url: str, timeout_s: float = 3.0) -> str | None:
    """None when `GET /v2/health/ready` answers 200; else why not, in one line."""
    address = f"{http_base(url)}/v2/health/ready"
    try:
        with urllib.request.urlopen(address, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as err:
        return (f"not ready: {address} answered HTTP {err.code} (starting, stopping, or a model failed to load; "
                "the server's log says which)")
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return f"no answer from {address}: {reason}"


def check(url: str, repository: str | Path | None = None, timeout_s: float = 3.0) -> Health:
    """Readiness of the server at `url`, and, given the `repository` it serves, its Python-backend stubs."""
    base = http_base(url)  # a bad address or path is refused before anything is asked
    expected = python_instances(repository) if repository is not None else {}
    not_ready = readiness(base, timeout_s)
    if repository is None:
        return Health(base, not_ready)
    alive = {name: pid for name, pid in live_stubs(repository).items() if name in expected}
    return Health(base, not_ready, expected, alive, stubs_checked=True)
