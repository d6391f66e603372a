"""`hub-vit train` and `hub_vit.train.loop.train` as a daily user meets them (audit of training, findings 1-17): stop
signals a script cannot miss, a damaged checkpoint, `--init` files and folders of the wrong kind, run folders that
hold someone else's files, reruns of finished runs, the micro-batch rule on resume, and small input slips. Tiny runs
on the 3-colour folder of test_train_loop (32x32 images, 1-6 steps)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hub_vit.train import checkpoint as ckpt
from hub_vit.train.data import DataFolderError, scan_split
from hub_vit.train.distributed import Dist
from hub_vit.train.loop import TrainingWarning, _Plan, train
from hub_vit.train.recipe import Recipe, SettingError
from hub_vit.train.run_folder import RunFolderError
from tests.test_train_cli import QUICK, _train
from tests.test_train_loop import TINY, _api_script, make_folder, signal_group_mid_run

# 3 val images: too few to set an out-of-domain threshold, so every finished run warns so
pytestmark = pytest.mark.filterwarnings("ignore:the model's out-of-domain score is not calibrated")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("data"), per_class=4, val_per_class=1)  # 12 train images


def _one_line_error(code: int, text: str, expected_code: int = 2) -> None:
    assert code == expected_code, text
    assert "Traceback" not in text and text.count("error:") == 1, text


def _files(folder: Path) -> dict[str, int]:
    """Every file under `folder` with its modification time (ns): what a rerun must leave alone."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ 1: stop signals
