"""The timm front door: registration, published parameter counts, pretrained cfgs, local weights, features."""

from __future__ import annotations

import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import save_file

import hub_vit  # noqa: F401  (registers the models)
from hub_vit.catalog import MODELS
from hub_vit.model import count_parameters

# Published parameter counts (1000 classes, 224 px). vit_jax: `vit_jax/models_test.py` MODEL_SIZES. SimpleViT S/16,
# B/16 and So400m/14: big_vision's own `jax.eval_shape` of configs/vit_s16_i1k.py with that variant (the manifests in
# tests/fixtures/jax/manifests/big_vision). Ti/L/H SimpleViT: research notes' count from the vit_jax-verified formula.
PUBLISHED = {
    "vit_ti16": 5_717_416,
    "vit_s16": 22_050_664,
    "vit_s32": 22_878_952,
    "vit_b8": 86_576_872,
    "vit_b16": 86_567_656,
    "vit_b32": 88_224_232,
    "vit_l16": 304_326_632,
    "vit_l32": 306_535_400,
    "vit_h14": 632_045_800,
    "simplevit_ti16": 5_716_456,
    "simplevit_s16": 22_122_472,
    "simplevit_b16": 87_006_184,
    "simplevit_l16": 305_173_480,
    "simplevit_so400m14": 414_628_696,
    "simplevit_h14": 633_355_240,
}


def independent_count(width: int, depth: int, mlp: int, patch: int, classes: int, tokens: int, rep: int | None,
                      cls: bool) -> int:
    """Parameter count from first principles (not from hub_vit's code), for sizes with no published number."""
    block = 2 * 2 * width + (width * 3 * width + 3 * width) + (width * width + width) + 2 * (width * mlp) + mlp + width
    feats = rep or width
    return (patch * patch * 3 * width + width + (width if cls else 0) + tokens * width + depth * block + 2 * width
            + ((width * rep + rep) if rep else 0) + feats * classes + classes)


UNPUBLISHED = {  # SimpleViT sizes nobody published a count for: (width, depth, mlp, patch)
    "simplevit_s32": (384, 12, 1536, 32),
    "simplevit_m16": (512, 12, 2048, 16),
    "simplevit_b32": (768, 12, 3072, 32),
}


def test_every_registered_name_has_a_golden_count() -> None:
    registered = set(timm.list_models("vit_*", module="timm_plugin")) | set(timm.list_models("simplevit_*"))
    assert registered >= set(MODELS) - {"simplevit_digits"}
    assert set(MODELS) - {"simplevit_digits"} == set(PUBLISHED) | set(UNPUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_published(name: str) -> None:
    with torch.device("meta"):  # no memory for L/H
        model = timm.create_model(name, img_size=224, num_classes=1000)
    assert count_parameters(model) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(UNPUBLISHED))
def test_parameter_count_of_unpublished_sizes(name: str) -> None:
    width, depth, mlp, patch = UNPUBLISHED[name]
    with torch.device("meta"):
        model = timm.create_model(name)
    assert count_parameters(model) == independent_count(width, depth, mlp, patch, 1000, 0, width, cls=False)


def test_independent_formula_reproduces_published_counts() -> None:
    """The formula above is trustworthy: it reproduces vit_jax's own S/16 and B/32 numbers."""
    assert independent_count(384, 12, 1536, 16, 1000, 197, None, cls=True) == PUBLISHED["vit_s16"]
    assert independent_count(768, 12, 3072, 32, 1000, 50, None, cls=True) == PUBLISHED["vit_b32"]


def test_simplevit_linear_head_variant() -> None:
    """SimpleViT S/16 with a linear head: 21,974,632 (EIFY's reproduction; big_vision rep_size=False)."""
    model = timm.create_model("simplevit_s16", rep_size=False)
    assert count_parameters(model) == 21_974_632


def test_done_when_command() -> None:
    """The issue's acceptance command, verbatim, in a fresh interpreter."""
    code = "import hub_vit, timm; m = timm.create_model('simplevit_s16'); print(sum(p.numel() for p in m.parameters()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "22122472"


