"""Image-folder data with big_vision's train/eval preprocessing, built from timm's transforms and Mixup.

Folder layout: `DATA/train/<class>/*.jpg|png|...` and `DATA/val/<class>/...` (class names = sub-folder names, sorted
naturally; `val` may lack classes, never add new ones).

Exact resumption: the training stream is a pure function of (seed, position). Global image position `p` belongs to
epoch `p // N`, whose permutation is seeded by (seed, epoch); the augmentation of that image is seeded by
(seed, p). Step `t` of a run reads positions `[t * batch, (t + 1) * batch)`, each process its own contiguous slice,
so a resumed run, a run with a different number of workers and (for the data) a run on another number of processes
all see the same images with the same augmentations.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from timm.data import create_transform
from timm.data.mixup import Mixup
from timm.data.readers.img_extensions import get_img_extensions
from timm.data.readers.reader_image_folder import natural_key
from torch.utils.data import Dataset, Sampler

from hub_vit.data_config import GOOGLE_EVAL
from hub_vit.image_formats import OWN_FILE_SUFFIXES
from hub_vit.image_modes import to_8bit
from hub_vit.train.recipe import Recipe

MEAN, STD = GOOGLE_EVAL.mean, GOOGLE_EVAL.std  # value_range(-1, 1)
SPLITS = ("train", "val")
# Beyond timm's default (png, jpg, jpeg): WebP, BMP and GIF, the user's own files (hub_vit.image_formats); the
# out-of-domain score fitted at the end of a run reads the same files
IMAGE_EXTENSIONS = frozenset(OWN_FILE_SUFFIXES)


class DataFolderError(ValueError):
    """The data folder is missing, empty, or holds something that is not an image."""

    @classmethod
    def from_worker(cls, exc: DataFolderError) -> DataFolderError:
        """The error's own one-line message when `exc` was raised in a data-loader worker: torch re-raises it in the
        main process with the worker's whole traceback as the message (20 lines for "cannot decode image ...")."""
        text = str(exc).rstrip()
        marker = f"{cls.__name__}: "
        if not text.startswith(f"Caught {cls.__name__}") or marker not in text:
            return exc
        return cls(text.rsplit(marker, 1)[1])


@dataclass(frozen=True)
class ImageFolderSplit:
    root: Path
    samples: tuple[tuple[Path, int], ...]  # (file, class index)
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.samples)


