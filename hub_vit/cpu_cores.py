"""How many CPU cores this process may keep busy: the cores its affinity mask allows (a cpuset-limited container,
`taskset`), and no more than its CPU quota pays for (a container's `--cpus`, a Kubernetes CPU limit: the cgroup's
CFS quota). A Kubernetes pod limited to 2 CPUs on a 64-core node sees 64 cores in its affinity mask; 64 threads per
ONNX Runtime session there spend most of each period throttled. Go (1.25) and the JVM size their thread pools the
same way.

Standard library only: `hub-vit repository` copies this file beside the Python-backend models that size thread pools
(as it copies image_formats.py), where they import it as `cpu_cores`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores(root: str | Path = "/") -> int:
    """The affinity mask's cores, capped by the CPU quota of this process's cgroups (rounded up); at least 1. `root`:
    where /proc and /sys are (another root describes an emulated host)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota(root)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def cpu_quota(root: str | Path = "/") -> float | None:
    """The CPUs this process's cgroup and its ancestors allow it per period (CFS quota / period: 1.5 for
    `docker run --cpus 1.5`), the smallest along the way; None when none is set or nothing can be read (not Linux,
    no cgroup file system mounted)."""
    root = Path(root)
    try:
        memberships = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in memberships:  # "<id>:<controllers>:<path>": "0::<path>" for cgroup v2's unified hierarchy
        _, controllers, path = line.split(":", 2)
        version = 2 if controllers == "" else 1 if "cpu" in controllers.split(",") else 0
        mount = _mount(mounts, version) if version else None
        if mount is None:
            continue
        mount_point, mount_root = mount  # a container's mount shows its own cgroup as the hierarchy's root
        relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
        top = root / mount_point.lstrip("/")
        folder = top / relative
        read = _v2_quota if version == 2 else _v1_quota
        while True:  # this cgroup and each one above it: the tightest quota applies
            limit = read(folder)
            if limit is not None:
                limits.append(limit)
            if folder == top or top not in folder.parents:
                break
            folder = folder.parent
    return min(limits) if limits else None


def _mount(mounts: list[str], version: int) -> tuple[str, str] | None:
    """(mount point, root within the hierarchy) of the cgroup file system of `version` holding the cpu controller.
    mountinfo: `id parent major:minor root mount-point options [optional...] - fstype source super-options`."""
    for line in mounts:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if (version == 2 and tail[0] == "cgroup2") or (version == 1 and tail[0] == "cgroup"
                                                        and "cpu" in tail[2].split(",")):
            return fields[4], fields[3]
    return None


def _v2_quota(folder: Path) -> float | None:
    """`cpu.max` ("<quota> <period>", "max <period>" when unlimited)."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" or int(period) <= 0 else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    """`cpu.cfs_quota_us` (-1 when unlimited) / `cpu.cfs_period_us`."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period
