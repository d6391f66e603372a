"""`hub-vit train` bad input that used to end in a traceback (or be accepted and fail later): each is now one line,
exit 2, before anything is written to the run folder (review s11, findings 5, 7, 9 and 12). Tiny runs on the
3-colour folder of test_train_loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hub_vit.catalog import default_model_folder
from tests.test_train_cli import QUICK, _train
from tests.test_train_loop import make_folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("data"), per_class=4, val_per_class=1)


def _refused(out: Path, *args: str) -> str:
    code, text = _train(*args, "--out", str(out))
    assert code == 2, text
    assert "Traceback" not in text and text.count("error:") == 1, text
    assert not out.exists(), sorted(p.name for p in out.iterdir())  # nothing written, not even recipe.json
    return text


@pytest.mark.parametrize(("randaug", "needle"), [
    ("randfoo", "randaug 'randfoo' must be 'rand' or start with 'rand-'"),  # timm: a bare AssertionError
    ("rand-m10-n2-x5", "randaug 'rand-m10-n2-x5': unknown or malformed part 'x5'"),  # timm: AssertionError
    ("rand-foo", "unknown or malformed part 'foo'"),  # timm skips a section without digits without a word
    ("rand-m9.5", "unknown or malformed part 'm9.5'"),  # timm: int('9.5') ValueError
    ("rand-m9-p1.5", "p is a probability in [0, 1], got 1.5"),
])
def test_bad_randaug_names_the_bad_part(data: Path, tmp_path: Path, randaug: str, needle: str) -> None:
    args = [a for a in QUICK if a not in ("--randaug", "")]  # QUICK turns RandAugment off with --randaug ''
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--steps", "1", *args,
                    "--randaug", randaug)
    assert needle in text


def test_timm_accepts_what_the_recipe_accepts() -> None:
    # the recipe's grammar must not refuse what timm reads (the strings of the docs and timm's own examples)
    from timm.data.auto_augment import rand_augment_transform

    from hub_vit.train.recipe import Recipe

    for config in ("rand-m10-n2-p1.0", "rand-m9-mstd0.5", "rand-m9-n3-mstd101-inc1", "rand-mstd1-tweights", "rand"):
        Recipe(randaug=config)
        rand_augment_transform(config, {})


@pytest.mark.parametrize("epochs", ["1e308", "inf"])
def test_epochs_too_large_is_one_line(data: Path, tmp_path: Path, epochs: str) -> None:
    # 1e308 epochs used to end in "OverflowError: cannot convert float infinity to integer" (steps_for); 1e307
    # started a run of 1e307 steps
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--epochs", epochs, *QUICK)
    assert "error: --epochs " in text and "total_epochs" not in text


@pytest.mark.parametrize(("args", "needle"), [
    # each used to name the recipe's field (`total_steps must be ...`), not the flag the user typed
    (("--steps", "0"), "error: --steps must be a positive integer, got 0"),
    (("--epochs", "-1"), "error: --epochs must be a finite number > 0, got -1.0"),
    (("--batch-size", "0"), "error: --batch-size must be a positive integer, got 0"),
    (("--micro-batch", "0"), "error: --micro-batch must be a positive integer, got 0"),
    (("--img-size", "0"), "error: --img-size must be a positive integer, got 0"),
    (("--stop-at", "-1"), "error: --stop-at must be a step >= 1, got -1"),
    # integers: "a finite number >= 0" before
    (("--warmup-steps", "-1"), "error: --warmup-steps must be an integer >= 0, got -1"),
    (("--workers", "-1"), "error: --workers must be an integer >= 0, got -1"),
    (("--lr", "0"), "error: --lr must be a finite number > 0, got 0.0"),
    (("--mixup", "-1"), "error: --mixup must be a finite number >= 0, got -1.0"),
    (("--seed", "-1"), "error: --seed must be an integer in [0, 2**64), got -1"),
    (("--precision", "fp8"), "error: unknown --precision 'fp8'; valid choices"),
    (("--device", "tpu"), "error: unknown --device 'tpu'; valid choices: 'cpu', 'cuda'"),
    # a setting named inside the message too; the user's quoted value is kept as typed
    (("--micro-batch", "3"), "error: --micro-batch 3 does not divide the per-process batch 8 (--batch-size 8 / 1 "
                             "processes)"),
    (("--randaug", "rand-total_steps"), "error: --randaug 'rand-total_steps': unknown or malformed part"),
    # a setting given with --set is named as typed there
    (("--set", "total_steps=0"), "error: total_steps must be a positive integer, got 0"),
])
def test_bad_setting_names_the_flag_as_typed(data: Path, tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    quick = [a for a in QUICK if a not in ("--randaug", "")] if "--randaug" in args else QUICK
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", *quick, *args)
    assert needle in text


def test_eval_every_epochs_beyond_the_run_means_eval_at_the_end(data: Path, tmp_path: Path) -> None:
    # 1e308 * 3 steps per epoch is inf: an OverflowError after recipe.json was written
    code, text = _train(str(data), "--out", str(tmp_path / "run"), "--model", "simplevit_digits", "--steps", "2",
                        "--set", "eval_every_epochs=1e308", *QUICK)
    assert code == 0, text
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if "val_top1" in r] == [2]


@pytest.mark.parametrize(("model", "needle"), [
    ("simplevit_s16.nope", "model 'simplevit_s16' has no pretrained tag 'nope'; valid tags: i1k_90ep, i1k_150ep, "
                           "i1k_300ep"),  # timm: RuntimeError: Invalid pretrained tag (nope)
])
def test_unknown_pretrained_tag_lists_the_tags(data: Path, tmp_path: Path, model: str, needle: str) -> None:
    text = _refused(tmp_path / "run", str(data), "--model", model, "--steps", "1", *QUICK)
    assert needle in text


def test_pretrained_for_a_model_without_weights(data: Path, tmp_path: Path) -> None:
    # timm: "RuntimeError: No pretrained weights exist for simplevit_ti16" traceback
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_ti16", "--pretrained", "--steps", "1", *QUICK)
    assert "model 'simplevit_ti16' has no published weights for --pretrained" in text
    assert "models with weights: simplevit_s16" in text and "drop --pretrained" in text


def test_init_and_pretrained_together_are_refused(data: Path, tmp_path: Path) -> None:
    # --init used to win silently while `"pretrained": true` went into recipe.json, training.json and the card
    text = _refused(tmp_path / "run", str(data), "--init", str(default_model_folder()), "--pretrained", "--steps", "1",
                    *QUICK)
    assert "--pretrained and --init both choose the starting weights" in text


def test_corrupt_or_mismatched_init_file_names_the_file(data: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "bad.safetensors"
    garbage.write_bytes(b"not a safetensors file")  # was: SafetensorError traceback
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--init", str(garbage), "--steps", "1",
                    *QUICK)
    assert f"--init {str(garbage)!r}: cannot use this weights file" in text and "not a readable safetensors" in text
    pickle_junk = tmp_path / "bad.pt"
    pickle_junk.write_bytes(b"garbage")  # was: UnpicklingError, a paragraph about weights_only
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--init", str(pickle_junk), "--steps",
                    "1", *QUICK)
    assert "not a weights-only torch file" in text
    cut = tmp_path / "cut.pt"  # a copy cut short: RuntimeError "PytorchStreamReader failed reading zip archive"
    torch.save({"w": torch.zeros(1000)}, cut)
    cut.write_bytes(cut.read_bytes()[:1000])
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--init", str(cut), "--steps", "1",
                    *QUICK)
    assert f"--init {str(cut)!r}: cannot use this weights file" in text and "is the file complete?" in text
    # the shipped digits weights loaded into the preset's default S/16: was a CheckpointMismatchError traceback
    digits_weights = default_model_folder() / "model.safetensors"
    text = _refused(tmp_path / "run", str(data), "--init", str(digits_weights), "--steps", "1", *QUICK)
    assert f"--init {str(digits_weights)!r}: cannot use this weights file (read as --model simplevit_s16)" in text
    assert "missing keys (96)" in text and "pass the file's architecture with --model" in text
    small = tmp_path / "other.safetensors"
    save_file({"pos_embed": torch.zeros(1, 4, 8)}, str(small))
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--init", str(small), "--steps", "1",
                    *QUICK)
    assert "checkpoint does not match the model" in text


def test_flag_and_set_for_the_same_setting_are_refused(data: Path, tmp_path: Path) -> None:
    # `--lr 1e-3 --set lr=3e-3`: --set used to win without a word
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--lr", "1e-3", "--set", "lr=3e-3",
                    "--steps", "1", *QUICK)
    assert "--lr and --set lr=3e-3 both set lr; pass one of them" in text
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--steps", "1", "--set",
                    "total_steps=2", *QUICK)
    assert "--steps and --set total_steps=2 both set total_steps" in text
    # two --set for one setting: the last one used to win without a word
    text = _refused(tmp_path / "run", str(data), "--model", "simplevit_digits", "--steps", "1", "--set", "lr=1e-3",
                    "--set", "lr=2e-3", *QUICK)
    assert "--set lr is given twice; pass it once" in text


def test_out_holding_something_else_is_refused(data: Path, tmp_path: Path) -> None:
    # checkpoints/, model/ and recipe.json used to be mixed into any existing folder
    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    code, text = _train(str(data), "--out", str(other), "--model", "simplevit_digits", "--steps", "1", *QUICK)
    assert code == 2 and f"--out {str(other)!r} is not a run folder (it holds notes.txt)" in text, text
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    code, text = _train("--preset", "digits", "--out", str(other), "--steps", "1", *QUICK)
    assert code == 2 and "is not a run folder" in text, text  # before the digits data is written into it
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_out_holding_only_the_jobs_own_log_is_a_run_folder(data: Path, tmp_path: Path) -> None:
    # `hub-vit train ... | tee run/train.log` and SLURM's `--output=run/%j.out` create the file before hub-vit starts
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("")
    (run / "1234.out").write_text("")
    code, text = _train(str(data), "--out", str(run), "--model", "simplevit_digits", "--steps", "1", *QUICK)
    assert code == 0 and (run / "model").is_dir(), text


def test_diverging_lr_is_one_line(data: Path, tmp_path: Path) -> None:
    # FloatingPointError("gradient norm is inf ...; lower --lr") was not caught: a traceback
    code, text = _train(str(data), "--out", str(tmp_path / "run"), "--model", "simplevit_digits", "--steps", "3",
                        "--lr", "1e30", *QUICK)
    assert code == 2 and "error: gradient norm is" in text and "lower --lr" in text and "Traceback" not in text
    # before its first checkpoint: the run folder it created (recipe.json alone) used to be left behind
    assert not (tmp_path / "run").exists()
    code, text = _train(str(data), "--out", str(tmp_path / "kept"), "--model", "simplevit_digits", "--steps", "3",
                        "--lr", "1e30", "--set", "checkpoint_every_steps=1", *QUICK)
    assert code == 2 and "error: gradient norm is" in text, text
    assert (tmp_path / "kept" / "checkpoints").is_dir()  # steps done before it diverged: resumable, kept


def test_install_to_with_own_data_is_refused(data: Path, tmp_path: Path) -> None:
    # installed a model of the user's classes as the default model, with digit samples named 0..9 it never saw
    text = _refused(tmp_path / "run", str(data), "--preset", "digits", "--steps", "1", "--install-to",
                    str(tmp_path / "inst"), *QUICK)
    assert "--install-to installs the default digits model" in text and "leave out DATA" in text
    assert not (tmp_path / "inst").exists()


def test_warmup_longer_than_the_run_is_a_one_line_warning(data: Path, tmp_path: Path) -> None:
    # the docs' fine-tune command on a Flowers-sized set ran 20 steps of a 200-step warm-up: the lr rose for the whole
    # run and ended at its peak; the only sign was timm's "Cosine annealing scheduler will have no effect ..."
    code, text = _train(str(data), "--out", str(tmp_path / "run"), "--model", "simplevit_digits", "--steps", "3",
                        *QUICK, "--warmup-steps", "20")
    assert code == 0, text
    assert ("warning: the warm-up (20 steps) is not shorter than the run (3 steps): the learning rate rises for the "
            "whole run and never decays; for a cosine decay pass e.g. --warmup-steps 1") in text
    assert "Cosine annealing" not in text and "TrainingWarning" not in text
    code, text = _train(str(data), "--out", str(tmp_path / "run2"), "--model", "simplevit_digits", "--steps", "3",
                        *QUICK, "--warmup-steps", "2")
    # the one warning left: its 6 held-out images are too few to calibrate the out-of-domain score
    warnings = [line for line in text.splitlines() if line.startswith("warning:")]
    assert code == 0 and len(warnings) == 1 and "out-of-domain score is not calibrated" in warnings[0], text



def test_a_run_folder_another_process_trains_is_refused_naming_it(data: Path, tmp_path: Path) -> None:
    # was: a second `hub-vit train` of the same --out trained alongside the first; checkpoints of both runs, and
    # metrics.jsonl steps 120, 15, 125 interleaved
    import subprocess
    import sys

    from hub_vit.train.recipe import Recipe
    from hub_vit.train.run_folder import RunFolderError

    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom hub_vit.train.run_folder import claimed\n"
                               f"with claimed({str(out)!r}):\n    print('held', flush=True)\n    sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        text = _refused(out, str(data), *QUICK, "--stop-at", "1")  # nothing written
        assert f"error: run folder '{out}' is being trained by another process (pid {holder.pid}): wait for it to " \
               "end" in text, text
        with pytest.raises(RunFolderError, match=f"pid {holder.pid}"):  # the library's own check, too
            from hub_vit.train.loop import train
            train(Recipe(), data, out / "sub" / "..", stop_at=1)  # the same folder, named another way
    finally:
        holder.kill()
        holder.wait()
    code, text = _train(str(data), "--out", str(out), *QUICK, "--stop-at", "1")  # its holder gone: trained
    assert code == 0, text


def test_a_model_named_with_its_tag_starts_from_that_tag_s_weights(data: Path, tmp_path: Path) -> None:
    # was: `--model NAME.TAG` trained from random weights, exit 0, while the card said "initialised from NAME.TAG
    # (random init, big_vision scheme)"; in export, rollout and serve a tag means its weights
    text = _refused(tmp_path / "scratch", str(data), "--model", "simplevit_digits.sklearn_digits", "--scratch",
                    "--steps", "1", *QUICK)
    assert "model 'simplevit_digits.sklearn_digits' names the published weights 'sklearn_digits', but the run starts " \
           "from random weights" in text and "('simplevit_digits') to train from scratch" in text, text
    code, text = _train(str(data), "--model", "simplevit_digits.sklearn_digits", "--steps", "1", *QUICK, "--out",
                        str(tmp_path / "run"))
    assert code == 0, text
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["pretrained"] is True
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "simplevit_digits.sklearn_digits (published weights)" in card, card


def test_a_run_folder_that_cannot_be_written_is_named_before_anything_runs(data: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # was: "error: Permission denied: '/ro/run'", exit 1, where convert, export and rollout name --out (exit 2)
    import errno
    import tempfile

    read_only = tmp_path / "ro"
    read_only.mkdir()
    real = tempfile.mkdtemp

    def mkdtemp(*args: object, dir: str | Path | None = None, **kwargs: object) -> str:  # noqa: A002
        if dir is not None and Path(dir) == read_only:  # as on a read-only mount (root ignores modes)
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    text = _refused(read_only / "run", str(data), "--model", "simplevit_digits", "--steps", "1", *QUICK)
    assert f"cannot write the run folder --out {str(read_only / 'run')!r}: Read-only file system in " \
           f"{str(read_only)!r}; choose another folder" in text, text


def test_device_cuda_without_a_gpu_exits_3_as_serve_does(data: Path, tmp_path: Path, monkeypatch) -> None:
    # was exit 2 ("bad input"): nothing asked is wrong, this host cannot run it (README's exit codes: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, text = _train(str(data), "--out", str(tmp_path / "run"), "--model", "simplevit_digits", "--device", "cuda",
                        *QUICK)
    assert code == 3 and "error: device 'cuda' was asked for but torch sees no CUDA device; use --device cpu" in text
    assert "Traceback" not in text and not (tmp_path / "run").exists()
