"""Atomic file output: readers see the old file or the complete new one, never half of it.

Every temporary file or folder is a hidden sibling of its target named `.<name>.tmp-<host>-<pid>-n<PID namespace>-
<random>` (the copy `replace_dir` moves aside: `.<name>.old-...`). A process killed before it could clean up (SIGKILL,
the OOM killer, a power cut) leaves one behind, a whole model's weights for a converted folder; the next write of the
same target removes those whose process is gone (`sweep_staging`): of this host and PID namespace, where its pid
means that process.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

# The disk refused a write once the work was under way: read-only, full, over quota, file too large. Not the work's
# fault: a command stops there (exit 1), rather than report it as a failure of what it was writing.
DISK_REFUSED_ERRNOS = frozenset(
    code for code in (errno.EROFS, errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG) if code is not None
)


def pid_namespace() -> int | None:
    """The inode of this process's PID namespace (None where /proc does not say). A pid means something only inside
    its namespace: another container sharing a folder (a volume) or /dev/shm (`docker run --ipc=host`) has pids this
    process cannot see, whatever its host name (containers of one Kubernetes pod share theirs)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def owner_tag() -> str:
    """`<pid>-n<PID namespace>-` (`<pid>-` where the namespace is unknown): what names of this process's leftovers
    carry before their random part, so a later process can remove them once this one is gone (`owner_gone`)."""
    namespace = pid_namespace()
    return f"{os.getpid()}-" if namespace is None else f"{os.getpid()}-n{namespace}-"


# what `owner_tag` writes, for a regular expression; names from before the namespace was recorded have the pid alone
OWNER_PATTERN = r"(?P<pid>\d+)-(?:n(?P<namespace>\d+)-)?"


def owner_gone(match: re.Match[str]) -> bool:
    """Whether the process named in a leftover's name (`OWNER_PATTERN`'s groups) is gone: only one of this PID
    namespace is looked up; one of another namespace is never taken for gone. A name without a namespace is judged
    by its pid."""
    namespace = match["namespace"]
    if namespace is not None and int(namespace) != pid_namespace():
        return False
    return process_gone(int(match["pid"]))


def _host() -> str:
    """This machine's name as staging names carry it: a pid says nothing about another machine's processes (a
    shared file system)."""
    return re.sub(r"[^A-Za-z0-9.]", ".", socket.gethostname())[:64] or "host"


# what follows `.<name>.` in a temporary name; mkdtemp / mkstemp add 8 characters of [a-z0-9_]
_STAGING = re.compile(rf"(?P<kind>tmp|old)-(?P<host>[A-Za-z0-9.]+)-{OWNER_PATTERN}[a-z0-9_]{{8}}")


def _owner() -> str:
    """`<host>-<owner_tag>`: the start of this process's staging names after `tmp-` / `old-`."""
    return f"{_host()}-{owner_tag()}"


def process_gone(pid: int) -> bool:
    """No process `pid` in this PID namespace (a live one, also another user's that we may not signal, is not gone)."""
    if os.name != "posix":  # Windows' os.kill(pid, 0) sends CTRL_C_EVENT instead of probing: assume alive
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return False
    except (ProcessLookupError, OverflowError):
        return True
    return False


def sweep_staging(target: str | Path) -> list[Path]:
    """Remove the temporary siblings of `target` left by processes of this host that are gone; returns them.

    A moved-aside old copy (`.old-`) is removed only while `target` exists: a process killed between `replace_dir`'s
    two renames leaves it as the only copy of the old folder. Live processes' files, other hosts' and names of other
    forms are left alone."""
    target = Path(target)
    host = _host()
    removed = []
    for path in target.parent.glob(f".{glob.escape(target.name)}.*-*"):
        match = _STAGING.fullmatch(path.name[len(target.name) + 2:])
        if (match is None or match["host"] != host or not owner_gone(match) or path.is_symlink()
                or (match["kind"] == "old" and not target.exists())):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def staging_dir(target: str | Path) -> Path:
    """A new, empty hidden folder beside `target` to write into before `replace_dir` moves it into place; leftovers
    of killed writers of the same target are swept first."""
    target = Path(target)
    sweep_staging(target)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{_owner()}", dir=target.parent))


