"""`hub-vit calibrate-domain FOLDER --images DIR`: fit a model folder's out-of-domain score on images of the kind the
model knows (`hub_vit.domain_fit`), so its answers say whether an image is one of them.

    hub-vit calibrate-domain runs/s16/model --images DATA/train --held-out DATA/val
    hub-vit calibrate-domain FOLDER --images DIR --out-of-domain PHOTOS --false-alarm-rate 0.01
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from hub_vit.cli.app import app, console, fail, is_environment_error, write_failed
from hub_vit.cli.path_option import given_path, local_model_folder
from hub_vit.domain import EXAMPLE_KINDS


@app.command("calibrate-domain")
def calibrate_domain_command(
    folder: Path = typer.Argument(..., help="A hub-vit model folder; domain.json and domain.safetensors go there.",
                                  parser=local_model_folder),
    images: Path = typer.Option(..., "--images", help="Folder of images of the kind the model knows (subfolders "
                                                      "too); the score is fitted on them.", parser=given_path),
    held_out: Path | None = typer.Option(None, "--held-out", help="Other such images, never fitted: half set the "
                                                                  "threshold, half check it. Default: every 4th of "
                                                                  "--images.", parser=given_path),
    out_of_domain: Path | None = typer.Option(None, "--out-of-domain", help="Images the model should not know: the "
                                                                            "share flagged and the AUROC are "
                                                                            "measured on them (never fitted).",
                                              parser=given_path),
    false_alarm_rate: float = typer.Option(0.01, "--false-alarm-rate", help="Share of in-domain images that may be "
                                                                            "flagged (sets the threshold)."),
    knows: str | None = typer.Option(None, "--knows", help="What the model knows, as a phrase after \"this model "
                                                           "knows\" (default: the folder's record, else its labels)."),
    examples: str | None = typer.Option(None, "--examples", help=f"Which demo examples fit it: "
                                                                 f"{', '.join(EXAMPLE_KINDS)}."),
) -> None:
    """Fit FOLDER's out-of-domain score on --images, set its threshold on held-out images and write it there."""
    from hub_vit.domain_fit import calibrate_domain
    from hub_vit.explain.image import ImageReadError

    try:
        domain = calibrate_domain(folder, images, held_out=held_out, out_of_domain=out_of_domain,
                                  false_alarm_rate=false_alarm_rate, knows=knows, examples=examples)
    except (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, ImageReadError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        if is_environment_error(exc):
            raise write_failed(folder, exc) from None
        raise
    assert domain.statistics is not None
    console.print(f"wrote {escape(str(folder))}/domain.json and domain.safetensors: threshold "
                  f"{domain.statistics.threshold:.4g}", soft_wrap=True)
    for key, value in domain.measured.items():
        console.print(f"  {key}: {escape(str(value))}", soft_wrap=True)
