"""What timm's own generic model tests ask of every model in its tree, checked on hub-vit's models.

timm's `tests/test_models.py` runs forward / backward, the default-cfg contract, `forward_intermediates` and the
feature wrapper, TorchScript, and torch.fx (forward and backward, also scripted after tracing) on every name in
`timm.list_models()`. These tests state the same contracts in hub-vit's words on small models of each family
(classic ViT with a class token, SimpleViT with sincos + GAP + pre-logits, a MAP head), so CI keeps them;
docs/architecture.md ("The ecosystems' own test suites") says how timm's suite itself is run against hub-vit.
"""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import hub_vit  # noqa: F401  (registers the models)
from hub_vit.catalog import MODELS

# one small model per family; the registered names are tried at a small image size (any patch multiple works)
FAMILIES = {
    "vit": dict(name="vit_ti16", img_size=32),
    "simplevit": dict(name="simplevit_ti16", img_size=32),
    "map": dict(name="hub_vit", variant="mu/4", pool_type="map", depth=4, img_size=16),
}


def build(family: str, **kwargs) -> nn.Module:
    args = dict(FAMILIES[family])
    return timm.create_model(args.pop("name"), **args, **kwargs)


def pixels(model: nn.Module, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, *model.spec.img_size)


def test_every_listed_name_builds_with_its_defaults() -> None:
    # timm's tests, benchmark and list_models-driven tools call create_model(name) with nothing else
    names = timm.list_models(module="timm_plugin")
    assert set(MODELS) | {"hub_vit"} == set(names)
    for name in names:
        with torch.device("meta"):  # the big ones too, without allocating them
            model = timm.create_model(name)
        assert model.num_classes == model.pretrained_cfg["num_classes"] and model.head_hidden_size > 0
    model = timm.create_model("hub_vit").eval()  # and the generic one runs at its default input size
    with torch.no_grad():
        assert model(torch.randn(1, *model.pretrained_cfg["input_size"])).shape == (1, 1000)


@pytest.mark.parametrize("family", FAMILIES)
def test_torchscript_gives_the_eager_output_and_saves(family: str, tmp_path) -> None:
    # timm scripts its models (set_scriptable); a saved TorchScript file is what libtorch (Triton's PyTorch
    # backend) loads
    with timm.set_scriptable(True):
        model = build(family, head_zeroinit=False).eval()
    x = pixels(model)
    scripted = torch.jit.script(model)
    torch.jit.save(scripted, tmp_path / "model.pt")
    loaded = torch.jit.load(tmp_path / "model.pt")
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(scripted(x), expected, atol=0, rtol=0)
        torch.testing.assert_close(loaded(x), expected, atol=0, rtol=0)
        # the scripted module keeps the model's size rule: another patch multiple works
        assert loaded(torch.randn(1, 3, 2 * x.shape[2], x.shape[3])).shape == expected[:1].shape


