"""timm's `pretrained_cfg_overlay=dict(file=...npz)`, the form the offline download message suggests, converts the
Google checkpoint (it used to reach `torch.load` and fail with `hasRecord("version")`), and so does timm's
`create_model(..., checkpoint_path=...npz)`, which hands the file to `model.load_pretrained`.

Golden values: `tests/fixtures/jax/vit_jax/tiny_token.io.npz` and `tiny_token_rep.io.npz`, the logits (and pre-logits)
of vit_jax's own code on its inputs.
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


def google_logits(name: str = "tiny_token") -> tuple[torch.Tensor, np.ndarray]:
    with np.load(JAX / f"{name}.io.npz") as io:
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


def test_checkpoint_path_npz_reproduces_googles_logits_and_leaves_no_hook_behind() -> None:
    # was: "Model cannot load numpy checkpoint" (timm calls model.load_pretrained after the build, and the hook was
    # bound for the build only); the model now has the method, and holds no reference to itself: freed without gc
    import gc
    import weakref

    model = timm.create_model("hub_vit", checkpoint_path=str(CHECKPOINT), **TINY_TOKEN).eval()
    inputs, logits = google_logits()
    with torch.no_grad():
        ours = model(inputs).double().numpy()
    assert float(np.abs(ours - logits).max()) <= 1e-5
    assert "load_pretrained" not in vars(model)
    gc.disable()
    try:
        gone = weakref.ref(model)
        del model
        assert gone() is None
    finally:
        gc.enable()


def test_a_pre_logits_layer_narrower_than_the_width_keeps_timms_two_feature_sizes_apart() -> None:
    # vit_jax's representation_size 32 on a width-64 model: forward_features gives the width per token
    # (`num_features`), the head reads the 32-wide pre-logits (`head_hidden_size`); both were 32 before
    with np.load(JAX / "tiny_token_rep.io.npz") as io:
        pre_logits = io["pre_logits"]
    model = timm.create_model("hub_vit", checkpoint_path=str(JAX / "tiny_token_rep.published.npz"),
                              **TINY_TOKEN, rep_size=32).eval()
    inputs, logits = google_logits("tiny_token_rep")
    with torch.no_grad():
        tokens = model.forward_features(inputs)
        pre = model.forward_head(tokens, pre_logits=True)
        assert float(np.abs(model.forward_head(tokens).double().numpy() - logits).max()) <= 1e-5
    assert (model.num_features, model.head_hidden_size) == (64, 32)
    assert tokens.shape[-1] == 64 and float(np.abs(pre.double().numpy() - pre_logits).max()) <= 1e-5
    model.reset_classifier(5)  # a new head reads the pre-logits
    with torch.no_grad():
        assert model(inputs).shape == (2, 5)


def test_load_pretrained_refuses_a_key_prefix_it_does_not_need() -> None:
    model = timm.create_model("hub_vit", **TINY_TOKEN)
    with pytest.raises(ValueError, match=r"prefix='opt/target/'.*finds the parameter tree .* leave prefix out"):
        model.load_pretrained(str(CHECKPOINT), prefix="opt/target/")


def test_load_pretrained_without_a_registered_reader_says_where_one_comes_from() -> None:
    # the model core reads no files: its reader is registered by timm's entry points; a model built directly, before
    # any timm build in the process, is told so instead of failing on a missing attribute
    import subprocess
    import sys

    script = ("from hub_vit.model import VisionTransformer; from hub_vit.variants import ViTSpec\n"
              "VisionTransformer(ViTSpec(width=64, depth=1, num_heads=2, mlp_dim=128, patch_size=16, img_size=32))"
              f".load_pretrained({str(CHECKPOINT)!r})")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: no checkpoint reader is registered: hub-vit's timm entry points register one when they " \
           "build a model (timm.create_model(...)); or read the file with hub_vit.conversion.load_checkpoint" \
           in done.stderr, done.stderr
