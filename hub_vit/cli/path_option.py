"""The one parser of every path a command takes: an empty one is refused instead of read as the current folder.

Click turns `-o ""` into `Path(".")`, so `hub-vit export onnx MODEL -o "$OUT"` with `OUT` unset wrote its files into
the current folder, and `--images ""` read it. Every `Path` option and argument of the CLI passes `parser=given_path`
(those that must exist are checked by click's `exists=True`, which refuses an empty path itself).
"""

from __future__ import annotations

from pathlib import Path

import typer

from hub_vit.hub_models import is_hub_reference, parse_reference


def given_path(text: str | Path) -> Path:
    """`text` as a Path; typer.BadParameter (exit 2, naming the flag) when it is empty or blank. Defaults arrive as
    Paths already and pass through."""
    if not str(text).strip():
        raise typer.BadParameter("is empty (an unset shell variable?); name a path, or '.' for the current folder")
    return Path(text)


def local_model_folder(text: str | Path) -> Path:
    """`given_path`, for a command that works on a local model folder (calibrate-domain and card write into it, push
    uploads it): a Hub model (`hf-hub:ORG/NAME`, which the other commands fetch) is refused with how to make a local
    copy of it."""
    if is_hub_reference(str(text)):
        try:
            repo_id, _ = parse_reference(str(text))
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        raise typer.BadParameter(f"{str(text)!r} is a model on the Hugging Face Hub, and this command works on a "
                                 f"local model folder: fetch one first (`hf download {repo_id} --local-dir DIR`) and "
                                 "give DIR")
    return given_path(text)


__all__ = ["given_path", "local_model_folder"]
