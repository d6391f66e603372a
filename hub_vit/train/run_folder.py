"""The run folder: what it may hold, what `recipe.json` records, and whether resuming it would change the experiment.

A run folder holds `recipe.json` (the recipe, the starting weights, the classes, a fingerprint of the data),
`metrics.jsonl`, `checkpoints/` and, once the run is complete, `model/`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hub_vit.atomic import atomic_path, file_in_the_way
from hub_vit.claim import Claim, Claimed
from hub_vit.file_hash import sha256_file
from hub_vit.train import checkpoint as ckpt
from hub_vit.train.models import init_folder_architecture
from hub_vit.train.recipe import Recipe


class RunFolderError(ValueError):
    """The run folder belongs to another recipe (resuming it would silently change the experiment)."""


# What a run folder holds (`data` is the digits preset's image folder, written by the command line)
RUN_ENTRIES = frozenset({"recipe.json", "metrics.jsonl", "checkpoints", "model", "data"})
LOG_SUFFIXES = frozenset({".log", ".out", ".err"})  # files a run folder may hold besides its own
_CLAIMED: set[str] = set()  # the run folders this process holds (`claimed`)


@contextlib.contextmanager
def claimed(run_dir: str | Path) -> Iterator[None]:
    """Hold `run_dir` against every other process's run while inside (`hub_vit.claim`; within this process it may be
    entered again): two runs of one folder interleaved their checkpoints and metrics.jsonl. RunFolderError naming the
    other run's pid when it is held."""
    name = "hub-vit-train-" + hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:40]
    if name in _CLAIMED:
        yield
        return
    try:
        claim = Claim(name)
    except Claimed as exc:
        raise RunFolderError(f"run folder {str(run_dir)!r} is being trained by another process (pid {exc.holder}): "
                             "wait for it to end, or stop it (the same command resumes it from its last "
                             "checkpoint), or give another folder") from None
    _CLAIMED.add(name)
    try:
        yield
    finally:
        _CLAIMED.discard(name)
        claim.release()



def run_settings(recipe: Recipe, init: str | Path | None, classes: tuple[str, ...],
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


def nothing_trained(run_dir: Path) -> bool:
    """No checkpoint and no model folder: a rerun would start over, whatever else the run folder holds (recipe.json,
    the metrics of steps it trains again)."""
    return ckpt.latest(run_dir) is None and not (run_dir / "model").exists()


def check_run_folder(run_dir: Path, recipe: Recipe, init: str | Path | None, classes: tuple[str, ...],
                      data: dict[str, Any] | None = None) -> list[str]:
    """RunFolderError when resuming `run_dir` would change the experiment; returns the warnings to print (data edited
    in place, a val split that changed, a run folder that predates the data fingerprint)."""
    check_run_folder_path(run_dir)
    saved = run_dir / "recipe.json"
    if not saved.is_file():
        return []
    if nothing_trained(run_dir):
        # a run that failed before its first checkpoint (`--lr` too high, a bad image): nothing trained to protect,
        # and the corrected command (the error's own advice) must be able to start over in the same folder
        return []
    old = json.loads(saved.read_text())
    new = run_settings(recipe, init, classes, data)
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


def trim_metrics(path: Path, step: int) -> None:
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
        write_text(path, "".join(f"{line}\n" for line in kept))


def write_settings(run_dir: Path, recipe: Recipe, init: str | Path | None, classes: tuple[str, ...],
                   data: dict[str, Any]) -> None:
    """Write `recipe.json`: what a resumed run is compared with (`check_run_folder`)."""
    write_text(run_dir / "recipe.json", json.dumps(run_settings(recipe, init, classes, data), indent=2))


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