@pytest.mark.parametrize("family", FAMILIES)
def test_fx_trace_forward_is_exact_and_keeps_the_input_checks(family: str) -> None:
    model = build(family, head_zeroinit=False).eval()
    x = pixels(model)
    traced = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x), atol=0, rtol=0)
    # the checks are one call in the graph (not traced through), so the traced model still explains bad input
    with pytest.raises(ValueError, match="expected 3 input channels, got 1"):
        traced(x[:, :1])
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        traced(x[..., :-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_fx_backward_reaches_every_parameter(family: str) -> None:
    model = build(family, num_classes=42).train()
    traced = torch.fx.symbolic_trace(model)
    out = traced(pixels(model))
    assert out.shape == (2, 42)
    out.mean().backward()
    missing = [name for name, p in traced.named_parameters() if p.grad is None]
    assert not missing, missing


@pytest.mark.parametrize("family", FAMILIES)
def test_fx_graph_can_be_scripted(family: str) -> None:
    model = build(family).eval()
    scripted = torch.jit.script(torch.fx.symbolic_trace(model))
    with torch.no_grad():
        torch.testing.assert_close(scripted(pixels(model)).shape, torch.Size([2, 1000]))


@pytest.mark.parametrize("family", FAMILIES)
def test_torchvision_feature_extractor_gives_block_outputs(family: str) -> None:
    model = build(family).eval()
    _, nodes = get_graph_node_names(model)
    assert "check_pixels" in nodes and "patch_tokens" in nodes  # the shape-dependent parts are single calls
    last = f"blocks.{len(model.blocks) - 1}"  # a module name: torchvision returns that module's output
    extractor = create_feature_extractor(model, return_nodes={last: "last", nodes[-1]: "logits"})
    x = pixels(model)
    with torch.no_grad():
        out = extractor(x)
        torch.testing.assert_close(out["logits"], model(x), atol=0, rtol=0)
        expected = model.forward_intermediates(x, indices=1, output_fmt="NLC", intermediates_only=True)[0]
    torch.testing.assert_close(out["last"][:, model.num_prefix_tokens:], expected, atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_features_only_maps_match_forward_intermediates(family: str) -> None:
    torch.manual_seed(0)
    model = build(family).eval()
    torch.manual_seed(0)  # the same weights
    features = build(family, features_only=True).eval()
    x = pixels(model, batch=1)
    with torch.no_grad():
        maps = features(x)
        final, inter = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x), atol=0, rtol=0)
    depth, width, patch = len(model.blocks), model.embed_dim, model.spec.patch_size
    assert features.feature_info.module_name() == [f"blocks.{i}" for i in range(depth - 3, depth)]
    grid = tuple(s // patch for s in x.shape[-2:])
    assert [m.shape for m in maps] == [(1, width, *grid)] * 3
    for a, b in zip(maps, inter[-3:], strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_default_cfg_contract(family: str) -> None:
    model = build(family).eval()
    state = model.state_dict()
    cfg = model.pretrained_cfg
    assert f"{cfg['first_conv']}.weight" in state and f"{cfg['classifier']}.weight" in state
    x = pixels(model, batch=1)
    with torch.no_grad():
        tokens = model.forward_features(x)  # unpooled (B, N, D)
        pre = model.forward_head(tokens, pre_logits=True)
        assert tokens.shape[-1] == model.num_features and pre.shape == (1, model.head_hidden_size)
        model.reset_classifier(0)
        assert model.num_classes == 0
        torch.testing.assert_close(model(x), pre, atol=0, rtol=0)
    headless = build(family, num_classes=0).eval()
    with torch.no_grad():
        assert headless(x).shape == (1, headless.head_hidden_size)


@pytest.mark.parametrize("family", FAMILIES)
def test_backward_and_checkpointing(family: str) -> None:
    model = build(family, num_classes=42).train()
    x = pixels(model)
    out = model(x)
    out.mean().backward()
    assert out.shape == (2, 42) and all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        plain = model(x)
        model.set_grad_checkpointing()
        torch.testing.assert_close(model(x), plain)
        torch.testing.assert_close(model.forward_intermediates(x)[0], model.forward_features(x))


@pytest.mark.parametrize("family", FAMILIES)
def test_factory_arguments_unknown_arguments_and_a_new_head_follow_timms_contract(family: str) -> None:
    # timm 1.0.31's own suite: create_model(..., device=, dtype=) builds there (was "unknown field(s) ['device',
    # 'dtype']"); an unknown argument is a TypeError; reset_classifier builds the head in the model's dtype and
    # device, in its training mode (a float64 model got a float32 head)
    model = build(family, device="meta", dtype=torch.bfloat16).eval()
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("meta", torch.bfloat16)}
    assert build(family, num_classes=0, device="meta").num_features == model.num_features
    with pytest.raises(TypeError, match=r"unknown field\(s\) \['not_a_model_arg'\]"):
        build(family, not_a_model_arg=1)
    model.to(dtype=torch.float64)
    model.reset_classifier(0)
    model.reset_classifier(2)
    assert (model.head.weight.device.type, model.head.weight.dtype, model.head.training) == ("meta", torch.float64,
                                                                                              False)
    real = build(family).eval().to(torch.bfloat16)  # a dtype changed after building: its output follows
    with torch.no_grad():
        assert real(pixels(real).to(torch.bfloat16)).dtype == torch.bfloat16
