"""Pillow image modes that `Image.convert` gets wrong, brought to 8 bits the way Pillow itself does for colour.

A 16-bit greyscale PNG opens as mode "I;16" (older Pillow: "I"). `convert("RGB")` / `convert("L")` on it *clip*
each value to 255 instead of scaling it, so a 16-bit photo turns almost entirely white and gets classified as
something else, silently (timm's own loader does the same). Pillow reads 16-bit *colour* PNGs straight to 8 bits by
keeping the high byte of each sample; we do the same for grey, so a 16-bit PNG and its 8-bit version (`value >> 8`)
give the same pixels.

The served preprocessing (`server/templates/preprocess/imageprep.py`) must stay importable without hub_vit and keeps
its own copy of this rule; a test checks the two agree.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

# Integer greyscale modes wider than 8 bits; "I" is 32-bit signed, holding 16-bit samples when it comes from a PNG.
WIDE_GREY_MODES: tuple[str, ...] = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def to_8bit(image: Image.Image) -> Image.Image:
    """A 16-bit greyscale image -> mode "L" with the high byte of each sample; any other image unchanged."""
    if image.mode not in WIDE_GREY_MODES:
        return image
    samples = np.asarray(image).astype(np.int64)  # (H, W); I;16B arrives big-endian, astype normalises it
    return Image.fromarray((np.clip(samples, 0, 65535) >> 8).astype(np.uint8))  # 2-D uint8 -> mode "L"
