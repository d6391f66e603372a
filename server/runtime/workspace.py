"""Temporary folders the Triton Python backend can start models from (`shell_safe_tempdir`), and removing what a
killed hub-vit process left in them and in /dev/shm."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from hub_vit.atomic import OWNER_PATTERN, owner_gone, owner_tag
from hub_vit.server.runtime.triton_install import ServerError

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


# `<prefix><owner_tag><random>`: the process that made it, so a later start can remove what a killed one left
_WORKSPACE = re.compile(rf"hub-vit-[a-z]+-{OWNER_PATTERN}")


def shell_safe_tempdir(prefix: str, *, runs_programs: bool = False) -> Path:
    """`tempfile.mkdtemp` in `temp_base(runs_programs=...)`; its name carries this process's id and PID namespace
    (`remove_orphaned_workspaces`)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}", dir=temp_base(runs_programs=runs_programs)))


def temp_base(*, runs_programs: bool = False) -> str:
    """$TMPDIR when its path is safe for the stub command line, else /tmp or /var/tmp. `runs_programs`: programs and
    shared libraries are started from the folder (Triton's backends), so a file system mounted `noexec` (a common
    hardening of /tmp) is passed over too: tritonserver would fail every model's load ("failed to map segment from
    shared object"). ServerError naming each folder and why, when none will do."""
    unusable = {}
    for base in dict.fromkeys(_temp_bases()):
        why = _unusable(base, runs_programs)
        if not why:
            return base
        unusable[base] = why
    listed = "; ".join(f"{base!r}: {why}" for base, why in unusable.items())
    needs = "writable, allowing programs to run (not mounted noexec)" if runs_programs else "writable"
    raise ServerError(f"no temporary folder Triton's Python backend can use ({listed}); point TMPDIR at a folder that "
                      f"is {needs}, on a path without spaces, shell characters or non-ASCII letters")


def _unusable(base: str, runs_programs: bool) -> str:
    """Why temporary folders made in `base` would not serve ('' when they would)."""
    if shell_unsafe(base):
        return f"its path holds {shell_unsafe(base)}"
    if not os.access(base, os.W_OK | os.X_OK):
        return "not writable" if os.path.isdir(base) else "not a folder"
    if runs_programs and os.statvfs(base).f_flag & os.ST_NOEXEC:
        return "mounted noexec: programs cannot run from it"
    return ""


# /dev/shm/<server id>_<uuid>: the Python-backend stubs' regions, named after `TritonServer.server_id`
_REGION = re.compile(rf"hub-vit-{OWNER_PATTERN}[0-9a-f]{{8}}_")


def remove_orphaned_regions(shm: Path = Path("/dev/shm")) -> None:
    """Remove the shared-memory regions of hub-vit servers whose starting process is gone: `stop` removes a server's
    own, but a process killed before it could (SIGKILL, a crash, a power cut) leaves them, 1 MB or what the stub's pool
    grew to, until reboot. A region whose process is alive, not ours to signal, or of another PID namespace (a
    container sharing /dev/shm: `docker run --ipc=host`) is left alone."""
    for region in shm.glob("hub-vit-*"):
        match = _REGION.match(region.name)
        if match is None or not owner_gone(match):
            continue
        try:
            region.unlink()
        except OSError:
            pass


def remove_orphaned_workspaces(bases: tuple[str, ...] | None = None) -> None:
    """Remove the temporary folders (`shell_safe_tempdir`) of hub-vit processes that are gone: `hub-vit serve`'s
    repository (a whole model.onnx: hundreds of MB for a ViT-B) and the server's backend copy are removed on every
    stop, but not after a SIGKILL. Folders of live processes, of other PID namespaces (another container's serve
    sharing the folder), other users' and older unnamed ones are left alone."""
    for base in bases or _temp_bases():
        for folder in Path(base).glob("hub-vit-*"):
            match = _WORKSPACE.match(folder.name)
            if match is not None and folder.is_dir() and not folder.is_symlink() and owner_gone(match):
                shutil.rmtree(folder, ignore_errors=True)
