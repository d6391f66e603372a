"""`hub-vit train`: the "Better plain ViT baselines" recipe on an image folder (or the bundled digits).

    hub-vit train DATA --out runs/s16                       # paper config: S/16, batch 1024, 90 epochs
    hub-vit train DATA --out runs/ft --init FOLDER --epochs 10 --lr 3e-4 --warmup-steps 20 --batch-size 64
    hub-vit train --preset digits --out runs/digits           # the shipped default model
    torchrun --nproc_per_node 8 -m hub_vit.train DATA --out runs/s16   # DDP, same global batch

Every recipe setting can be changed with `--set key=value` (see docs/training.md); the run folder records them all.
Running the same command again resumes from the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from hub_vit.cli.app import (
    CANNOT_NOW,
    DISK_REFUSED_ERRNOS,
    app,
    console,
    download_status,
    err_console,
    fail,
    in_flag_words,
    write_failed,
)
from hub_vit.cli.path_option import given_path

PRESETS = ("vit_s16_i1k", "digits")
# the flags whose name is not the setting's (`_flag`); recipe settings without a flag of their own only have --set
FLAG_NAMES = {"total_epochs": "--epochs", "total_steps": "--steps"}


def _preset_default(setting: str) -> str:
    """` (default 0.001 for vit_s16_i1k, 0.003 for digits)` for --help: a flag that defaults to its preset's value
    has no default of its own for typer to show, and the values were only in docs/training.md."""
    from hub_vit.train.digits import DIGITS_RECIPE  # light: no torch (`hub-vit --help` loads this module)
    from hub_vit.train.recipe import VIT_S16_I1K

    def shown(value: object) -> str:
        return repr(value) if value == "" else f"{value:g}" if isinstance(value, float) else str(value)

    values = [(name, getattr(recipe, setting)) for name, recipe in zip(PRESETS, (VIT_S16_I1K, DIGITS_RECIPE),
                                                                        strict=True)]
    if len({shown(v) for _, v in values}) == 1:
        return f" (default {shown(values[0][1])}, both presets)"
    return " (default " + ", ".join(f"{shown(v)} for {name}" for name, v in values) + ")"


@app.command("train")
def train_command(
    data: Path | None = typer.Argument(None, help="Data folder with train/<class>/* and val/<class>/* images.",
                                       parser=given_path),
    out: Path = typer.Option(..., "--out", "-o", help="Run folder (recipe.json, metrics.jsonl, checkpoints/, model/).",
                             parser=given_path),
    preset: str = typer.Option("vit_s16_i1k", help=f"Starting recipe: {', '.join(PRESETS)}."),
    model: str | None = typer.Option(None, help="Registered architecture, e.g. simplevit_s16 (`hub-vit models`)."
                                     + _preset_default("model")),
    pretrained: bool | None = typer.Option(None, "--pretrained/--scratch", help="Start from published weights."),
    init: Path | None = typer.Option(None, help="Fine-tune from a hub-vit model folder (hf-hub:ORG/NAME: one on the "
                                                "Hugging Face Hub) or weights file.",
                                     parser=given_path),
    img_size: int | None = typer.Option(None, help="Training/eval image size." + _preset_default("img_size")),
    batch_size: int | None = typer.Option(None, help="Global batch (all processes, all accumulation steps)."
                                          + _preset_default("batch_size")),
    micro_batch: int | None = typer.Option(None, help="Images per process per forward pass (gradient accumulation)."),
    epochs: float | None = typer.Option(None, help="Training epochs (big_vision total_epochs)."
                                        + _preset_default("total_epochs")),
    steps: int | None = typer.Option(None, help="Optimizer steps; overrides --epochs."),
    lr: float | None = typer.Option(None, help="Peak learning rate." + _preset_default("lr")),
    wd: float | None = typer.Option(None, help="big_vision decoupled weight decay (AdamW gets wd / lr)."
                                    + _preset_default("wd")),
    warmup_steps: int | None = typer.Option(None, help="Linear warm-up steps before the cosine decay."
                                            + _preset_default("warmup_steps")),
    mixup: float | None = typer.Option(None, help="Mixup Beta(p, p) concentration; 0 turns it off."
                                       + _preset_default("mixup")),
    randaug: str | None = typer.Option(None, help="timm RandAugment string, '' turns it off."
                                       + _preset_default("randaug")),
    seed: int | None = typer.Option(None, help="Seed of the init, data order, augmentation and mixup."
                                    + _preset_default("seed")),
    precision: str | None = typer.Option(None, help="auto (bf16 autocast on CUDA), fp32 or bf16."),
    workers: int | None = typer.Option(None, help="Data-loading worker processes per training process "
                                                   "(default: the preset's, at most the CPUs this process may use)."),
    set_: list[str] = typer.Option([], "--set", help="Any recipe setting: --set eval_crop_pct=1.0 (repeatable)."),
    device: str | None = typer.Option(None, help="cpu or cuda (default: cuda when available)."),
    threads: int | None = typer.Option(None, help="torch CPU threads per process (default: torch's choice)."),
    stop_at: int | None = typer.Option(None, help="Stop (with a checkpoint) after this step; rerun with a larger "
                                                   "--stop-at, or without it, to resume."),
    install_to: Path | None = typer.Option(None, help="digits preset: copy the finished model folder here, with "
                                                       "sample images and a card stub.", parser=given_path),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the progress bar."),
) -> None:
    """Train or fine-tune a ViT with the "Better plain ViT baselines" recipe (resumes if --out has checkpoints)."""
    _check_flags(threads, preset, install_to, data, out)
    from hub_vit.train.run_folder import RunFolderError, claimed

    try:  # before anything is written there (the digits data, too); held by the process that writes the folder
        with claimed(out) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext():
            _train(out, data, preset, install_to, flags=dict(
                model=model, pretrained=pretrained, img_size=img_size, batch_size=batch_size, micro_batch=micro_batch,
                total_epochs=epochs, total_steps=steps, lr=lr, wd=wd, warmup_steps=warmup_steps, mixup=mixup,
                randaug=randaug, seed=seed, precision=precision, workers=workers), set_=set_,
                options=dict(init=init, device=device, stop_at=stop_at, progress=progress))
    except RunFolderError as exc:  # another process trains it
        raise fail(str(exc)) from None


def _train(out: Path, data: Path | None, preset: str, install_to: Path | None, *, flags: dict[str, Any],
           set_: list[str], options: dict[str, Any]) -> None:
    """The run, once its folder is held: `flags` are the recipe's settings given as flags, `options` train()'s."""
    created = _created_folder(out)
    for item in set_:  # `--lr 1e-3 --set lr=3e-3` used to let --set win without a word
        key = _set_key(item)
        if flags.get(key) is not None:
            raise fail(f"{_flag(key)} and --set {item} both set {key}; pass one of them")
    result = _run(preset, flags, set_, data, out, created, options)
    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 reports
        return
    _report(result, install_to)


def _unused_model_flag(model: str | None, init: Path | str | None) -> str | None:
    """Why `--model` is not what is trained, when `--init` names a model folder of another architecture (the folder
    decides, as documented; a contradicting --model was dropped without a word), else None."""
    from hub_vit.train.models import init_folder_architecture

    architecture = init_folder_architecture(init)
    if model is None or architecture is None or architecture == model:
        return None
    return (f"--model {model} is not used: --init {str(init)!r} is a model folder, and its architecture "
            f"({architecture}) is what is trained; leave --model out, or start from {model} (--pretrained)")


def _check_flags(threads: int | None, preset: str, install_to: Path | None, data: Path | None, out: Path) -> None:
    """Refused before anything is written or trained."""
    from hub_vit.train.run_folder import RunFolderError, check_run_folder_path

    if threads is not None:
        import torch

        if threads < 1:
            raise fail(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    if preset not in PRESETS:
        raise fail(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    if install_to is not None and preset != "digits":
        raise fail("--install-to installs the default model (digit samples, sklearn-digits card) and needs "
                   "--preset digits; the finished model folder of any run is OUT/model")
    if install_to is not None and data is not None:
        # the default model's samples, held-out check and card are scikit-learn's digits: a model trained on DATA
        # installed with them would claim digit samples (named 0..9) for classes it does not have
        raise fail("--install-to installs the default digits model and trains on the bundled digits: leave out DATA "
                   f"({str(data)!r}); the finished model folder of a run on your own data is OUT/model")
    if install_to is not None:
        from hub_vit.folder import check_output_folder

        try:  # before a training run, not after it: the folder is replaced, so it must be a model folder
            check_output_folder(install_to, overwrite=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise fail(f"--install-to: {exc}") from None
    try:  # before the digits data is written into it: a file there would end in a NotADirectoryError traceback
        check_run_folder_path(out)
    except RunFolderError as exc:
        raise fail(str(exc)) from None


def _settings_as_flags(message: str) -> str:
    """A TrainingWarning's advice in flag words: `warmup_steps=2` -> `--warmup-steps 2` (outside quoted values: a
    path may hold `lr=`)."""
    import re

    from hub_vit.train.recipe import FIELDS

    pattern = re.compile(rf"(?<![\w-])({'|'.join(FIELDS)})=")
    parts = re.split(r"""('[^']*'|"[^"]*")""", message)
    parts[::2] = [pattern.sub(lambda m: f"{_flag(m.group(1))} ", part) for part in parts[::2]]
    return "".join(parts)


