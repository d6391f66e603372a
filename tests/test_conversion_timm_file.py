"""timm's `pretrained_cfg_overlay=dict(file=...npz)`, the form the offline download message suggests, converts the
Google checkpoint (it used to reach `torch.load` and fail with `hasRecord("version")`).

Golden values: `tests/fixtures/jax/vit_jax/tiny_token.io.npz`, the logits of vit_jax's own code on its inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import hub_vit  # noqa: F401  (registers the timm architectures)
from hub_vit.conversion import ArchitectureMismatchError

JAX = Path(__file__).resolve().parent / "fixtures" / "jax" / "vit_jax"
CHECKPOINT = JAX / "tiny_token.published.npz"
# vit_jax/fixtures.json: tiny_token is patch 16, hidden 64, 2 layers, 2 heads, mlp 128, 10 classes, 64x64, token pool
TINY_TOKEN = dict(width=64, depth=2, num_heads=2, mlp_dim=128, patch_size=16, num_classes=10, img_size=64,
                  posemb="learn", pool_type="tok", posemb_on_cls=True)


def google_logits() -> tuple[torch.Tensor, np.ndarray]:
    with np.load(JAX / "tiny_token.io.npz") as io:
        return torch.from_numpy(io["inputs"]).permute(0, 3, 1, 2).contiguous(), io["logits"]


@pytest.mark.parametrize("overlay", [dict(file=str(CHECKPOINT)), dict(file=str(CHECKPOINT), custom_load=True)],
                         ids=["file only", "file + custom_load"])
def test_npz_file_overlay_reproduces_googles_logits(overlay: dict) -> None:
    model = timm.create_model("hub_vit", pretrained=True, pretrained_cfg_overlay=overlay, **TINY_TOKEN).eval()
    inputs, logits = google_logits()
    with torch.no_grad():
        ours = model(inputs).double().numpy()
    assert float(np.abs(ours - logits).max()) <= 1e-5


def test_npz_file_overlay_on_a_registered_name_names_both_architectures() -> None:
    # The message's own example: a catalog name plus a local npz of another size is an architecture error
    with pytest.raises(ArchitectureMismatchError, match=r"width 64 \(checkpoint\) vs 384 \(model\)"):
        timm.create_model("simplevit_s16.i1k_90ep", pretrained=True,
                          pretrained_cfg_overlay=dict(file=str(CHECKPOINT)))
