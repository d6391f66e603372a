"""The one model module: position embeddings, attention paths, resolution changes, init, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hub_vit.layers import posemb_sincos_2d, resample_posemb
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

TINY = dict(width=64, depth=2, mlp_dim=128, num_heads=4, patch_size=16, img_size=64, num_classes=10)
FAMILIES = {
    "vit_jax_token": dict(posemb="learn", pool_type="tok", posemb_on_cls=True),
    "big_vision_token": dict(posemb="learn", pool_type="tok"),
    "simplevit_gap_rep": dict(posemb="sincos2d", pool_type="gap", rep_size=True),
    "map": dict(posemb="learn", pool_type="map"),
}


def _model(family: str, **kw) -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(ViTSpec(**{**TINY, **FAMILIES[family], **kw}))
    with torch.no_grad():  # big_vision zero-inits the head; randomise it so logits differ between classes
        model.head.weight.normal_(std=0.5)
    return model.eval()


@pytest.mark.parametrize(
    ("fixture", "grid"), [("tiny_sincos2d_gap_rep", (4, 4)), ("tiny_sincos2d_gap_h48w64", (3, 4))]
)
def test_sincos2d_equals_big_vision_output(jax_fixtures, fixture: str, grid: tuple[int, int]) -> None:
    """Golden values: `vit.posemb_sincos_2d` as computed by big_vision itself (tests/fixtures/jax)."""
    reference = np.load(jax_fixtures / "big_vision" / f"{fixture}.io.npz")["posemb_sincos2d"]
    ours = posemb_sincos_2d(*grid, reference.shape[-1]).numpy()
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=1e-6, rtol=0)


def test_sincos2d_formula_by_hand() -> None:
    """Channel order [sin x, cos x, sin y, cos y], omega = 1/10000**(i/(D/4-1)); x = column, y = row."""
    h, w, D = 3, 5, 16
    pe = posemb_sincos_2d(h, w, D, dtype=torch.float64)[0]
    omega = 1.0 / 10000 ** (np.arange(D // 4) / (D // 4 - 1))
    row, col = 2, 3
    token = pe[row * w + col].numpy()
    expected = np.concatenate([np.sin(col * omega), np.cos(col * omega), np.sin(row * omega), np.cos(row * omega)])
    np.testing.assert_allclose(token, expected, atol=1e-12)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_attention_path_matches_fused_path(family: str) -> None:
    model = _model(family)
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        fused = model(x)
        out = model.forward_all(x, output_attentions=True, output_hidden_states=True)
    assert (out.logits - fused).abs().max().item() <= 1e-5
    n_tokens = 16 + model.num_prefix_tokens
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3
    for attn in out.attentions:
        assert attn.shape == (3, 4, n_tokens, n_tokens)
        torch.testing.assert_close(attn.sum(-1), torch.ones(3, 4, n_tokens), atol=1e-5, rtol=0)
        assert (attn >= 0).all()
    if family == "map":
        assert out.pool_attention.shape == (3, 4, 1, 16)
        torch.testing.assert_close(out.pool_attention.sum(-1), torch.ones(3, 4, 1), atol=1e-5, rtol=0)


def test_gap_pools_normed_patch_tokens() -> None:
    """big_vision order for GAP: final LayerNorm first, then the mean over tokens."""
    model = _model("simplevit_gap_rep")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = model.forward_all(x)
        expected = model.head(torch.tanh(model.pre_logits.fc(out.tokens.mean(1))))
    torch.testing.assert_close(out.logits, expected)


def test_sincos_model_runs_at_new_sizes_without_interpolation(monkeypatch) -> None:
    model = VisionTransformer(ViTSpec.from_variant("mu/16", posemb="sincos2d", pool_type="gap", img_size=224)).eval()

    def no_interpolation(*args, **kwargs):
        raise AssertionError("a sincos2d model must recompute its table, never interpolate it")

    monkeypatch.setattr(F, "interpolate", no_interpolation)
    for size in [(288, 288), (160, 224)]:
        with torch.no_grad():
            tokens = model.forward_features(torch.randn(2, 3, *size))
        assert tokens.shape == (2, (size[0] // 16) * (size[1] // 16), 32)
    # the table used for 288 is exactly big_vision's 18x18 one: check the first block's input
    x = torch.randn(1, 3, 288, 288)
    with torch.no_grad():
        patches = model.patch_embed.proj(x).flatten(2).transpose(1, 2)
        torch.testing.assert_close(model.embed(x), patches + posemb_sincos_2d(18, 18, 32))


def test_learned_posemb_is_resampled_for_other_sizes() -> None:
    model = _model("vit_jax_token")
    x = torch.randn(1, 3, 96, 64)  # 6x4 grid instead of 4x4
    with torch.no_grad():
        embedded = model.embed(x)
        patches = model.patch_embed.proj(x).flatten(2).transpose(1, 2)
        grid = resample_posemb(model.pos_embed[:, 1:], (4, 4), (6, 4))
        expected = torch.cat([model.cls_token + model.pos_embed[:, :1], patches + grid], 1)
    torch.testing.assert_close(embedded, expected)
    assert model(x).shape == (1, 10)


def test_resample_posemb_matches_scipy_zoom_order1() -> None:
    """vit_jax / big_vision resample with scipy.ndimage.zoom(order=1); compare on a random grid."""
    from scipy import ndimage

    rng = np.random.default_rng(0)
    grid = rng.normal(size=(4, 4, 8)).astype(np.float32)
    expected = ndimage.zoom(grid, (7 / 4, 5 / 4, 1), order=1)
    ours = resample_posemb(torch.from_numpy(grid.reshape(1, 16, 8)), (4, 4), (7, 5)).numpy().reshape(7, 5, 8)
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_big_vision_init() -> None:
    torch.manual_seed(0)
    spec = ViTSpec.from_variant("S/16", posemb="learn", pool_type="tok", num_classes=10)
    model = VisionTransformer(spec)
    D = spec.width
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.cls_token) == 0
    q, k, v = model.blocks[0].attn.qkv.weight.chunk(3)
    bound = math.sqrt(6 / (D + D))  # xavier-uniform of each (D, D) projection, not of the fused (3D, D) matrix
    for w in (q, k, v):
        assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
    assert model.blocks[0].mlp.fc1.bias.std() < 1e-5
    conv = model.patch_embed.proj.weight
    assert abs(conv.std().item() - math.sqrt(1 / (3 * 16 * 16))) < 0.1 * math.sqrt(1 / (3 * 16 * 16))
    assert abs(model.pos_embed.std().item() - 1 / math.sqrt(D)) < 0.1 / math.sqrt(D)


def test_gradient_checkpointing_gives_same_gradients() -> None:
    model = _model("simplevit_gap_rep").train()
    x = torch.randn(2, 3, 64, 64)
    model(x).sum().backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for g, r in zip((p.grad for p in model.parameters()), reference, strict=True):
        torch.testing.assert_close(g, r)


def test_every_parameter_gets_a_gradient() -> None:
    for family in FAMILIES:
        model = _model(family).train()
        model(torch.randn(2, 3, 64, 64)).logsumexp(-1).sum().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, f"{family}: no gradient for {missing}"


def test_reset_classifier_and_pre_logits() -> None:
    model = _model("simplevit_gap_rep")
    model.reset_classifier(3)
    x = torch.randn(2, 3, 64, 64)
    assert model(x).shape == (2, 3) and torch.count_nonzero(model.head.weight) == 0
    model.reset_classifier(0)
    assert model(x).shape == (2, 64)
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (2, 64)
    with pytest.raises(ValueError, match="pooling is 'avg'; it cannot be changed to 'token'"):
        model.reset_classifier(3, global_pool="token")


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((2, 1, 64, 64), r"expected 3 input channels, got 1 \(input shape \(2, 1, 64, 64\)\)"),
        ((2, 64, 64, 3), "expected 3 input channels, got 64 .* images must be NCHW"),
        ((2, 3, 60, 64), "image size 60x64 is not divisible by the patch size 16"),
        ((3, 64, 64), r"expected a \(batch, channels, height, width\) image tensor, got shape \(3, 64, 64\)"),
    ],
)
def test_bad_input_is_a_clear_error(shape: tuple[int, ...], message: str) -> None:
    model = _model("simplevit_gap_rep")
    with pytest.raises(ValueError, match=message):
        model(torch.randn(*shape))


def test_a_compiled_model_checks_its_input_too() -> None:
    # was: torch.compile skipped the checks, and a 60x64 image was cropped silently to 48x64 (eager: the error below);
    # backend="eager" runs dynamo's tracing, where the checks were skipped, without compiling kernels
    model = _model("simplevit_gap_rep").eval()
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(ValueError, match="image size 60x64 is not divisible by the patch size 16"):
        compiled(torch.randn(1, 3, 60, 64))
    with pytest.raises(ValueError, match="expected 3 input channels, got 1"):
        compiled(torch.randn(1, 1, 64, 64))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-5)


def test_raw_uint8_pixels_are_a_clear_error() -> None:
    """Was torch's "Input type (unsigned char) and bias type (float) should be the same" from inside the conv."""
    model = _model("simplevit_gap_rep")
    with pytest.raises(ValueError, match=r"expected normalised float pixels, got a torch.uint8 tensor"):
        model(torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8))


