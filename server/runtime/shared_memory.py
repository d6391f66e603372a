"""Whether /dev/shm has room for the pools of a repository's Python-backend stubs, checked before the server starts.

Every Python-backend model instance (one stub process) exchanges its batches with tritonserver through its own pool
in /dev/shm. In Triton 2.51 a pool starts at 1 MiB (`shm-default-byte-size`) and never shrinks; when a batch does not
fit in what the pool has free, Triton grows it by that batch's size on top of what it holds (measured on 2.51: a pool
of 22 MiB that had carried a 20 MiB batch grew to 53 MiB for a 30 MiB one). So a pool whose batches are at most B
bytes ends below 2 B. A batch whose pool cannot grow fails alone (HTTP 500 / gRPC INTERNAL, Triton's "Failed to
increase the shared memory pool size") and the server serves on. Docker gives a container 64 MB of /dev/shm.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from hub_vit.server.runtime.health import python_instances
from hub_vit.server.runtime.triton_install import ServerError

SHM = Path("/dev/shm")
POOL_START = 1 << 20  # Triton 2.51's shm-default-byte-size: each stub's pool at its start
MIB = 1 << 20


@dataclass(frozen=True)
class SharedMemoryRoom:
    """What /dev/shm offers and what a repository's stubs may take from it (bytes)."""

    free: int  # what /dev/shm has free now (other programs share it)
    instances: int  # Python-backend model instances: one pool each
    wanted: int  # what their pools grow to, each carrying batches up to the largest request the front lets through

    @property
    def enough(self) -> bool:
        return self.free >= self.wanted

    def warning(self, max_request_flag: str) -> str:
        """Why requests may fail for want of shared memory, with the numbers and what to do (only when not enough)."""
        suggested = math.ceil(self.wanted / (256 * MIB)) * 256
        return (f"/dev/shm has {_mib(self.free)} free, and the {self.instances} Python-backend model instances may "
                f"need up to {_mib(self.wanted)} to carry requests as large as {max_request_flag} lets through (each "
                "instance's pool grows to about twice the largest batch it carried, and never shrinks): a batch "
                "that finds no room fails with Triton's \"Failed to increase the shared memory pool size\" while "
                f"smaller ones are served. In a container, give it more (docker run --shm-size={suggested}m; in "
                "Kubernetes, an emptyDir of medium Memory mounted at /dev/shm)")


def shared_memory_room(repository: str | Path, max_request_bytes: int, shm: Path = SHM) -> SharedMemoryRoom:
    """The room `repository`'s stubs may want in `shm` when no request is over `max_request_bytes`.

    Raises ServerError when `shm` is missing or cannot hold even the stubs' first pools (the models would not load,
    and Triton would say so only deep in its log)."""
    instances = len(python_instances(repository))
    try:
        stat = os.statvfs(shm)
    except OSError as err:
        raise ServerError(f"cannot use {shm}: {err.strerror}; Triton's Python backend exchanges every batch through "
                          "shared memory there") from None
    free = stat.f_bavail * stat.f_frsize
    if free < instances * POOL_START:
        raise ServerError(f"{shm} has {_mib(free)} free, less than the {_mib(instances * POOL_START)} the "
                          f"{instances} Python-backend model instances take at their start (1 MiB each): the models "
                          "would not load; free some there, or give the container more (docker run --shm-size=1g)")
    return SharedMemoryRoom(free, instances, instances * (POOL_START + 2 * max_request_bytes))


def _mib(size: int) -> str:
    return f"{size / MIB:,.0f} MiB" if size >= MIB else f"{size / 1024:,.0f} KiB"
