"""The front's bounds (`hub-vit serve --max-request-mb`, `--max-connections`, `--front-processes`), and how they are
shared among its processes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hub_vit.cgroup_limits import usable_cores

MAX_PROCESSES = 64
# --max-request-mb: Triton's gRPC server takes messages up to 2 GiB - 1 (grpc's receive limit is a C int)
MAX_REQUEST_MB = ((1 << 31) - 1) >> 20
# --exit-timeout: tritonserver reads --exit-timeout-secs as a 32-bit int and refuses more
MAX_EXIT_TIMEOUT_S = (1 << 31) - 1
# per client connection of a front process's share: one on each protocol, and one more for HTTP over the cap
DESCRIPTORS_PER_CONNECTION = 3
OWN_DESCRIPTORS = 64  # listeners, control socket, event loop, log
CORES_PER_PROCESS = 4  # the default: one front process per 4 cores (the rest serve Triton and its stubs), 1 to 4


def default_processes() -> int:
    """One front process per `CORES_PER_PROCESS` cores this process may keep busy (`hub_vit.cgroup_limits`), at least 1
    and at most 4: at about 0.1 ms of CPU per request, one process relays some 10,000 requests/s, and Triton needs the
    other cores to answer them (docs/serving.md, "The front's cost")."""
    return min(4, max(1, usable_cores() // CORES_PER_PROCESS))


@dataclass(frozen=True)
class FrontLimits:
    """The front's bounds; every one has a default fit for the shipped model on a small host. `max_connections` and
    `max_buffered_bytes` are the whole front's, shared evenly among its `processes` (the kernel spreads new connections
    evenly across them)."""

    max_body_bytes: int = 64 << 20  # Triton 25.x's own --http-max-input-size default; also the inflated size
    # HTTP bodies, and apart gRPC messages being reassembled, held at once across connections (beyond: 503 /
    # UNAVAILABLE, retry)
    max_buffered_bytes: int = 256 << 20
    max_head_bytes: int = 64 << 10
    head_timeout_s: float = 10.0  # a request's head, from its first byte (a new connection's: from its accept)
    # An idle keep-alive connection (answered, no byte of a next request yet) is closed without a word after this long:
    # longer than load balancers' idle timeouts (AWS ALB 60 s; nginx's own keepalive_timeout is 75 s), so the balancer,
    # not serve, ends an idle connection (one serve closes just as the balancer sends on it is a 502 there)
    keep_alive_s: float = 75.0
    body_timeout_s: float = 60.0
    max_connections: int = 4096
    upstream_connections: int = 64  # per process: requests relayed to Triton at once (its descriptors stay few)
    processes: int = 1
    # Whether the served repository applies clients' per-request queue timeouts (its queue policy allows them); when
    # not, the front refuses a request that carries one, which Triton would silently ignore
    queue_timeouts: bool = True
    # Whether serve replaces a server that dies (--max-restarts above 0): a server the front cannot reach is then
    # "restarting"; without restarts it is gone, and serve shutting down
    restarts: bool = True

    def __post_init__(self) -> None:
        for key in ("max_body_bytes", "max_buffered_bytes", "max_head_bytes", "max_connections",
                    "upstream_connections", "processes"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        for key in ("queue_timeouts", "restarts"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be True or False, got {getattr(self, key)!r}")
        if self.processes > MAX_PROCESSES:
            raise ValueError(f"processes must be at most {MAX_PROCESSES}, got {self.processes}")
        for key in ("head_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be a positive number of seconds, got {getattr(self, key)!r}")

    def share(self, total: int) -> int:
        """One process's share of a bound of the whole front."""
        return math.ceil(total / self.processes)

    @property
    def descriptors(self) -> int:
        """The file descriptors one front process may need: its share of the connection cap on each protocol, as many
        again for HTTP connections over the cap (kept open, for 1 s, in case they carry a health probe), its
        connections to Triton on each protocol, and a few of its own (listeners, control socket, loop)."""
        return DESCRIPTORS_PER_CONNECTION * self.share(self.max_connections) + self._fixed_descriptors

    def connections_within(self, descriptors: int) -> int:
        """The largest `max_connections` whose `descriptors` per process fit in `descriptors` (0: none)."""
        per_process = (descriptors - self._fixed_descriptors) // DESCRIPTORS_PER_CONNECTION
        return max(per_process, 0) * self.processes

    @property
    def _fixed_descriptors(self) -> int:  # one front process's own, whatever its client connections
        return 2 * self.upstream_connections + OWN_DESCRIPTORS
