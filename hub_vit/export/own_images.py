"""The verification set of a model: noise and photo crops, plus the model's own kind of images where it has some:
a folder the user names (`hub-vit export onnx --images DIR`), else the held-out images its model folder names
(`hub_vit.folder.held_out_images`: a trained model's `val` split, the shipped digits model's held-out digits). Own
images are prepared by the model's own eval transform at the graph's input size, and top-1 agreement is judged on
them: a digits model is judged on digits, not on photos it was never meant to classify.

`verification_set` is the one place that decides it, for `hub-vit export onnx` and the CPU flavour's variants alike.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hub_vit.data_config import DataConfig
from hub_vit.export.plan import OwnImages, VerificationSet
from hub_vit.folder import DIGITS_HELD_OUT, HeldOutImages, held_out_images

if TYPE_CHECKING:
    from hub_vit.resolve import ResolvedModel

DEFAULT_LIMIT = 512  # own images read at most (verification and calibration share them)


def load_image_folder(folder: str | Path, data: DataConfig, limit: int | None = None) -> np.ndarray:
    """Image files of `folder` (recursively, sorted) -> (N, C, H, W) float32, each prepared exactly as the model's
    own eval transform `data` prepares it (EXIF orientation, resize, centre crop, mean/std), so int8 calibration
    and verification see the activations the served model will see. `limit` (0 or None: all) takes files evenly
    spaced over the sorted list, so a folder of class folders gives every class its share."""
    from hub_vit.explain.image import ImageReadError, load_image, own_image_files, prepare_image
    from hub_vit.image_formats import OWN_FILE_FORMATS

    if limit is not None and limit < 0:
        raise ValueError(f"the image limit must be >= 0 (0 = all), got {limit}")
    # the user's own files, read as `hub-vit train` and `calibrate-domain` read them: a model trained on BMP or GIF
    # files names a held-out split of them
    files = own_image_files(folder, "--images")
    if limit and len(files) > limit:
        files = [files[i] for i in np.linspace(0, len(files) - 1, limit).round().astype(int)]
    out = np.empty((len(files), data.in_chans, *data.img_size), dtype=np.float32)
    for i, f in enumerate(files):
        # The user's own files: above Pillow's 89 MP warning is fine (large=True); load_image's errors name the file,
        # prepare_image's (an aspect ratio too extreme to resize) do not
        image = load_image(f, large=True, formats=OWN_FILE_FORMATS)
        try:
            out[i] = prepare_image(image, data).tensor.numpy()
        except ImageReadError as exc:
            raise ImageReadError(f"{str(f)!r}: {exc}") from None
    return out


def _held_out(record: HeldOutImages, data: DataConfig, limit: int) -> np.ndarray:
    if record.generated == DIGITS_HELD_OUT:
        from PIL import Image

        from hub_vit.digits_data import load_digits_split
        from hub_vit.explain.image import prepare_image

        digits, _ = load_digits_split("val")  # (360, 32, 32, 3) uint8, never trained on
        digits = digits[np.linspace(0, len(digits) - 1, min(limit, len(digits))).round().astype(int)]
        return np.stack([prepare_image(Image.fromarray(d), data).tensor.numpy() for d in digits])
    return load_image_folder(record.folder, data, limit)


def verification_set(source: ResolvedModel, *, images: str | Path | None = None, limit: int = DEFAULT_LIMIT,
                     **counts: int | None) -> VerificationSet:
    """The verification set for `source`: `counts` (n_random, n_photos, n_calibration, seed) as given, its own images
    (`images`, else the held-out images its folder names), and `trained` unless its weights are random (or an
    in-memory module: nothing says what its classes mean). Held-out images that cannot be read are a `note`, and
    top-1 is then judged on the photos; a bad `images` folder is an error (the user named it)."""
    if limit < 0:
        raise ValueError(f"the image limit must be >= 0 (0 = all), got {limit}")
    limit = limit or 1 << 30
    module = source.module
    data = replace(source.data, img_size=tuple(module.spec.img_size))  # the graph's size, whatever the transform's
    check = VerificationSet(**counts, trained=not (source.kind == "module" or source.random_weights),
                            classifier=bool(module.spec.num_classes))
    if images is not None:
        return replace(check, own=OwnImages(load_image_folder(images, data, limit), source=f"--images {images}"))
    record = None if source.folder is None else held_out_images(source.folder)
    if record is None:
        return check
    try:
        own = _held_out(record, data, limit)
    except (OSError, ValueError, ImportError) as exc:  # a moved data folder, no scikit-learn: photos judge instead
        return replace(check, note=f"{record.describe()} not read ({exc}); top-1 judged on the photos")
    return replace(check, own=OwnImages(own, source=record.describe(), scope="held-out images"))


__all__ = ["DEFAULT_LIMIT", "load_image_folder", "verification_set"]
