"""Converting at a new image size resamples learned position embeddings exactly as Google's code does.

vit_jax (`checkpoint.py::interpolate_posembed`) and big_vision (`models/vit.py::resample_posemb`) both reshape the
patch part of the table to its (gs, gs, D) grid and call `scipy.ndimage.zoom(grid, (new/old, new/old, 1), order=1)`,
keeping the class-token entry (vit_jax) untouched. That algorithm is re-implemented below with scipy and applied to
the fixture's own embedding; the converter's output must match it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.ndimage
import timm
import torch

import hub_vit  # noqa: F401
from hub_vit.conversion import convert_file, infer_spec, read_npz
from hub_vit.conversion.writer import convert_to_folder

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
VIT_JAX = JAX / "vit_jax" / "tiny_token.published.npz"  # posemb (1, 1+16, 64) with a class-token slot
BIG_VISION = JAX / "big_vision" / "tiny_learn_tok.npz"  # posemb (1, 16, 64), patches only


def google_zoom(posemb: np.ndarray, has_class_token: bool, new_side: int) -> np.ndarray:
    """Google's algorithm: split off the class-token entry, zoom the square grid with order=1, re-attach."""
    tok, grid = (posemb[:, :1], posemb[0, 1:]) if has_class_token else (posemb[:, :0], posemb[0])
    old_side = int(np.sqrt(len(grid)))
    grid = grid.reshape(old_side, old_side, -1)
    zoom = (new_side / old_side, new_side / old_side, 1)
    grid = scipy.ndimage.zoom(grid, zoom, order=1).reshape(1, new_side * new_side, -1)
    return np.concatenate([tok, grid], axis=1)


@pytest.mark.parametrize("img", [32, 96, 112, 160])  # grid 4x4 -> 2x2, 6x6, 7x7, 10x10
def test_vit_jax_posemb_resampled_like_google(img: int) -> None:
    posemb = read_npz(VIT_JAX)["Transformer/posembed_input/pos_embedding"]
    conv = convert_file(VIT_JAX, img_size=img)
    assert conv.spec.img_size == (img, img) and conv.spec.posemb_on_cls
    expected = google_zoom(posemb, has_class_token=True, new_side=img // 16)
    ours = conv.state_dict["pos_embed"].numpy()
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=0, atol=2e-6)
    assert np.array_equal(ours[:, 0], posemb[:, 0]), "the class-token entry must not be resampled"


def test_big_vision_posemb_resampled_like_google() -> None:
    posemb = read_npz(BIG_VISION)["params/pos_embedding"]
    conv = convert_file(BIG_VISION, img_size=96)
    expected = google_zoom(posemb, has_class_token=False, new_side=6)
    np.testing.assert_allclose(conv.state_dict["pos_embed"].numpy(), expected, rtol=0, atol=2e-6)
    # cls is untouched: big_vision's cls token never gets a position embedding
    assert np.array_equal(conv.state_dict["cls_token"].numpy(), read_npz(BIG_VISION)["params/cls"])


def test_timm_custom_load_at_new_size_resamples_like_google() -> None:
    """timm asking for 96 px from a 64 px checkpoint: `convert_npz_file(path, spec)` fits the spec's grid."""
    spec = infer_spec(read_npz(VIT_JAX)).replace(img_size=96)
    model = timm.create_model("hub_vit", pretrained=True, pretrained_cfg_overlay=dict(file=str(VIT_JAX),
                                                                                      custom_load=True),
                              **spec.to_dict()).eval()
    expected = google_zoom(read_npz(VIT_JAX)["Transformer/posembed_input/pos_embedding"], True, 6)
    np.testing.assert_allclose(model.pos_embed.detach().numpy(), expected, rtol=0, atol=2e-6)
    x = torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (2, 3, 96, 96)).astype(np.float32))
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()


def test_cli_folder_at_new_size(tmp_path: Path) -> None:
    result = convert_to_folder(VIT_JAX, tmp_path / "out", img_size=96, progress=False)
    info = json.loads((result.path / "conversion.json").read_text())
    assert info["spec"]["img_size"] == [96, 96] and info["checkpoint_spec"]["img_size"] == [64, 64]
    assert any("resampled from grid 4x4 to 6x6" in n for n in info["notes"])
    parity = info["parity"]  # the function changed: only the patch embeddings can be compared to Google's
    assert set(parity["max_abs_diff"]) == {"patch_embeddings"} and parity["passed"]
    assert "logits" in parity["skipped"]
    cfg = json.loads((result.path / "config.json").read_text())
    assert cfg["pretrained_cfg"]["input_size"] == [3, 96, 96]


def test_sincos_is_recomputed_for_a_new_size(tmp_path: Path) -> None:
    """sincos2d has no parameter: a 96 px conversion still reproduces Google's logits at the fixture's 64 px."""
    ckpt = JAX / "big_vision" / "tiny_sincos2d_gap_rep.npz"
    result = convert_to_folder(ckpt, tmp_path / "out", img_size=96, progress=False)
    assert "pos_embed" not in convert_file(ckpt, img_size=96).state_dict
    assert result.conversion.spec.img_size == (96, 96)
    assert result.parity.mode == "reference" and "logits" in result.parity.max_abs_diff and result.parity.passed
