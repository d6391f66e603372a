"""The processes of a tritonserver: its process group (stubs included), reading it from /proc, ending it, and
telling a Python-backend stub by its command line."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from hub_vit.cgroup_limits import memory_limit, oom_kills

PR_SET_PDEATHSIG = 1


def kill_process_group(pgid: int) -> None:
    """SIGKILL what is left of the server's session (it was started with `start_new_session`, so its process group
    id is its pid): Triton's Python-backend stub processes, orphaned when tritonserver exits without reaping them."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left: the normal case after a clean drain


# tritonserver's and its stubs' oom_score_adj (inherited by the stubs): under memory pressure the kernel ends them
# before serve, which replaces them. Without it, the OOM killer could end serve, and with it the whole service, for a
# stub decoding a huge image (a score's adjustment weighs a share of the whole limit: anything less than the maximum
# can leave serve, with the demo's model loaded in it, ahead of a stub).
SERVER_OOM_SCORE_ADJ = 1000  # the kernel's maximum: always first


def die_with_parent() -> None:
    """This process gets SIGTERM when its parent (the thread that started it) dies: no orphan is left working for a
    serve that was killed outright."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def server_child_setup() -> None:
    """Runs in tritonserver's process before exec: it dies with its parent (no orphaned server if serve is killed),
    and it and its stubs are the OOM killer's victims before serve."""
    die_with_parent()
    try:
        Path("/proc/self/oom_score_adj").write_text(str(SERVER_OOM_SCORE_ADJ))
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


def oom_killed(kills_before: int | None) -> str | None:
    """How the kernel ended a process of this server, when the OOM killer has ended one of this cgroup's processes
    since `kills_before` (`cgroup_limits.oom_kills()` when the server started): the cgroup's memory limit reached,
    or the machine's memory; None otherwise (a SIGKILL from elsewhere, a crash)."""
    kills = oom_kills()
    if kills_before is None or kills is None or kills <= kills_before:
        return None
    limit = memory_limit()
    reached = (f"this container's memory limit ({limit / (1 << 30):.1f} GiB: docker run --memory, a Kubernetes memory "
               "limit) was reached" if limit is not None else "the machine ran out of memory")
    return (f"the kernel's OOM killer ended it: {reached}; give the server more memory, or serve with fewer "
            "instances (--instances) or smaller batches (--max-batch-size)")


def _stat(entry: Path) -> tuple[str, int, int]:
    """(state, parent pid, process group) of /proc/<pid>; OSError once the process is gone, ValueError if unreadable."""
    stat = (entry / "stat").read_text()
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'
    state, ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
    return state, int(ppid), int(pgrp)


def _processes() -> Iterator[tuple[int, Path]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name), entry


def live_processes(pgid: int | None = None) -> dict[int, str]:
    """pid -> command line of the live processes (zombies count as dead) in process group `pgid`, or of every one
    this user may read when `pgid` is None, from /proc."""
    found = {}
    for pid, entry in _processes():
        try:
            state, _ppid, pgrp = _stat(entry)
            if (pgid is not None and pgrp != pgid) or state in ("Z", "X"):
                continue
            found[pid] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return found


def reap_adopted(pgid: int, timeout_s: float = 2.0) -> None:
    """Wait for the processes of group `pgid` that became this process's children when their parent died: Triton's
    stubs once tritonserver is gone. The kernel hands orphans to the PID namespace's init, and serve is that init
    when a container runs it as its command (`CMD ["hub-vit", "serve"]`, a Kubernetes pod without an init): without
    this each replaced server left its stubs as zombies, a few more pids taken for every restart until the container's
    pid limit stops the next server from starting. Elsewhere init adopts them and there is nothing to wait for. Call
    it after SIGKILLing the group; the server's own process, still to be waited by its `Popen`, is left alone."""
    adopted = []
    for pid, entry in _processes():
        try:
            _state, ppid, pgrp = _stat(entry)
        except (OSError, ValueError):
            continue
        if ppid == os.getpid() and pgrp == pgid and pid != pgid:
            adopted.append(pid)
    deadline = time.monotonic() + timeout_s
    for pid in adopted:
        while True:
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped meanwhile
                break
            if done or time.monotonic() > deadline:  # a process stuck in the kernel is left to a later call
                break
            time.sleep(0.01)


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
