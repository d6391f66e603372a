"""`hub-vit train` from the command line: what a run records, what it prints, and how bad input ends (one line,
exit 2, nothing written). Tiny runs on the 3-colour folder of test_train_loop (32x32 images, 1-2 steps)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_vit.catalog import default_model_folder
from hub_vit.cli import _load_commands, app
from hub_vit.train.recipe import Recipe
from tests.test_train_loop import make_folder

# small and quick: one thread, no worker processes, no augmentation, 8 images a step
QUICK = ["--img-size", "32", "--batch-size", "8", "--warmup-steps", "1", "--mixup", "0", "--randaug", "",
         "--workers", "0", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("data"))


def _train(*args: str) -> tuple[int, str]:
    _load_commands()
    result = CliRunner().invoke(app, ["train", *args])
    return result.exit_code, " ".join(result.output.split())


def test_pretrained_offline_is_a_one_line_error(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # used to end in a 325-line traceback (DownloadError is a RuntimeError, which the command did not catch)
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    out = tmp_path / "run"
    code, text = _train(str(data), "--out", str(out), "--model", "simplevit_s16.i1k_300ep", "--pretrained",
                        "--stop-at", "1", *QUICK)
    assert code == 3, text  # this machine cannot download now (README, "Exit codes")
    assert "cannot download https://storage.googleapis.com/big_vision/vit_s16_i1k_300ep.npz" in text
    assert "Traceback" not in text and "curl -L -o" in text
    assert not out.exists()


def test_fine_tuning_a_folder_records_the_folder_architecture(data: Path, tmp_path: Path) -> None:
    # the shipped digits model is a simplevit_digits; the vit_s16_i1k preset's default model is simplevit_s16
    assert json.loads((default_model_folder() / "config.json").read_text())["architecture"] == "simplevit_digits"
    out = tmp_path / "ft"
    code, text = _train(str(data), "--out", str(out), "--init", str(default_model_folder()), "--steps", "1", *QUICK)
    assert code == 0, text
    assert json.loads((out / "recipe.json").read_text())["model"] == "simplevit_digits"
    training = json.loads((out / "model" / "training.json").read_text())
    assert training["recipe"]["model"] == "simplevit_digits"
    assert json.loads((out / "model" / "config.json").read_text())["architecture"] == "simplevit_digits"
    card = (out / "model" / "README.md").read_text()
    assert "simplevit_digits" in card and "simplevit_s16" not in card
    assert "its position embedding is" not in text  # the folder's own 32 px: nothing to say
    assert "--model" not in text  # none given: nothing to say
    # a contradicting --model: the folder's architecture is still what is trained, and now it is said (was silent)
    code, text = _train(str(data), "--out", str(tmp_path / "ft2"), "--init", str(default_model_folder()), "--model",
                        "vit_b16", "--steps", "1", *QUICK)
    assert code == 0 and "warning: --model vit_b16 is not used: --init" in text, text
    assert "its architecture (simplevit_digits) is what is trained" in text, text
    assert json.loads((tmp_path / "ft2" / "recipe.json").read_text())["model"] == "simplevit_digits"


def test_fine_tuning_a_folder_at_another_size_says_so(data: Path, tmp_path: Path) -> None:
    # was silent: the preset's img_size, not the folder's, sets the run's resolution
    quick = [*QUICK[:QUICK.index("--img-size")], *QUICK[QUICK.index("--img-size") + 2:]]
    code, text = _train(str(data), "--out", str(tmp_path / "ft"), "--init", str(default_model_folder()), "--steps",
                        "1", "--img-size", "48", *quick)
    assert code == 0, text
    assert (f"warning: --init {str(default_model_folder())!r} is a 32x32 model and this run trains at 48x48 (the "
            "recipe's img_size): its position embedding is computed for the new grid; pass --img-size 32 to keep its "
            "size") in text  # the digits model's is sincos2d


def test_stop_at_hint_says_how_to_resume(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "2", *QUICK]
    code, text = _train(*args, "--stop-at", "1")
    assert code == 0 and "stopped at step 1/2" in text
    # the same command (same --stop-at) would stop again at once, so the hint must not say "the same command"
    assert "larger --stop-at or without it" in text
    code, text = _train(*args, "--stop-at", "1")
    assert code == 0 and "stopped at step 1/2" in text  # what the old hint led to: no progress
    code, text = _train(*args)
    assert code == 0 and "after 2 steps" in text, text


def test_progress_into_a_log_file_says_where_the_run_starts(data: Path, tmp_path: Path) -> None:
    # was: nothing until the first eval (step 225 of the digits preset, half a minute), rich drawing its bar only at
    # the end where the output is not a terminal
    out = tmp_path / "run"
    args = [str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "2",
            *(arg for arg in QUICK if arg != "--no-progress")]
    code, text = _train(*args, "--stop-at", "1")
    assert code == 0 and "train: 2 steps" in text and "resuming" not in text, text
    code, text = _train(*args)
    assert code == 0 and "train: 2 steps, resuming after step 1" in text, text


@pytest.mark.parametrize(("cpus", "expected"), [({0}, 1), ({0, 1}, 2), (set(range(64)), 4)])
def test_default_workers_fit_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch, cpus: set[int],
                                                           expected: int) -> None:
    # torch warns when a loader has more workers than the process's CPUs (4 workers on the 2-core CI machine did)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus, raising=False)
    assert Recipe().workers == expected
    assert Recipe(workers=8).workers == 8  # an explicit count is kept as given
    assert Recipe().replace(workers=6).workers == 6


@pytest.mark.parametrize("inside", [False, True], ids=["out-is-a-file", "parent-is-a-file"])
def test_out_that_is_a_file_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                inside: bool) -> None:
    # --preset digits writes its data into OUT first: that used to end in a NotADirectoryError traceback
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("mine")
    out = Path("afile", "run") if inside else Path("afile")
    code, text = _train("--preset", "digits", "--out", str(out), "--steps", "1", *QUICK)
    assert code == 2, text
    assert f"--out {str(out)!r} cannot be a run folder" in text and "a file is in the way" in text
    assert "Traceback" not in text
    assert Path("afile").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_run_folder_with_brackets_is_printed_verbatim(data: Path, tmp_path: Path) -> None:
    # "[draft]" used to vanish, and "[/]" raised rich's MarkupError after the run had finished
    out = tmp_path / "x [" / "]y [draft]"
    code, text = _train(str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "1", *QUICK)
    assert code == 0, text
    assert f"-> {out / 'model'}" in text and "MarkupError" not in text


def test_digits_pretrained_offline_leaves_no_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the digits data is written into OUT before the weights are fetched; a clean error must not leave it behind
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    out = tmp_path / "troff"
    code, text = _train("--preset", "digits", "--out", str(out), "--model", "simplevit_s16.i1k_300ep",
                        "--pretrained", "--stop-at", "1", *QUICK)
    assert code == 3 and "cannot download" in text, text
    assert not out.exists()
    kept = tmp_path / "kept"
    (kept / "mine.txt").parent.mkdir()
    (kept / "mine.txt").write_text("x")  # an existing folder is the user's: nothing in it is removed
    code, text = _train("--preset", "digits", "--out", str(kept), "--model", "simplevit_s16.i1k_300ep",
                        "--pretrained", "--stop-at", "1", *QUICK)
    assert code == 2, text
    assert (kept / "mine.txt").read_text() == "x"


def test_unreadable_training_images_at_step_0_leave_no_run_folder(data: Path, tmp_path: Path) -> None:
    # the train split is read only once the steps start: the run folder it created was left holding recipe.json
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    for image in (bad / "train").glob("*/*.png"):
        image.write_text("not an image")
    out = tmp_path / "new" / "run"  # its parent too is created by the run
    code, text = _train(str(bad), "--out", str(out), "--model", "simplevit_digits", "--steps", "2", *QUICK)
    assert code == 2 and "error: cannot decode image" in text and "Traceback" not in text, text
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()  # made by the user before: theirs, kept
    code, text = _train(str(bad), "--out", str(existing), "--model", "simplevit_digits", "--steps", "2", *QUICK)
    assert code == 2 and "error: cannot decode image" in text, text
    assert existing.is_dir()
