"""`train()`: the big_vision training loop in PyTorch (one process, or one of many under `torchrun`).

Per optimizer step t (0-based): set lr = schedule(t); for each of `accum` micro-batches: mixup, forward (bf16
autocast on CUDA), softmax cross-entropy / accum, backward (DDP all-reduces on the last one); clip the global grad norm
to 1.0; AdamW step. The run folder holds `recipe.json`, `metrics.jsonl`, `checkpoints/` and, when the run is complete,
`model/` (a hub-vit model folder with `training.json`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.loss import SoftTargetCrossEntropy
from torch.utils.data import DataLoader, Subset

from hub_vit.atomic import file_in_the_way
from hub_vit.train import checkpoint as ckpt
from hub_vit.train import distributed
from hub_vit.train.data import EvalImages, SeededMixup, StreamBatches, TrainStream, scan_split
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
    interrupted: bool = False  # Ctrl-C: stopped after a step, with a checkpoint of it
    history: list[dict[str, Any]] = field(default_factory=list)


class _StopOnInterrupt:
    """Ctrl-C (SIGINT) ends a single-process run after the current step, with a checkpoint of it, instead of losing
    every step since the last checkpoint (1000 by default). A second Ctrl-C interrupts at once."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous)  # the next Ctrl-C is a plain KeyboardInterrupt

    def __enter__(self) -> _StopOnInterrupt:
        if self.enabled:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and signal.getsignal(signal.SIGINT) == self._handle:
            signal.signal(signal.SIGINT, self._previous)


def _ignore_sigint(worker_id: int) -> None:
    """Data-loader workers share the terminal's process group: Ctrl-C must not kill them mid-step (the main process
    finishes the step, then stops; its loader shuts them down)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RunFolderError(ValueError):
    """The run folder belongs to another recipe (resuming it would silently change the experiment)."""


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
    _check_run_folder(run_dir, recipe, init, classes)
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
        run_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(run_dir / "recipe.json", json.dumps(_run_settings(recipe, init, classes), indent=2))
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

    stream = TrainStream(train_split, recipe)
    end_step = min(total_steps, stop_at) if stop_at is not None else total_steps
    sampler = StreamBatches(recipe.batch_size, micro, accum, d.rank, d.world_size, start_step, end_step)
    loader = DataLoader(stream, batch_sampler=sampler, num_workers=recipe.workers, worker_init_fn=_ignore_sigint,
                        pin_memory=d.device.type == "cuda", persistent_workers=False)
    steps_per_epoch = recipe.steps_per_epoch(len(train_split))
    eval_every = max(1, round(recipe.eval_every_epochs * steps_per_epoch))
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
    batches = iter(loader)
    model.train()
    stop = _StopOnInterrupt(enabled=not d.enabled)  # DDP ranks would stop at different steps and hang
    with bar, stop:
        while step < end_step:
            scheduler.step_update(num_updates=step)  # lr for update `step` (optax: count before increment)
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for k in range(accum):
                images, labels = next(batches)
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
                now = time.perf_counter()
                mean_loss = distributed.all_sum(d, [loss_sum])[0] / d.world_size / (step - last_step)
                rate = (step - last_step) * recipe.batch_size / max(now - last_t, 1e-9)
                log(dict(step=step, epoch=round(step / steps_per_epoch, 3), loss=mean_loss, lr=lr,
                         grad_norm=float(grad_norm), img_per_s=round(rate, 1)))
                bar.update(step, mean_loss, lr, rate)
                last_t, last_step, loss_sum = now, step, 0.0
            if step % eval_every == 0 or step == total_steps:
                val = evaluate(net, val_split, recipe, d, autocast)
                log(dict(step=step, epoch=round(step / steps_per_epoch, 3), **val))
                bar.note(f"step {step}: val top-1 {val['val_top1']:.2%}  loss {val['val_loss']:.4f}")
                model.train()
            wall = wall_before + time.perf_counter() - t0
            if step % recipe.checkpoint_every_steps == 0 or step == end_step or stop.requested:
                if d.is_main:
                    ckpt.save(run_dir, step, model, optimizer, scheduler, extra=dict(wall_time_s=wall))
                distributed.barrier(d)
            if stop.requested:
                break

    result = TrainResult(run_dir=run_dir, step=step, total_steps=total_steps, history=history,
                         interrupted=stop.requested and step < total_steps)
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
                        worker_init_fn=_ignore_sigint)
    correct = total = loss = 0.0
    for images, labels in loader:
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
def _run_settings(recipe: Recipe, init: str | Path | None, classes: tuple[str, ...]) -> dict[str, Any]:
    """What `recipe.json` records, and what a resumed run must match."""
    return {**recipe.to_dict(), "init": str(init) if init else None, "classes": list(classes)}


def check_run_folder_path(run_dir: str | Path) -> None:
    """RunFolderError naming --out when `run_dir` (or a parent) is a file: checked before anything is written, also
    the digits data the CLI puts inside the run folder (else a NotADirectoryError traceback)."""
    run_dir = Path(run_dir)
    blocker = file_in_the_way(run_dir)
    if blocker is not None:
        where = "" if blocker == run_dir else f" (its parent {str(blocker)!r} is a file)"
        raise RunFolderError(f"--out {str(run_dir)!r} cannot be a run folder{where}: a file is in the way; choose a "
                             "folder path")


def _check_run_folder(run_dir: Path, recipe: Recipe, init: str | Path | None, classes: tuple[str, ...]) -> None:
    check_run_folder_path(run_dir)
    saved = run_dir / "recipe.json"
    if not saved.is_file():
        return
    if ckpt.latest(run_dir) is None and not (run_dir / "model").exists():
        # a run that failed before its first checkpoint (`--lr` too high, a bad image): nothing trained to protect,
        # and the corrected command (the error's own advice) must be able to start over in the same folder
        return
    old = json.loads(saved.read_text())
    new = _run_settings(recipe, init, classes)
    if "classes" in old and old["classes"] != new["classes"]:  # runs from before it was recorded: not checked
        added = sorted(set(new["classes"]) - set(old["classes"]))
        removed = sorted(set(old["classes"]) - set(new["classes"]))
        raise RunFolderError(f"run folder {str(run_dir)!r} was started on other classes (added: {added or 'none'}, "
                             f"removed: {removed or 'none'}); its head and labels would not match: resume with the "
                             "same data or choose a new --out folder")
    ignore = {"workers", "log_every_steps", "checkpoint_every_steps", "classes"}  # do not change the result
    if init_folder_architecture(init) is not None:
        ignore.add("model")  # the folder (compared as `init`) decides it; runs before the fix recorded the default
    diff = {k: (old.get(k), v) for k, v in new.items() if k not in ignore and old.get(k) != v}
    if diff:
        lines = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise RunFolderError(f"run folder {str(run_dir)!r} was started with another recipe ({lines}); "
                             "resume it with the same settings or choose a new --out folder")


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
