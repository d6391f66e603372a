"""The resize that comes before the centre crop, and the bound on it.

timm's eval transform (torchvision `Resize(int)`) resizes the *shorter* side, so a thin image grows: a 2 kB PNG of
2x200000 pixels would become 256x25600000 (20 GB) and end the process. Every in-process path that resizes an image
from outside checks the target size here first. The served preprocessing
(`server/repository/templates/preprocess/imageprep.py`) keeps its own copy, because it runs without hub_vit, and bounds
it by its `max_pixels` option (same default).

Bundled into saved model folders as transformers remote code (`hub_vit.hf.remote_code`): standard library only.
"""

from __future__ import annotations

MAX_RESIZED_PIXELS = 40_000_000


def check_not_empty(width: int, height: int) -> None:
    """ValueError unless the image has at least one pixel: nothing can be resized from none."""
    if width < 1 or height < 1:
        raise ValueError(f"the image is {width}x{height} pixels: an image without pixels cannot be resized")


def shorter_side_resize(width: int, height: int, size: int) -> tuple[int, int]:
    """(W, H) after resizing the shorter side of a `width` x `height` image to `size`, the longer side truncated.
    ValueError for an image without pixels (a side of 0: was a ZeroDivisionError)."""
    check_not_empty(width, height)
    short, long = min(width, height), max(width, height)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def eval_resize(width: int, height: int, scale_height: int, scale_width: int) -> tuple[int, int]:
    """(W, H) after timm's eval resize to the scale size (`floor(input size / crop_pct)`) in its centre-crop mode:
    torchvision `Resize(int)` (shorter side) for a square scale size, timm's `ResizeKeepRatio` otherwise (the side
    with the smaller source/target ratio lands on its target, the other keeps the aspect ratio and is rounded)."""
    if scale_height == scale_width:
        return shorter_side_resize(width, height, scale_height)
    check_not_empty(width, height)
    ratio = min(height / scale_height, width / scale_width)
    return round(width / ratio), round(height / ratio)


def check_resize(width: int, height: int, new_width: int, new_height: int,
                 error: type[ValueError] = ValueError) -> None:
    """`error` naming both sizes if resizing `width` x `height` to `new_width` x `new_height` would create more than
    `MAX_RESIZED_PIXELS` pixels (an extreme aspect ratio)."""
    if new_width * new_height > MAX_RESIZED_PIXELS:
        raise error(f"aspect ratio too extreme: a {width}x{height} image would be resized to {new_width}x{new_height} "
                    f"= {new_width * new_height} pixels before the centre crop, more than the limit of "
                    f"{MAX_RESIZED_PIXELS}")
