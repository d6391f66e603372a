"""`train()`: the big_vision training loop in PyTorch (one process, or one of many under `torchrun`).

Per optimizer step t (0-based): set lr = schedule(t); for each of `accum` micro-batches: mixup, forward (bf16
autocast on CUDA), softmax cross-entropy / accum, backward (DDP all-reduces on the last one); clip the global grad norm
to 1.0; AdamW step. The run folder (`run_folder.py`) holds `recipe.json`, `metrics.jsonl`, `checkpoints/` and, when the
run is complete, `model/` (a hub-vit model folder with `training.json`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.loss import SoftTargetCrossEntropy
from torch.utils.data import DataLoader, Subset

from hub_vit.domain import Domain
from hub_vit.hub_models import hub_folder, is_hub_reference
from hub_vit.train import checkpoint as ckpt
from hub_vit.train import distributed
from hub_vit.train.data import (
    DataFolderError,
    EvalImages,
    ImageFolderSplit,
    SeededMixup,
    StreamBatches,
    TrainStream,
    check_headers,
    fingerprint,
    scan_split,
)
from hub_vit.train.models import build_model, check_init_path, init_folder_architecture, init_resized_note
from hub_vit.train.recipe import Recipe, SettingError
from hub_vit.train.run_folder import (
    MODEL_DIR,
    RunFolderError,
    check_out_outside_data,
    check_run_folder,
    claimed,
    finished_model,
    trim_metrics,
    write_settings,
)
from hub_vit.train.schedule import current_lr, make_optimizer, make_scheduler
from hub_vit.train.workers import StopOnSignal, ignore_stop_signals, one_line_errors, shut_down_workers, start_workers
from hub_vit.weights_digest import state_dict_digest


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    total_steps: int
    model_dir: Path | None = None  # set when the run reached total_steps
    val_top1: float | None = None
    # Ctrl-C or SIGTERM: stopped after a step, with a checkpoint of it (after the last step: before model/ is written)
    interrupted: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    stop_signal: int | None = None  # the signal that stopped the run (signal.SIGINT or signal.SIGTERM)
    already_complete: bool = False  # the run folder's model/ was there: nothing was trained or written


class TrainingWarning(UserWarning):
    """Something the run goes on with but the user should know: a warm-up longer than the run, data edited since the
    checkpoint, a run folder too old to record its data. The command line prints each as one `warning:` line. A
    setting it advises is written `name=value` as `train()` takes it (`warmup_steps=2`); the command line shows the
    flag (`--warmup-steps 2`)."""


def train(recipe: Recipe, data_dir: str | Path, run_dir: str | Path, *, init: str | Path | None = None,
          device: str | None = None, stop_at: int | None = None, progress: bool = True,
          architecture: str | None = None, dataset_info: dict[str, Any] | None = None,
          domain: Domain | None = None) -> TrainResult:
    """Train (or resume) the run in `run_dir` on `data_dir/{train,val}/<class>/<image>`.

    `init`: a model folder (`hf-hub:ORG/NAME[@REVISION]`: one on the Hugging Face Hub) or weights file to fine-tune.
    `stop_at`: stop after this global step (a checkpoint is written) without finishing the run; calling `train`
    again resumes from the newest checkpoint. Every input is checked before anything is written to `run_dir`. A run
    whose `model/` is already there is complete: it is returned as it is (`already_complete`), nothing is trained.

    Ctrl-C and SIGTERM (single process) end the run after the current step, with a checkpoint of it, and are then
    raised again (`stopped_by_signal`): KeyboardInterrupt and SystemExit(143), each with the `TrainResult` as
    `result`. One after the last step, before the model folder is written, stops there the same way (`model_dir` is
    None; calling `train` again writes it); one while it is written interrupts at once (it is staged: no `model/`).
    """
    if not isinstance(recipe, Recipe):  # a dict failed as "'dict' object has no attribute 'micro_batch_for'"
        raise TypeError(f"recipe must be a Recipe (Recipe.from_dict(d) for a dict, VIT_S16_I1K.replace(...) for a "
                        f"preset), got {type(recipe).__name__}")
    run_dir, data_dir = Path(run_dir), Path(data_dir)
    recipe.micro_batch_for(distributed.world_size_from_env())  # a batch that cannot split fails before any setup
    _check_architecture(architecture, recipe, init)  # was found when the model folder was written, after the run
    if init is not None and is_hub_reference(str(init)):  # fetched into huggingface_hub's cache: a folder from here on
        init = hub_folder(str(init))
    d = distributed.setup(device)
    try:
        with claimed(run_dir) if d.is_main else contextlib.nullcontext():  # the process that writes the folder
            plan = _Plan.check(recipe, data_dir, run_dir, d, init, stop_at)
            result = _already_complete(plan)
            if result is None:
                trainer = Trainer(plan, d, progress)
                trainer.fit()
                result = trainer.finish(architecture, dataset_info or {}, domain)
    finally:
        distributed.teardown(d)
    _raise_stop_signal(result)
    return result


def _check_architecture(architecture: str | None, recipe: Recipe, init: str | Path | None) -> None:
    """ValueError for an `architecture` the model folder could not record: checked against the registered model the
    run trains, or by name where the model comes from `init` (its spec is known once it is read)."""
    from hub_vit.catalog import MODELS
    from hub_vit.folder import check_architecture

    base = recipe.model.partition(".")[0]
    check_architecture(architecture, MODELS[base].spec if init is None and base in MODELS else None)


def _already_complete(plan: _Plan) -> TrainResult | None:
    """The result of a run whose model folder is written (a rerun of a finished command, in a Makefile or a job
    script): model/ is left as it is, with the calibration and the files added to it since."""
    training = finished_model(plan.run_dir, plan.recipe, plan.total_steps)
    if training is None:
        return None
    held_out = training.get("held_out")
    top1 = held_out.get("top1") if isinstance(held_out, dict) else None
    return TrainResult(run_dir=plan.run_dir, step=plan.total_steps, total_steps=plan.total_steps,
                       model_dir=plan.run_dir / MODEL_DIR,
                       val_top1=float(top1) if isinstance(top1, (int, float)) else None,
                       already_complete=True)


def _raise_stop_signal(result: TrainResult) -> None:
    """A stop signal the run ended on, raised again now that its step is checkpointed: a script (a sweep, `train();
    export()`) must stop as it would on the signal anywhere else, not go on and end with 0. Plain KeyboardInterrupt
    and SystemExit, not subclasses: Python ends a script on an uncaught KeyboardInterrupt with the shell's 130 only
    for that exact class (1 for a subclass), and a scheduler reads SystemExit's 143 as "terminated"."""
    if result.stop_signal is None:
        return
    last = " (the model folder is not written yet)" if result.step == result.total_steps else ""
    stop: BaseException = (SystemExit(128 + signal.SIGTERM) if result.stop_signal == signal.SIGTERM else
                           KeyboardInterrupt(f"stopped by Ctrl-C after step {result.step}/{result.total_steps}, "
                                             f"checkpoint written{last}; call train() again to resume"))
    stop.result = result  # type: ignore[attr-defined]
    raise stop


