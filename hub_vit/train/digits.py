"""The shipped default model's data and recipe: scikit-learn's handwritten digits as a 32x32 RGB image folder.

`sklearn.datasets.load_digits` ships inside the scikit-learn wheel (1797 images, 8x8, 17 grey levels 0..16, bright
ink on a dark background), so the default model trains and evaluates with no download. Each image is scaled to
0..255, upsampled 8x8 -> 32x32 (PIL bilinear) and repeated to RGB; patch 4 gives the model an 8x8 grid, one token
per original pixel's neighbourhood.

Held-out split: `train_test_split(test_size=0.2, stratify=labels, random_state=0)` over the 1797 images (1437
train / 360 held-out "val", every class in proportion). `load_digits_split("val")` returns exactly those images, so
any test can evaluate the default model on the data it never saw.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from hub_vit import catalog
from hub_vit.atomic import process_gone

# the data and its split (below the export, which verifies the shipped model on the held-out split)
from hub_vit.digits_data import HELD_OUT_FRACTION, IMG_SIZE, SPLIT_SEED, SPLITS, load_digits_split, original_indices
from hub_vit.paths import listed
from hub_vit.train.recipe import Recipe
from hub_vit.variants import ViTSpec

LABELS = catalog.DIGIT_LABELS  # the class folders, named as the shipped model's classes
# what the default model knows, as its domain.json says it after "this model knows"
DOMAIN_KNOWS = "the handwritten digits 0-9 (8x8 scans from scikit-learn's digits data set)"

# The architecture lives in the catalog (the one table of architectures): a small SimpleViT (sincos2d posemb,
# global average pooling, tanh pre-logits as in the paper's config), patch 4 on 32x32.
DIGITS_SPEC: ViTSpec = catalog.DIGITS_SPEC

# The paper's recipe scaled down (see docs/training.md "The default model" for each change and why).
DIGITS_RECIPE = Recipe(
    model=catalog.DEFAULT_MODEL,
    img_size=IMG_SIZE,
    batch_size=32,
    total_epochs=40.0,
    lr=3e-3,
    wd=1e-4,
    warmup_steps=100,
    crop_area=(0.7, 1.0),
    hflip=0.0,
    randaug="",
    mixup=0.2,
    eval_crop_pct=1.0,
    workers=1,
    eval_every_epochs=5.0,
    checkpoint_every_steps=500,
    log_every_steps=20,
)


def write_image_folder(root: str | Path) -> Path:
    """`root/{train,val}/<digit>/<index in load_digits>.png`: the data folder `hub-vit train` reads.

    Written into a temporary sibling and renamed, so an interrupted call leaves no half-filled folder. A ValueError
    naming what `root` holds, before anything is written, when it is something else (an unrelated `data/` folder in
    a run folder ended in an 'OSError: Directory not empty' traceback, or was trained on as if it were the digits).
    """
    root = Path(root)
    check_image_folder_target(root)
    if (root / "train").is_dir() and (root / "val").is_dir():
        return root
    _remove_abandoned_tmps(root)
    tmp = root.with_name(f".{root.name}.{os.getpid()}.tmp")  # per process: torchrun ranks may race here
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # Ctrl-C or a full disk mid-way: the half-filled folder goes too (the rename below is the commit)
        _write_splits(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(root)
    except OSError:  # another process finished first; its folder has the same content
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / "val").is_dir():
            raise
    return root


def check_image_folder_target(root: Path) -> None:
    """ValueError unless `root` is absent, an empty folder, or the digits image folder `write_image_folder` wrote
    (train/ and val/ with digit class folders only): anything else would be replaced or read as the digits."""
    if not root.exists() and not root.is_symlink():
        return
    if not root.is_dir():
        raise ValueError(f"{str(root)!r} is a file, where the digits image folder is written: move it away or "
                         "choose another folder")
    entries = sorted(p.name for p in root.iterdir())
    splits_ok = all(name in SPLITS and (root / name).is_dir() for name in entries)
    classes_ok = splits_ok and all(p.is_dir() and p.name in LABELS for name in entries for p in (root / name).iterdir())
    if splits_ok and classes_ok:
        return
    raise ValueError(f"{str(root)!r} holds files that are not the digits image folder hub-vit writes there (it holds "
                     f"{listed(entries)}); --preset digits without DATA writes its images into it: move it away or "
                     "choose another folder")


def _write_splits(tmp: Path) -> None:
    for split in SPLITS:
        images, labels = load_digits_split(split)
        for image, label, index in zip(images, labels, original_indices(split), strict=True):
            folder = tmp / split / LABELS[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{index:04d}.png")


def _remove_abandoned_tmps(root: Path) -> None:
    """Remove `.<root>.<pid>.tmp` folders whose process is gone (killed with SIGKILL, say, or a crash before the
    cleanup ran): the name is per process, so no later run would ever reuse, and so remove, them. A live pid may be
    another torchrun rank writing right now: its folder is left alone."""
    for tmp in root.parent.glob(f".{root.name}.*.tmp") if root.parent.is_dir() else ():
        pid = tmp.name[len(root.name) + 2: -len(".tmp")]
        if pid.isdigit() and process_gone(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def export_samples(folder: str | Path, per_class: int = 2, size: int = 128, usable: np.ndarray | None = None
                   ) -> list[Path]:
    """Held-out digits as `<label>_<i>.png`, upsampled (nearest, so resizing back to 32 px restores the model's exact
    input) to `size` px for the demo, the README command and the serving tests.

    `usable`: optional boolean mask over the held-out split (e.g. "the shipped model gets this one right"); the first
    `per_class` usable images of each digit are taken.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = load_digits_split("val")
    usable = np.ones(len(labels), dtype=bool) if usable is None else usable
    written = []
    for label in range(10):
        for i, index in enumerate(np.flatnonzero((labels == label) & usable)[:per_class]):
            path = folder / f"{label}_{i}.png"
            Image.fromarray(images[index]).resize((size, size), Image.Resampling.NEAREST).save(path)
            written.append(path)
    return written