def _flag(setting: str) -> str:
    """The flag of a recipe setting (or of train()'s `stop_at`, `device`): `total_steps` -> `--steps`."""
    return FLAG_NAMES.get(setting, "--" + setting.replace("_", "-"))


def _set_key(item: str) -> str:
    """The setting a `--set KEY=VALUE` item changes, as the recipe spells it."""
    return item.partition("=")[0].strip().replace("-", "_")


def _run(preset: str, flags: dict[str, Any], set_: list[str], data: Path | None, out: Path, created: Path | None,
         options: dict[str, Any]) -> Any:
    """Train with the preset's recipe changed by the flags; clean errors end the command with one line and no
    half-made run folder."""
    from hub_vit.conversion.download import DownloadError
    from hub_vit.domain import Domain
    from hub_vit.network import HubUnreachableError
    from hub_vit.train import digits
    from hub_vit.train.data import DataFolderError
    from hub_vit.train.distributed import NoCudaDevice
    from hub_vit.train.loop import TrainingWarning
    from hub_vit.train.models import ModelChoiceError
    from hub_vit.train.recipe import VIT_S16_I1K, SettingError
    from hub_vit.train.run_folder import RunFolderError, SettingChangeError

    recipe = digits.DIGITS_RECIPE if preset == "digits" else VIT_S16_I1K
    try:
        recipe = recipe.replace(**{k: v for k, v in flags.items() if v is not None}).with_overrides(set_)
        if "." in recipe.model and flags["pretrained"] is None and options["init"] is None and \
                not any(_set_key(item) == "pretrained" for item in set_):
            recipe = recipe.replace(pretrained=True)  # `--model NAME.TAG` starts from that tag's weights, as elsewhere
        dataset_info: dict[str, Any] = {}
        architecture = domain = None
        if data is None:
            if preset != "digits":
                raise fail("give a DATA folder (train/<class>/*, val/<class>/*), or use --preset digits")
            data = digits.write_image_folder(out / "data")
            dataset_info = digits.dataset_info()
            architecture = recipe.model.partition(".")[0] if options["init"] is None else None  # the name, no tag
            domain = Domain(knows=digits.DOMAIN_KNOWS, examples="digits")
        with warnings.catch_warnings():  # restores showwarning and the filters afterwards
            warnings.simplefilter("always", TrainingWarning)
            warnings.showwarning = _show_warning(warnings.showwarning, TrainingWarning)
            unused = _unused_model_flag(flags.get("model"), options["init"])
            if unused:
                warnings.warn(unused, TrainingWarning, stacklevel=1)
            return _train_until_stopped(recipe, data, out, **options, architecture=architecture,
                                        dataset_info=dataset_info, domain=domain)
    except DownloadError as exc:  # --pretrained offline: the message names the URL to fetch by hand and the cache
        _discard_fresh_run_folder(out, created)
        raise _pretrained_download_failed(exc, recipe.model) from None
    except (HubUnreachableError, NoCudaDevice) as exc:  # --init hf-hub: neither reachable nor cached; no GPU here
        _discard_fresh_run_folder(out, created)
        raise fail(str(exc), code=CANNOT_NOW) from None
    except (SettingError, SettingChangeError) as exc:  # `--steps 0`: the library names `total_steps`
        _discard_fresh_run_folder(out, created)
        given = {_set_key(item) for item in set_}  # a setting given by --set keeps its name
        raise fail(in_flag_words(str(exc), [k for k in (*flags, "stop_at", "device") if k not in given],
                                  FLAG_NAMES)) from None
    except (ValueError, FileNotFoundError) as exc:
        if isinstance(exc, (DataFolderError, RunFolderError, ModelChoiceError)) or type(exc) in (ValueError,
                                                                                                 FileNotFoundError):
            _discard_fresh_run_folder(out, created)
            raise fail(str(exc)) from None
        raise
    except OSError as exc:  # the disk refused a write: full, read-only, over quota (a checkpoint, the metrics, data)
        if exc.errno not in DISK_REFUSED_ERRNOS:
            raise
        _discard_fresh_run_folder(out, created)
        raise _disk_refused(out, exc) from None
    except FloatingPointError as exc:  # "gradient norm is inf at step 2; lower --lr": a bad value, found by running
        _discard_fresh_run_folder(out, created)
        raise fail(str(exc)) from None
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the first step (e.g. while the digits data is written)
        _discard_fresh_run_folder(out, created)
        console.print("interrupted; checkpoints written before are kept, run the same command to resume")
        raise typer.Exit(128 + signal.SIGINT) from None
    except SystemExit as exc:  # SIGTERM outside the training steps, or a second one (hub_vit.cli's handler)
        if exc.code == 128 + signal.SIGTERM:
            _discard_fresh_run_folder(out, created)  # no half-made run folder
            console.print("stopped by SIGTERM; checkpoints written before are kept, run the same command to resume")
        raise


