"""What this process's cgroups allow it, read from the kernel's cgroup files (v1 and v2), as a container sees them.

* CPU: how many cores it may keep busy (`usable_cores`): the cores its affinity mask allows (a cpuset, `taskset`),
  and no more than its CPU quota pays for (`docker run --cpus`, a Kubernetes CPU limit: the CFS quota). A pod limited
  to 2 CPUs on a 64-core node sees 64 cores in its affinity mask; 64 threads per ONNX Runtime session there spend
  the quota in a few ms of each period and wait out the rest throttled. Go (1.25) and the JVM size their thread pools
  the same way.
* Memory: its limit (`memory_limit`) and how many processes of its cgroup the OOM killer has ended (`oom_kills`), so
  that a server process killed for memory is named so, with the limit, rather than as "killed by SIGKILL".

Standard library only: `hub-vit repository` copies this file beside the Python-backend models that size thread pools
(as it copies image_formats.py), where they import it as `cgroup_limits`. `root`: where /proc and /sys are (another
root describes an emulated host).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
N = TypeVar("N", int, float)
NO_V1_LIMIT = 1 << 62  # cgroup v1 reports "no memory limit" as a page-rounded LONG_MAX


def usable_cores(root: str | Path = "/") -> int:
    """The affinity mask's cores, capped by the CPU quota of this process's cgroups (rounded up); at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota(root)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def cpu_quota(root: str | Path = "/") -> float | None:
    """The CPUs this process's cgroup and its ancestors allow it per period (CFS quota / period: 1.5 for
    `docker run --cpus 1.5`), the smallest along the way; None when none is set or nothing can be read."""
    return _tightest("cpu", root, _v2_quota, _v1_quota)


def memory_limit(root: str | Path = "/") -> int | None:
    """The bytes of memory this process's cgroup and its ancestors allow it (`docker run --memory`, a Kubernetes
    memory limit), the smallest along the way; None when none is set or nothing can be read."""
    return _tightest("memory", root, _v2_memory, _v1_memory)


def _tightest(controller: str, root: str | Path, v2: Callable[[Path], N | None],
              v1: Callable[[Path], N | None]) -> N | None:
    """The smallest limit `v2` / `v1` read in this process's cgroup of `controller` and those above it."""
    limits = [limit for version, folders in cgroup_folders(controller, root) for folder in folders
              if (limit := _read(folder, version, v2, v1)) is not None]
    return min(limits) if limits else None


def oom_kills(root: str | Path = "/") -> int | None:
    """How many processes of this process's memory cgroup (and, on cgroup v2, of those below it) the OOM killer has
    ended so far, by any OOM (the cgroup's limit or the whole machine's); None when the kernel does not say."""
    for version, folders in cgroup_folders("memory", root):
        count = _read(folders[0], version, _v2_oom_kills, _v1_oom_kills)
        if count is not None:
            return count
    return None


def cgroup_folders(controller: str, root: str | Path = "/") -> list[tuple[int, list[Path]]]:
    """For each cgroup hierarchy holding `controller` (cgroup v2's unified one; v1's with that controller):
    (version, [this process's cgroup folder, its parent, ... up to the hierarchy's top]). [] where /proc cannot tell
    (not Linux) or no such hierarchy is mounted."""
    root = Path(root)
    try:
        memberships = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in memberships:  # "<id>:<controllers>:<path>": "0::<path>" for cgroup v2's unified hierarchy
        _, controllers, path = line.split(":", 2)
        version = 2 if controllers == "" else 1 if controller in controllers.split(",") else 0
        mount = _mount(mounts, version, controller) if version else None
        if mount is None:
            continue
        mount_point, mount_root = mount  # a container's mount shows its own cgroup as the hierarchy's root
        relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
        top = root / mount_point.lstrip("/")
        folder, folders = top / relative, []
        while True:
            folders.append(folder)
            if folder == top or top not in folder.parents:
                break
            folder = folder.parent
        found.append((version, folders))
    return found


def _mount(mounts: list[str], version: int, controller: str) -> tuple[str, str] | None:
    """(mount point, root within the hierarchy) of the cgroup file system of `version` holding `controller`.
    mountinfo: `id parent major:minor root mount-point options [optional...] - fstype source super-options`."""
    for line in mounts:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if (version == 2 and tail[0] == "cgroup2") or (version == 1 and tail[0] == "cgroup"
                                                        and controller in tail[2].split(",")):
            return fields[4], fields[3]
    return None


def _read(folder: Path, version: int, v2: Callable[[Path], T | None], v1: Callable[[Path], T | None]) -> T | None:
    try:
        return (v2 if version == 2 else v1)(folder)
    except (OSError, ValueError, IndexError):  # not there (the controller is off at this level), or unreadable
        return None


def _v2_quota(folder: Path) -> float | None:  # cpu.max: "<quota> <period>", "max <period>" when unlimited
    quota, period = (folder / "cpu.max").read_text().split()[:2]
    return None if quota == "max" or int(period) <= 0 else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:  # cpu.cfs_quota_us (-1 when unlimited) / cpu.cfs_period_us
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    period = int((folder / "cpu.cfs_period_us").read_text())
    return None if quota <= 0 or period <= 0 else quota / period


def _v2_memory(folder: Path) -> int | None:  # memory.max: bytes, "max" when unlimited
    text = (folder / "memory.max").read_text().strip()
    return None if text == "max" else int(text)


def _v1_memory(folder: Path) -> int | None:  # memory.limit_in_bytes: a huge number when unlimited
    limit = int((folder / "memory.limit_in_bytes").read_text())
    return None if limit >= NO_V1_LIMIT else limit


def _v2_oom_kills(folder: Path) -> int | None:  # memory.events: "oom_kill N" among other counters
    return _counter(folder / "memory.events", "oom_kill")


def _v1_oom_kills(folder: Path) -> int | None:  # memory.oom_control: "oom_kill N" (Linux 4.13+)
    return _counter(folder / "memory.oom_control", "oom_kill")


def _counter(path: Path, name: str) -> int | None:
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return None
