"""`hub-vit` command line: one typer app; each sub-command lives in its own module under `hub_vit.cli`.

Modules register their commands on `hub_vit.cli.app.app` when imported. A module whose optional dependencies are
missing is skipped, and its commands say which extra to install.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import sys
import threading
from typing import NoReturn

from hub_vit.cli.app import CANNOT_NOW, app, console, fail, is_environment_error, os_error_text
from hub_vit.cli.stop_signals import raise_on
from hub_vit.host import install_extra, missing_extra, module_not_found
from hub_vit.network import HubUnreachableError

# One module per capability; each adds its commands to `app` on import.
COMMAND_MODULES = ("models", "convert", "export", "train", "repository", "serve", "classify", "loadtest", "health",
                   "explain", "cards", "domain", "cache")


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"hub_vit.cli.{name}")


def _print_any_name() -> None:
    """A file name that is not valid in the locale's encoding (latin-1 bytes from an old zip: `caf\\udce9.png` to
    Python) is printed escaped, not a UnicodeEncodeError mid-run: where the locale's stdout is strict (en_US.UTF-8;
    C.UTF-8 already writes such names back as their bytes)."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def main() -> None:
    # Python's default SIGTERM ends the process at once, skipping the `finally` / `except BaseException` blocks that
    # remove staging folders (a killed convert left `.OUT.tmp-*` with a full copy of the weights); an exception runs
    # them. `hub-vit serve` installs its own handler (drain, then exit).
    raise_on([signal.SIGTERM])
    _print_any_name()
    # grpc's core logs at INFO to stderr by default (a TLS handshake to a plain port: "I1201 ... Handshake failed with
    # error SSL_ERROR_SSL ..." above hub-vit's own message); its errors still show. A user's GRPC_VERBOSITY wins.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    _load_commands()
    try:
        app()
    except HubUnreachableError as exc:  # a Hub model (`hf-hub:ORG/NAME`) neither reachable nor cached, for any command
        fail(str(exc), code=CANNOT_NOW)
        raise SystemExit(CANNOT_NOW) from None
    except (ModuleNotFoundError, RuntimeError) as exc:  # an extra not installed (a wheel without [serve]): one line
        extra = missing_extra(exc)
        if extra is None:
            raise
        fail(f"hub-vit {' '.join(sys.argv[1:2])} needs hub-vit's {extra} extra, which is not installed here (no module "
             f"{(module_not_found(exc).name or '').split('.')[0]!r}): {install_extra(extra)}", code=CANNOT_NOW)
        raise SystemExit(CANNOT_NOW) from None
    except OSError as exc:
        # The safety net for every command: a read-only, full or forbidden destination that a command did not catch
        # itself is one line naming the reason and the path, not a traceback. Other errors (bugs) keep theirs;
        # KeyboardInterrupt is not an OSError and keeps its own handling.
        if not is_environment_error(exc):
            raise
        fail(os_error_text(exc), code=1)
        raise SystemExit(1) from None


def run() -> NoReturn:
    """The `hub-vit` program: `main`, then the process ends without Python's teardown of its modules (below)."""
    try:
        main()
    except SystemExit as done:  # every command ends here, typer's standalone mode included
        _exit_without_teardown(done.code)
    _exit_without_teardown(0)


def _exit_without_teardown(code: int | str | None) -> NoReturn:
    """Exit with `code` (SystemExit's meaning) once the command is done, without Python's teardown of its modules.

    Tearing down torch, transformers and timm (their objects freed one by one, their libraries' destructors) took 1 to
    3 s after a command's last line: `serve` after tritonserver had stopped, `export` after its table. What a normal
    exit does that matters still happens: other threads are waited for, the atexit handlers run (logging's flush,
    multiprocessing's children, folders registered for removal) and stdout / stderr are flushed."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    # What CPython's exit runs first, and os._exit does not: the hooks that tell thread pools' idle workers to stop
    # (concurrent.futures'; NNCF and OpenVINO leave such pools behind), then a wait for the non-daemon threads; then
    # the atexit handlers.
    threading._shutdown()  # noqa: SLF001
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away (`hub-vit models | head`)
            stream.flush()
    os._exit(code)


__all__ = ["app", "console", "main", "run"]