def _train_until_stopped(*args: Any, **kwargs: Any) -> Any:
    """`train()`'s result, also when a stop signal ended it: the API raises the signal again once the step is
    checkpointed (KeyboardInterrupt, SystemExit(143)), and the command reports it in one line with the shell's exit
    code (`_report`)."""
    from hub_vit.train.loop import stopped_by_signal, train

    try:
        return train(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit) as exc:
        result = stopped_by_signal(exc)
        if result is None:  # a second signal, or one outside the steps: `_run` handles it
            raise
        return result


def _pretrained_download_failed(exc: Exception, model: str) -> typer.Exit:
    """The download's own line (the URL, the cache, `hub-vit convert`), and, when this machine cannot download now,
    how this run can start from a copy of the file fetched elsewhere: the download's advice is written for
    conversion."""
    code = download_status(exc)
    hint = ""
    if code == CANNOT_NOW:
        hint = (f" To train from a copy of the file fetched elsewhere, pass it in place of --pretrained: --init "
                f"FILE.npz --model {model.partition('.')[0]}.")
    return fail(f"{exc}{hint}", code=code)


def _disk_refused(out: Path, exc: OSError) -> typer.Exit:
    """`error: cannot write to 'OUT': No space left on device` (exit 1), and whether the run can be resumed: the
    checkpoint being written was removed, those written before are kept."""
    from hub_vit.train.run_folder import nothing_trained

    resume = ("; the checkpoints written before are kept: make room and run the same command to resume"
              if out.is_dir() and not nothing_trained(out) else "")
    return write_failed(out, exc, resume)