def test_pretrained_cfgs_and_data_config() -> None:
    assert set(timm.list_pretrained("simplevit_s16*")) == {f"simplevit_s16.i1k_{e}" for e in ("90ep", "150ep", "300ep")}
    model = timm.create_model("simplevit_s16.i1k_300ep")
    cfg = model.pretrained_cfg
    assert cfg["url"] == "https://storage.googleapis.com/big_vision/vit_s16_i1k_300ep.npz"
    assert cfg["tag"] == "i1k_300ep" and cfg["license"] == "apache-2.0" and cfg["num_classes"] == 1000
    data = timm.data.resolve_data_config({}, model=model)
    assert data["mean"] == (0.5, 0.5, 0.5) and data["std"] == (0.5, 0.5, 0.5)
    assert data["input_size"] == (3, 224, 224) and data["crop_pct"] == pytest.approx(224 / 256)
    hi = timm.create_model("vit_b16.augreg_in21k_ft_in1k_384")  # a 384 px tag builds at 384 px
    assert hi.spec.img_size == (384, 384) and hi.pos_embed.shape == (1, 577, 768)
    assert timm.create_model("vit_s16.augreg_in21k").num_classes == 21843


def test_create_model_kwargs() -> None:
    model = timm.create_model("simplevit_ti16", num_classes=7, img_size=(64, 96), in_chans=1)
    assert model(torch.randn(2, 1, 64, 96)).shape == (2, 7)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['depthh'\]"):
        timm.create_model("simplevit_ti16", depthh=3)


def test_unknown_model_name() -> None:
    with pytest.raises(RuntimeError, match="Unknown model"):
        timm.create_model("simplevit_s17")
    with pytest.raises(KeyError, match="unknown hub-vit model 'simplevit_s17'; valid names: simplevit_ti16"):
        hub_vit.get_entry("simplevit_s17")


def test_pretrained_cfg_overlay_of_no_file_names_the_path(tmp_path) -> None:
    # was: timm's bare FileNotFoundError() (its log alone named the path)
    missing = tmp_path / "model.safetensors"
    with pytest.raises(FileNotFoundError, match=f"file='{missing}': no such file"):
        timm.create_model("simplevit_digits", pretrained=True, pretrained_cfg_overlay=dict(file=str(missing)))
    with pytest.raises(IsADirectoryError, match=f"is a folder; .* timm.create_model\\('local-dir:{tmp_path}'"):
        timm.create_model("hub_vit", pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path)))


def test_a_file_shorter_than_a_safetensors_header_says_so(tmp_path) -> None:
    # was: "its header length -1 does not fit the 6-byte file", a length no file held
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"hello\n")
    with pytest.raises(ValueError, match=r"is not a safetensors file: 6 bytes, shorter than the 8-byte header length"):
        timm.create_model("simplevit_digits", pretrained=True, pretrained_cfg_overlay=dict(file=str(junk)))


def test_pretrained_cfg_overlay_loads_local_safetensors(tmp_path) -> None:
    source = timm.create_model("vit_ti16", img_size=64, num_classes=5)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_(std=0.2)
    path = tmp_path / "weights.safetensors"
    save_file(source.state_dict(), str(path))
    # timm convention: the overlay describes the file, including its class count
    loaded = timm.create_model("vit_ti16", pretrained=True, img_size=64,
                               pretrained_cfg_overlay=dict(file=str(path), num_classes=5))
    assert loaded.num_classes == 5
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), source.eval()(x), atol=0, rtol=0)
    # a different input size resamples the learned embedding; a different class count re-initialises the head
    bigger = timm.create_model("vit_ti16", pretrained=True, img_size=96, num_classes=3,
                               pretrained_cfg_overlay=dict(file=str(path), num_classes=5))
    assert bigger.pos_embed.shape == (1, 37, 192) and torch.count_nonzero(bigger.head.weight) == 0
    torch.testing.assert_close(bigger.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)


