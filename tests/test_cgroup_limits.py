"""`hub_vit.cgroup_limits`: the cores a process may keep busy, capped by its cgroup's CPU quota; its memory limit and
the OOM killer's count of its cgroup's processes.

Emulated hosts lay out /proc/self/cgroup, /proc/self/mountinfo and the cgroup files as the kernel documents them
(Documentation/admin-guide/cgroup-v2.rst: `cpu.max` is "$MAX $PERIOD", "max" when unlimited; cgroup v1's CFS
bandwidth: `cpu.cfs_quota_us`, -1 when unlimited, over `cpu.cfs_period_us`; `memory.max` / `memory.events` and v1's
`memory.limit_in_bytes` / `memory.oom_control`), with the values Docker writes for `docker run --cpus 1.5` (150000
over 100000). Where this machine lets a test make cgroup v1 groups, a real quota is read by a process placed in one,
and a real OOM kill is counted in another.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hub_vit.cgroup_limits import cpu_quota, memory_limit, oom_kills, usable_cores

AFFINITY = len(os.sched_getaffinity(0))


def _host(root: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> Path:
    """An emulated host under `root`: its /proc/self files and cgroup files (path under root -> text)."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


V2_MOUNT = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_a_docker_container_with_cpus_1_5_on_cgroup_v2(tmp_path: Path) -> None:
    # Docker's own namespace: the container's cgroup is the root of the hierarchy it sees
    root = _host(tmp_path, "0::/\n", V2_MOUNT, {"sys/fs/cgroup/cpu.max": "150000 100000\n"})
    assert cpu_quota(root) == 1.5
    assert usable_cores(root) == min(AFFINITY, 2)  # rounded up: 1.5 CPUs keep two threads half busy


def test_the_tightest_level_of_the_hierarchy_applies(tmp_path: Path) -> None:
    # a container granted 2 CPUs below a parent granted 4: its affinity may still list 16
    root = _host(tmp_path, "0::/pod/box\n", V2_MOUNT, {"sys/fs/cgroup/cpu.max": "max 100000\n",
                                                      "sys/fs/cgroup/pod/cpu.max": "400000 100000\n",
                                                      "sys/fs/cgroup/pod/box/cpu.max": "200000 100000\n"})
    assert cpu_quota(root) == 2.0
    (root / "sys/fs/cgroup/pod/box/cpu.max").write_text("max 100000\n")
    assert cpu_quota(root) == 4.0
    (root / "sys/fs/cgroup/pod/cpu.max").write_text("max 100000\n")
    assert cpu_quota(root) is None


def test_a_kubernetes_pod_limit_above_an_unlimited_container_applies(tmp_path: Path) -> None:
    pod = "sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice"
    root = _host(tmp_path, "0::/kubepods.slice/kubepods-pod1.slice/cri-abc.scope\n", V2_MOUNT, {
        "sys/fs/cgroup/cpu.max": "max 100000\n",
        f"{pod}/cpu.max": "50000 100000\n",  # the pod: half a CPU
        f"{pod}/cri-abc.scope/cpu.max": "max 100000\n",  # its container: no limit of its own
    })
    assert cpu_quota(root) == 0.5
    assert usable_cores(root) == 1


