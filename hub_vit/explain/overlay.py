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


def colorize(values: np.ndarray, colormap: str = "jet") -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 colours."""
    idx = np.clip(np.round(np.asarray(values) * 255), 0, 255).astype(np.int64)
    return colormap_table(colormap)[idx]


def blend(image: Image.Image | np.ndarray, relevance: torch.Tensor | np.ndarray,
          box: tuple[float, float, float, float] | None = None, alpha: float = 0.5,
          colormap: str = "jet") -> np.ndarray:
    """Heat map of `relevance` (h, w) blended over `image`; returns (H, W, 3) uint8 at the image's own size.

    `box` (left, top, right, bottom) is where the map lies in the image (the model's crop); outside it the image is
    shown dimmed. `alpha` is the heat map's opacity.
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    rgb = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if rgb.ndim == 2:
        rgb = np.repeat(rgb[..., None], 3, axis=2)
    rgb = rgb[..., :3].astype(np.float32)  # (H, W, 3)
    H, W = rgb.shape[:2]
    left, top, right, bottom = (0, 0, W, H) if box is None else box
    x0, y0 = max(0, int(round(left))), max(0, int(round(top)))
    x1, y1 = min(W, max(x0 + 1, int(round(right)))), min(H, max(y0 + 1, int(round(bottom))))
    out = rgb * 0.35  # outside the crop: dimmed, no heat
    # Normalise on the patch grid, then upsample: bilinear values stay in [0, 1] and the picture is smooth.
    heat = colorize(upsample_map(normalize_map(relevance), (y1 - y0, x1 - x0)), colormap).astype(np.float32)
    out[y0:y1, x0:x1] = (1 - alpha) * rgb[y0:y1, x0:x1] + alpha * heat
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def save_png(array: np.ndarray, path: str) -> None:
    """Write (H, W, 3) uint8 as PNG atomically: a temporary file in the same folder, then a rename."""
    from hub_vit.atomic import atomic_path

    with atomic_path(path, suffix=".png") as tmp:
        Image.fromarray(array).save(tmp, format="PNG")