def staging_file(target: str | Path) -> Path:
    """A new, empty hidden file beside `target` to write into before it is renamed onto `target` (`os.replace`); each
    process gets its own, so two writers of the same target never write into one file. Leftovers of killed writers of
    the same target are swept first. OSError when the folder refuses it."""
    target = Path(target)
    sweep_staging(target)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-{_owner()}", dir=target.parent)
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary file next to `path`; rename it to `path` only if the block succeeds, else delete it.

    The temp file is in the target folder so the final `os.replace` is an atomic rename on the same filesystem.
    The result is world-readable (0644): exports, cards and overlays are read by servers and people, and mkstemp
    would leave it 0600. `suffix` only shapes the error for a directory given where a file name belongs.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"output path {str(path)!r} is a directory; give a file name such as model{suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = staging_file(path)
    except OSError as exc:
        raise PermissionError(f"cannot write to {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# How write libraries report the disk refusing a write, none of them as an OSError: safetensors (Rust) as
# SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"); torch.save into a
# Python file object as a RuntimeError raised while the file's OSError was handled; C++ streams (OpenVINO's IR writer)
# as RuntimeError("basic_ios::clear: iostream error"), with no reason at all. Uncaught, each ended in a traceback.
_RUST_OS_ERROR = re.compile(r"I/O error: .*\(os error (\d+)\)")
# a file system with less than this free when a C++ stream failed is taken to be full (the failed write used it up)
_FULL_BELOW_BYTES = 1 << 20


@contextlib.contextmanager
def disk_errors_as_os_errors(path: str | Path) -> Iterator[None]:
    """Around one safetensors, torch.save or OpenVINO write to `path`: the disk refusing it (full, read-only, over
    quota, file too large) is raised as the OSError it is (errno, the system's reason, `path`), which callers already
    handle as a refused write. Any other failure is raised unchanged."""
    try:
        yield
    except OSError:
        raise
    except Exception as exc:
        code = _refused_write_errno(exc, Path(path))
        if code is None:
            raise
        raise OSError(code, os.strerror(code), os.fspath(path)) from exc


def _refused_write_errno(exc: BaseException, path: Path) -> int | None:
    if type(exc).__name__ == "SafetensorError":
        found = _RUST_OS_ERROR.search(str(exc))
        return int(found[1]) if found else None
    if not isinstance(exc, RuntimeError):
        return None
    if isinstance(exc.__context__, OSError):  # torch.save: the file object's write raised, then torch's writer gave up
        return exc.__context__.errno
    return errno.ENOSPC if _free_bytes(path) < _FULL_BELOW_BYTES else None  # a C++ stream: the disk, if it is full


def _free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path` (or its nearest existing
    folder); a very large number when that cannot be told."""
    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        stats = os.statvfs(folder)
    except (OSError, AttributeError):  # no statvfs on Windows
        return 1 << 62
    return stats.f_bavail * stats.f_frsize


def replace_dir(staging: Path, final: Path) -> None:
    """Move a finished `staging` folder (a sibling of `final`) into place with renames only.

    An existing `final` is moved aside first and restored if the swap fails, so `final` is always either the old
    complete folder or the new one. Every entry is made world-readable first (mkdtemp/mkstemp writers leave
    0700/0600): model folders, repositories and shipped assets are read by servers running as other users.
    """
    for path in (staging, *staging.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    if not final.exists():
        os.replace(staging, final)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-{_owner()}", dir=final.parent))
    os.replace(final, old / final.name)
    try:
        os.replace(staging, final)
    except BaseException:
        os.replace(old / final.name, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def holds_cwd(folder: str | Path) -> bool:
    """`folder` is the current directory or one of its parents: replacing it would leave the shell in a deleted
    folder."""
    resolved, cwd = Path(folder).resolve(), Path.cwd().resolve()
    return resolved == cwd or resolved in cwd.parents


def file_in_the_way(folder: str | Path) -> Path | None:
    """The file (`folder` itself or one of its parents) that stops `folder` from being created as a directory, or
    None. Checked before work starts, so the error names the path instead of a later NotADirectoryError."""
    folder = Path(folder)
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)


def cannot_create(folder: str | Path) -> str | None:
    """Why `folder` could not be created (the OS's reason, found by making and removing an empty folder in its
    nearest existing parent: a read-only or pseudo file system, no permission), or None when it exists or could be.
    Checked before long work whose result would go there."""
    folder = Path(folder)
    return None if folder.is_dir() else cannot_write_in(folder.parent)


def cannot_write_in(folder: str | Path) -> str | None:
    """Why nothing could be created in `folder`, or in its nearest existing parent when it does not exist yet (the
    OS's reason, found by making and removing an empty folder there), or None."""
    folder = Path(folder)
    parent = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hub-vit-probe-", dir=parent))
    except OSError as exc:
        return f"{exc.strerror or exc} in {str(parent)!r}"
    return None


def missing_folders(folder: str | Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first: what `mkdir(parents=True)` creates,
    recorded before it runs so a failed write can take them away again (`remove_empty_folders`)."""
    folder = Path(folder)
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    return missing


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove the folders a failed write created (deepest first, as `missing_folders` lists them) while they are
    empty: a failed download, conversion or rollout leaves no empty folder tree behind."""
    for path in folders:
        with contextlib.suppress(OSError):  # not empty (something written before the failure, or meanwhile): kept
            path.rmdir()
