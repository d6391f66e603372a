"""`hub-vit train` and `train()` after a second user audit: a stop signal after the last step, a val image damaged
inside, a missing `--init` on resume, `Recipe.load` of a run folder's recipe.json, and the micro-batch messages. Tiny
runs on the 3-colour folder of test_train_loop (32x32 images, 2-6 steps); the signals are raised in the process
itself at the phase under test (a patched `evaluate` / calibration), so every test is deterministic."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from hub_vit.catalog import default_model_folder
from hub_vit.train import checkpoint as ckpt
from hub_vit.train.data import DataFolderError
from hub_vit.train.distributed import Dist
from hub_vit.train.loop import _Plan, stopped_by_signal, train
from hub_vit.train.recipe import FIELDS, RUN_RECORD, Recipe
from hub_vit.train.run_folder import run_settings, write_settings
from tests.test_train_cli import QUICK, _train
from tests.test_train_loop import TINY, make_folder

# 6 val images: too few to set an out-of-domain threshold, so every finished run warns so
pytestmark = pytest.mark.filterwarnings("ignore:the model's out-of-domain score is not calibrated")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("data"))  # 24 train images: 3 steps of 8 per epoch


def _signal_in(monkeypatch: pytest.MonkeyPatch, name: str, signum: int) -> None:
    """`hub_vit.train.loop.<name>` raising `signum` in this process each time it is called, before it runs: the
    signal lands in that phase of the run, as a Ctrl-C would."""
    import hub_vit.train.loop as loop

    real: Callable = getattr(loop, name)

    def signalled(*args: object, **kwargs: object) -> object:
        signal.raise_signal(signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, name, signalled)


# ------------------------------------------------------------------------------------------ 1: signal after the end
def test_a_ctrl_c_during_the_last_eval_stops_before_the_model_folder(data: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C during the last step's eval used to be lost: the run went on through the export and calibration,
    then train() raised a KeyboardInterrupt saying the run could be resumed, with `interrupted` False and the model
    folder written."""
    run, recipe = tmp_path / "run", TINY.replace(total_steps=2)
    _signal_in(monkeypatch, "evaluate", signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as caught:
        train(recipe, data, run, progress=False)
    result = stopped_by_signal(caught.value)
    assert result is not None and result.interrupted and result.stop_signal == signal.SIGINT
    assert result.step == 2 and result.model_dir is None
    assert str(caught.value) == ("stopped by Ctrl-C after step 2/2, checkpoint written (the model folder is not "
                                 "written yet); call train() again to resume")
    assert ckpt.latest(run).step == 2 and not (run / "model").exists()
    # the rerun measures the last step again before it writes the model folder: a signal there stops it alike
    with pytest.raises(KeyboardInterrupt) as caught:
        train(recipe, data, run, progress=False)
    result = stopped_by_signal(caught.value)
    assert result is not None and result.interrupted and result.model_dir is None
    assert not (run / "model").exists()
    monkeypatch.undo()
    result = train(recipe, data, run, progress=False)
    assert not result.already_complete and not result.interrupted and (result.model_dir / "README.md").is_file()


def test_the_command_exits_130_on_a_ctrl_c_during_the_last_eval(data: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """It printed the held-out line and exited 0 (`_report` read only `interrupted`, which was False)."""
    out = tmp_path / "run"
    _signal_in(monkeypatch, "evaluate", signal.SIGINT)
    code, text = _train(str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "2", *QUICK)
    assert code == 130, text
    assert ("stopped by Ctrl-C after step 2/2, checkpoint written (the model folder is not written yet); run the same "
            "command to resume") in text, text
    assert "held-out top-1" not in text and not (out / "model").exists() and ckpt.latest(out).step == 2


def test_a_ctrl_c_while_the_model_folder_is_written_interrupts_it(data: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the export has begun the signal interrupts it at once (the folder is staged: none is left), and the
    command says so with 130; the rerun writes it."""
    out = tmp_path / "run"
    args = [str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "2", *QUICK]
    _signal_in(monkeypatch, "calibrate_domain_or_warn", signal.SIGINT)
    code, text = _train(*args)
    assert code == 130, text
    assert "interrupted; checkpoints written before are kept, run the same command to resume" in text, text
    assert not (out / "model").exists() and ckpt.latest(out).step == 2
    monkeypatch.undo()
    code, text = _train(*args)
    assert code == 0 and "held-out top-1" in text and (out / "model" / "README.md").is_file(), text


def test_a_sigterm_during_the_last_eval_exits_143_from_the_command(data: Path, tmp_path: Path) -> None:
    """The real entry point (`hub_vit.cli.main`, whose own SIGTERM handler stands outside the steps), in a process of
    its own."""
    out = tmp_path / "run"
    argv = ["hub-vit", "train", str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "2", *QUICK]
    script = ("import os, signal, sys\nimport hub_vit.train.loop as loop\nreal = loop.evaluate\n"
              "def evaluate(*args, **kwargs):\n    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    return real(*args, **kwargs)\n"
              f"loop.evaluate = evaluate\nsys.argv = {argv!r}\nfrom hub_vit.cli import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert "stopped by SIGTERM after step 2/2, checkpoint written (the model folder is not written yet)" in text
    assert "Traceback" not in text and not (out / "model").exists() and ckpt.latest(out).step == 2


# ------------------------------------------------------------------------------------------ 5: val image damaged inside
def _zero_pixels(png: Path) -> None:
    """Zero the compressed pixel data of `png`, with valid chunk CRCs: PIL's `verify` passes it, decoding fails."""
    raw, pos = png.read_bytes(), 8
    out = bytearray(raw[:pos])
    while pos < len(raw):
        length, kind = int.from_bytes(raw[pos:pos + 4], "big"), raw[pos + 4:pos + 8]
        body = bytes(length) if kind == b"IDAT" else raw[pos + 8:pos + 8 + length]
        out += raw[pos:pos + 8] + body + zlib.crc32(kind + body).to_bytes(4, "big")
        pos += 12 + length
    png.write_bytes(bytes(out))


def _damaged_val(data: Path, tmp_path: Path) -> tuple[Path, Path, bytes]:
    import shutil

    mine = Path(shutil.copytree(data, tmp_path / "data"))
    bad = mine / "val" / "green" / "1.png"
    good = bad.read_bytes()
    _zero_pixels(bad)
    return mine, bad, good


def test_a_val_image_damaged_inside_keeps_the_steps_before_its_eval(data: Path, tmp_path: Path) -> None:
    """It passed the check before the first step and failed the first eval: every step since the last checkpoint
    was lost (all of a fresh run's), although the comment in `fit` said an eval that fails must not cost them."""
    mine, bad, good = _damaged_val(data, tmp_path)
    run = tmp_path / "run"
    recipe = TINY.replace(total_steps=6, eval_every_epochs=1.0, checkpoint_every_steps=1000)  # eval at step 3
    with pytest.raises(DataFolderError) as caught:
        train(recipe, mine, run, progress=False)
    message = str(caught.value)
    assert message.startswith(f"cannot decode image {str(bad)!r}") and "\n" not in message, message
    assert message.endswith("; checkpoint of step 3 written: replace the file with a readable image, or remove it "
                            "from the val split, and run the same command to resume"), message
    assert ckpt.latest(run).step == 3
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    bad.write_bytes(good)
    result = train(recipe, mine, run, progress=False)
    assert result.model_dir is not None and [h["step"] for h in result.history if "loss" in h] == [4, 5, 6]


def test_the_command_keeps_a_fresh_run_folder_whose_first_eval_fails(data: Path, tmp_path: Path) -> None:
    """The command deleted the fresh run folder (nothing was checkpointed) with its steps."""
    mine, bad, _ = _damaged_val(data, tmp_path)
    out = tmp_path / "run"
    code, text = _train(str(mine), "--out", str(out), "--model", "simplevit_digits", "--steps", "6", *QUICK)
    assert code == 2 and text.count("error:") == 1 and "Traceback" not in text, text
    assert f"error: cannot decode image '{bad}'" in text and "run the same command to resume" in text, text
    assert ckpt.latest(out).step == 3  # 24 images, batch 8: the first eval comes after step 3


# ------------------------------------------------------------------------------------------ 2: --init on resume
def test_a_missing_init_on_resume_is_named_before_the_recipe_is_compared(data: Path, tmp_path: Path) -> None:
    """It said the run folder "was started with another recipe (model: ...)": a missing folder names no model."""
    out = tmp_path / "run"
    args = [str(data), "--out", str(out), "--steps", "3", *QUICK]
    code, text = _train(*args, "--init", str(default_model_folder()), "--stop-at", "1")
    assert code == 0, text
    (tmp_path / "empty").mkdir()
    for init, needle in ((tmp_path / "nope", "is neither a model folder nor a weights file"),
                         (tmp_path / "empty", "is not a hub-vit model folder: config.json is missing")):
        code, text = _train(*args, "--init", str(init), "--stop-at", "2")
        assert code == 2 and text.count("error:") == 1, text
        assert f"error: --init '{init}' {needle}" in text and "another recipe" not in text, text
    assert ckpt.latest(out).step == 1


# ------------------------------------------------------------------------------------------ 4: Recipe.load
def test_recipe_load_reads_a_run_folders_recipe_json(data: Path, tmp_path: Path) -> None:
    """It refused the file ("unknown recipe setting(s) ['classes', 'data', ...]"), though the recipe module says a
    run is reproducible from it alone."""
    recipe = TINY.replace(total_steps=7, lr=1e-3, crop_area=(0.3, 1.0))
    write_settings(tmp_path, recipe, default_model_folder(), ("a", "b"), {"train": {}, "val": {}}, micro=4)
    assert Recipe.load(tmp_path / "recipe.json") == recipe
    assert Recipe.load(tmp_path) == recipe  # the run folder itself
    # the keys it drops are exactly what recipe.json records besides the settings
    assert set(run_settings(recipe, None, ("a",))) - set(FIELDS) == RUN_RECORD
    (tmp_path / "other.json").write_text(json.dumps({**recipe.to_dict(), "lrr": 1}))
    with pytest.raises(ValueError, match=r"unknown recipe setting\(s\) \['lrr'\]"):
        Recipe.load(tmp_path / "other.json")


# ------------------------------------------------------------------------------------------ nitpicks
def test_the_micro_batch_refusal_on_resume_is_in_flag_words(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [str(data), "--out", str(out), "--model", "simplevit_digits", "--img-size", "32", "--batch-size", "8",
            "--warmup-steps", "1", "--randaug", "", "--workers", "0", "--threads", "1", "--no-progress", "--steps",
            "3"]
    code, text = _train(*args, "--micro-batch", "4", "--stop-at", "1")
    assert code == 0, text
    code, text = _train(*args)
    assert code == 2 and text.count("error:") == 1, text
    assert ("would use 8 (--micro-batch, else --batch-size 8 / the number of processes); with --mixup on (0.2)" in text
            and "same number of processes and --micro-batch, or choose" in text), text


def test_a_micro_batch_larger_than_the_batch_warns_naming_both(data: Path, tmp_path: Path) -> None:
    """`--micro-batch 16 --batch-size 8` was clamped to 8 without a word (and recorded as 16)."""
    from hub_vit.cli.train import _settings_as_flags

    notes = _Plan.check(TINY.replace(micro_batch=16, total_steps=6), data, tmp_path / "run", Dist(), None, None).notes
    assert [_settings_as_flags(note) for note in notes] == [
        "--micro-batch 16 is larger than the 8 images each process takes per step (--batch-size 8): each forward "
        "pass takes 8, without gradient accumulation; pass --micro-batch 8 or leave it out"]
    assert _Plan.check(TINY.replace(micro_batch=8, total_steps=6), data, tmp_path / "run", Dist(), None,
                       None).notes == []


def test_one_step_is_not_written_as_steps(data: Path, tmp_path: Path) -> None:
    notes = _Plan.check(TINY.replace(total_steps=1, warmup_steps=1, batch_size=32, micro_batch=None), data,
                        tmp_path / "run", Dist(), None, None).notes
    assert notes[0].startswith("the warm-up (1 step) is not shorter than the run (1 step): "), notes
    assert "and the run's 1 step is 1.33 epochs; pass e.g. batch_size=24" in notes[1], notes
