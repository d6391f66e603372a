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

from hub_vit.atomic import atomic_path, cannot_write_in, file_in_the_way
from hub_vit.claim import Claim, Claimed
from hub_vit.file_hash import sha256_file
from hub_vit.paths import listed
from hub_vit.train import checkpoint as ckpt
from hub_vit.train.models import init_folder_architecture
from hub_vit.train.recipe import RUN_RECORD, Recipe


class RunFolderError(ValueError):
    """The run folder belongs to another recipe (resuming it would silently change the experiment)."""


class SettingChangeError(RunFolderError):
    """Resuming the run folder would change a setting. As a `SettingError`'s, the message names each setting as
    `Recipe` spells it (`micro_batch`), outside quotes and never as a plain word, so that a front end can put its own
    name in its place (`--micro-batch`)."""


# What a run folder holds (`data` is the digits preset's image folder, written by the command line)
RUN_ENTRIES = frozenset({"recipe.json", "metrics.jsonl", "checkpoints", "model", "data"})
LOG_SUFFIXES = frozenset({".log", ".out", ".err"})  # files a run folder may hold besides its own
# settings that do not change the result: a resumed run may change them
NOT_COMPARED = frozenset({"workers", "log_every_steps", "checkpoint_every_steps"})
MODEL_DIR = "model"
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
                  data: dict[str, Any] | None = None, micro: int | None = None) -> dict[str, Any]:
    """What `recipe.json` records, and what a resumed run must match: the recipe, the starting weights (resolved
    path and sha256 of the weights file), the classes, a fingerprint of the data (`data.fingerprint`) and the
    images per forward pass of each process (`micro`: --micro-batch, or batch_size / processes)."""
    # the keys of RUN_RECORD: what Recipe.load drops from recipe.json
    return {**recipe.to_dict(), **_init_settings(init), "classes": list(classes), "data": data,
            "effective_micro_batch": micro}


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
    problem = cannot_write_in(run_dir)  # a read-only mount, another user's folder: was "Permission denied", exit 1
    if problem is not None:
        raise RunFolderError(f"cannot write the run folder --out {str(run_dir)!r}: {problem}; choose another folder")
    if run_dir.is_dir() and not (run_dir / "recipe.json").is_file():
        # an existing folder of something else (a project, a folder of runs) would get checkpoints/, model/ and
        # recipe.json mixed into it
        # the job's own log (`| tee run/train.log`, SLURM's `--output=run/%j.out`) is written before hub-vit starts
        foreign = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith(".") and p.name not in RUN_ENTRIES
                         and not (p.is_file() and p.suffix in LOG_SUFFIXES))
        if foreign:
            raise RunFolderError(f"--out {str(run_dir)!r} is not a run folder (it holds {listed(foreign)}); choose a "
                                 "new or empty folder")
    _check_model_dir(run_dir)


def _check_model_dir(run_dir: Path) -> None:
    """RunFolderError when `run_dir/model` is something the run would have to replace at its end without having
    written it: a file, or a folder that is not a model folder `hub-vit train` wrote (no training.json). It used to
    be found after the whole run, with a traceback; an empty folder is fine."""
    folder = run_dir / MODEL_DIR
    if not folder.exists() and not folder.is_symlink():
        return
    if not folder.is_dir():
        raise RunFolderError(f"--out {str(run_dir)!r} holds a file {MODEL_DIR!r} where the run writes its model "
                             "folder: move it away or choose another --out folder")
    if is_trained_model_folder(folder) or not any(folder.iterdir()):
        return
    held = sorted(p.name for p in folder.iterdir())
    raise RunFolderError(f"--out {str(run_dir)!r} holds a {MODEL_DIR}/ folder that hub-vit train did not write (it "
                         f"holds {listed(held)}; no training.json), where the run writes its model folder: move "
                         f"{str(folder)!r} away or choose another --out folder")


def is_trained_model_folder(folder: Path) -> bool:
    """A hub-vit model folder with a `training.json`: what `hub-vit train` writes as `<run>/model`."""
    from hub_vit.folder import TRAINING_RECORD, is_model_folder

    return is_model_folder(folder) and (folder / TRAINING_RECORD).is_file()


