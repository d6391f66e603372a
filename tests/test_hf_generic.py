"""What transformers' own generic model tests (ModelTesterMixin, ConfigTester) ask of a model, checked on hub-vit's.

The same contracts in hub-vit's words, on a tiny model of each family, so CI keeps them; docs/architecture.md ("The
ecosystems' own test suites") says how transformers' suite itself is run against hub-vit.
"""

from __future__ import annotations

import json

import pytest
import timm
import torch
import torch.nn.functional as F
from transformers import AutoModelForImageClassification, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

import hub_vit  # noqa: F401  (registers the Auto classes)
from hub_vit.folder import load_model_folder
from hub_vit.hf import HubViTConfig, HubViTForImageClassification, HubViTModel

FAMILIES = {  # transformers' ViT tester sizes: width 32, depth 2, 4 heads, mlp 37, patch 4 on 32 px
    "vit": dict(posemb="learn", pool_type="tok", posemb_on_cls=True, rep_size=None),
    "simplevit": dict(posemb="sincos2d", pool_type="gap", rep_size=True),
    "map": dict(posemb="learn", pool_type="map"),
}


def config(family: str, **kwargs) -> HubViTConfig:
    return HubViTConfig(width=32, depth=2, num_heads=4, mlp_dim=37, patch_size=4, img_size=32, num_labels=10,
                        head_zeroinit=False, **FAMILIES[family], **kwargs)


def pixels(batch: int = 3) -> torch.Tensor:
    return torch.rand(batch, 3, 32, 32) * 2 - 1


# ------------------------------------------------------------------------------------------------------------ config
def test_standard_config_names_alias_the_spec_fields() -> None:
    # transformers' tooling reads these names (ConfigTester; DeepSpeed fills "auto" sizes from hidden_size)
    cfg = HubViTConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, intermediate_size=96,
                       num_channels=1)
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim, cfg.in_chans) == (64, 3, 2, 96, 1)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.num_channels) == (64, 3, 2, 96, 1)
    cfg.hidden_size = 128  # one field behind each name, never a second copy
    assert cfg.width == 128 and cfg.to_spec().width == 128 and "hidden_size" not in cfg.to_dict()


def test_an_extra_attribute_saved_by_save_pretrained_loads_back(tmp_path) -> None:
    # tools tag configs with their own attributes (transformers' tests set layer_norm_epsilon on every config); what
    # save_pretrained wrote must load, even when its name is close to a field
    cfg = config("vit")
    cfg.layer_norm_epsilon = 0.5
    cfg.save_pretrained(tmp_path)
    loaded = HubViTConfig.from_pretrained(tmp_path)
    assert loaded.layer_norm_epsilon == 0.5 and loaded.layer_norm_eps == cfg.layer_norm_eps
    assert loaded.to_spec() == cfg.to_spec()


def test_a_misspelt_keyword_is_still_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown HubViTConfig field 'layer_norm_epsilon' \(did you mean "
                                         r"'layer_norm_eps'\?\); valid architecture fields: width, depth"):
        HubViTConfig(layer_norm_epsilon=1e-5)


# ------------------------------------------------------------------------------------------------------------ labels
@pytest.mark.parametrize("family", FAMILIES)
def test_the_backbone_keeps_its_configs_labels(family: str, tmp_path) -> None:
    cfg = config(family)
    base = HubViTModel(cfg)
    assert base.config.num_labels == 10 and base.vit.num_classes == 0
    classifier = HubViTForImageClassification(base.config)  # transformers' tests build one class from the other's
    assert classifier.vit.head.out_features == 10
    base.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["num_classes"] == saved["model_args"]["num_classes"] == 0 and len(saved["id2label"]) == 10
    assert HubViTModel.from_pretrained(tmp_path).config.num_labels == 10
    head_missing = AutoModelForImageClassification.from_pretrained(tmp_path)
    assert head_missing.config.num_labels == 10 and head_missing.vit.head.out_features == 10
    # timm and hub-vit's own loader read the folder as what it holds: a headless model
    x = pixels()
    with torch.no_grad():
        expected = base(x).pooler_output
        assert torch.equal(timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()(x), expected)
        assert torch.equal(load_model_folder(tmp_path)[0](x), expected)


