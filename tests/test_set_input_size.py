"""timm's `set_input_size` on hub-vit models: the resized model is the model built at that size from the same weights.

Every reference comes from a path that existed before `set_input_size`: timm's loader with `img_size=` (square source
grids), transformers' `from_pretrained(..., img_size=)` (any grid), a forward at the new size (the model resamples
per forward), timm's own `VisionTransformer.set_input_size` for the patch filters, and FlexiViT's defining property.
"""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.models import get_model_input_config
from transformers import AutoModelForImageClassification

import hub_vit  # noqa: F401  (registers the models)
from hub_vit.folder import load_model_folder, save_model_folder
from hub_vit.hf import HubViTForImageClassification
from hub_vit.layers import resample_posemb
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec
from hub_vit.weights import adapt_state_dict

# timm-built tiny models, one per position-embedding layout: vit_jax (class-token slot), big_vision (patches only)
TIMM_MODELS = {
    "vit_jax": ("vit_ti16", dict(num_classes=5)),
    "big_vision": ("hub_vit", dict(variant="mu/4", posemb="learn", pool_type="gap", num_classes=5)),
}


def _randomise(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():  # the class token / posemb / head start at zero; make every tensor matter
        for p in model.parameters():
            p.normal_(std=0.2)
    return model.eval()


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].shape == sb[key].shape, key
        torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("layout", sorted(TIMM_MODELS))
def test_learned_posemb_equals_timms_load_at_that_size(layout: str, tmp_path) -> None:
    name, kwargs = TIMM_MODELS[layout]
    source = _randomise(timm.create_model(name, img_size=32, **kwargs))
    path = tmp_path / "w.safetensors"
    save_file(source.state_dict(), str(path))
    new_size = (64, 48)  # non-square, so height and width cannot be swapped unnoticed
    expected = timm.create_model(name, img_size=new_size, pretrained=True, **kwargs,
                                 pretrained_cfg_overlay=dict(file=str(path), num_classes=5)).eval()

    source.set_input_size(img_size=new_size)
    extra = 1 if source.spec.posemb_on_cls else 0
    assert isinstance(source.pos_embed, torch.nn.Parameter) and source.pos_embed.requires_grad
    assert source.pos_embed.shape == (1, extra + (64 // source.spec.patch_size) * (48 // source.spec.patch_size),
                                      source.spec.width)
    assert source.spec == expected.spec and source.spec.img_size == new_size
    _assert_same_state(source, expected)
    x = torch.randn(2, 3, *new_size)
    with torch.no_grad():
        torch.testing.assert_close(source(x), expected(x), rtol=0, atol=0)
    # timm's record of the current size follows, the checkpoint's pretrained_cfg stays (as on timm's own ViT and on
    # a model built with img_size=)
    assert get_model_input_config(source) == get_model_input_config(expected)
    assert get_model_input_config(source)["input_size"] == (3, *new_size)
    assert source.pretrained_cfg["input_size"] == expected.pretrained_cfg["input_size"]


@pytest.mark.parametrize("spec", [
    # MAP model on a non-square 32x48 grid (timm's loader assumes square source grids)
    ViTSpec.from_variant("mu/8", posemb="learn", pool_type="map", img_size=(32, 48), num_classes=5,
                         head_zeroinit=False),
    ViTSpec.from_variant("mu/8", posemb="learn", pool_type="tok", posemb_on_cls=True, img_size=(48, 32),
                         num_classes=5, head_zeroinit=False),
], ids=["map", "vit_jax"])
def test_non_square_grid_equals_transformers_load_at_that_size(spec: ViTSpec, tmp_path) -> None:
    model = _randomise(VisionTransformer(spec))
    HubViTForImageClassification.from_vit(model).save_pretrained(tmp_path)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = model(x)  # the unresized model resamples its embedding for this input on the fly
    expected = AutoModelForImageClassification.from_pretrained(tmp_path, img_size=64).eval()
    model.set_input_size(64)
    _assert_same_state(model, expected.vit)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected(x).logits, rtol=0, atol=0)
        torch.testing.assert_close(model(x), before, rtol=0, atol=1e-6)