def stopped_by_signal(exc: BaseException) -> TrainResult | None:
    """The result a KeyboardInterrupt or SystemExit raised by `train()` after a stop signal carries (the run up to
    the step it stopped after, checkpointed), else None (one raised anywhere else)."""
    result = getattr(exc, "result", None)
    return result if isinstance(result, TrainResult) else None


@dataclass
class _Plan:
    """Everything a run is, checked before anything is written to its folder: a bad batch size, data folder or recipe
    fails here."""

    recipe: Recipe
    data_dir: Path
    run_dir: Path
    init: str | Path | None
    micro: int  # images per process per forward pass
    accum: int  # micro-batches per optimizer step
    train_split: ImageFolderSplit
    val_split: ImageFolderSplit
    total_steps: int
    end_step: int  # total_steps, or stop_at
    data: dict[str, Any]  # fingerprints of the two splits
    notes: list[str]  # warnings to print once the run starts
    stream: TrainStream

    @property
    def classes(self) -> tuple[str, ...]:
        return self.train_split.classes

    @classmethod
    def check(cls, recipe: Recipe, data_dir: Path, run_dir: Path, d: distributed.Dist, init: str | Path | None,
              stop_at: int | None) -> _Plan:
        micro, accum = recipe.micro_batch_for(d.world_size)
        check_out_outside_data(run_dir, data_dir)  # before the run folder is read as a class of images
        train_split = scan_split(data_dir, "train")
        val_split = scan_split(data_dir, "val", classes=train_split.classes)
        total_steps = recipe.steps_for(len(train_split))
        if stop_at is not None and stop_at < 1:
            raise SettingError(f"stop_at must be a step >= 1, got {stop_at}")
        check_init_path(init)
        folder_architecture = init_folder_architecture(init)
        if folder_architecture is not None:  # record what is trained, not the preset's default `model`
            recipe = recipe.replace(model=folder_architecture)
        data = {"train": fingerprint(train_split), "val": fingerprint(val_split)}
        notes = check_run_folder(run_dir, recipe, init, train_split.classes, data, micro=micro)
        # a damaged val image would surface at the first eval, after (possibly) hours
        check_headers(path for path, _ in val_split.samples)
        try:  # timm builds the augmentation here, before anything is written, not in the first data-loader worker
            stream = TrainStream(train_split, recipe)
        except (AssertionError, KeyError) as exc:  # timm's RandAugment parser asserts; the recipe's check is stricter
            raise SettingError(f"randaug {recipe.randaug!r}: timm refuses it ({exc or type(exc).__name__})") from None
        resized = init_resized_note(init, recipe.img_size)
        if resized:
            notes.append(resized)
        if recipe.warmup_steps >= total_steps and recipe.warmup_steps > 0:
            # timm's scheduler caps it silently (at total_steps - 1): the run would end at the peak lr, never
            # annealed. A warning, not an error: short trial runs of a preset (`--steps 30`) do this on purpose.
            notes.append(f"the warm-up ({_steps(recipe.warmup_steps)}) is not shorter than the run "
                         f"({_steps(total_steps)}): the learning rate rises for the whole run and never decays; for a "
                         f"cosine decay pass e.g. warmup_steps={max(1, total_steps // 10) if total_steps > 1 else 0}")
        if recipe.micro_batch is not None and recipe.micro_batch > micro:
            # `micro_batch_for` takes the whole per-process batch then: the run was recorded with a micro batch it
            # never used, without a word
            per = f" / {d.world_size} processes" if d.world_size > 1 else ""
            notes.append(f"micro_batch={recipe.micro_batch} is larger than the {micro} images each process takes per "
                         f"step (batch_size={recipe.batch_size}{per}): each forward pass takes {micro}, without "
                         f"gradient accumulation; pass micro_batch={micro} or leave it out")
        batch_note = _batch_larger_than_data(recipe, len(train_split), total_steps, d.world_size)
        if batch_note:
            notes.append(batch_note)
        end_step = min(total_steps, stop_at) if stop_at is not None else total_steps
        return cls(recipe, data_dir, run_dir, init, micro, accum, train_split, val_split, total_steps, end_step, data,
                   notes, stream)