def _report(result: Any, install_to: Path | None) -> None:
    from hub_vit.train import digits

    if result.interrupted:
        name = "Ctrl-C" if result.stop_signal in (None, signal.SIGINT) else signal.Signals(result.stop_signal).name
        console.print(f"stopped by {name} after step {result.step}/{result.total_steps}, checkpoint written"
                      f"{_before_model(result)}; run the same command to resume")
        raise typer.Exit(128 + (result.stop_signal or signal.SIGINT))  # 130 for Ctrl-C, 143 for SIGTERM
    if result.already_complete:  # a rerun of a finished command (a Makefile, a job script): nothing to do
        top1 = "" if result.val_top1 is None else f" (held-out top-1 {result.val_top1:.2%})"
        console.print(f"run already complete{top1}: the model folder is {escape(str(result.model_dir))}, left as it "
                      "is; choose a new --out to train again", soft_wrap=True)
    elif result.model_dir is None:
        # the same --stop-at would stop again at once: the run goes on only with a later stop or none
        console.print(f"stopped at step {result.step}/{result.total_steps}; to resume, run the same command with a "
                      f"larger --stop-at or without it")
        return
    else:
        console.print(f"held-out top-1 {result.val_top1:.2%} after {result.step} steps -> "
                      f"{escape(str(result.model_dir))}", soft_wrap=True)
    if install_to is not None and result.model_dir is not None:
        digits.install_default_model(result.model_dir, install_to)
        console.print(f"installed the model folder, samples and card stub in {escape(str(install_to))}",
                      soft_wrap=True)