def test_sincos_model_changes_only_its_spec() -> None:
    model = _randomise(timm.create_model("simplevit_ti16", img_size=32, num_classes=5))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        before = model(x)
    model.set_input_size((48, 64))
    assert model.spec.img_size == (48, 64) and model.pos_embed is None
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)


def test_resized_model_saves_and_reloads_at_its_new_size(tmp_path) -> None:
    model = _randomise(timm.create_model("vit_ti16", img_size=32, num_classes=5))
    model.set_input_size(64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    folder = save_model_folder(model, tmp_path / "m", native_vit=True)
    loaded, info = load_model_folder(folder)
    assert loaded.spec.img_size == (64, 64) and info.pretrained_cfg["input_size"] == [3, 64, 64]
    assert loaded.pos_embed.shape == (1, 17, 192)
    _assert_same_state(loaded, model)
    via_timm = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    via_hf = AutoModelForImageClassification.from_pretrained(folder).eval()
    native = AutoModelForImageClassification.from_pretrained(folder / "native").eval()  # stock transformers ViT
    with torch.no_grad():
        torch.testing.assert_close(via_timm(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(via_hf(x).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(native(x).logits, expected, rtol=0, atol=1e-5)
    assert via_hf.config.img_size == [64, 64] and native.config.image_size == 64


def test_transformers_model_resized_through_timms_api_saves_its_new_size(tmp_path) -> None:
    # set_input_size knows nothing of the wrapper's config; save_pretrained writes the module's own size, so the
    # folder loads back (a stale img_size=32 config failed on vit.pos_embed)
    model = HubViTForImageClassification.from_vit(_randomise(timm.create_model("vit_ti16", img_size=32,
                                                                               num_classes=3)))
    model.vit.set_input_size(64, patch_size=8)
    model.save_pretrained(tmp_path)
    again = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert (again.config.img_size, again.config.patch_size) == ([64, 64], 8)
    _assert_same_state(again.vit, model.vit)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, model.eval()(x).logits, rtol=0, atol=0)


def test_training_updates_the_resampled_table() -> None:
    model = timm.create_model("vit_ti16", img_size=32, num_classes=3).train()
    model.set_input_size(64)
    assert "pos_embed" in dict(model.named_parameters())
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    assert model.pos_embed.grad is not None and model.pos_embed.grad.shape == (1, 17, 192)


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(img_size=50), "image size 50x50 is not divisible by the patch size 16; use a multiple of 16"),
    (dict(img_size=(32, 40)), "image size 32x40 is not divisible by the patch size 16"),
    (dict(img_size=0), "img_size must be a positive integer, got 0"),
    (dict(img_size=-32), "img_size must be a positive integer, got -32"),
    (dict(img_size=32.0), "img_size must be a positive integer, got 32.0"),
    (dict(img_size="64"), "img_size must be a positive integer, got '64'"),
    (dict(img_size=True), "img_size must be a positive integer, got True"),
    (dict(img_size=(64, 64, 64)), r"img_size must be an int or a \(height, width\) pair"),
    (dict(patch_size=0), "patch_size must be a positive integer, got 0"),
    (dict(patch_size=(8, 16)), r"patch_size must be square \(hub-vit patches are p x p\), got \(8, 16\)"),
    (dict(patch_size=24), "image size 32x32 is not divisible by the patch size 24"),
])
def test_bad_sizes_are_refused_and_leave_the_model_unchanged(kwargs: dict, needle: str) -> None:
    model = timm.create_model("vit_ti16", img_size=32, num_classes=3)
    spec, state = model.spec, {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=needle):
        model.set_input_size(**kwargs)
    assert model.spec == spec
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {k: tuple(v.shape) for k, v in state.items()}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert get_model_input_config(model)["input_size"] == (3, 32, 32)