def test_strict_loading_lists_every_problem(tmp_path) -> None:
    source = timm.create_model("simplevit_ti16", img_size=32, num_classes=5)
    state = source.state_dict()
    state.pop("blocks.0.norm1.weight")
    state["extra.weight"] = torch.zeros(1)
    state["norm.bias"] = torch.zeros(7)
    path = tmp_path / "broken.safetensors"
    save_file(state, str(path))
    with pytest.raises(ValueError) as err:
        timm.create_model("simplevit_ti16", pretrained=True, img_size=32,
                          pretrained_cfg_overlay=dict(file=str(path), num_classes=5))
    text = str(err.value)
    assert "missing keys (1): blocks.0.norm1.weight" in text and "unexpected keys (1): extra.weight" in text
    assert "norm.bias: checkpoint (7,) vs model (192,)" in text


def test_pretrained_download_goes_through_hub_vits_downloader(tmp_path, monkeypatch) -> None:
    """timm's own downloader would use its own cache and, offline, raise `URLError: Name or service not known`."""
    from hub_vit.conversion import download as downloads

    source = timm.create_model("vit_ti16", img_size=32)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_(std=0.2)
    path = tmp_path / "weights.safetensors"
    save_file(source.state_dict(), str(path))
    asked = []
    monkeypatch.setattr(downloads, "download",
                        lambda url, expected_sha256=None, catalog_name=None: asked.append((url, catalog_name)) or path)
    loaded = timm.create_model("vit_ti16.augreg_in21k_ft_in1k", pretrained=True, img_size=32)
    # the catalog name, for an error that names it (a 404: the catalog is out of date)
    assert asked == [(MODELS["vit_ti16"].weight("augreg_in21k_ft_in1k").url, "vit_ti16.augreg_in21k_ft_in1k")]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), source.eval()(x), atol=0, rtol=0)


def test_pretrained_offline_names_the_url_and_the_cache(tmp_path, monkeypatch) -> None:
    from hub_vit.conversion.download import DownloadError, cached_path

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    url = MODELS["simplevit_s16"].weight("i1k_90ep").url
    with pytest.raises(DownloadError) as err:
        timm.create_model("simplevit_s16.i1k_90ep", pretrained=True)
    text = str(err.value)
    assert url in text and str(cached_path(url)) in text and "curl -L -o" in text


def test_pretrained_without_weights_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="No pretrained weights exist for simplevit_b32"):
        timm.create_model("simplevit_b32", pretrained=True)


def test_features_only() -> None:
    model = timm.create_model("simplevit_ti16", features_only=True, out_indices=(2, 5), img_size=64)
    feats = model(torch.randn(1, 3, 64, 64))
    assert [f.shape for f in feats] == [(1, 192, 4, 4)] * 2
    assert model.feature_info.channels() == [192, 192] and model.feature_info.reduction() == [16, 16]


def test_features_only_defaults_to_the_last_three_blocks_as_timm_vit() -> None:
    model = timm.create_model("simplevit_ti16", features_only=True, img_size=64)
    assert model.feature_info.module_name() == ["blocks.9", "blocks.10", "blocks.11"]