def _before_model(result: Any) -> str:
    """What a run stopped after its last step lacks: its model folder, written by the rerun."""
    return " (the model folder is not written yet)" if result.step == result.total_steps else ""


def _created_folder(out: Path) -> Path | None:
    """The outermost folder that the run creates for `out` (`out` itself, or a missing parent); None when `out`
    exists."""
    if out.exists():
        return None
    top = out
    while not top.parent.exists():
        top = top.parent
    return top


def _discard_fresh_run_folder(out: Path, created: Path | None) -> None:
    """After a clean error, remove the run folder this command created (`created`: with the parents it made for it)
    while there is nothing to resume in it: no checkpoint, no model folder. A failure before the first checkpoint (a
    bad image or a diverging lr at step 0, `--preset digits` offline after writing its data) then leaves nothing
    behind, instead of a recipe.json alone. A folder that existed before is kept, and so is a run with a checkpoint
    (a bad image mid-run writes one and says how to resume). Not under torchrun: another rank may still be writing
    there."""
    from hub_vit.train.run_folder import RUN_ENTRIES, nothing_trained

    if created is None or os.environ.get("WORLD_SIZE", "1") != "1" or not out.is_dir() or not nothing_trained(out):
        return
    if any(p.name not in RUN_ENTRIES for p in out.iterdir()):  # not all of it written by the run: not ours to remove
        return
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    folder = out
    while folder != created:  # the parents created for it, each only while empty
        folder = folder.parent
        try:
            folder.rmdir()
        except OSError:
            return


def _show_warning(default, category: type[Warning]):
    """`warnings.showwarning` that prints the run's own warnings as one `warning:` line (not Python's
    'file:line: TrainingWarning: ...' with a source line), in flag words, and leaves every other warning to
    `default`."""
    def show(message, kind, filename, lineno, file=None, line=None):  # warnings.showwarning's signature
        if issubclass(kind, category):
            text = escape(_settings_as_flags(str(message)))
            err_console.print(f"[yellow]warning:[/] {text}", soft_wrap=True, emoji=False)
        else:
            default(message, kind, filename, lineno, file, line)
    return show