def test_the_api_raises_sigterm_again_once_the_step_is_checkpointed(data: Path, tmp_path: Path) -> None:
    """A sweep script under SLURM or `timeout` used to go on to its next run after SIGTERM and end with 0: train()
    only set TrainResult.interrupted. It now raises SystemExit(143) after the checkpoint (no traceback)."""
    run = tmp_path / "run"
    recipe = TINY.replace(total_steps=2000, checkpoint_every_steps=1000, mixup=0.0, randaug="")
    script = _api_script(recipe, data, run)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out = signal_group_mid_run(proc, run, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "went on" not in out and "Traceback" not in out, out
    step = ckpt.latest(run).step
    assert 3 <= step < 2000  # the step it stopped after, checkpointed


# ------------------------------------------------------------------------------------------ 2: damaged checkpoint
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(data: Path, tmp_path: Path) -> None:
    """A state.pt cut short (a full disk, a copy that stopped) used to end every rerun in a 107-line traceback,
    although the checkpoint before it was kept for that."""
    run, recipe = tmp_path / "run", TINY.replace(total_steps=6)
    train(recipe, data, run, stop_at=2, progress=False)
    train(recipe, data, run, stop_at=4, progress=False)
    state = run / "checkpoints" / "step_000000004" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    with pytest.warns(TrainingWarning, match=r"checkpoint '.*step_000000004' cannot be read \(state\.pt: .*\): "
                                             r"removed it, and resuming from step_000000002 instead"):
        result = train(recipe, data, run, progress=False)
    assert [h["step"] for h in result.history if "loss" in h][0] == 3  # the steps after 2 are trained again
    assert result.model_dir is not None and ckpt.latest(run).step == 6


def test_no_readable_checkpoint_is_one_line_naming_what_to_delete(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "4", *QUICK,
            "--set", "checkpoint_every_steps=1"]
    code, text = _train(*args, "--stop-at", "2")
    assert code == 0, text
    for folder in (out / "checkpoints").iterdir():
        (folder / "model.safetensors").write_bytes(b"\0" * 100)
    code, text = _train(*args)
    _one_line_error(code, text)
    assert f"no checkpoint of run folder '{out}' can be read (step_000000002: model.safetensors: " in text, text
    assert f"delete '{out / 'checkpoints'}' to train the run again from step 0" in text
    assert len(list((out / "checkpoints").iterdir())) == 2  # nothing removed


# ------------------------------------------------------------------------------------------ 3, 12: --init
def test_init_from_a_torch_file_that_holds_more_than_weights(data: Path, tmp_path: Path) -> None:
    """`{'model': sd, 'optimizer': ..., 'epoch': 3}` and hub-vit's own state.pt ended in an AttributeError
    traceback (exit 1)."""
    code, text = _train(str(data), "--out", str(tmp_path / "base"), "--model", "simplevit_digits", "--steps", "1",
                        *QUICK)
    assert code == 0, text
    weights = load_file(str(tmp_path / "base" / "model" / "model.safetensors"))
    torch.save({"model": weights, "optimizer": {}, "epoch": 3}, tmp_path / "ck_model.pt")
    code, text = _train(str(data), "--out", str(tmp_path / "ft"), "--init", str(tmp_path / "ck_model.pt"), "--model",
                        "simplevit_digits", "--steps", "1", *QUICK)
    assert code == 0, text  # the weights under 'model'
    state = tmp_path / "base" / "checkpoints" / "step_000000001" / "state.pt"
    code, text = _train(str(data), "--out", str(tmp_path / "ft2"), "--init", str(state), "--model",
                        "simplevit_digits", "--steps", "1", *QUICK)
    _one_line_error(code, text)
    assert f"--init '{state}'" in text and "training state of a hub-vit checkpoint" in text, text
    assert f"--init '{state.with_name('model.safetensors')}' with --model simplevit_digits" in text, text
    assert not (tmp_path / "ft2").exists()
    torch.save({"weights": weights, "epoch": 3}, tmp_path / "other.pt")
    code, text = _train(str(data), "--out", str(tmp_path / "ft3"), "--init", str(tmp_path / "other.pt"), "--model",
                        "simplevit_digits", "--steps", "1", *QUICK)
    _one_line_error(code, text)
    assert "none of model, state_dict, model_state_dict is a dict of tensors" in text, text


def test_init_given_a_run_folder_or_a_checkpoint_names_what_to_pass(data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, text = _train(str(data), "--out", str(run), "--model", "simplevit_digits", "--steps", "1", *QUICK)
    assert code == 0, text
    code, text = _train(str(data), "--out", str(tmp_path / "ft"), "--init", str(run), "--steps", "1", *QUICK)
    _one_line_error(code, text)
    assert f"--init '{run}' is a training run folder, not a model folder: pass its model folder, --init " \
           f"'{run / 'model'}'" in text, text
    step = run / "checkpoints" / "step_000000001"
    code, text = _train(str(data), "--out", str(tmp_path / "ft"), "--init", str(step), "--steps", "1", *QUICK)
    _one_line_error(code, text)
    assert f"--init '{step / 'model.safetensors'}' with --model simplevit_digits" in text, text
    assert not (tmp_path / "ft").exists()


# ------------------------------------------------------------------------------------------ 4, 5: foreign folders
def test_out_with_a_model_folder_hub_vit_did_not_write_is_refused_before_training(data: Path, tmp_path: Path
                                                                                  ) -> None:
    """It used to train the whole run, then fail with a traceback (and every rerun did the same)."""
    out = tmp_path / "om"
    (out / "model").mkdir(parents=True)
    (out / "model" / "notes.txt").write_text("precious")
    code, text = _train(str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "1", *QUICK)
    _one_line_error(code, text)
    assert f"--out '{out}' holds a model/ folder that hub-vit train did not write (it holds notes.txt" in text, text
    assert sorted(p.name for p in out.iterdir()) == ["model"]  # nothing trained, nothing written
    assert (out / "model" / "notes.txt").read_text() == "precious"


def test_digits_preset_with_an_unrelated_data_folder_is_refused(tmp_path: Path) -> None:
    """`OSError: [Errno 39] Directory not empty: 'od3/.data.18663.tmp' -> 'od3/data'` traceback."""
    out = tmp_path / "od3"
    (out / "data").mkdir(parents=True)
    (out / "data" / "x.csv").write_text("x")
    code, text = _train("--preset", "digits", "--out", str(out), "--steps", "1", "--no-progress", "--workers", "0")
    _one_line_error(code, text)
    assert f"'{out / 'data'}' holds files that are not the digits image folder hub-vit writes there (it holds " \
           "x.csv)" in text, text
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["data", "data/x.csv"]


# ------------------------------------------------------------------------------------------ 6: finished runs
def test_rerunning_a_finished_run_leaves_its_model_folder_alone(data: Path, tmp_path: Path) -> None:
    """A rerun rewrote model/: the calibration done since (`hub-vit calibrate-domain`) and the files added there were
    deleted. It is now a no-op that says where the model is (exit 0), as a Makefile or job script needs."""
    out = tmp_path / "run"
    args = [str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "2", *QUICK]
    code, text = _train(*args)
    assert code == 0, text
    (out / "model" / "my_notes.txt").write_text("mine")
    before = _files(out)
    code, text = _train(*args)
    assert code == 0, text
    assert "run already complete (held-out top-1 " in text and f"the model folder is {out / 'model'}, left as it " \
           "is" in text, text
    assert "warning:" not in text  # not even the calibration warning of the first run
    assert _files(out) == before  # nothing rewritten, the added file kept


# ------------------------------------------------------------------------------------------ 7: staged model folder
def test_the_model_folder_appears_only_when_complete(data: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the calibration left a model/ with weights but no card or domain files, which looked
    finished."""
    import hub_vit.train.loop as loop

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    run, recipe = tmp_path / "run", TINY.replace(total_steps=2)
    monkeypatch.setattr(loop, "calibrate_domain_or_warn", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(recipe, data, run, progress=False)
    assert not (run / "model").exists()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "recipe.json"]  # no staging
    monkeypatch.undo()
    result = train(recipe, data, run, progress=False)
    assert (result.model_dir / "README.md").is_file() and (result.model_dir / "training.json").is_file()


def test_a_model_folder_written_again_keeps_the_files_added_to_it(data: Path, tmp_path: Path) -> None:
    """A model/ without its card (left by an export interrupted before it was staged) is exported again: the files a
    person added to it used to be deleted with it."""
    run, recipe = tmp_path / "run", TINY.replace(total_steps=2)
    train(recipe, data, run, progress=False)
    (run / "model" / "README.md").unlink()
    (run / "model" / "notes.txt").write_text("mine")
    result = train(recipe, data, run, progress=False)
    assert not result.already_complete and (result.model_dir / "README.md").is_file()
    assert (result.model_dir / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------------ 8: micro batch on resume
def test_resume_with_another_micro_batch_follows_the_mixup_rule(data: Path, tmp_path: Path) -> None:
    """With mixup on, the micro batch decides which images are mixed and with what ratio: another one is refused.
    With mixup off it only changes float rounding: it used to be refused too (`micro_batch: 4 -> None`), while
    another torchrun size, which changes it the same way, was accepted without a word. Now both follow one rule."""
    mixed = TINY.replace(total_steps=3)  # batch 8, micro_batch 4, mixup 0.2
    train(mixed, data, tmp_path / "mixed", stop_at=1, progress=False)
    with pytest.raises(RunFolderError, match=r"trained with 4 images per forward pass of each process and this run "
                                             r"would use 8 .*with mixup on \(0\.2\)"):
        train(mixed.replace(micro_batch=None), data, tmp_path / "mixed", progress=False)
    plain = TINY.replace(total_steps=3, mixup=0.0)
    train(plain, data, tmp_path / "plain", stop_at=1, progress=False)
    with pytest.warns(TrainingWarning, match=r"with mixup off only float rounding changes: resuming on it"):
        result = train(plain.replace(micro_batch=None), data, tmp_path / "plain", progress=False)
    assert result.model_dir is not None
    assert json.loads((result.model_dir / "training.json").read_text())["micro_batch"] == 8


def test_a_resume_under_another_number_of_processes_follows_the_same_rule(data: Path, tmp_path: Path) -> None:
    """A 1-process run resumed under `torchrun --nproc_per_node 2` halves the micro batch (8 -> 4): with mixup on
    it is refused like another --micro-batch, with mixup off it warns."""
    for mixup in (0.2, 0.0):
        recipe = TINY.replace(total_steps=3, micro_batch=None, mixup=mixup)
        run = tmp_path / f"run{mixup}"
        train(recipe, data, run, stop_at=1, progress=False)
        two = Dist(world_size=2)  # what torchrun's environment gives each process (checked before any setup)
        if mixup:
            with pytest.raises(RunFolderError, match=r"trained with 8 images per forward pass of each process and "
                                                     r"this run would use 4"):
                _Plan.check(recipe, data, run, two, None, None)
        else:
            notes = _Plan.check(recipe, data, run, two, None, None).notes
            assert any("with mixup off only float rounding changes" in note for note in notes), notes


# ------------------------------------------------------------------------------------------ 9, 16, 17: input slips
def test_a_batch_larger_than_the_training_set_warns_with_a_value_to_use(data: Path, tmp_path: Path) -> None:
    code, text = _train(str(data), "--out", str(tmp_path / "run"), "--model", "simplevit_digits", "--epochs", "2",
                        *QUICK, "--batch-size", "32")
    assert code == 0, text
    assert ("warning: --batch-size 32 is larger than the 12 training images: each step repeats them (2.67 times each "
            "on average), and the run's 1 step is 2.67 epochs, not the 2 asked for; pass e.g. --batch-size 12"
            ) in text, text


def test_an_odd_micro_batch_under_torchrun_names_the_division_and_valid_sizes() -> None:
    with pytest.raises(SettingError, match=r"got 3 = batch_size 6 / 2 processes; valid batch sizes: multiples of 4 "
                                           r"\(e\.g\. 4 or 8\), or mixup 0 to turn it off"):
        Recipe(batch_size=6).micro_batch_for(2)
    with pytest.raises(SettingError, match=r"got 1 \(micro_batch\); valid micro batches for the per-process batch 8: "
                                           r"\[2, 4, 8\]"):
        Recipe(batch_size=8, micro_batch=1).micro_batch_for(1)


def test_out_inside_a_data_split_is_refused(tmp_path: Path) -> None:
    """`--out DATA/train/run1` was accepted; the next run read the run folder as a class of images."""
    data = make_folder(tmp_path / "data", per_class=4, val_per_class=1)  # its own: the old code trained into it
    out = data / "train" / "run1"
    code, text = _train(str(data), "--out", str(out), "--model", "simplevit_digits", "--steps", "1", *QUICK)
    _one_line_error(code, text)
    assert f"--out '{out}' is inside the data folder's train split" in text, text
    assert not out.exists()


def test_a_data_folder_that_is_a_file_is_named_as_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataFolderError, match=r"data folder '.*afile' is a file, not a folder"):
        scan_split(tmp_path / "afile", "train")


# ------------------------------------------------------------------------------------------ 14: hidden folders
def test_hidden_folders_inside_class_folders_are_skipped(tmp_path: Path) -> None:
    """Jupyter's `.ipynb_checkpoints` copies were read as images of the class, without a word."""
    root = make_folder(tmp_path / "data", per_class=2, val_per_class=1)
    hidden = root / "train" / "red" / ".ipynb_checkpoints"
    hidden.mkdir()
    (hidden / "0-checkpoint.png").write_bytes((root / "train" / "blue" / "0.png").read_bytes())
    assert len(scan_split(root, "train")) == 6


# ------------------------------------------------------------------------------------------ 8, 15: the docs
def test_the_training_docs_say_what_micro_batch_changes_and_what_loads_model_folders() -> None:
    text = " ".join((Path(__file__).parents[1] / "docs" / "training.md").read_text().split())
    assert "8 x 128 images per step, same recipe" not in text and "same batch 1024, 8 accumulation steps`" not in text
    assert "With Mixup on (the default) it is another run" in text
    assert "`import hub_vit` first" in text


def test_warnings_name_settings_as_the_api_takes_them(data: Path, tmp_path: Path) -> None:
    """The API's warnings said `pass e.g. --warmup-steps 2` to Python users (the command line still says so)."""
    with pytest.warns(TrainingWarning, match=r"pass e\.g\. warmup_steps=1$"):
        train(TINY.replace(total_steps=2, warmup_steps=5), data, tmp_path / "run", progress=False)


# ------------------------------------------------------------------------------------------ 10, 13: help and advice
def test_help_shows_each_presets_default() -> None:
    """`hub-vit train --help` showed no default for any numeric setting: they were only in the docs."""
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    text = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400"}).output
    assert "Peak learning rate. (default 0.001 for vit_s16_i1k, 0.003 for digits)" in text, text
    assert "(default 1024 for vit_s16_i1k, 32 for digits)" in text and "(default 0.2, both presets)" in text


def test_pretrained_offline_says_how_this_run_can_start_from_a_copy(data: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The download's advice named `hub-vit convert` and timm's pretrained_cfg_overlay, not what train accepts."""
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    code, text = _train(str(data), "--out", str(tmp_path / "run"), "--model", "simplevit_s16.i1k_300ep",
                        "--pretrained", "--steps", "1", *QUICK)
    _one_line_error(code, text, expected_code=3)
    assert text.endswith("pass it in place of --pretrained: --init FILE.npz --model simplevit_s16."), text