def test_timm_train_script_kwargs() -> None:
    # timm's train.py always passes drop_rate (0.0 by default) and may pass the other regularisers and global_pool
    model = timm.create_model("simplevit_ti16", drop_rate=0.1, drop_path_rate=0.2, attn_drop_rate=0.0,
                              proj_drop_rate=0.0, global_pool="avg", num_classes=3, img_size=32)
    assert isinstance(model.head_drop, torch.nn.Dropout) and model.head_drop.p == 0.1
    rates = [block.drop_path.drop_prob if hasattr(block.drop_path, "drop_prob") else 0.0 for block in model.blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.2, 12).tolist())  # timm's linear stochastic-depth schedule
    plain = timm.create_model("simplevit_ti16", num_classes=3, img_size=32)
    assert list(model.state_dict()) == list(plain.state_dict())  # regularisation adds no weights
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.eval()(x), plain.eval()(x), rtol=0, atol=0)  # identity in eval
    model.train()  # and random in training: stochastic depth in the blocks, dropout before the (zero-init) head
    assert not torch.equal(model.forward_features(x), model.forward_features(x))
    torch.nn.init.normal_(model.head.weight)
    features = model.forward_head(model.forward_features(x), pre_logits=True)
    assert not torch.equal(model.head(features), model.forward_head(model.forward_features(x)))


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(attn_drop_rate=0.1), "attn_drop_rate=0.1 is not implemented by hub-vit models; supported regularisation"),
    (dict(drop_path_rate=1.5), r"drop_path_rate must be a number in \[0, 1\)"),
    (dict(global_pool="token"), "this model pools with 'avg' .* pass global_pool='avg'"),
    (dict(dynamic_img_pad=True), "dynamic_img_pad=True is not supported: images must tile into whole patches"),
])
def test_unsupported_timm_kwargs_are_named(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        timm.create_model("simplevit_ti16", img_size=32, **kwargs)


def test_generic_architecture_builds_its_default_and_fields_change_it() -> None:
    # timm lists 'hub_vit', so it must build with its defaults (timm's tests, benchmark and list_models-driven tools
    # assume so): the generic default is the paper's SimpleViT-S/16, as HubViTConfig(); fields change it
    with torch.device("meta"):
        assert timm.create_model("hub_vit").spec == MODELS["simplevit_s16"].spec
        assert timm.create_model("hub_vit", depth=2, pool_type="map").spec == MODELS["simplevit_s16"].spec.replace(
            depth=2, pool_type="map")
    with pytest.raises(ValueError, match="unknown pool_type 'cls'"):
        timm.create_model("hub_vit", pool_type="cls")


def test_pretrained_rgb_weights_for_grey_input() -> None:
    # timm's convention (adapt_input_conv): RGB patch filters summed for in_chans=1, so with mean = std = 0.5 a grey
    # image gives the RGB model's output for the same image repeated on three channels.
    rgb = timm.create_model("simplevit_digits", pretrained=True).eval()
    grey = timm.create_model("simplevit_digits", pretrained=True, in_chans=1).eval()
    x = torch.rand(2, 1, 32, 32) * 2 - 1
    torch.testing.assert_close(grey(x), rgb(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=0)


def test_generic_architecture_from_model_args() -> None:
    model = timm.create_model("hub_vit", variant="mu/4", img_size=32, num_classes=10, posemb="sincos2d",
                              pool_type="gap")
    assert model.spec.width == 32 and model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_dynamic_img_size_is_accepted_as_it_is_always_on() -> None:
    # timm ViT code passes dynamic_img_size=True; it was "unknown field(s)" with a list of spec fields
    model = timm.create_model("simplevit_ti16", img_size=32, dynamic_img_size=True).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 48, 64)).shape == (1, 1000)


def test_timm_s_own_vit_argument_names_are_refused_naming_the_field_they_stand_for() -> None:
    # code written for timm's VisionTransformer passes embed_dim / mlp_ratio: the error said only "unknown field(s)"
    from hub_vit.variants import UnknownFieldError

    with pytest.raises(UnknownFieldError, match=r"'embed_dim' is width here; 'mlp_ratio' is mlp_dim \(the MLP's "
                                                r"hidden width itself: mlp_ratio x width\) here"):
        timm.create_model("hub_vit", embed_dim=192, mlp_ratio=4.0)
    with pytest.raises(UnknownFieldError, match=r"\['not_a_field'\]; valid fields: \[[^]]+\]$"):  # no hint
        timm.create_model("simplevit_ti16", not_a_field=1)


def test_pretrained_without_published_weights_is_refused_before_the_model_is_built(monkeypatch) -> None:
    # was timm's refusal after the build: 9 s and 2.5 GB for vit_h14's 632M parameters
    from hub_vit.model import VisionTransformer

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the refusal")

    monkeypatch.setattr(VisionTransformer, "__init__", built)
    with pytest.raises(RuntimeError, match=r"No pretrained weights exist for vit_h14\. Use `pretrained=False`"):
        timm.create_model("vit_h14", pretrained=True)
