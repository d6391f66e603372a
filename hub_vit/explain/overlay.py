"""Turning a (grid_h, grid_w) relevance map into a picture: upsample, colour-map, blend over the image.

The colour maps are small piecewise-linear tables written here (no matplotlib dependency). When the model saw only a
centre crop, the heat map is placed on that crop's box and the rest of the image is dimmed, so nobody reads
relevance into pixels the model never saw.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

# (position, (r, g, b)) control points in [0, 1]; interpolated linearly into 256-entry tables.
_ANCHORS: dict[str, list[tuple[float, tuple[float, float, float]]]] = {
    "jet": [(0.0, (0.0, 0.0, 0.5)), (0.11, (0.0, 0.0, 1.0)), (0.34, (0.0, 1.0, 1.0)),
            (0.65, (1.0, 1.0, 0.0)), (0.89, (1.0, 0.0, 0.0)), (1.0, (0.5, 0.0, 0.0))],
    "inferno": [(0.0, (0.0, 0.0, 0.02)), (0.25, (0.34, 0.06, 0.43)), (0.5, (0.73, 0.21, 0.33)),
                (0.75, (0.98, 0.55, 0.04)), (1.0, (0.99, 1.0, 0.64))],
    "gray": [(0.0, (0.0, 0.0, 0.0)), (1.0, (1.0, 1.0, 1.0))],
}
COLORMAPS: tuple[str, ...] = tuple(_ANCHORS)


def colormap_table(name: str) -> np.ndarray:
    """(256, 3) uint8 lookup table for colour map `name`."""
    if name not in _ANCHORS:
        raise ValueError(f"unknown colormap {name!r}; valid choices: {', '.join(COLORMAPS)}")
    pos = np.array([p for p, _ in _ANCHORS[name]])
    rgb = np.array([c for _, c in _ANCHORS[name]])  # (K, 3)
    t = np.linspace(0.0, 1.0, 256)
    table = np.stack([np.interp(t, pos, rgb[:, c]) for c in range(3)], axis=1)
    return np.round(table * 255).astype(np.uint8)


def normalize_map(relevance: torch.Tensor | np.ndarray) -> np.ndarray:
    """Min-max scale one map to [0, 1]. A (near-)constant map becomes all zeros, never NaN and never amplified
    float rounding noise (differences below 1e-6 of the map's magnitude count as constant)."""
    arr = np.asarray(relevance.detach().cpu() if isinstance(relevance, torch.Tensor) else relevance, np.float32)
    lo, hi = float(arr.min()), float(arr.max())
    if hi - lo <= 1e-6 * max(abs(hi), abs(lo), 1e-30):
        return np.zeros_like(arr)
    return (arr - lo) / (hi - lo)


def upsample_map(relevance: torch.Tensor | np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(h, w) -> (H, W) float32 by bilinear interpolation (pixel centres aligned, as image resizing does)."""
    t = torch.as_tensor(np.asarray(relevance, np.float32) if not isinstance(relevance, torch.Tensor) else relevance)
    t = t.detach().float().cpu()[None, None]  # (1, 1, h, w)
    return F.interpolate(t, size=size, mode="bilinear", align_corners=False)[0, 0].numpy()


def color_indices(values: np.ndarray) -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W) uint8 rows of a colour table (1 byte a pixel)."""
    return np.clip(np.round(np.asarray(values) * 255), 0, 255).astype(np.uint8)


def colorize(values: np.ndarray, colormap: str = "jet") -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 colours."""
    return colormap_table(colormap)[color_indices(values)]


BAND_ROWS = 256  # rows blended at a time: the float temporaries cover a band, not the image (a 108 MP photo)


def blend(image: Image.Image | np.ndarray, relevance: torch.Tensor | np.ndarray,
          box: tuple[float, float, float, float] | None = None, alpha: float = 0.5,
          colormap: str = "jet") -> np.ndarray:
    """Heat map of `relevance` (h, w) blended over `image`; returns (H, W, 3) uint8 at the image's own size.

    `box` (left, top, right, bottom) is where the map lies in the image (the model's crop); outside it the image is
    shown dimmed. `alpha` is the heat map's opacity.
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    shape = tuple(relevance.shape)
    if len(shape) != 2:  # a batch's maps (B, h, w) reached F.interpolate's own shape error
        raise ValueError(f"blend draws one map (grid_h, grid_w), got shape {shape}; for a batch, blend each image's "
                         "own: result.maps[i]")
    # checked where the map lies: numpy cannot read a CUDA tensor, which the drawing below moves to the CPU itself
    finite = torch.isfinite(relevance).all() if isinstance(relevance, torch.Tensor) else np.isfinite(relevance).all()
    if not bool(finite):  # drew a map of NaN with a RuntimeWarning
        raise ValueError("the map holds NaN or infinite values; the model's attentions or gradients were not finite")
    table = colormap_table(colormap)
    rgb = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if rgb.ndim == 2:
        rgb = np.repeat(rgb[..., None], 3, axis=2)
    rgb = rgb[..., :3]  # (H, W, 3), as given (uint8 from a picture)
    H, W = rgb.shape[:2]
    left, top, right, bottom = (0, 0, W, H) if box is None else box
    x0, y0 = max(0, int(round(left))), max(0, int(round(top)))
    x1, y1 = min(W, max(x0 + 1, int(round(right)))), min(H, max(y0 + 1, int(round(bottom))))
    # Normalise on the patch grid, then upsample: bilinear values stay in [0, 1] and the picture is smooth. Kept as
    # colour-table rows (1 byte a pixel); the float arithmetic below runs one band of rows at a time, so a large photo
    # costs a few bytes a pixel instead of ~65 (every (H, W, 3) float32 temporary at once)
    heat_rows = color_indices(upsample_map(normalize_map(relevance), (y1 - y0, x1 - x0)))
    out = np.empty((H, W, 3), np.uint8)
    for start in range(0, H, BAND_ROWS):
        stop = min(H, start + BAND_ROWS)
        band = rgb[start:stop].astype(np.float32)
        blended = band * 0.35  # outside the crop: dimmed, no heat
        top_row, bottom_row = max(start, y0), min(stop, y1)
        if top_row < bottom_row:
            heat = table[heat_rows[top_row - y0:bottom_row - y0]].astype(np.float32)
            rows = slice(top_row - start, bottom_row - start)
            blended[rows, x0:x1] = (1 - alpha) * band[rows, x0:x1] + alpha * heat
        out[start:stop] = np.clip(np.round(blended), 0, 255).astype(np.uint8)
    return out


def save_png(array: np.ndarray, path: str) -> None:
    """Write (H, W, 3) uint8 as PNG atomically: a temporary file in the same folder, then a rename."""
    from hub_vit.atomic import atomic_path

    with atomic_path(path, suffix=".png") as tmp:
        Image.fromarray(array).save(tmp, format="PNG")