def test_float_pixels_of_another_dtype_are_a_clear_error_outside_autocast() -> None:
    """Was torch's "Input type (double) and bias type (float) should be the same" from inside the conv; transformers'
    front door casts them instead (tests/test_hf.py)."""
    model = _model("simplevit_gap_rep").eval()
    x = torch.randn(2, 3, 64, 64)
    with pytest.raises(ValueError, match=r"the pixels are torch.float64 and the model's weights torch.float32: "
                                         r"cast one to the other \(pixels.to\(torch.float32\), or model.to"):
        model(x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts them for the ops
        assert model(x.bfloat16()).shape == (2, 10)
    assert model.to(torch.float64)(x.double()).dtype == torch.float64


def test_forward_intermediates() -> None:
    model = _model("vit_jax_token")
    x = torch.randn(2, 3, 64, 64)
    final, feats = model.forward_intermediates(x, indices=[0, 1])
    assert final.shape == (2, 17, 64) and [f.shape for f in feats] == [(2, 64, 4, 4)] * 2
    with torch.no_grad():
        hidden = model.forward_all(x, output_hidden_states=True).hidden_states
    torch.testing.assert_close(feats[1], hidden[2][:, 1:].reshape(2, 4, 4, 64).permute(0, 3, 1, 2))
    nlc = model.forward_intermediates(x, indices=1, output_fmt="NLC", intermediates_only=True)
    assert nlc[0].shape == (2, 16, 64)
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NLC'"):
        model.forward_intermediates(x, output_fmt="NHWC")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_pruned_models_run_and_save_as_folders_that_load_back(family: str, tmp_path) -> None:
    # timm's prune_intermediate_layers: a MAP model's forward raised "'NoneType' object is not callable", and the
    # spec kept the old depth, so a saved pruned model did not load back
    from hub_vit.folder import load_model_folder, save_model_folder

    model = _model(family, depth=3, rep_size=True).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = model.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
        assert model.prune_intermediate_layers(indices=[1]) == [1]
        after = model.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
        assert torch.equal(before, after) and len(model.blocks) == 2 and model.spec.depth == 2
        assert model(x).shape == (2, 64)  # pooled features, no head (the pool is part of the architecture)
    save_model_folder(model, tmp_path / "pruned")
    loaded, _ = load_model_folder(tmp_path / "pruned")
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


@pytest.mark.parametrize("prune_head", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_pruned_of_its_norm_loads_back_alike_in_every_loader(family: str, prune_head: bool, tmp_path) -> None:
    # prune_norm=True left the spec with its final norm: the folder saved, and every loader refused it ("missing
    # keys (2): norm.bias, norm.weight"), for the config asked for weights the file did not hold
    import timm
    from transformers import AutoModel, AutoModelForImageClassification

    from hub_vit.folder import load_model_folder, save_model_folder

    model = _model(family, depth=3)
    x = torch.randn(2, 3, 64, 64)
    assert model.prune_intermediate_layers(indices=[1], prune_norm=True, prune_head=prune_head) == [1]
    assert model.spec.final_norm is False and isinstance(model.norm, torch.nn.Identity)
    assert not any(key.startswith("norm.") for key in model.state_dict())
    folder = save_model_folder(model, tmp_path / "pruned")
    loaded, info = load_model_folder(folder)
    assert info.spec == model.spec and isinstance(loaded.norm, torch.nn.Identity)
    timm_model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    auto = AutoModel if prune_head else AutoModelForImageClassification
    hf = auto.from_pretrained(folder).eval()
    with torch.no_grad():
        expected, tokens = model(x), model.forward_features(x)
        assert torch.equal(loaded(x), expected) and torch.equal(timm_model(x), expected)
        out = hf(x)
        assert torch.equal(out.pooler_output if prune_head else out.logits, expected)
        if prune_head:  # no norm in transformers' build either: its tokens are the last block's, unnormalised
            assert torch.equal(out.last_hidden_state, tokens)


def test_final_norm_is_the_spec_switch_a_norm_pruned_model_is_built_from() -> None:
    # timm's `final_norm=False`: built that way, a model takes a norm-pruned model's weights strictly and computes the
    # same; the default is left out of to_dict, so every other model's config and card stay as they were
    pruned = _model("map", depth=2)
    pruned.prune_intermediate_layers(indices=[1], prune_norm=True, prune_head=False)
    built = VisionTransformer(ViTSpec(**{**TINY, **FAMILIES["map"]}, final_norm=False)).eval()
    assert built.spec == pruned.spec
    built.load_state_dict(pruned.state_dict())  # strict
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(built(x), pruned(x))
    assert pruned.spec.to_dict()["final_norm"] is False and ViTSpec.from_dict(pruned.spec.to_dict()) == pruned.spec
    assert "final_norm" not in built.spec.replace(final_norm=True).to_dict()
    with pytest.raises(ValueError, match="final_norm must be True or False"):
        ViTSpec(**TINY, final_norm="false")
    import timm

    ti = timm.create_model("vit_ti16", final_norm=False)  # timm's own argument, on a registered name
    assert ti.spec.final_norm is False and isinstance(ti.norm, torch.nn.Identity)


def test_a_norm_pruned_model_is_refused_as_a_native_vit_before_anything_is_written(tmp_path) -> None:
    # HF's ViTForImageClassification always has its final layernorm: was a KeyError 'norm.weight' while writing
    from hub_vit.folder import save_model_folder

    model = _model("vit_jax_token")
    model.prune_intermediate_layers(indices=[1], prune_norm=True, prune_head=False)
    with pytest.raises(ValueError, match=r"native transformers ViTForImageClassification: final_norm=False"):
        save_model_folder(model, tmp_path / "native", native_vit=True)
    assert list(tmp_path.iterdir()) == []
