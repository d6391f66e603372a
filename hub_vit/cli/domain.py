"""`hub-vit calibrate-domain FOLDER --images DIR`: fit a model folder's out-of-domain score on images of the kind the
model knows (`hub_vit.domain_fit`), so its answers say whether an image is one of them.

    hub-vit calibrate-domain runs/s16/model --images DATA/train --held-out DATA/val
    hub-vit calibrate-domain FOLDER --images DIR --out-of-domain PHOTOS --false-alarm-rate 0.01
"""

from __future__ import annotations

from pathlib import Path

import typer

from hub_vit.cli.app import app, console, fail, is_environment_error, write_failed
from hub_vit.cli.path_option import given_path, local_model_folder
from hub_vit.domain import EXAMPLE_KINDS


@app.command("calibrate-domain")
def calibrate_domain_command(
    folder: Path = typer.Argument(..., help="A hub-vit model folder; domain.json and domain.safetensors go there.",
                                  parser=local_model_folder),
    images: Path = typer.Option(..., "--images", help="Folder of images of the kind the model knows (subfolders "
                                                      "too); the score is fitted on them.", parser=given_path),
    held_out: Path | None = typer.Option(None, "--held-out", help="Other such images, never fitted: all of them set "
                                                                  "the threshold; the false alarms are checked 2-fold "
                                                                  "(each half against the other half's threshold). "
                                                                  "Default: every 4th of --images.",
                                         parser=given_path),
    out_of_domain: Path | None = typer.Option(None, "--out-of-domain", help="Images the model should not know: the "
                                                                            "share flagged and the AUROC are "
                                                                            "measured on them (never fitted).",
                                              parser=given_path),
    false_alarm_rate: float = typer.Option(0.01, "--false-alarm-rate", help="Share of in-domain images that may be "
                                                                            "flagged (sets the threshold)."),
    knows: str | None = typer.Option(None, "--knows", help="What the model knows, as a phrase on one line after "
                                                           "\"this model knows\" (default: the folder's record, else "
                                                           "its labels)."),
    examples: str | None = typer.Option(None, "--examples", help=f"Which demo examples fit it: "
                                                                 f"{', '.join(EXAMPLE_KINDS)}."),
) -> None:
    """Fit FOLDER's out-of-domain score on --images, set its threshold on held-out images and write it there."""
    from hub_vit.domain_fit import calibrate_folder
    from hub_vit.explain.image import ImageReadError
    from hub_vit.train.data import check_headers  # `hub-vit train`'s check of its val split: cheap, before any feature

    try:
        done = calibrate_folder(folder, images, held_out=held_out, out_of_domain=out_of_domain,
                                false_alarm_rate=false_alarm_rate, knows=knows, examples=examples,
                                check_images=check_headers)
    except (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, ImageReadError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        if is_environment_error(exc):
            raise write_failed(folder, exc) from None
        raise
    statistics = done.domain.statistics
    assert statistics is not None
    say(f"wrote {folder}/domain.json and domain.safetensors: threshold {statistics.threshold:.4g}")
    for key, value in done.domain.measured.items():
        say(f"  {key}: {_measured(key, value, done.domain.measured)}")
    if done.card is not None:
        say(f"updated {done.card} (the model card) with the new numbers")
    elif done.card_note is not None:
        say(f"note: {done.card_note}")
    # the served repository holds a copy of the statistics, and serve and the demo read the record once, at start
    say("a running `hub-vit serve` or `hub-vit demo` of this folder uses the new threshold once restarted; a "
        "repository written by `hub-vit repository` keeps the old one until it is written again")


def say(text: str) -> None:
    """One line on the terminal as it is (paths and values are not rich markup), whole on one line for scripts."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _measured(key: str, value: object, measured: dict[str, object]) -> str:
    """A measured value as printed: the 2-fold check's None says why nothing was checked."""
    if key == "check_false_alarms" and value is None:
        from hub_vit.domain_score import fewest_held_out

        rate = float(measured["false_alarm_rate"])  # type: ignore[arg-type]
        return (f"not measured: {measured['held_out_images']} held-out images do not split into two halves of at "
                f"least {fewest_held_out(rate)} each, the fewest that set a threshold at {rate:.2%} (give "
                f"{2 * fewest_held_out(rate)} or more held-out images to have the false alarms checked)")
    return str(value)