# ------------------------------------------------------------------------------------------------- checkpointing
def test_checkpointing_goes_through_transformers_layers_and_options() -> None:
    model = HubViTForImageClassification(config("simplevit")).train()
    assert all(isinstance(block, GradientCheckpointingLayer) for block in model.vit.blocks)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True}, every_n_layers=2)
    assert [block.gradient_checkpointing for block in model.vit.blocks] == [True, False]
    assert model.vit.blocks[0]._gradient_checkpointing_func.keywords == {"use_reentrant": True}
    calls = []
    for i, block in enumerate(model.vit.blocks):  # a checkpointed block runs its attention again in backward
        block.attn.register_forward_hook(lambda *_, i=i: calls.append(i))
    x, labels = pixels(), torch.tensor([1, 2, 3])
    model(x, labels=labels).loss.backward()
    assert calls == [0, 1, 0]
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing
    model(x, labels=labels).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], msg=name)


# ---------------------------------------------------------------------------------------------------------- init
@pytest.mark.parametrize("family", FAMILIES)
def test_init_goes_through_init_weights_module_by_module(family: str, monkeypatch) -> None:
    # transformers initialises the weights a checkpoint lacks module by module (`_init_weights`); seeding each call
    # makes that deterministic, so a model built in memory and one "loaded" from nothing must agree exactly
    original = PreTrainedModel._initialize_weights

    def seeded(self, module, *args, **kwargs):
        torch.manual_seed(7)
        return original(self, module, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "_initialize_weights", seeded)
    for cls in (HubViTModel, HubViTForImageClassification):
        built = cls(config(family)).state_dict()
        loaded = cls.from_pretrained(None, config=config(family), state_dict={}).state_dict()
        assert built.keys() == loaded.keys()
        assert [k for k in built if not torch.equal(built[k], loaded[k])] == []
        # and it is still big_vision's init: zero class token, unit LayerNorms, zero biases of q/k/v
        if "vit.cls_token" in loaded:
            assert not loaded["vit.cls_token"].any()
        assert torch.equal(loaded["vit.norm.weight"], torch.ones(32))
        assert not loaded["vit.blocks.0.attn.qkv.bias"].any()


def test_loaded_tensors_keep_their_values_when_a_new_head_is_initialised(tmp_path) -> None:
    model = HubViTForImageClassification(config("map"))
    model.save_pretrained(tmp_path)
    other = HubViTForImageClassification.from_pretrained(tmp_path, num_labels=3, ignore_mismatched_sizes=True)
    saved, new = model.state_dict(), other.state_dict()
    assert [k for k in saved if saved[k].shape == new[k].shape and not torch.equal(saved[k], new[k])] == []
    assert new["vit.head.weight"].shape == (3, 32)


# ----------------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("family", FAMILIES)
def test_attn_implementation_is_honoured_and_attentions_are_real(family: str, monkeypatch) -> None:
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    torch.manual_seed(0)
    fused = HubViTForImageClassification(config(family, attn_implementation="sdpa")).eval()
    torch.manual_seed(0)
    eager = HubViTForImageClassification(config(family, attn_implementation="eager")).eval()
    x = pixels()
    with torch.no_grad():
        a = fused(x).logits
        assert calls, "sdpa must use the fused kernel"
        calls.clear()
        b = eager(x).logits
        assert not calls, "eager must compute softmax(q k^T) explicitly"
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        # output_attentions=True returns the probabilities the explicit path computed, also under sdpa
        out = fused(x, output_attentions=True)
        assert not calls
    assert len(out.attentions) == 2
    for attn in out.attentions:
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]))
    torch.testing.assert_close(out.logits, a, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("model_class", [HubViTModel, HubViTForImageClassification])
def test_output_loading_info_returns_the_model_and_the_report(model_class, tmp_path) -> None:
    model_class(config("vit")).save_pretrained(tmp_path)
    model, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(model, model_class)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert not info["unexpected_keys"]


def test_a_weights_file_without_any_of_the_models_tensors_loads_with_every_weight_missing(tmp_path) -> None:
    # transformers' contract: nothing of such a file is loaded, every weight is reported missing and initialised (a
    # file that holds the model's tensors with other shapes or dtypes is refused: tests/test_hostile_files.py)
    from safetensors.torch import save_file

    HubViTForImageClassification(config("simplevit")).save_pretrained(tmp_path)
    save_file({"tensor": torch.tensor([1, 2])}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model, info = HubViTForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    params = {name for name, _ in model.named_parameters()}
    assert params <= set(info["missing_keys"])
    assert {key.removeprefix("vit.") for key in info["unexpected_keys"]} == {"tensor"}  # under the base prefix
    assert torch.isfinite(model(pixels()).logits).all()
