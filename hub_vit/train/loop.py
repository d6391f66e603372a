"""`train()`: the big_vision training loop in PyTorch (one process, or one of many under `torchrun`).

Per optimizer step t (0-based): set lr = schedule(t); for each of `accum` micro-batches: mixup, forward (bf16
autocast on CUDA), softmax cross-entropy / accum, backward (DDP all-reduces on the last one); clip the global grad norm
to 1.0; AdamW step. The run folder holds `recipe.json`, `metrics.jsonl`, `checkpoints/` and, when the run is complete,
`model/` (a hub-vit model folder with `training.json`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import math
import os
import platform
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.loss import SoftTargetCrossEntropy
from torch.utils.data import DataLoader, Subset

from hub_vit.atomic import file_in_the_way
from hub_vit.conversion.download import sha256_file
from hub_vit.train import checkpoint as ckpt
from hub_vit.train import distributed
from hub_vit.train.data import (
    DataFolderError,
    EvalImages,
    SeededMixup,
    StreamBatches,
    TrainStream,
    check_headers,
    fingerprint,
    scan_split,
)
from hub_vit.train.models import build_model, init_folder_architecture
from hub_vit.train.recipe import Recipe
from hub_vit.train.schedule import current_lr, make_optimizer, make_scheduler
from hub_vit.weights_digest import state_dict_digest


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    total_steps: int
    model_dir: Path | None = None  # set when the run reached total_steps
    val_top1: float | None = None
    interrupted: bool = False  # Ctrl-C or SIGTERM: stopped after a step, with a checkpoint of it
    history: list[dict[str, Any]] = field(default_factory=list)
    stop_signal: int | None = None  # the signal that stopped the run (signal.SIGINT or signal.SIGTERM)


class TrainingWarning(UserWarning):
    """Something the run goes on with but the user should know: a warm-up longer than the run, data edited since the
    checkpoint, a run folder too old to record its data. The command line prints each as one `warning:` line."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _StopOnSignal:
    """Ctrl-C (SIGINT) and SIGTERM (`kill`, `timeout`, SLURM's scancel and time limit, systemd) end a single-process
    run after the current step, with a checkpoint of it, instead of losing every step since the last checkpoint (1000
    by default). After the first signal the previous handlers are back, so a second one interrupts at once (the
    checkpoint being written is a staging folder renamed into place: it is either complete or absent)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        self._restore()

    def __enter__(self) -> _StopOnSignal:
        if self.enabled:
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) == signal.SIG_IGN:  # ignored on purpose by whoever started us: keep it so
                    continue
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._handle:
                # getsignal/signal return None for a handler installed outside Python: signal.signal(signum, None)
                # raises TypeError, so the default action stands in for it
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._previous[signum]


def _ignore_stop_signals(worker_id: int) -> None:
    """Data-loader workers share the process group: Ctrl-C from the terminal, and SIGTERM from `timeout` or SLURM
    (which signal the whole group), must not kill them mid-step. The main process finishes the step, writes the
    checkpoint and stops; its loader shuts them down. A worker killed by the signal used to make torch raise 'DataLoader
    worker is killed by signal: Terminated' in the main process, even inside the clean-up of a checkpoint."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held by `_start_workers` until now


def _start_workers(loader: DataLoader) -> Iterator:
    """`iter(loader)`, with the stop signals held (blocked) in this thread while it starts the worker processes.

    A new worker installs torch's SIGTERM handler (which re-raises a SIGTERM not sent by its parent) before it runs
    `_ignore_stop_signals`; a group SIGTERM landing in between killed it, and the run failed instead of stopping
    after its step. The workers inherit the held signals and release them once they ignore them (a pending one is
    then dropped); here a pending one is delivered as soon as the mask is restored (to `_StopOnSignal` in a run)."""
    if not hasattr(signal, "pthread_sigmask"):  # not on Windows, where none of this applies
        return iter(loader)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class RunFolderError(ValueError):
    """The run folder belongs to another recipe (resuming it would silently change the experiment)."""


# What a run folder holds (`data` is the digits preset's image folder, written by the command line)
RUN_ENTRIES = frozenset({"recipe.json", "metrics.jsonl", "checkpoints", "model", "data"})
LOG_SUFFIXES = frozenset({".log", ".out", ".err"})  # files a run folder may hold besides its own