def finished_model(run_dir: Path, recipe: Recipe, total_steps: int) -> dict[str, Any] | None:
    """The `training.json` of `run_dir`'s model folder when it is the complete result of this run (model card
    written, the same steps and recipe): the run is then complete and its folder is left alone. None otherwise."""
    from hub_vit.folder import TRAINING_RECORD
    from hub_vit.model_cards.facts import CARD

    folder = run_dir / MODEL_DIR
    if not is_trained_model_folder(folder) or not (folder / CARD).is_file():
        return None  # a folder from before model/ was staged may lack its card: exported again
    try:
        training = json.loads((folder / TRAINING_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(training, dict) or training.get("steps") != total_steps:
        return None
    # the micro batch is compared by `check_run_folder` (allowed to change with mixup off): not a reason to export again
    ignored = NOT_COMPARED | {"micro_batch"}
    recorded = training.get("recipe")
    if not isinstance(recorded, dict) or any(recorded.get(k) != v for k, v in recipe.to_dict().items()
                                             if k not in ignored):
        return None
    return training


def check_out_outside_data(run_dir: Path, data_dir: Path) -> None:
    """RunFolderError when the run folder is inside the data's `train` or `val` split: its checkpoints would be read
    as images of a class (the next run failed on 'model.safetensors is not an image file')."""
    run = Path(run_dir).resolve()
    for split in ("train", "val"):
        folder = (Path(data_dir) / split).resolve()
        if run == folder or folder in run.parents:
            raise RunFolderError(f"--out {str(run_dir)!r} is inside the data folder's {split} split "
                                 f"({str(Path(data_dir) / split)!r}), where every folder is a class of images: choose "
                                 f"a run folder outside {str(Path(data_dir) / 'train')!r} and "
                                 f"{str(Path(data_dir) / 'val')!r}")


def nothing_trained(run_dir: Path) -> bool:
    """No checkpoint and no model folder: a rerun would start over, whatever else the run folder holds (recipe.json,
    the metrics of steps it trains again)."""
    return ckpt.latest(run_dir) is None and not (run_dir / "model").exists()


def check_run_folder(run_dir: Path, recipe: Recipe, init: str | Path | None, classes: tuple[str, ...],
                      data: dict[str, Any] | None = None, micro: int | None = None) -> list[str]:
    """RunFolderError when resuming `run_dir` would change the experiment; returns the warnings to print (data edited
    in place, a val split that changed, a run folder that predates the data fingerprint, another micro batch with
    mixup off). `micro`: the images per forward pass of each process this run would use."""
    check_run_folder_path(run_dir)
    saved = run_dir / "recipe.json"
    if not saved.is_file():
        return []
    if nothing_trained(run_dir):
        # a run that failed before its first checkpoint (`--lr` too high, a bad image): nothing trained to protect,
        # and the corrected command (the error's own advice) must be able to start over in the same folder
        return []
    old = json.loads(saved.read_text())
    new = run_settings(recipe, init, classes, data, micro)
    if "classes" in old and old["classes"] != new["classes"]:  # runs from before it was recorded: not checked
        added = sorted(set(new["classes"]) - set(old["classes"]))
        removed = sorted(set(old["classes"]) - set(new["classes"]))
        raise RunFolderError(f"run folder {str(run_dir)!r} was started on other classes (added: {added or 'none'}, "
                             f"removed: {removed or 'none'}); its head and labels would not match: resume with the "
                             "same data or choose a new --out folder")
    # do not change the result, or compared below
    ignore = {*NOT_COMPARED, *RUN_RECORD}
    if init_folder_architecture(init) is not None:
        ignore.add("model")  # the folder (compared as `init`) decides it; runs before the fix recorded the default
    if old.get("effective_micro_batch") is not None and micro is not None:
        ignore.add("micro_batch")  # what it makes is compared (`_micro_batch_change`), whichever way it is set
    diff = {k: (old.get(k), v) for k, v in new.items() if k not in ignore and old.get(k) != v}
    init_change = _init_change(old, new)
    if init_change:
        diff["init"] = init_change
    if diff:
        lines = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise SettingChangeError(f"run folder {str(run_dir)!r} was started with another recipe ({lines}); "
                                 "resume it with the same settings or choose a new --out folder")
    notes = _micro_batch_change(run_dir, old.get("effective_micro_batch"), micro, recipe)
    if data is None:
        return notes
    if not isinstance(old.get("data"), dict):
        return [*notes, f"run folder {str(run_dir)!r} was started before hub-vit recorded a fingerprint of the data: "
                "the data is not compared with the data the checkpoint was trained on"]
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


def _micro_batch_change(run_dir: Path, old: Any, new: int | None, recipe: Recipe) -> list[str]:
    """The rule for a resume whose images per forward pass of each process differ from the run's (another
    --micro-batch, or another number of torchrun processes): Mixup draws one ratio per micro batch and pairs images
    within it, so with mixup on the rest of the run would be another recipe, refused; with mixup off only float
    rounding changes (the optimizer still sees the mean gradient of batch_size images): a warning."""
    if not isinstance(old, int) or new is None or old == new:
        return []
    what = (f"run folder {str(run_dir)!r} was trained with {old} images per forward pass of each process and this "
            f"run would use {new} (micro_batch, else batch_size {recipe.batch_size} / the number of processes)")
    if recipe.mixup:
        raise SettingChangeError(f"{what}; with mixup on ({recipe.mixup:g}) that changes which images are mixed "
                                 "and with what ratio, so the rest of the run would follow another recipe: resume "
                                 "with the same number of processes and micro_batch, or choose a new --out folder")
    return [f"{what}; with mixup off only float rounding changes: resuming on it (training.json records the new "
            "value)"]


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
                   data: dict[str, Any], micro: int | None = None) -> None:
    """Write `recipe.json`: what a resumed run is compared with (`check_run_folder`)."""
    write_text(run_dir / "recipe.json", json.dumps(run_settings(recipe, init, classes, data, micro), indent=2))


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