def test_no_arguments_or_the_same_size_change_nothing() -> None:
    model = timm.create_model("vit_ti16", img_size=32, num_classes=3)
    pos = model.pos_embed
    model.set_input_size()
    model.set_input_size(img_size=(32, 32), patch_size=16)
    assert model.pos_embed is pos and model.spec.img_size == (32, 32)


# ------------------------------------------------------------------------------------------------------ patch size
def test_new_patch_size_resamples_the_filters_as_timms_vit() -> None:
    model = _randomise(timm.create_model("vit_ti16", img_size=32, num_classes=5))
    reference = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=5)  # timm's own ViT
    with torch.no_grad():
        reference.patch_embed.proj.weight.copy_(model.patch_embed.proj.weight)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    reference.set_input_size(patch_size=8)
    model.set_input_size(patch_size=8)
    assert model.spec.patch_size == 8 and model.spec.img_size == (32, 32)
    assert model.patch_embed.proj.weight.shape == (192, 3, 8, 8) and model.patch_embed.proj.stride == (8, 8)
    torch.testing.assert_close(model.patch_embed.proj.weight, reference.patch_embed.proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(model.patch_embed.proj.bias, state["patch_embed.proj.bias"], rtol=0, atol=0)
    # the position embedding: the load path's resampling from the 2x2 to the 4x4 grid, class-token slot kept
    pos = state["pos_embed"]
    torch.testing.assert_close(model.pos_embed, torch.cat([pos[:, :1], resample_posemb(pos[:, 1:], (2, 2), (4, 4))], 1),
                               rtol=0, atol=0)
    # = building the patch-8 model and loading the checkpoint with the filters resampled as above
    built = VisionTransformer(model.spec).eval()
    state["patch_embed.proj.weight"] = reference.patch_embed.proj.weight.detach()
    built.load_state_dict(adapt_state_dict(state, built, source_grid=(2, 2)))
    _assert_same_state(model, built)
    assert model.feature_info[0]["reduction"] == 8
    assert get_model_input_config(model)["input_size"] == (3, 32, 32)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


def test_resampled_filters_keep_flexivits_property() -> None:
    """FlexiViT (big_vision's PI-resize, which timm implements): a p' filter applied to a patch resized from p to p'
    (bicubic, antialiased: the resize the pseudo-inverse inverts) gives the p filter's token for the original patch."""
    model = _randomise(timm.create_model("hub_vit", variant="mu/4", posemb="sincos2d", pool_type="gap", img_size=16))
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        tokens = model.patch_embed.proj(x)  # (1, D, 4, 4)
    model.set_input_size(img_size=32, patch_size=8)
    patches = x.unfold(2, 4, 4).unfold(3, 4, 4)  # (1, C, 4, 4, p, p)
    grown = F.interpolate(patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 3, 4, 4), size=(8, 8), mode="bicubic",
                          antialias=True)  # each patch on its own: (16, C, 8, 8)
    image = grown.reshape(1, 4, 4, 3, 8, 8).permute(0, 3, 1, 4, 2, 5).reshape(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.patch_embed.proj(image), tokens, rtol=0, atol=1e-5)


def test_patch_embed_describes_the_input_size_as_timms_vit() -> None:
    # was: AttributeError for code written for timm's ViTs (Grad-CAM reshape helpers read patch_embed.grid_size)
    model = timm.create_model("vit_ti16", img_size=(32, 48), num_classes=5)
    reference = timm.create_model("vit_tiny_patch16_224", img_size=(32, 48), num_classes=5)  # timm's own ViT

    def described(vit: torch.nn.Module) -> tuple:
        embed = vit.patch_embed
        return embed.img_size, embed.patch_size, embed.grid_size, embed.num_patches, vit.has_class_token

    assert described(model) == described(reference) == ((32, 48), (16, 16), (2, 3), 6, True)
    model.set_input_size((64, 64), patch_size=8)
    reference.set_input_size((64, 64), patch_size=8)
    assert described(model) == described(reference) == ((64, 64), (8, 8), (8, 8), 64, True)
    assert timm.create_model("simplevit_ti16", img_size=32).has_class_token is False