def train(recipe: Recipe, data_dir: str | Path, run_dir: str | Path, *, init: str | Path | None = None,
          device: str | None = None, stop_at: int | None = None, progress: bool = True,
          architecture: str | None = None, dataset_info: dict[str, Any] | None = None) -> TrainResult:
    """Train (or resume) the run in `run_dir` on `data_dir/{train,val}/<class>/<image>`.

    `stop_at`: stop after this global step (a checkpoint is written) without finishing the run; calling `train`
    again resumes from the newest checkpoint. Every input is checked before anything is written to `run_dir`.
    """
    run_dir, data_dir = Path(run_dir), Path(data_dir)
    recipe.micro_batch_for(distributed.world_size_from_env())  # a batch that cannot split fails before any setup
    d = distributed.setup(device)
    try:
        return _train(recipe, data_dir, run_dir, d, init, stop_at, progress, architecture, dataset_info or {})
    finally:
        distributed.teardown(d)


def _train(recipe: Recipe, data_dir: Path, run_dir: Path, d: distributed.Dist, init: str | Path | None,
           stop_at: int | None, progress: bool, architecture: str | None, dataset_info: dict[str, Any]) -> TrainResult:
    # ---- validate everything first: nothing is written for a bad batch size, data folder or recipe
    micro, accum = recipe.micro_batch_for(d.world_size)
    train_split = scan_split(data_dir, "train")
    val_split = scan_split(data_dir, "val", classes=train_split.classes)
    classes = train_split.classes
    total_steps = recipe.steps_for(len(train_split))
    if stop_at is not None and stop_at < 1:
        raise ValueError(f"stop_at must be a step >= 1, got {stop_at}")
    folder_architecture = init_folder_architecture(init)
    if folder_architecture is not None:  # record what is trained, not the preset's default `model`
        recipe = recipe.replace(model=folder_architecture)
    data = {"train": fingerprint(train_split), "val": fingerprint(val_split)}
    notes = _check_run_folder(run_dir, recipe, init, classes, data)
    check_headers(val_split)  # a damaged val image used to surface at the first eval, after (possibly) hours of steps
    try:  # timm builds the augmentation here, before anything is written, not in the first data-loader worker
        stream = TrainStream(train_split, recipe)
    except (AssertionError, KeyError) as exc:  # timm's RandAugment parser asserts; the recipe's own check is stricter
        raise ValueError(f"randaug {recipe.randaug!r}: timm refuses it ({exc or type(exc).__name__})") from None
    if recipe.warmup_steps >= total_steps and recipe.warmup_steps > 0:
        # timm's scheduler caps it silently (at total_steps - 1): the run would end at the peak lr, never annealed.
        # A warning, not an error: short trial runs of a preset (`--preset digits --steps 30`) do this on purpose.
        notes.append(f"the warm-up ({recipe.warmup_steps} steps) is not shorter than the run ({total_steps} steps): "
                     "the learning rate rises for the whole run and never decays; for a cosine decay pass e.g. "
                     f"--warmup-steps {max(1, total_steps // 10) if total_steps > 1 else 0}")
    torch.manual_seed(recipe.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
    model, source = build_model(recipe, len(classes), init)
    model.to(d.device)
    optimizer = make_optimizer(model, recipe)
    scheduler = make_scheduler(optimizer, recipe, total_steps)

    start_step, wall_before = 0, 0.0
    found = ckpt.latest(run_dir)
    if found is not None:
        extra = ckpt.load(found, model, optimizer, scheduler)
        start_step, wall_before = extra["step"], float(extra.get("wall_time_s", 0.0))
    if d.is_main:
        for note in notes:
            warnings.warn(note, TrainingWarning, stacklevel=3)
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.remove_staging(run_dir)  # left by a process killed while writing a checkpoint (SIGKILL, power loss)
        _atomic_write(run_dir / "recipe.json", json.dumps(_run_settings(recipe, init, classes, data), indent=2))
        _trim_metrics(run_dir / "metrics.jsonl", start_step)
    distributed.barrier(d)

    net: torch.nn.Module = model
    if d.enabled:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
    use_bf16 = recipe.precision == "bf16" or (recipe.precision == "auto" and d.device.type == "cuda")
    autocast = (lambda: torch.autocast(d.device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
    mixup = SeededMixup(recipe.mixup, len(classes)) if recipe.mixup > 0 else None
    soft_ce = SoftTargetCrossEntropy()

    end_step = min(total_steps, stop_at) if stop_at is not None else total_steps
    sampler = StreamBatches(recipe.batch_size, micro, accum, d.rank, d.world_size, start_step, end_step)
    loader = DataLoader(stream, batch_sampler=sampler, num_workers=recipe.workers,
                        worker_init_fn=_ignore_stop_signals, pin_memory=d.device.type == "cuda",
                        persistent_workers=False)
    steps_per_epoch = recipe.steps_per_epoch(len(train_split))  # exact (not rounded): as training.json's `epochs`
    eval_every = recipe.steps_every(recipe.eval_every_epochs, len(train_split))
    metrics_path = run_dir / "metrics.jsonl"
    history: list[dict[str, Any]] = []

    def log(record: dict[str, Any]) -> None:
        history.append(record)
        if d.is_main:
            with metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")

    bar = _Progress(enabled=progress and d.is_main, total=total_steps, start=start_step)
    step, t0, last_t, last_step = start_step, time.perf_counter(), time.perf_counter(), start_step
    loss_sum, val = 0.0, None
    batches = _start_workers(loader)
    model.train()
    stop = _StopOnSignal(enabled=not d.enabled)  # DDP ranks would stop at different steps and hang
    saved_step = start_step if found is not None else -1

    def checkpoint() -> None:
        nonlocal saved_step
        if saved_step == step:
            return
        if d.is_main:
            ckpt.save(run_dir, step, model, optimizer, scheduler,
                      extra=dict(wall_time_s=wall_before + time.perf_counter() - t0))
        distributed.barrier(d)
        saved_step = step

    def log_losses() -> None:
        """One metrics record for the steps since the last one (mean loss; the last step's lr and grad norm)."""
        nonlocal last_t, last_step, loss_sum
        now = time.perf_counter()
        mean_loss = distributed.all_sum(d, [loss_sum])[0] / d.world_size / (step - last_step)
        rate = (step - last_step) * recipe.batch_size / max(now - last_t, 1e-9)
        log(dict(step=step, epoch=round(step / steps_per_epoch, 3), loss=mean_loss, lr=lr,
                 grad_norm=float(grad_norm), img_per_s=round(rate, 1)))
        bar.update(step, mean_loss, lr, rate)
        last_t, last_step, loss_sum = now, step, 0.0

    lr, grad_norm = 0.0, torch.zeros(())  # of the last step done; set by the first
    with bar, stop, _shut_down_workers(batches):
        while step < end_step:
            scheduler.step_update(num_updates=step)  # lr for update `step` (optax: count before increment)
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for k in range(accum):
                try:
                    images, labels = next(batches)
                except DataFolderError as exc:  # a damaged training image: one line naming it, not a worker traceback
                    error = DataFolderError.from_worker(exc)
                    if d.enabled or step == start_step:  # no rank may wait for the others here / nothing new to save
                        raise error from None
                    # the weights are those of `step` completed steps (this one's update has not been applied): keep
                    # them, so that replacing the file (same name) and rerunning loses nothing
                    if step > last_step:
                        log_losses()  # the resumed run starts after `step`: these steps would never be logged
                    checkpoint()
                    raise DataFolderError(f"{error}; checkpoint of step {step} written: replace the file with a "
                                          "readable image of the same name and run the same command to resume "
                                          "(removing it changes the run's length and is refused)") from None
                images = images.to(d.device, non_blocking=True)
                labels = labels.to(d.device, non_blocking=True)
                if mixup is not None:
                    mixup.reseed(recipe.seed, 3, step, d.rank * accum + k)  # global micro-batch index
                    images, targets = mixup(images, labels)  # (B, C, H, W), (B, classes) soft
                else:
                    targets = F.one_hot(labels, len(classes)).float()
                sync = k == accum - 1 or not d.enabled
                with (contextlib.nullcontext() if sync else net.no_sync()), autocast():
                    logits = net(images)
                    loss = soft_ce(logits.float(), targets) / accum
                loss.backward()
                step_loss += float(loss.detach())
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip_norm or math.inf)
            if not torch.isfinite(grad_norm):
                raise FloatingPointError(f"gradient norm is {float(grad_norm)} at step {step}; lower --lr")
            lr = current_lr(optimizer)
            optimizer.step()
            step += 1
            loss_sum += step_loss
            if step % recipe.log_every_steps == 0 or step == end_step or stop.requested:
                log_losses()
            # the checkpoint comes before the eval: an eval that fails (a damaged val image, out of memory) must not
            # cost the steps since the last checkpoint
            if step % recipe.checkpoint_every_steps == 0 or step == end_step or stop.requested:
                checkpoint()
            if step % eval_every == 0 or step == total_steps:
                val = evaluate(net, val_split, recipe, d, autocast)
                log(dict(step=step, epoch=round(step / steps_per_epoch, 3), **val))
                bar.note(f"step {step}: val top-1 {val['val_top1']:.2%}  loss {val['val_loss']:.4f}")
                model.train()
            if stop.requested:
                checkpoint()  # the signal may have come during the eval
                break

    result = TrainResult(run_dir=run_dir, step=step, total_steps=total_steps, history=history,
                         interrupted=stop.requested and step < total_steps, stop_signal=stop.signum)
    if step < total_steps:
        return result
    if val is None:  # resumed a finished run: measure again
        val = evaluate(net, val_split, recipe, d, autocast)
    digests = distributed.all_gather(d, state_dict_digest(model.state_dict()))
    if len(set(digests)) != 1:
        raise RuntimeError(f"processes ended with different weights (sha256 per rank: {digests})")
    result.val_top1 = val["val_top1"]
    if d.is_main:
        training = _training_record(recipe, data_dir, train_split, val_split, total_steps, val, source, d, micro,
                                    accum, wall_before + time.perf_counter() - t0, digests, dataset_info)
        result.model_dir = export_model(model, run_dir / "model", recipe, classes, training, architecture)
    distributed.barrier(d)
    result.model_dir = run_dir / "model"
    return result


@torch.no_grad()
def evaluate(net: torch.nn.Module, split, recipe: Recipe, d: distributed.Dist, autocast=contextlib.nullcontext
             ) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy on the eval split (each process a strided share, summed)."""
    net.eval()
    data = EvalImages(split, recipe)
    share = Subset(data, range(d.rank, len(data), d.world_size))
    loader = DataLoader(share, batch_size=min(256, max(len(share), 1)), num_workers=min(recipe.workers, 2),
                        worker_init_fn=_ignore_stop_signals)
    correct = total = loss = 0.0
    batches = _start_workers(loader)
    with _shut_down_workers(batches):  # also when the loop body raises (a second Ctrl-C during the forward pass)
        for images, labels in _one_line_errors(batches):
            images, labels = images.to(d.device), labels.to(d.device)
            with autocast():
                logits = net(images).float()  # (B, classes)
            correct += float((logits.argmax(-1) == labels).sum())
            loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            total += len(labels)
    correct, total, loss = distributed.all_sum(d, [correct, total, loss])
    return dict(val_top1=correct / total, val_loss=loss / total, val_images=int(total))


def export_model(model: torch.nn.Module, folder: Path, recipe: Recipe, classes: tuple[str, ...],
                 training: dict[str, Any], architecture: str | None) -> Path:
    """The finished run as a hub-vit model folder (timm + transformers), with `training.json` inside."""
    from hub_vit.folder import save_model_folder
    from hub_vit.model_cards import write_card_or_remove

    pretrained_cfg = dict(
        input_size=(3, recipe.img_size, recipe.img_size), crop_pct=recipe.eval_crop_pct, crop_mode="center",
        interpolation=recipe.interpolation, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), num_classes=len(classes),
    )
    model = model.to("cpu").eval()
    folder = save_model_folder(model, folder, labels=list(classes), pretrained_cfg=pretrained_cfg,
                               architecture=architecture,
                               extra_files={"training.json": json.dumps(training, indent=2) + "\n"}, overwrite=True)
    write_card_or_remove(folder)  # the card is rendered from training.json; no card, no folder
    return folder


# ------------------------------------------------------------------------------------------------------ helpers
def _one_line_errors(batches):
    """The loader's batches; a DataFolderError raised in a worker comes out with its own one-line message."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except DataFolderError as exc:
            raise DataFolderError.from_worker(exc) from None
        yield batch


@contextlib.contextmanager
def _shut_down_workers(batches):
    """Stop the loader's worker processes when the loop ends, also by an exception. The workers ignore SIGTERM
    (`_ignore_stop_signals`), so they must be told to exit: left to garbage collection, an iterator kept alive by
    the exception's traceback outlives the interpreter's exit, where multiprocessing terminates its daemon children
    with SIGTERM and waits for them, forever."""
    try:
        yield batches
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)  # torch's multi-process iterator; none with 0 workers
        if shutdown is not None:
            shutdown()


def _run_settings(recipe: Recipe, init: str | Path | None, classes: tuple[str, ...],
                  data: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `recipe.json` records, and what a resumed run must match: the recipe, the starting weights (resolved
    path and sha256 of the weights file), the classes and a fingerprint of the data (`data.fingerprint`)."""
    return {**recipe.to_dict(), **_init_settings(init), "classes": list(classes), "data": data}


def _init_settings(init: str | Path | None) -> dict[str, Any]:
    """`init` as an absolute path (a resumed job may start in another directory, or name it another way) and the
    sha256 of its weights file (a folder's model.safetensors), so that moved weights resume and replaced ones do
    not."""
    if init is None:
        return {"init": None, "init_sha256": None}
    path = Path(init)
    weights = path / "model.safetensors" if path.is_dir() else path
    return {"init": str(path.resolve()), "init_sha256": _sha256(weights) if weights.is_file() else None}


def _sha256(path: Path) -> str:
    info = path.stat()
    return _sha256_of(str(path.resolve()), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    """Cached per (file, size, mtime): the run folder check and recipe.json both need it, and an H/14 file is
    2.5 GB."""
    return sha256_file(path)


def check_run_folder_path(run_dir: str | Path) -> None:
    """RunFolderError naming --out when `run_dir` (or a parent) is a file: checked before anything is written, also
    the digits data the CLI puts inside the run folder (else a NotADirectoryError traceback)."""
    run_dir = Path(run_dir)
    blocker = file_in_the_way(run_dir)
    if blocker is not None:
        where = "" if blocker == run_dir else f" (its parent {str(blocker)!r} is a file)"
        raise RunFolderError(f"--out {str(run_dir)!r} cannot be a run folder{where}: a file is in the way; choose a "
                             "folder path")
    if run_dir.is_dir() and not (run_dir / "recipe.json").is_file():
        # an existing folder of something else (a project, a folder of runs) would get checkpoints/, model/ and
        # recipe.json mixed into it
        # the job's own log (`| tee run/train.log`, SLURM's `--output=run/%j.out`) is written before hub-vit starts
        foreign = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith(".") and p.name not in RUN_ENTRIES
                         and not (p.is_file() and p.suffix in LOG_SUFFIXES))
        if foreign:
            listed = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise RunFolderError(f"--out {str(run_dir)!r} is not a run folder (it holds {listed}); choose a new or "
                                 "empty folder")


def _check_run_folder(run_dir: Path, recipe: Recipe, init: str | Path | None, classes: tuple[str, ...],
                      data: dict[str, Any] | None = None) -> list[str]:
    """RunFolderError when resuming `run_dir` would change the experiment; returns the warnings to print (data edited
    in place, a val split that changed, a run folder that predates the data fingerprint)."""
    check_run_folder_path(run_dir)
    saved = run_dir / "recipe.json"
    if not saved.is_file():
        return []
    if ckpt.latest(run_dir) is None and not (run_dir / "model").exists():
        # a run that failed before its first checkpoint (`--lr` too high, a bad image): nothing trained to protect,
        # and the corrected command (the error's own advice) must be able to start over in the same folder
        return []
    old = json.loads(saved.read_text())
    new = _run_settings(recipe, init, classes, data)
    if "classes" in old and old["classes"] != new["classes"]:  # runs from before it was recorded: not checked
        added = sorted(set(new["classes"]) - set(old["classes"]))
        removed = sorted(set(old["classes"]) - set(new["classes"]))
        raise RunFolderError(f"run folder {str(run_dir)!r} was started on other classes (added: {added or 'none'}, "
                             f"removed: {removed or 'none'}); its head and labels would not match: resume with the "
                             "same data or choose a new --out folder")
    # do not change the result, or compared below
    ignore = {"workers", "log_every_steps", "checkpoint_every_steps", "classes", "data", "init", "init_sha256"}
    if init_folder_architecture(init) is not None:
        ignore.add("model")  # the folder (compared as `init`) decides it; runs before the fix recorded the default
    diff = {k: (old.get(k), v) for k, v in new.items() if k not in ignore and old.get(k) != v}
    init_change = _init_change(old, new)
    if init_change:
        diff["init"] = init_change
    if diff:
        lines = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise RunFolderError(f"run folder {str(run_dir)!r} was started with another recipe ({lines}); "
                             "resume it with the same settings or choose a new --out folder")
    if data is None:
        return []
    if not isinstance(old.get("data"), dict):
        return [f"run folder {str(run_dir)!r} was started before hub-vit recorded a fingerprint of the data: the "
                "data is not compared with the data the checkpoint was trained on"]
    notes = []
    for split in ("train", "val"):
        change = _data_change(split, old["data"].get(split), data[split])
        if change is None:
            continue
        kind, text = change
        if split == "train" and kind != "sizes":
            raise RunFolderError(f"{text}; the run's length, learning-rate schedule and image order follow from the "
                                 f"training images: restore the data, or start a new run folder (--out) to train on "
                                 f"this data")
        notes.append(f"{text}; resuming on them" + (
            " (same image order and schedule)" if split == "train" else
            ": the held-out numbers before and after this point are measured on different images"))
    return notes


def _data_change(split: str, old: Any, new: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, message) for a split whose fingerprint differs from the one recorded when the run started."""
    if not isinstance(old, dict):
        return None
    head = f"{split} data changed since the checkpoint"
    if old.get("images") != new["images"]:
        return "count", f"{head}: {new['images']} images, the run was started with {old.get('images')}"
    if old.get("names_sha256") != new["names_sha256"]:
        return "names", f"{head}: the same number of images ({new['images']}) but other file names"
    if old.get("files_sha256") != new["files_sha256"]:
        return "sizes", (f"{head}: the same {new['images']} file names, but some files have other sizes (edited "
                         "or replaced images)")
    return None


def _init_change(old: dict[str, Any], new: dict[str, Any]) -> tuple[Any, Any] | None:
    """(old, new) when the starting weights differ from the run's; None when they are the same weights, wherever
    they are now (compared by sha256) or, for run folders from before the digest was recorded, by resolved path."""
    a, b = old.get("init"), new.get("init")
    if a is None or b is None:
        return None if a == b else (a, b)
    if old.get("init_sha256") and new.get("init_sha256"):
        if old["init_sha256"] == new["init_sha256"]:
            return None
        if a == b:
            return f"{a} (sha256 {old['init_sha256'][:12]}...)", f"{b} (sha256 {new['init_sha256'][:12]}...)"
        return a, b
    if new.get("init_sha256") is None and not Path(b).exists():
        return None  # build_model names the missing path next
    return None if a == b or Path(a).resolve() == Path(b) else (a, b)


def _trim_metrics(path: Path, step: int) -> None:
    """Drop the records after `step` (the checkpoint a resumed run restarts from): they are logged again."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short when the run was killed
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    if len(kept) != len(lines):
        _atomic_write(path, "".join(f"{line}\n" for line in kept))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def hardware(d: distributed.Dist) -> dict[str, Any]:
    info: dict[str, Any] = dict(
        device=d.device.type, processes=d.world_size, cpu_threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
        platform=platform.platform(), python=platform.python_version(), torch=torch.__version__,
    )
    if d.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(d.device)
    import timm

    info["timm"] = timm.__version__
    return info


def _training_record(recipe: Recipe, data_dir: Path, train_split, val_split, total_steps: int, val: dict[str, float],
                     source: str, d: distributed.Dist, micro: int, accum: int, wall: float, digests: list,
                     dataset_info: dict[str, Any]) -> dict[str, Any]:
    return dict(
        recipe=recipe.to_dict(),
        torch_weight_decay=recipe.torch_weight_decay,
        init=source,
        dataset=dict(path=str(data_dir), num_train=len(train_split), num_val=len(val_split),
                     classes=list(train_split.classes), **dataset_info),
        steps=total_steps,
        epochs=round(total_steps * recipe.batch_size / len(train_split), 2),
        micro_batch=micro,
        accumulation_steps=accum,
        held_out=dict(split="val", top1=val["val_top1"], loss=val["val_loss"], images=val["val_images"]),
        wall_time_s=round(wall, 1),
        hardware=hardware(d),
        rank_weight_digests=digests,
        # what held_out was measured on (every rank holds the same weights, checked above); the card withholds the
        # accuracy once the folder's model.safetensors holds other weights (`hub_vit.weights_digest`)
        weights_digest=digests[0],
        finished_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )


class _Progress:
    """rich progress bar (step, loss, lr, img/s) on the main process; silent elsewhere."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from hub_vit.cli.app import console

        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("train", total=total, completed=start, stats="")

    def __enter__(self) -> _Progress:
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()

    def update(self, step: int, loss: float, lr: float, rate: float) -> None:
        if self.enabled:
            self.progress.update(self.task, completed=step,
                                 stats=f"loss {loss:.4f}  lr {lr:.2e}  {rate:,.0f} img/s")

    def note(self, message: str) -> None:
        if self.enabled:
            self.progress.console.print(message, markup=False)
