"""`hub-vit` command line: one typer app; each sub-command lives in its own module under `hub_vit.cli`.

Modules register their commands on `hub_vit.cli.app.app` when imported. A module whose optional dependencies are
missing is skipped, and its commands say which extra to install.
"""

from __future__ import annotations

import importlib

from hub_vit.cli.app import app, console

# One module per capability; each adds its commands to `app` on import.
COMMAND_MODULES = ("models", "convert", "export", "train", "serve", "explain", "cards")


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"hub_vit.cli.{name}")


def main() -> None:
    _load_commands()
    app()


__all__ = ["app", "console", "main"]