def dataset_info() -> dict:
    """How the image folder was made (goes into training.json)."""
    import sklearn

    from hub_vit.folder import DIGITS_HELD_OUT  # here: it loads torch, and `hub-vit --help` reads DIGITS_RECIPE

    return dict(
        name="scikit-learn load_digits (UCI optical recognition of handwritten digits, test part)",
        scikit_learn=sklearn.__version__,
        split=f"train_test_split(test_size={HELD_OUT_FRACTION}, stratify=labels, random_state={SPLIT_SEED})",
        preprocessing="8x8 grey 0..16 -> x255/16 uint8 -> PIL bilinear 32x32 -> RGB; bright ink on dark background",
        held_out_loader="hub_vit.train.digits.load_digits_split('val')",
        held_out_images=DIGITS_HELD_OUT,  # the export verifies the model on it (hub_vit.folder.held_out_images)
    )


def domain_sources() -> dict[str, str]:
    """How the default model's domain.json names the images its out-of-domain score is fitted and checked on."""
    return {"images": "the digits training split (hub_vit.train.digits.load_digits_split('train'))",
            "held_out": "the held-out digits split (load_digits_split('val'))"}


def held_out_predictions(model_dir: str | Path) -> np.ndarray:
    """Class indices a model folder predicts for the held-out split (32x32 inputs, [-1, 1], no resize needed)."""
    import torch

    from hub_vit.folder import load_model_folder

    model, _ = load_model_folder(model_dir)
    images, _ = load_digits_split("val")
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0  # (N, 3, 32, 32) in [-1, 1]
    with torch.no_grad():
        return model.eval()(x).argmax(-1).numpy()


def install_default_model(model_dir: str | Path, dest: str | Path) -> Path:
    """Copy a finished digits run's model folder to `dest` with `samples/`, atomically, then write its model card."""
    from hub_vit.atomic import replace_dir
    from hub_vit.folder import check_output_folder

    model_dir, dest = Path(model_dir), Path(dest)
    if not (model_dir / "training.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a finished training run's model folder: training.json is missing")
    check_output_folder(dest, overwrite=True)  # replaces a model folder, never an arbitrary one (or the cwd)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_dir, tmp)
    # demo / README / serving-test samples: held-out digits the model classifies correctly, so that downstream
    # checks of "predicted label == file name" test the plumbing, not the model's 2-3 % of errors
    export_samples(tmp / "samples", usable=held_out_predictions(model_dir) == load_digits_split("val")[1])
    replace_dir(tmp, dest)
    from hub_vit.model_cards import write_model_card

    write_model_card(dest)  # the real card, titled after the catalog entry the folder is bundled as
    return dest
