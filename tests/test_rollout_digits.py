"""On the shipped default model and real held-out digits, rollout mass falls on the strokes, not the background.

Measure per image: the share of the rollout map's mass that lies on stroke patches, against the share of the grid
those patches cover (what a map that ignores the image would get on average). The threshold is checked to be one
that shuffled maps (same values, random places) fail, so the test can tell a real map from a random one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hub_vit.demo.models import default_model_path

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="the default model is not shipped in this build")

STROKE_LEVEL = 64  # mean patch brightness (0..255) above which a patch counts as ink
MIN_MASS_ON_STROKES = 0.5  # "mostly on the strokes"
MIN_LIFT = 0.1  # ... and clearly above the strokes' area share


def stroke_mask(images: np.ndarray, patch: int) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, H/patch, W/patch) bool: patches whose mean brightness is ink-like."""
    grey = images[..., 0].astype(np.float32)
    n, h, w = grey.shape
    means = grey.reshape(n, h // patch, patch, w // patch, patch).mean(axis=(2, 4))
    return means > STROKE_LEVEL


def mass_on(maps: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return (maps * mask).sum(axis=(1, 2)) / maps.sum(axis=(1, 2))


@pytest.fixture(scope="module")
def held_out() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from hub_vit.demo.models import ModelChoice, load_explainer
    from hub_vit.explain import attention_rollout
    from hub_vit.train.digits import load_digits_split

    explainer = load_explainer(ModelChoice(key="default", kind="folder", target=str(default_model_path())))
    images, _ = load_digits_split("val")  # 360 digits the model never trained on
    images = images[::3]  # 120 of them keep the test quick
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255).sub(0.5).div(0.5)  # [-1, 1], as trained
    maps = attention_rollout(explainer.model, x, head_fusion="mean").maps.numpy()
    return images, maps, stroke_mask(images, explainer.model.spec.patch_size)


def test_rollout_mass_mostly_on_digit_strokes(held_out: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    _, maps, mask = held_out
    on_strokes = mass_on(maps, mask)
    area = mask.mean(axis=(1, 2))
    print(f"mass on strokes {on_strokes.mean():.3f} vs stroke area {area.mean():.3f}; "
          f"images above their area share: {(on_strokes > area).mean():.2%}")
    assert on_strokes.mean() >= MIN_MASS_ON_STROKES
    assert on_strokes.mean() - area.mean() >= MIN_LIFT
    assert (on_strokes > area).mean() >= 0.8


def test_threshold_rejects_shuffled_maps(held_out: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    _, maps, mask = held_out
    rng = np.random.default_rng(0)
    n, h, w = maps.shape
    shuffled = np.stack([rng.permutation(m.reshape(-1)).reshape(h, w) for m in maps])
    on_strokes = mass_on(shuffled, mask)
    area = mask.mean(axis=(1, 2))
    assert not (on_strokes.mean() >= MIN_MASS_ON_STROKES and on_strokes.mean() - area.mean() >= MIN_LIFT)