def scan_split(root: str | Path, split: str, classes: tuple[str, ...] | None = None) -> ImageFolderSplit:
    """List `root/split/<class>/<image>`; every file must be an image (dotfiles are skipped).

    Raises `DataFolderError` naming the folder or file and what was expected. With `classes` given (the train split's),
    a class folder not in that list is an error, so label indices always mean the same class.
    """
    folder = Path(root) / split
    if Path(root).is_file():  # was "data folder 'DATA/train' does not exist"
        raise DataFolderError(f"data folder {str(root)!r} is a file, not a folder; expected a folder that holds "
                              f"{' and '.join(f'{s}/<class>/<image>' for s in SPLITS)}")
    if not folder.is_dir():
        raise DataFolderError(
            f"data folder {str(folder)!r} does not exist; expected {str(Path(root))!r} to hold "
            f"{' and '.join(f'{s}/<class>/<image>' for s in SPLITS)}"
        )
    extensions = set(get_img_extensions(as_set=True)) | IMAGE_EXTENSIONS
    loose = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if loose:
        raise DataFolderError(f"{str(folder)!r} holds files outside class folders ({', '.join(loose[:5])}); "
                              f"expected {split}/<class>/<image>")
    found = sorted((p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")), key=natural_key)
    defines_classes = classes is None  # the train split does; the val split must use its classes
    if classes is None:
        classes = tuple(found)
        if len(classes) < 2:
            listed = ", ".join(classes) or "none"
            raise DataFolderError(f"{str(folder)!r} has {len(classes)} class folder(s) ({listed}); a classifier "
                                  f"needs at least 2: {split}/<class>/<image>")
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise DataFolderError(f"{str(folder)!r} has class folders {unknown} that the train split does not have; "
                              f"valid classes: {', '.join(classes)}")
    samples: list[tuple[Path, int]] = []
    for name in found:
        index = classes.index(name)
        for path in sorted(_class_files(folder / name), key=lambda p: natural_key(str(p))):
            if path.name.startswith("."):
                continue
            if path.suffix.lower() not in extensions:
                raise DataFolderError(
                    f"{str(path)!r} is not an image file; every file under {split}/<class>/ must have one of the "
                    f"extensions {', '.join(sorted(extensions))}"
                )
            samples.append((path, index))
    seen = {label for _, label in samples}
    empty = [name for i, name in enumerate(classes) if i not in seen]
    if empty and defines_classes and samples:
        raise DataFolderError(f"class folder(s) {empty} under {str(folder)!r} hold no images; a class the model "
                              "never sees cannot be learned (remove the folder or add images)")
    if not samples:
        raise DataFolderError(f"data folder {str(folder)!r} has no images; expected {split}/<class>/<image> with "
                              f"one of the extensions {', '.join(sorted(extensions))}")
    return ImageFolderSplit(folder, tuple(samples), tuple(classes))


def _class_files(folder: Path) -> Iterator[Path]:
    """The files under a class folder, hidden folders skipped as hidden files are: Jupyter's `.ipynb_checkpoints`
    copies of images were read as images of the class (without a word, possibly of another class)."""
    for parent, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        yield from (Path(parent) / f for f in files)


def fingerprint(split: ImageFolderSplit) -> dict[str, object]:
    """What a resumed run compares to make sure it reads the data the run started with: the image count, a digest of
    the sorted relative paths (the order of the images and the length of the run follow from them) and a digest of
    the paths with their sizes (an image edited or replaced in place). File sizes, not contents: one `stat` per
    image, cheap even for ImageNet's 1.28M files."""
    files = sorted((path.relative_to(split.root).as_posix(), path.stat().st_size) for path, _ in split.samples)
    names = hashlib.sha256("".join(f"{name}\n" for name, _ in files).encode())
    sized = hashlib.sha256("".join(f"{name}\t{size}\n" for name, size in files).encode())
    return dict(images=len(files), names_sha256=names.hexdigest(), files_sha256=sized.hexdigest())


def check_headers(files: Iterable[Path]) -> None:
    """DataFolderError naming the first of `files` PIL cannot identify, or whose structure is broken: `verify` checks it
    without decoding for some formats (PNG's chunk CRCs), and a JPEG that does not end with its end-of-image marker
    (cut short: a copy or download that stopped) is decoded whole to see whether it is. Cheap: the pixels of whole
    files are not decoded, so an image damaged inside can still fail later, when it is decoded."""
    for path in files:
        try:
            with Image.open(path) as img:
                is_jpeg = img.format == "JPEG"
                img.verify()
            if is_jpeg and not _ends_with_jpeg_eoi(path):  # also a valid file with data after its end (a trailer)
                with Image.open(path) as img:
                    img.load()
        except Image.DecompressionBombError as exc:  # not an OSError: it would escape as a traceback
            raise DataFolderError(_too_large(path, exc)) from exc
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:  # PIL's PNG verify raises SyntaxError
            raise DataFolderError(f"cannot decode image {str(path)!r}: {exc}") from exc


def _ends_with_jpeg_eoi(path: Path) -> bool:
    """The file's last bytes, less any padding, are JPEG's end-of-image marker FF D9."""
    with path.open("rb") as file:
        file.seek(max(0, path.stat().st_size - 64))
        return file.read().rstrip(b"\0\r\n ").endswith(b"\xff\xd9")


def load_rgb(path: Path) -> Image.Image:
    """An RGB image upright as displayed (EXIF orientation applied, as the rollout, the image processor and the
    served preprocessing do: a phone photo must not be trained sideways and served upright)."""
    try:
        with Image.open(path) as img:
            return to_8bit(ImageOps.exif_transpose(img)).convert("RGB")  # 16-bit grey: scaled, not clipped to white
    except Image.DecompressionBombError as exc:
        raise DataFolderError(_too_large(path, exc)) from exc
    except (UnidentifiedImageError, OSError) as exc:
        raise DataFolderError(f"cannot decode image {str(path)!r}: {exc}") from exc


def _too_large(path: Path, exc: Exception) -> str:
    return (f"image {str(path)!r} is too large to decode safely ({exc}); shrink it, or raise "
            "PIL.Image.MAX_IMAGE_PIXELS if the file is trusted")


def train_transform(recipe: Recipe):  # -> torchvision Compose
    """inception_crop(area, ratio) | flip_lr | randaug(n, m) | value_range(-1, 1), as timm transforms."""
    return create_transform(
        recipe.img_size, is_training=True, scale=recipe.crop_area, ratio=recipe.crop_ratio, hflip=recipe.hflip,
        vflip=0.0, color_jitter=None, auto_augment=recipe.randaug or None, interpolation=recipe.interpolation,
        mean=MEAN, std=STD, re_prob=0.0,
    )


def eval_transform(recipe: Recipe):
    """resize_small(img_size / crop_pct) | central_crop(img_size) | value_range(-1, 1)."""
    return create_transform(**recipe.eval_data().timm_transform_args(), is_training=False)


def sample_seed(seed: int, *key: int) -> int:
    return int(np.random.SeedSequence([seed, *key]).generate_state(1)[0])


class TrainStream(Dataset):
    """Maps a global stream position to (augmented image, label); see the module docstring for the seeding."""

    def __init__(self, split: ImageFolderSplit, recipe: Recipe) -> None:
        self.split, self.seed, self.transform = split, recipe.seed, train_transform(recipe)
        self._perm: tuple[int, torch.Tensor] | None = None  # (epoch, permutation), cached per worker

    def __len__(self) -> int:
        return len(self.split)

    def index_of(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.split))
        if self._perm is None or self._perm[0] != epoch:
            gen = torch.Generator().manual_seed(sample_seed(self.seed, 1, epoch))
            self._perm = (epoch, torch.randperm(len(self.split), generator=gen))
        return int(self._perm[1][offset])

    def __getitem__(self, position: int) -> tuple[torch.Tensor, int]:
        path, label = self.split.samples[self.index_of(position)]
        # timm/torchvision transforms draw from python `random`, numpy and torch: seed all three for this image.
        s = sample_seed(self.seed, 2, position)
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)
        return self.transform(load_rgb(path)), label


