"""Pillow image modes that `Image.convert` gets wrong, brought to 8 bits and opaque before it runs.

A 16-bit greyscale PNG opens as mode "I;16" (older Pillow: "I"). `convert("RGB")` / `convert("L")` on it *clip*
each value to 255 instead of scaling it, so a 16-bit photo turns almost entirely white and gets classified as
something else, silently (timm's own loader does the same). Pillow reads 16-bit *colour* PNGs straight to 8 bits by
keeping the high byte of each sample; we do the same for grey, so a 16-bit PNG and its 8-bit version (`value >> 8`)
give the same pixels.

Transparency (RGBA, LA, a palette or a colour key with transparency): `convert("RGB")` drops the alpha channel and
keeps whatever colour the invisible pixels hold, so the model would see pixels the user cannot (a cut-out photo's
hidden half, or a black-ink digit on a transparent background becoming an all-black square). Such images are
composited onto white, the background a browser and most viewers show them on.

The served preprocessing (`server/repository/templates/preprocess/imageprep.py`) runs without hub_vit: `hub-vit
repository` copies this file beside it, so this module must import nothing but numpy and Pillow.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

# Integer greyscale modes wider than 8 bits; "I" is 32-bit signed, holding 16-bit samples when it comes from a PNG.
WIDE_GREY_MODES: tuple[str, ...] = ("I;16", "I;16B", "I;16L", "I;16N", "I")
# Modes with an alpha channel ("a": premultiplied), and which of them (plus plain grey) stay grey once opaque.
ALPHA_MODES: tuple[str, ...] = ("RGBA", "RGBa", "LA", "La", "PA")
GREY_MODES: tuple[str, ...] = ("1", "L", "LA", "La")
BACKGROUND = 255  # white, per channel


def to_8bit(image: Image.Image) -> Image.Image:
    """An image `convert("RGB")` / `convert("L")` handles right: 16-bit greyscale -> mode "L" with the high byte of
    each sample; a transparent image -> composited onto white (mode "L" for grey, else "RGB"); any other image
    unchanged."""
    if image.mode in WIDE_GREY_MODES:
        samples = np.asarray(image).astype(np.int64)  # (H, W); I;16B arrives big-endian, astype normalises it
        grey = (np.clip(samples, 0, 65535) >> 8).astype(np.uint8)
        key = image.info.get("transparency")
        if isinstance(key, int):  # a PNG colour key (tRNS) on the full 16-bit sample: those pixels are transparent
            grey[samples == key] = BACKGROUND
        return Image.fromarray(grey)  # 2-D uint8 -> mode "L"
    return flatten_alpha(image)


def flatten_alpha(image: Image.Image) -> Image.Image:
    """A transparent image composited onto white (mode "L" for grey, else "RGB"); an opaque one unchanged."""
    if image.mode not in ALPHA_MODES and "transparency" not in image.info:
        return image
    grey = image.mode in GREY_MODES
    # Pillow turns a palette's or a colour key's transparency into alpha on the way to RGBA (grey through LA: La and
    # "1" convert to LA only)
    rgba = (image.convert("LA") if grey else image).convert("RGBA")
    if rgba.getchannel("A").getextrema()[0] < 255:  # an opaque image (alpha 255 everywhere) needs no compositing
        rgba = Image.alpha_composite(Image.new("RGBA", rgba.size, (BACKGROUND,) * 3 + (255,)), rgba)
    rgb = rgba.convert("RGB")
    return rgb.convert("L") if grey else rgb  # grey stays grey: L of R = G = B is that value exactly
