"""scikit-learn's handwritten digits as the shipped default model sees them, and its held-out split.

`sklearn.datasets.load_digits` ships inside the scikit-learn wheel (1797 images, 8x8, 17 grey levels 0..16, bright
ink on a dark background). Each image is scaled to 0..255, upsampled 8x8 -> 32x32 (PIL bilinear) and repeated to
RGB. Held-out split: `train_test_split(test_size=0.2, stratify=labels, random_state=0)` (1437 train / 360 held-out
"val", every class in proportion). Below the export and the training (`hub_vit.train.digits` trains on it, the
export verifies the shipped model on its held-out split), so both read one copy of the rules.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from PIL import Image

IMG_SIZE = 32
SPLIT_SEED = 0
HELD_OUT_FRACTION = 0.2
SPLITS = ("train", "val")


@cache
def _split_indices() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    labels = load_digits().target
    train, val = train_test_split(np.arange(len(labels)), test_size=HELD_OUT_FRACTION, stratify=labels,
                                  random_state=SPLIT_SEED)
    return {"train": np.sort(train), "val": np.sort(val)}


def to_rgb32(image_8x8: np.ndarray) -> np.ndarray:
    """(8, 8) floats in 0..16 -> (32, 32, 3) uint8."""
    grey = Image.fromarray(np.round(image_8x8 * (255.0 / 16.0)).astype(np.uint8), mode="L")
    big = np.asarray(grey.resize((IMG_SIZE, IMG_SIZE), Image.Resampling.BILINEAR))
    return np.repeat(big[:, :, None], 3, axis=2)


def load_digits_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 32, 32, 3), labels int64 (N,)) for `"train"` (1437) or the held-out `"val"` (360)."""
    if split not in SPLITS:
        raise ValueError(f"unknown digits split {split!r}; valid splits: {', '.join(map(repr, SPLITS))}")
    from sklearn.datasets import load_digits

    raw = load_digits()
    idx = _split_indices()[split]
    images = np.stack([to_rgb32(raw.images[i]) for i in idx])
    return images, raw.target[idx].astype(np.int64)


def original_indices(split: str) -> np.ndarray:
    """Positions in `load_digits()` of the split's images (file names of the image folder use them)."""
    if split not in SPLITS:
        raise ValueError(f"unknown digits split {split!r}; valid splits: {', '.join(map(repr, SPLITS))}")
    return _split_indices()[split]


__all__ = ["HELD_OUT_FRACTION", "IMG_SIZE", "SPLITS", "SPLIT_SEED", "load_digits_split", "original_indices", "to_rgb32"]
