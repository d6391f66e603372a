"""An empty path is refused, never read as the current folder (hub_vit/cli/path_option.py): click turns `-o ""` into
`Path(".")`, so `hub-vit export onnx MODEL -o "$OUT"` with `OUT` unset wrote its files into the current folder. Every
command's path flags and arguments refuse it (exit 2, naming the flag) before any work, and leave the folder as it
was; a path command without the check is found by walking the commands."""

from __future__ import annotations

import typing
from pathlib import Path

import click
import pytest
import typer.main
from typer.testing import CliRunner

import hub_vit.cli as cli
from hub_vit.cli.app import app
from hub_vit.cli.path_option import given_path, local_model_folder

DIGITS = str(Path(__file__).resolve().parents[1] / "hub_vit" / "assets" / "digits")
SAMPLE = str(Path(DIGITS) / "samples" / "3_0.png")
CHECKPOINT = str(Path(__file__).resolve().parent / "fixtures" / "jax" / "big_vision" / "tiny_learn_tok.npz")

CASES = {
    "export onnx -o": (["export", "onnx", DIGITS, "-o", "", "--variant", "fp32"], "'-o' / '--out'"),
    "export onnx --images": (["export", "onnx", DIGITS, "--images", " "], "'--images'"),
    "convert -o": (["convert", CHECKPOINT, "-o", ""], "'-o' / '--out'"),
    "train -o": (["train", "--preset", "digits", "-o", ""], "'--out' / '-o'"),
    "repository OUT": (["repository", "", "--model", DIGITS], "'out'"),
    "rollout -o": (["rollout", SAMPLE, "-o", ""], "'--out' / '-o'"),
    "rollout IMAGES": (["rollout", ""], "'images'"),
    "classify -o": (["classify", SAMPLE, "--explain", "-o", ""], "'--out' / '-o'"),
    "calibrate-domain --images": (["calibrate-domain", DIGITS, "--images", ""], "'--images'"),
    "card FOLDER": (["card", ""], "'folder'"),
    "serve --repository": (["serve", "--repository", ""], "'--repository'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_empty_path_is_refused_naming_the_flag_and_nothing_is_written(case: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    args, flag = CASES[case]
    cli._load_commands()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert f"Invalid value for {flag}: is empty (an unset shell variable?)" in text, text
    assert not any(tmp_path.iterdir())  # nothing written where it would have gone


def test_every_path_flag_of_every_command_is_checked() -> None:
    """A `Path` flag or argument without the parser reads '' as '.', unless click checks that it exists (which refuses
    '' itself)."""
    cli._load_commands()
    unchecked, checked = [], 0

    def walk(command: click.Command, name: str) -> None:
        nonlocal checked
        for sub_name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{name} {sub_name}")
        for param in command.params:
            descriptor = param.type_descriptor
            if Path not in (descriptor.annotation, *typing.get_args(descriptor.annotation)):
                continue
            if descriptor.parameter_info.parser in (given_path, local_model_folder):  # the latter calls given_path
                checked += 1
            elif not descriptor.parameter_info.exists:
                unchecked.append(f"{name}: {param.name}")

    walk(typer.main.get_command(app), "hub-vit")
    assert not unchecked, unchecked
    assert checked >= 20  # the walk found the commands' path flags


def test_given_path_keeps_what_is_given() -> None:
    assert given_path("out dir/x") == Path("out dir/x") and given_path(Path("exports")) == Path("exports")
    assert given_path(".") == Path(".")
