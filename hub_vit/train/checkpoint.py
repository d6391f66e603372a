"""Training checkpoints that resume exactly: weights (safetensors) + optimizer, scheduler and step (torch file).

Layout: `RUN/checkpoints/step_000123/{model.safetensors, state.pt}`. A checkpoint is written into a temporary folder
and renamed into place, so a crash never leaves a half-written `step_*` folder that `latest()` would pick up. The data
stream needs no saved RNG state: it is a function of (seed, step) (see `hub_vit.train.data`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

PREFIX = "step_"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
         extra: dict[str, Any] | None = None, keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep` ones."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:09d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "step": str(step)})
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "extra": extra or {}}, tmp / "state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


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


def load(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
         ) -> dict[str, Any]:
    """Restore weights, optimizer and scheduler in place; returns the saved `extra` dict (with `step`)."""
    model.load_state_dict(load_file(str(ckpt.path / "model.safetensors")), strict=True)
    state = torch.load(ckpt.path / "state.pt", map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return {**state.get("extra", {}), "step": int(state["step"])}