def _batch_larger_than_data(recipe: Recipe, images: int, total_steps: int, world_size: int) -> str | None:
    """What a run says when its batch holds more images than the training set: every step then repeats each image,
    and the run's steps (at least 1) make other epochs than those asked for. None otherwise."""
    if recipe.batch_size <= images:
        return None
    # the largest batch that fits and still splits: over the processes, into the micro batch, into mixup's pairs
    unit = world_size * (2 if recipe.mixup else 1)
    fits = max(unit, images // unit * unit)
    epochs = round(total_steps * recipe.batch_size / images, 2)
    asked = "" if recipe.total_steps is not None else f", not the {recipe.total_epochs:g} asked for"
    return (f"batch_size={recipe.batch_size} is larger than the {images} training images: each step repeats them "
            f"({recipe.batch_size / images:.3g} times each on average), and the run's {_steps(total_steps)} "
            f"{'is' if total_steps == 1 else 'are'} {epochs:g} epoch{'' if epochs == 1 else 's'}{asked}; pass e.g. "
            f"batch_size={fits}")


def _steps(count: int) -> str:
    return f"{count} step" if count == 1 else f"{count} steps"


class Trainer:
    """One run's model, optimizer and counters between steps: `fit()` runs the steps, `finish()` measures and writes
    the model folder once the run is complete."""

    def __init__(self, plan: _Plan, d: distributed.Dist, progress: bool) -> None:
        self.plan, self.d, recipe = plan, d, plan.recipe
        torch.manual_seed(recipe.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
        self.model, self.source = build_model(recipe, len(plan.classes), plan.init)
        self.model.to(d.device)
        self.optimizer = make_optimizer(self.model, recipe)
        self.scheduler = make_scheduler(self.optimizer, recipe, plan.total_steps)
        self.start_step, self.wall_before = 0, 0.0
        found, extra, unreadable = ckpt.load_newest(plan.run_dir, self.model, self.optimizer, self.scheduler)
        if found is not None:
            self.start_step, self.wall_before = extra["step"], float(extra.get("wall_time_s", 0.0))
        elif unreadable:
            raise RunFolderError(_no_readable_checkpoint(plan.run_dir, unreadable))
        if d.is_main:
            for note in [*plan.notes, *_fall_back_notes(unreadable, found)]:
                warnings.warn(note, TrainingWarning, stacklevel=3)
            plan.run_dir.mkdir(parents=True, exist_ok=True)
            ckpt.remove_staging(plan.run_dir)  # left by a process killed while writing a checkpoint
            write_settings(plan.run_dir, recipe, plan.init, plan.classes, plan.data, plan.micro)
            trim_metrics(plan.run_dir / "metrics.jsonl", self.start_step)
        distributed.barrier(d)
        if d.is_main:  # once every process has read its checkpoint
            ckpt.remove([u.checkpoint for u in unreadable])

        self.net: torch.nn.Module = self.model
        if d.enabled:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
        use_bf16 = recipe.bf16_autocast(d.device.type)
        self.autocast: Callable[[], Any] = (
            (lambda: torch.autocast(d.device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext)
        self.mixup = SeededMixup(recipe.mixup, len(plan.classes)) if recipe.mixup > 0 else None
        self.soft_ce = SoftTargetCrossEntropy()
        self.steps_per_epoch = recipe.steps_per_epoch(len(plan.train_split))  # exact, as training.json's `epochs`
        self.eval_every = recipe.steps_every(recipe.eval_every_epochs, len(plan.train_split))
        self.history: list[dict[str, Any]] = []
        self.bar = _Progress(enabled=progress and d.is_main, total=plan.total_steps, start=self.start_step)
        self.stop = StopOnSignal(enabled=not d.enabled)  # DDP ranks would stop at different steps and hang
        self.step = self.start_step
        self.saved_step = self.start_step if found is not None else -1
        self.t0 = self.last_t = time.perf_counter()
        self.last_step, self.loss_sum = self.start_step, 0.0
        self.lr, self.grad_norm = 0.0, torch.zeros(())  # of the last step done; set by the first
        self.val: dict[str, float] | None = None

    # ---- the steps
    def fit(self) -> None:
        """Steps from the newest checkpoint up to `end_step`; a stop signal ends the run after its step."""
        plan, recipe = self.plan, self.plan.recipe
        sampler = StreamBatches(recipe.batch_size, plan.micro, plan.accum, self.d.rank, self.d.world_size,
                                self.start_step, plan.end_step)
        loader = DataLoader(plan.stream, batch_sampler=sampler, num_workers=recipe.workers,
                            worker_init_fn=ignore_stop_signals, pin_memory=self.d.device.type == "cuda",
                            persistent_workers=False)
        batches = start_workers(loader)
        self.model.train()
        with self.bar, self.stop, shut_down_workers(batches):
            while self.step < plan.end_step:
                self.train_step(batches)
                if self.step % recipe.log_every_steps == 0 or self.step == plan.end_step or self.stop.requested:
                    self.log_losses()
                # the checkpoint comes before the eval: an eval that fails (a damaged val image, out of memory)
                # must not cost the steps since the last checkpoint (between checkpoints, `evaluate_keeping_steps`
                # writes one when a val image cannot be decoded)
                if (self.step % recipe.checkpoint_every_steps == 0 or self.step == plan.end_step
                        or self.stop.requested):
                    self.checkpoint()
                if self.step % self.eval_every == 0 or self.step == plan.total_steps:
                    self.evaluate_now()
                if self.stop.requested:
                    self.checkpoint()  # the signal may have come during the eval
                    break

    def train_step(self, batches: Iterator) -> None:
        """One optimizer step over `accum` micro-batches."""
        plan, recipe, d = self.plan, self.plan.recipe, self.d
        self.scheduler.step_update(num_updates=self.step)  # lr for update `step` (optax: count before increment)
        self.optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for k in range(plan.accum):
            images, labels = self._next_batch(batches)
            images = images.to(d.device, non_blocking=True)
            labels = labels.to(d.device, non_blocking=True)
            if self.mixup is not None:
                self.mixup.reseed(recipe.seed, 3, self.step, d.rank * plan.accum + k)  # global micro-batch index
                images, targets = self.mixup(images, labels)  # (B, C, H, W), (B, classes) soft
            else:
                targets = F.one_hot(labels, len(plan.classes)).float()
            sync = k == plan.accum - 1 or not d.enabled
            with (contextlib.nullcontext() if sync else self.net.no_sync()), self.autocast():
                logits = self.net(images)
                loss = self.soft_ce(logits.float(), targets) / plan.accum
            loss.backward()
            step_loss += float(loss.detach())
        self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), recipe.grad_clip_norm or math.inf)
        if not torch.isfinite(self.grad_norm):
            raise FloatingPointError(f"gradient norm is {float(self.grad_norm)} at step {self.step}; lower --lr")
        self.lr = current_lr(self.optimizer)
        self.optimizer.step()
        self.step += 1
        self.loss_sum += step_loss

    def _next_batch(self, batches: Iterator) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return next(batches)
        except DataFolderError as exc:  # a damaged training image: one line naming it, not a worker traceback
            error = DataFolderError.from_worker(exc)
            if self.d.enabled or self.step == self.start_step:  # no rank may wait for the others / nothing to save
                raise error from None
            # the weights are those of `step` completed steps (this one's update has not been applied): keep them,
            # so that replacing the file (same name) and rerunning loses nothing
            if self.step > self.last_step:
                self.log_losses()  # the resumed run starts after `step`: these steps would never be logged
            self.checkpoint()
            raise DataFolderError(f"{error}; checkpoint of step {self.step} written: replace the file with a readable "
                                  "image of the same name and run the same command to resume (removing it changes "
                                  "the run's length and is refused)") from None

    # ---- records
    def log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.d.is_main:
            with (self.plan.run_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")

    def log_losses(self) -> None:
        """One metrics record for the steps since the last one (mean loss; the last step's lr and grad norm)."""
        now, recipe = time.perf_counter(), self.plan.recipe
        steps = self.step - self.last_step
        mean_loss = distributed.all_sum(self.d, [self.loss_sum])[0] / self.d.world_size / steps
        rate = steps * recipe.batch_size / max(now - self.last_t, 1e-9)
        self.log(dict(step=self.step, epoch=round(self.step / self.steps_per_epoch, 3), loss=mean_loss, lr=self.lr,
                      grad_norm=float(self.grad_norm), img_per_s=round(rate, 1)))
        self.bar.update(self.step, mean_loss, self.lr, rate)
        self.last_t, self.last_step, self.loss_sum = now, self.step, 0.0

    def evaluate_keeping_steps(self) -> dict[str, float]:
        """`evaluate` on the val split; an image that fails to decode there (one `check_headers` passed: damaged
        inside an intact structure) ends the run with one line naming it, after a checkpoint of the steps done, as a
        damaged training image does: the eval comes every epoch, so a fresh run lost every step before it (and the
        command line then deleted its run folder)."""
        try:
            return evaluate(self.net, self.plan.val_split, self.plan.recipe, self.d, self.autocast)
        except DataFolderError as exc:
            if self.d.enabled:  # no rank may wait for the others in the checkpoint's barrier
                raise
            if self.step > self.last_step:
                self.log_losses()  # the resumed run starts after `step`: these steps would never be logged
            self.checkpoint()
            raise DataFolderError(f"{exc}; checkpoint of step {self.step} written: replace the file with a readable "
                                  "image, or remove it from the val split, and run the same command to resume"
                                  ) from None

    def checkpoint(self) -> None:
        if self.saved_step == self.step:
            return
        if self.d.is_main:
            ckpt.save(self.plan.run_dir, self.step, self.model, self.optimizer, self.scheduler,
                      extra=dict(wall_time_s=self.wall_before + time.perf_counter() - self.t0))
        distributed.barrier(self.d)
        self.saved_step = self.step

    def evaluate_now(self) -> None:
        self.val = self.evaluate_keeping_steps()
        self.log(dict(step=self.step, epoch=round(self.step / self.steps_per_epoch, 3), **self.val))
        self.bar.note(f"step {self.step}: val top-1 {self.val['val_top1']:.2%}  loss {self.val['val_loss']:.4f}")
        self.model.train()

    # ---- the end
    def finish(self, architecture: str | None, dataset_info: dict[str, Any], domain: Domain | None = None
               ) -> TrainResult:
        """The result; for a complete run also the model folder (main process) with its training record."""
        plan, d = self.plan, self.d
        digests: list[str] = []
        if self.step == plan.total_steps and not self.stop.requested:
            # up to the export a stop signal ends the run as it ends a step (entered only before one came: after it,
            # a second signal must interrupt at once)
            with self.stop:
                if self.val is None:  # resumed a finished run: measure again
                    self.val = self.evaluate_keeping_steps()
                digests = distributed.all_gather(d, state_dict_digest(self.model.state_dict()))
        # A stop signal after the last step (during its eval) stops here, before the model folder is written: the
        # export and the calibration take minutes on a large split, and went on against the signal, the command then
        # exiting 0. The last step is checkpointed: a rerun measures it again and writes model/.
        result = TrainResult(run_dir=plan.run_dir, step=self.step, total_steps=plan.total_steps,
                             history=self.history, interrupted=self.stop.requested, stop_signal=self.stop.signum)
        if self.step < plan.total_steps or self.stop.requested:
            return result
        assert self.val is not None  # measured at the last step, or above
        if len(set(digests)) != 1:
            raise RuntimeError(f"processes ended with different weights (sha256 per rank: {digests})")
        result.val_top1 = self.val["val_top1"]
        if d.is_main:
            wall = self.wall_before + time.perf_counter() - self.t0
            training = _training_record(plan, self.val, self.source, d, wall, digests, dataset_info)
            export_model(self.model, plan.run_dir / MODEL_DIR, plan.recipe, plan.classes, training, architecture,
                         data_dir=plan.data_dir, domain=domain)
        distributed.barrier(d)
        result.model_dir = plan.run_dir / MODEL_DIR
        return result


def _fall_back_notes(unreadable: list[ckpt.Unreadable], used: ckpt.Checkpoint | None) -> list[str]:
    """The warning of a resume that skipped newer checkpoints it could not read."""
    if not unreadable or used is None:
        return []
    return [f"checkpoint {str(u.checkpoint.path)!r} cannot be read ({u.reason}): removed it, and resuming from "
            f"{used.path.name} instead (the steps after it are trained again)" for u in unreadable]


def _no_readable_checkpoint(run_dir: Path, unreadable: list[ckpt.Unreadable]) -> str:
    listed = "; ".join(f"{u.checkpoint.path.name}: {u.reason}" for u in unreadable)
    return (f"no checkpoint of run folder {str(run_dir)!r} can be read ({listed}): delete "
            f"{str(ckpt.checkpoint_dir(run_dir))!r} to train the run again from step 0, or restore the checkpoints "
            "from a copy")


@torch.no_grad()
def evaluate(net: torch.nn.Module, split: ImageFolderSplit, recipe: Recipe, d: distributed.Dist,
             autocast: Callable[[], Any] = contextlib.nullcontext) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy on the eval split (each process a strided share, summed)."""
    net.eval()
    data = EvalImages(split, recipe)
    share = Subset(data, range(d.rank, len(data), d.world_size))
    loader = DataLoader(share, batch_size=min(256, max(len(share), 1)), num_workers=min(recipe.workers, 2),
                        worker_init_fn=ignore_stop_signals)
    correct = total = loss = 0.0
    batches = start_workers(loader)
    with shut_down_workers(batches):  # also when the loop body raises (a second Ctrl-C during the forward pass)
        for images, labels in one_line_errors(batches):
            images, labels = images.to(d.device), labels.to(d.device)
            with autocast():
                logits = net(images).float()  # (B, classes)
            correct += float((logits.argmax(-1) == labels).sum())
            loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            total += len(labels)
    correct, total, loss = distributed.all_sum(d, [correct, total, loss])
    return dict(val_top1=correct / total, val_loss=loss / total, val_images=int(total))


def export_model(model: torch.nn.Module, folder: Path, recipe: Recipe, classes: tuple[str, ...],
                 training: dict[str, Any], architecture: str | None, *, data_dir: Path | None = None,
                 domain: Domain | None = None) -> Path:
    """The finished run as a hub-vit model folder (timm + transformers), with `training.json` inside and, given the
    run's `data_dir`, its out-of-domain score fitted on the train split and calibrated on the val split
    (`calibrate_domain_or_warn`; `domain`: what the record says the model knows, default guessed from the classes).

    The folder is written, calibrated and given its card in a staging folder, then renamed into place: `folder`
    only ever appears complete (Ctrl-C during the calibration left one without card or domain files, which looked
    finished). Files a person added to an earlier `folder` that this one does not have are copied into the new one."""
    from hub_vit.atomic import replace_dir, staging_dir
    from hub_vit.folder import save_model_folder
    from hub_vit.model_cards import write_model_card

    folder = Path(folder)
    pretrained_cfg = dict(recipe.eval_data().pretrained_cfg(), num_classes=len(classes))
    model = model.to("cpu").eval()
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = staging_dir(folder)  # a hidden sibling; one a killed writer left is swept here
    try:
        # the card is titled after the run folder (`<run>/model`): the staged copy has the same last two names
        staged = stage / folder.resolve().parent.name / folder.name
        save_model_folder(model, staged, labels=list(classes), pretrained_cfg=pretrained_cfg, architecture=architecture,
                          extra_files={"training.json": json.dumps(training, indent=2) + "\n"})
        if data_dir is not None:
            calibrate_domain_or_warn(staged, data_dir, domain, named=folder)
        write_model_card(staged)  # rendered from training.json
        _keep_added_files(folder, staged)
        replace_dir(staged, folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return folder


def _keep_added_files(old: Path, new: Path) -> None:
    """Copy the entries of the model folder `old` that the new export `new` does not write (notes, a person's own
    files) into `new`, which replaces `old`: a run never deletes what it did not write. Copied, not moved: should the
    swap fail, `old` stays as it was."""
    if not old.is_dir():
        return
    for entry in old.iterdir():
        if (new / entry.name).exists():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, new / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, new / entry.name, follow_symlinks=False)


def calibrate_domain_or_warn(folder: Path, data_dir: Path, domain: Domain | None, *, named: Path | None = None
                             ) -> None:
    """Fit the model folder's out-of-domain score on the run's train split and set its threshold on the val split
    (`hub_vit.domain_fit`); a val split too small for the threshold (or an unreadable image) leaves the model
    uncalibrated, with a TrainingWarning that says how to calibrate it later (`named`: the folder's path in that
    command, where `folder` is the staged copy that becomes it)."""
    from hub_vit.domain_fit import calibrate_domain

    try:
        calibrate_domain(folder, data_dir / "train", held_out=data_dir / "val",
                         knows=None if domain is None else domain.knows,
                         examples=None if domain is None else domain.examples)
    except ValueError as exc:
        warnings.warn(TrainingWarning(f"the model's out-of-domain score is not calibrated ({exc}); its answers say "
                                      "\"unknown\" to whether an image is of the kind it knows. Calibrate it with "
                                      f"`{calibrate_command(named or folder, domain)}`"),
                      stacklevel=2)


def calibrate_command(folder: Path, domain: Domain | None) -> str:
    """The `hub-vit calibrate-domain` command that calibrates `folder` later with what this run says the model knows
    (the preset's --knows / --examples): without them the record would say what the labels suggest ('photos' for the
    digits)."""
    import shlex

    words = ["hub-vit", "calibrate-domain", str(folder), "--images", "DIR", "--held-out", "DIR"]
    if domain is not None:
        words += ["--knows", domain.knows, "--examples", domain.examples]
    return " ".join(word if word == "DIR" else shlex.quote(word) for word in words)


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


def _training_record(plan: _Plan, val: dict[str, float], source: str, d: distributed.Dist, wall: float,
                     digests: list[str], dataset_info: dict[str, Any]) -> dict[str, Any]:
    recipe, train_split = plan.recipe, plan.train_split
    return dict(
        recipe=recipe.to_dict(),
        torch_weight_decay=recipe.torch_weight_decay,
        init=source,
        # held_out_images: where the export and the CPU flavour judge this model's reduced-precision variants
        # (hub_vit.folder.held_out_images); a recipe's own data set may name its split instead
        dataset={**dict(path=str(plan.data_dir), num_train=len(train_split), num_val=len(plan.val_split),
                        classes=list(train_split.classes), held_out_images=str((plan.data_dir / "val").resolve())),
                 **dataset_info},
        steps=plan.total_steps,
        epochs=round(plan.total_steps * recipe.batch_size / len(train_split), 2),
        micro_batch=plan.micro,
        accumulation_steps=plan.accum,
        held_out=dict(split="val", top1=val["val_top1"], loss=val["val_loss"], images=val["val_images"]),
        wall_time_s=round(wall, 1),
        hardware=hardware(d),
        rank_weight_digests=digests,
        # what held_out was measured on (every rank holds the same weights, checked above); the card withholds the
        # accuracy once the folder's model.safetensors holds other weights (`hub_vit.weights_digest`)
        weights_digest=digests[0],
        finished_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


class _Progress:
    """rich progress bar (step, loss, lr, img/s) on the main process; silent elsewhere. Where the output is not a
    terminal (a log file, a job's output), rich draws the bar only when the run ends: there a line says where the run
    starts, and one line per tenth of the run or per minute gives the same numbers."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.enabled, self.total, self.start = enabled, total, start
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.lines = not Console().is_terminal  # a log file: lines, and no bar drawn once at the end
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(), transient=False, disable=self.lines,
        )
        self.task = self.progress.add_task("train", total=total, completed=start, stats="")
        self.said_step, self.said_at = start, time.monotonic()

    def __enter__(self) -> _Progress:
        if self.enabled:
            self.progress.start()
            if self.lines:
                resumed = f", resuming after step {self.start}" if self.start else ""
                self.note(f"train: {self.total} steps{resumed}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()

    def update(self, step: int, loss: float, lr: float, rate: float) -> None:
        if self.enabled:
            stats = f"loss {loss:.4f}  lr {lr:.2e}  {rate:,.0f} img/s"
            self.progress.update(self.task, completed=step, stats=stats)
            now = time.monotonic()
            if self.lines and step < self.total and (10 * (step - self.said_step) >= self.total
                                                     or now - self.said_at >= 60):
                self.note(f"step {step}/{self.total}  {stats}")
                self.said_step, self.said_at = step, now

    def note(self, message: str) -> None:
        if self.enabled:
            self.progress.console.print(message, markup=False)
