"""Training checkpoints that resume exactly: weights (safetensors) + optimizer, scheduler and step (torch file).

Layout: `RUN/checkpoints/step_000123/{model.safetensors, state.pt}`. A checkpoint is written into a temporary folder
and renamed into place, so a crash never leaves a half-written `step_*` folder that `latest()` would pick up. The data
stream needs no saved RNG state: it is a function of (seed, step) (see `hub_vit.train.data`).
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hub_vit.atomic import disk_errors_as_os_errors

PREFIX = "step_"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
         extra: dict[str, Any] | None = None, keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep` ones.

    The staging folder `.step_N.<pid>` is renamed into place when complete; a process killed before that leaves it
    behind, and `remove_staging` (at the next start) removes it. Permissions follow the umask like the rest of the
    run folder (tempfile.mkdtemp made the folder 0700 and safetensors writes 0600: teammates on a shared file system
    could read model/ but not resume from or inspect the checkpoints).
    """
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:09d}"
    tmp = root / f".{final.name}.{os.getpid()}"  # one writer per run folder; a same-named leftover is a dead one's
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        # through a Python file object: a refused write (a full disk) is then an OSError torch's error was raised
        # from, not a bare "basic_ios::clear: iostream error"
        with open(tmp / "state.pt", "wb") as file, disk_errors_as_os_errors(tmp / "state.pt"):
            torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "extra": extra or {}}, file)
        with disk_errors_as_os_errors(tmp / "model.safetensors"):
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "step": str(step)})
        os.chmod(tmp / "model.safetensors", stat.S_IMODE((tmp / "state.pt").stat().st_mode))  # open()'s umask mode
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def remove_staging(run_dir: Path) -> list[Path]:
    """Remove the `.step_*` staging folders of checkpoints whose writer was killed before renaming them (hundreds of
    MB each for a B/16; `list_checkpoints` never picks them up, so nothing else would remove them)."""
    root = checkpoint_dir(run_dir)
    stale = sorted(p for p in root.glob(f".{PREFIX}*") if p.is_dir()) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [Checkpoint(p, int(p.name[len(PREFIX):])) for p in root.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()
             and (p / "state.pt").is_file() and (p / "model.safetensors").is_file()]
    return sorted(found, key=lambda c: c.step)


def latest(run_dir: Path) -> Checkpoint | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


class CheckpointReadError(ValueError):
    """A checkpoint whose files cannot be read back (cut short by a full disk or a copy that stopped, or garbled):
    the message names the file and what is wrong."""


@dataclass(frozen=True)
class Unreadable:
    checkpoint: Checkpoint
    reason: str  # which file, and why it cannot be read


def load(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
         ) -> dict[str, Any]:
    """Restore weights, optimizer and scheduler in place; returns the saved `extra` dict (with `step`).
    CheckpointReadError, before anything is restored, when a file of the checkpoint cannot be read."""
    weights, state = _read(ckpt)
    model.load_state_dict(weights, strict=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return {**state.get("extra", {}), "step": int(state["step"])}


def load_newest(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
                ) -> tuple[Checkpoint | None, dict[str, Any], list[Unreadable]]:
    """Restore the newest checkpoint that can be read: (it, its `extra` dict, the newer ones that could not be).

    Two are kept so that one damaged by a full disk or a copy cut short costs the steps since the one before, not
    the run. (None, {}, [...]) when none can be read; (None, {}, []) when there is none."""
    unreadable: list[Unreadable] = []
    for candidate in reversed(list_checkpoints(run_dir)):
        try:
            return candidate, load(candidate, model, optimizer, scheduler), unreadable
        except CheckpointReadError as exc:
            unreadable.append(Unreadable(candidate, str(exc)))
    return None, {}, unreadable


def remove(checkpoints: list[Checkpoint]) -> None:
    """Remove checkpoints (the unreadable ones a resume skipped: newer than the step it resumes from, they would be
    picked up as the newest again, and the resumed run writes those steps anew)."""
    for checkpoint in checkpoints:
        shutil.rmtree(checkpoint.path, ignore_errors=True)


def _read(ckpt: Checkpoint) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The weights and the training state of `ckpt`, checked for the entries `load` restores."""
    import pickle
    import struct
    import zipfile

    from safetensors import SafetensorError

    errors = (SafetensorError, RuntimeError, OSError, EOFError, pickle.UnpicklingError, struct.error,
              zipfile.BadZipFile, ValueError)
    path = ckpt.path / "model.safetensors"
    try:
        weights = load_file(str(path))
        path = ckpt.path / "state.pt"
        state = torch.load(path, map_location="cpu", weights_only=True)
    except errors as exc:  # torch: "PytorchStreamReader failed reading zip archive: ..." for a file cut short
        raise CheckpointReadError(f"{path.name}: {_first_sentence(exc)}") from None
    missing = [key for key in ("step", "optimizer", "scheduler") if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointReadError(f"state.pt: no {', '.join(missing)} entry")
    return weights, state


def _first_sentence(exc: BaseException) -> str:
    """The first sentence of an error's message: torch follows "failed finding central directory" with a paragraph
    on how files get corrupted."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ", 1)[0].rstrip(".")
