"""Reading untrusted image files and preparing them the way a hub-vit model expects, remembering the crop.

The model sees a centre crop (resize the shorter side to `size / crop_pct`, crop `size`), so a rollout map covers
only that crop. `prepare_image` returns the crop's box in the original image's pixels, which lets the overlay put the
map back where the model looked instead of stretching it over the whole photo.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

from hub_vit.data_config import INTERPOLATIONS as DATA_INTERPOLATIONS
from hub_vit.data_config import DataConfig
from hub_vit.image_formats import (
    FORMATS,
    NAMES,
    OTHER_SUFFIXES,
    OWN_FILE_NAMES,
    OWN_FILE_SUFFIXES,
    SIGNATURE_BYTES,
    empty_file,
    other_format,
    signature_format,
)
from hub_vit.image_modes import to_8bit
from hub_vit.paths import image_files
from hub_vit.resize_bound import check_resize, eval_resize

# Only these decoders ever run on a user's file or upload: the server's (hub_vit.image_formats)
IMAGE_FORMATS: tuple[str, ...] = FORMATS
# The one data config's interpolation names -> Pillow's filters (same names, upper case)
INTERPOLATIONS: dict[str, Image.Resampling] = {name: Image.Resampling[name.upper()] for name in DATA_INTERPOLATIONS}


class ImageReadError(ValueError):
    """A file could not be read as an image; the message names the file and the supported formats."""


def own_image_files(folder: str | Path, flag: str) -> list[Path]:
    """The image files of the user's own folder `folder` (`flag`: the option that named it), as `hub-vit train` reads
    them (`OWN_FILE_SUFFIXES`: BMP and GIF too); one that also holds images of formats not read (HEIC, TIFF, ...) is
    refused, naming them: a score fitted, or int8 calibrated and judged, on part of the folder is not what was asked."""
    return image_files(folder, flag, OWN_FILE_SUFFIXES, others=OTHER_SUFFIXES, taken=OWN_FILE_NAMES)


def load_image(source: str | Path | bytes, name: str | None = None, *, large: bool = False,
               max_pixels: int | None = None, formats: Sequence[str] = IMAGE_FORMATS) -> Image.Image:
    """Decode JPEG / PNG / WebP (`hub_vit.image_formats`; `formats`: `OWN_FILE_FORMATS` for the user's own files)
    from a path or bytes, apply EXIF orientation, refuse decompression bombs.

    Returns an RGB (or L, for grey images) PIL image, fully loaded; a transparent image is composited onto white
    (`hub_vit.image_modes`). Any failure is an `ImageReadError`: a file that is no image in these formats, a damaged
    or truncated one (with Pillow's reason), or one too large.
    Above Pillow's `MAX_IMAGE_PIXELS` (89 MP) an image is refused, unless `large` (the user's own files on the
    command line: a 108 MP phone photo is real); Pillow's hard limit, twice that, always applies. `max_pixels`, when
    given, is a tighter bound checked on the header, before any pixel is decoded (the demo uses the server's).
    """
    label = name or (str(source) if not isinstance(source, bytes) else "upload")
    fp: Any = io.BytesIO(source) if isinstance(source, bytes) else source
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if large else "error", Image.DecompressionBombWarning)
        try:
            im = Image.open(fp, formats=list(formats))  # lazy: reads the header only
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
            raise ImageReadError(f"{label!r} is too large to decode safely ({exc})") from exc
        except FileNotFoundError as exc:
            raise ImageReadError(f"image file {label!r} does not exist") from exc
        except IsADirectoryError as exc:
            raise ImageReadError(f"{label!r} is a folder, not an image file") from exc
        except Exception as exc:  # Pillow raises many exception types on malformed input (ValueError, OSError, ...)
            head = _first_bytes(source)
            claimed = signature_format(head)
            if claimed is not None:  # a JPEG / PNG / WebP cut short in its header: damaged, not another format
                reason = str(exc).strip() or type(exc).__name__
                raise ImageReadError(f"{label!r} is a damaged or incomplete {claimed} image ({reason})") from exc
            names = NAMES if tuple(formats) == FORMATS else OWN_FILE_NAMES
            if not head and _empty(source):
                raise ImageReadError(empty_file(label, names)) from exc
            other = other_format(head)
            if other is not None:
                raise ImageReadError(f"{label!r} is a {other} image, not one of the supported formats: {names} "
                                     "(convert it to one of them)") from exc
            raise ImageReadError(f"cannot read {label!r} as an image ({type(exc).__name__}); supported formats: "
                                 f"{names}") from exc
        with im:
            (width, height), kind = im.size, im.format
            if max_pixels is not None and width * height > max_pixels:
                raise ImageReadError(f"{label!r} is too large: it declares {width}x{height} = "
                                     f"{width * height / 1e6:.1f} MP, more than the limit of {max_pixels / 1e6:.1f} "
                                     "MP; refused before decoding")
            try:
                im.load()  # the pixels: a truncated or corrupt file fails only here
                upright = to_8bit(ImageOps.exif_transpose(im))  # 16-bit grey scaled, transparency onto white
                return upright.convert("L" if upright.mode in ("1", "L", "F") else "RGB")
            except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:  # found only while decoding
                raise ImageReadError(f"{label!r} is too large to decode safely ({exc})") from exc
            except Exception as exc:  # the header was fine: a damaged file, not an unsupported format
                reason = str(exc).strip() or type(exc).__name__
                raise ImageReadError(f"{label!r} is a damaged or incomplete {kind} image ({reason})") from exc


def _empty(source: str | Path | bytes) -> bool:
    """`source` holds no bytes at all (an upload cut off, a file created and never written)."""
    if isinstance(source, bytes):
        return not source
    try:
        return os.stat(source).st_size == 0
    except OSError:
        return False


def _first_bytes(source: str | Path | bytes) -> bytes:
    """The first bytes of `source`, enough for a format's signature (a BMP's reaches byte 18); none when it cannot be
    read."""
    if isinstance(source, bytes):
        return source[:SIGNATURE_BYTES]
    try:
        with open(source, "rb") as file:
            return file.read(SIGNATURE_BYTES)
    except OSError:
        return b""


@dataclass(frozen=True)
class PreparedImage:
    """A model input and where it came from."""

    image: Image.Image  # the decoded original (RGB or L)
    tensor: torch.Tensor  # (C, H, W) float32, normalised
    box: tuple[float, float, float, float]  # (left, top, right, bottom) of the model's crop, in original pixels


def prepare_image(image: Image.Image, data: DataConfig) -> PreparedImage:
    """Resize to `size / crop_pct` keeping the aspect ratio (as timm does; `crop_mode` "squash": both sides to it),
    centre-crop `size`, normalise. `data` is the model's one `DataConfig`.

    `ValueError` for timm's "border" crop mode (not implemented here); `ImageReadError` if the resize would create
    more than `hub_vit.resize_bound.MAX_RESIZED_PIXELS` pixels (an extreme aspect ratio)."""
    th, tw = data.img_size
    w, h = image.size
    # Same sizes and rounding as timm's eval transform (Resize(int) or ResizeKeepRatio, then CenterCrop).
    scale_h, scale_w = data.scale_size
    if data.crop_mode == "squash":
        rw, rh = scale_w, scale_h
    elif data.crop_mode == "center":
        rw, rh = eval_resize(w, h, scale_h, scale_w)
    else:
        raise ValueError(f"crop_mode {data.crop_mode!r} is not supported for rollout; valid: 'center', 'squash'")
    check_resize(w, h, rw, rh, error=ImageReadError)
    resized = image.convert("L" if data.in_chans == 1 else "RGB").resize((rw, rh), INTERPOLATIONS[data.interpolation])
    left, top = int(round((rw - tw) / 2.0)), int(round((rh - th) / 2.0))
    crop = resized.crop((left, top, left + tw, top + th))
    arr = np.asarray(crop, dtype=np.float32) / 255.0
    arr = arr[..., None] if arr.ndim == 2 else arr  # (H, W, C)
    arr = (arr - np.asarray(data.mean, np.float32)) / np.asarray(data.std, np.float32)
    tensor = torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))
    sx, sy = w / rw, h / rh
    box = (left * sx, top * sy, (left + tw) * sx, (top + th) * sy)
    return PreparedImage(image=image, tensor=tensor, box=box)
