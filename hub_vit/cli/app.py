"""The shared typer application and rich console."""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Iterable, Mapping

import typer
from rich.console import Console
from rich.markup import escape

from hub_vit.atomic import DISK_REFUSED_ERRNOS

app = typer.Typer(
    name="hub-vit",
    help="Google's Vision Transformers for timm, transformers, ONNX and Triton.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)
# Off a terminal (a pipe, a file, CI's log) rich would lay everything out for 80 columns and cut table cells to fit
# (`int8-dy…` twice in a column of variant names). There, lines are as long as their content instead; an explicit
# COLUMNS still sets the width, as rich reads it on a terminal.
OFF_TERMINAL_WIDTH = 10_000


def _console(*, stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    on_terminal = stream is not None and stream.isatty()
    return Console(stderr=stderr, width=None if on_terminal or "COLUMNS" in os.environ else OFF_TERMINAL_WIDTH)


console = _console(stderr=False)
err_console = _console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a red error line and return the Exit to raise: `raise fail("...")`."""
    # escaped: paths may hold [brackets]; soft-wrapped: a command or path in the message stays pasteable
    # emoji=False: '127.0.0.1:-1' must not turn into a thumbs-down
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, emoji=False)
    return typer.Exit(code)


def as_flags(message: str) -> str:
    """A library message read on the command line: `pass overwrite=True (--overwrite)` -> `pass --overwrite`."""
    return message.replace("overwrite=True (--overwrite)", "--overwrite")


# errno values that describe the machine, not hub-vit: the disk refused a write, no permission, or a path is too long.
# The user fixes these by choosing another path, so a traceback only hides the one line they need. Any other OSError
# (ENOENT on a packaged file, EBADF, ...) may be a bug and keeps its traceback.
ENVIRONMENT_ERRNOS = DISK_REFUSED_ERRNOS | {errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}


def is_environment_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS


def in_flag_words(message: str, fields: Iterable[str], flags: Mapping[str, str] | None = None) -> str:
    """A library message about `fields` read on the command line: each field name outside the quoted values becomes
    its flag (`flags[field]`, else `max_queue_size` -> `--max-queue-size`); the user's own values are quoted (`!r`)
    and kept as typed."""
    parts = re.split(r"""('[^']*'|"[^"]*")""", message)
    for field in sorted(fields, key=len, reverse=True):  # longest first: max_queue_size before queue_size
        flag = (flags or {}).get(field, "--" + field.replace("_", "-"))
        parts[::2] = [re.sub(rf"(?<![\w-]){field}\b", flag, part) for part in parts[::2]]
    return "".join(parts)


def os_error_text(exc: OSError) -> str:
    """`Read-only file system: 'out/x'`: the OS reason, then the path it names (when it names one). A copy's or a
    rename's error names both files, the source first (`shutil.copyfile`, `os.replace`); the destination is the one
    a full or read-only disk holds, or a folder stands in the way of, so it comes first: `...: 'dst' (from 'src')`."""
    reason = exc.strerror or str(exc)
    if isinstance(exc.filename2, (str, bytes, os.PathLike)):
        return f"{reason}: {os.fsdecode(exc.filename2)!r} (from {os.fsdecode(exc.filename)!r})"
    if isinstance(exc.filename, (str, bytes, os.PathLike)):
        return f"{reason}: {os.fsdecode(exc.filename)!r}"
    return reason


def write_failed(path: str | os.PathLike[str], exc: OSError, then: str = "") -> typer.Exit:
    """`error: cannot write to 'PATH': <OS reason><then>` (exit 1): a destination on a read-only or full file system;
    `then`: what the user can do about it, after the reason ("; ...").

    An OSError without an errno is hub-vit's own message (`atomic_path`: "cannot write to 'x': Read-only file
    system") and is printed as it is."""
    if exc.errno is None:
        return fail(str(exc), code=1)
    return fail(f"cannot write to {os.fspath(path)!r}: {exc.strerror or exc}{then}", code=1)


# Exit status of a command this machine cannot carry out now, though nothing asked is wrong: no network for a download
# or an upload, no TensorRT / GPU for an engine. 1: the work failed (a disk or a server refused); 2: bad input.
CANNOT_NOW = 3


def download_failed(exc: Exception, context: str = "") -> typer.Exit:
    """`error: <context><the download's message>` with its exit status: CANNOT_NOW without network (offline mode, no
    route, a timeout, the server's 5xx: retry, or download by hand as the message says), 1 when the download cache
    cannot be written, 2 for what was asked (a URL the server answers 404, a file that is not the catalog's)."""
    return fail(f"{context}{exc}", code=download_status(exc))


def download_status(exc: Exception) -> int:
    """The exit status of a failed download (`download_failed`)."""
    from hub_vit.conversion.download import CacheNotWritableError, NetworkUnavailableError

    return CANNOT_NOW if isinstance(exc, NetworkUnavailableError) else 1 if isinstance(exc, CacheNotWritableError) \
        else 2


def _print_version(value: bool) -> None:
    if value:
        from hub_vit.version import __version__

        console.print(f"hub-vit {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print hub-vit's version and exit."),
) -> None:
    """Google's Vision Transformers for timm, transformers, ONNX and Triton."""


def given(ctx: typer.Context, key: str) -> bool:
    """Option `key` was set on the command line (or by an environment variable), not left at its default. By name:
    typer vendors its own click, whose ParameterSource is not click's."""
    source = ctx.get_parameter_source(key)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