@pytest.mark.parametrize(("mount_root", "folder"), [
    ("/docker/abc", "sys/fs/cgroup/cpu,cpuacct"),  # inside the container: its group is the root it sees
    ("/", "sys/fs/cgroup/cpu,cpuacct/docker/abc"),  # the same group seen from the host
])
def test_a_cgroup_v1_docker_container(tmp_path: Path, mount_root: str, folder: str) -> None:
    mountinfo = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
                 f"32 31 0:29 {mount_root} /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
                 f"35 31 0:32 {mount_root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")
    root = _host(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n0::/\n", mountinfo,
                 {f"{folder}/cpu.cfs_quota_us": "150000\n", f"{folder}/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(root) == 1.5
    assert usable_cores(root) == min(AFFINITY, 2)
    (root / folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(root) is None


def test_no_quota_leaves_the_affinity_mask(tmp_path: Path) -> None:
    v1 = _host(tmp_path / "v1", "1:cpu:/\n", "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", {
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"})
    v2 = _host(tmp_path / "v2", "0::/\n", V2_MOUNT, {"sys/fs/cgroup/cpu.max": "max 100000\n"})
    bare = _host(tmp_path / "bare", "", "", {})  # no cgroup file system mounted at all
    for root in (v1, v2, bare):
        assert cpu_quota(root) is None and usable_cores(root) == AFFINITY
    assert cpu_quota(tmp_path / "nothing") is None  # no /proc either (not Linux)


def _v1_group(controller: str) -> Path:
    group = Path("/sys/fs/cgroup") / controller / f"hub-vit-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot make a cgroup v1 {controller} group here: {err}")
    return group


def test_a_real_cgroup_v1_quota_is_read_by_a_process_in_it() -> None:
    group = _v1_group("cpu")
    try:
        (group / "cpu.cfs_quota_us").write_text("50000")  # half a CPU per 100 ms period
        script = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()))\n"  # into the group, then read
                  "from hub_vit.cgroup_limits import cpu_quota, usable_cores; print(cpu_quota(), usable_cores())")
        placed = subprocess.run([sys.executable, "-c", script, str(group / "cgroup.procs")], capture_output=True,
                                text=True, timeout=60)
        assert placed.returncode == 0, placed.stderr
        assert placed.stdout.split() == ["0.5", "1"], placed.stdout
    finally:
        group.rmdir()


def test_memory_limit_and_oom_kills_on_cgroup_v2_and_v1(tmp_path: Path) -> None:
    v2 = _host(tmp_path / "v2", "0::/pod/box\n", V2_MOUNT, {
        "sys/fs/cgroup/pod/memory.max": "2147483648\n",  # the pod: 2 GiB
        "sys/fs/cgroup/pod/box/memory.max": "max\n",
        "sys/fs/cgroup/pod/box/memory.events": "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"})
    assert memory_limit(v2) == 2 << 30 and oom_kills(v2) == 2
    v1 = _host(tmp_path / "v1", "5:memory:/docker/abc\n",
               "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n", {
                   "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
                   "sys/fs/cgroup/memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"})
    assert memory_limit(v1) is None and oom_kills(v1) == 1
    assert memory_limit(tmp_path / "nothing") is None and oom_kills(tmp_path / "nothing") is None


def test_a_real_oom_kill_in_a_cgroup_v1_group_is_counted_with_its_limit() -> None:
    group = _v1_group("memory")
    try:
        (group / "memory.limit_in_bytes").write_text(str(64 << 20))
        if (group / "memory.memsw.limit_in_bytes").exists():  # swap accounting on: no swapping out of the limit
            (group / "memory.memsw.limit_in_bytes").write_text(str(64 << 20))
        script = ("import subprocess, sys; open(sys.argv[1], 'w').write(str(__import__('os').getpid()))\n"
                  "from hub_vit.cgroup_limits import memory_limit, oom_kills\n"
                  "before = oom_kills()\n"
                  "hog = subprocess.run([sys.executable, '-c', 'b = bytearray(256 << 20); b[::4096] = b\"x\" * "
                  "len(b[::4096])'])\n"
                  "print(before, oom_kills(), memory_limit(), hog.returncode)")
        placed = subprocess.run([sys.executable, "-c", script, str(group / "cgroup.procs")], capture_output=True,
                                text=True, timeout=120)
        assert placed.returncode == 0, placed.stderr
        before, after, limit, hog = placed.stdout.split()
        assert (int(before), int(after), int(limit), int(hog)) == (0, 1, 64 << 20, -9)  # SIGKILL, and counted
    finally:
        group.rmdir()
