"""The one parser of every path a command takes: an empty one is refused instead of read as the current folder.

Click turns `-o ""` into `Path(".")`, so `hub-vit export onnx MODEL -o "$OUT"` with `OUT` unset wrote its files into
the current folder, and `--images ""` read it. Every `Path` option and argument of the CLI passes `parser=given_path`
(those that must exist are checked by click's `exists=True`, which refuses an empty path itself).
"""

from __future__ import annotations

from pathlib import Path

import typer


def given_path(text: str | Path) -> Path:
    """`text` as a Path; typer.BadParameter (exit 2, naming the flag) when it is empty or blank. Defaults arrive as
    Paths already and pass through."""
    if not str(text).strip():
        raise typer.BadParameter("is empty (an unset shell variable?); name a path, or '.' for the current folder")
    return Path(text)


__all__ = ["given_path"]
