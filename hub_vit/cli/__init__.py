"""`hub-vit` command line: one typer app; each sub-command lives in its own module under `hub_vit.cli`.

Modules register their commands on `hub_vit.cli.app.app` when imported. A module whose optional dependencies are
missing is skipped, and its commands say which extra to install.
"""

from __future__ import annotations

import importlib
import signal

from hub_vit.cli.app import app, console, fail, is_environment_error, os_error_text

# One module per capability; each adds its commands to `app` on import.
COMMAND_MODULES = ("models", "convert", "export", "train", "repository", "serve", "classify", "loadtest", "health",
                   "explain", "cards", "domain", "cache")


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"hub_vit.cli.{name}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Python's default SIGTERM ends the process at once, skipping the `finally` / `except BaseException` blocks that
    # remove staging folders (a killed convert left `.OUT.tmp-*` with a full copy of the weights); a SystemExit runs
    # them. `hub-vit serve` installs its own handler (drain, then exit).
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _load_commands()
    try:
        app()
    except OSError as exc:
        # The safety net for every command: a read-only, full or forbidden destination that a command did not catch
        # itself is one line naming the reason and the path, not a traceback. Other errors (bugs) keep theirs;
        # KeyboardInterrupt is not an OSError and keeps its own handling.
        if not is_environment_error(exc):
            raise
        fail(os_error_text(exc), code=1)
        raise SystemExit(1) from None


__all__ = ["app", "console", "main"]