class EvalImages(Dataset):
    def __init__(self, split: ImageFolderSplit, recipe: Recipe) -> None:
        self.split, self.transform = split, eval_transform(recipe)

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.split.samples[index]
        return self.transform(load_rgb(path)), label


class StreamBatches(Sampler[list[int]]):
    """Micro-batches of stream positions for one process, from `start_step` to `total_steps`.

    Global step t covers positions [t*B, (t+1)*B); rank r takes [t*B + r*B/W, t*B + (r+1)*B/W), cut into
    `accum` micro-batches of `micro` positions.
    """

    def __init__(self, batch_size: int, micro: int, accum: int, rank: int, world: int, start_step: int,
                 total_steps: int) -> None:
        self.batch_size, self.micro, self.accum = batch_size, micro, accum
        self.rank, self.world, self.start_step, self.total_steps = rank, world, start_step, total_steps

    def __len__(self) -> int:
        return max(self.total_steps - self.start_step, 0) * self.accum

    def __iter__(self) -> Iterator[list[int]]:
        per_rank = self.batch_size // self.world
        for step in range(self.start_step, self.total_steps):
            base = step * self.batch_size + self.rank * per_rank
            for k in range(self.accum):
                start = base + k * self.micro
                yield list(range(start, start + self.micro))


class SeededMixup(Mixup):
    """timm's batch Mixup with big_vision's semantics: one ratio lam ~ Beta(p, p) per batch, always applied, no label
    smoothing; the ratio comes from a generator re-seeded for every micro-batch, so resumed runs mix identically."""

    def __init__(self, p: float, num_classes: int) -> None:
        super().__init__(mixup_alpha=p, cutmix_alpha=0.0, prob=1.0, mode="batch", label_smoothing=0.0,
                         num_classes=num_classes)
        self.rng = np.random.default_rng(0)

    def reseed(self, seed: int, *key: int) -> None:
        self.rng = np.random.default_rng([seed, *key])

    def _params_per_batch(self) -> tuple[float, bool]:
        return float(self.rng.beta(self.mixup_alpha, self.mixup_alpha)), False
