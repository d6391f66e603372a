"""The transformers front door: config <-> spec, the two model classes, save/load, attentions, processor, pipeline."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
import transformers
from packaging import version
from PIL import Image
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    ViTForImageClassification,
    pipeline,
)

import hub_vit  # noqa: F401  (registers the Auto classes)
from hub_vit.hf import HubViTConfig, HubViTForImageClassification, HubViTImageProcessor, HubViTModel
from hub_vit.hf.native_vit import native_vit_config, to_native_vit
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

# Tiny specs, one per pooling flavour. head_zeroinit=False: a zero head would make every logit comparison trivial.
SPECS = {
    "simplevit": ViTSpec.from_variant("mu/8", posemb="sincos2d", pool_type="gap", rep_size=True, img_size=32,
                                      num_classes=5, head_zeroinit=False),
    "vit": ViTSpec.from_variant("mu/8", posemb="learn", pool_type="tok", posemb_on_cls=True, img_size=32,
                                num_classes=5, head_zeroinit=False),
    "map": ViTSpec.from_variant("mu/8", posemb="learn", pool_type="map", img_size=(32, 48), num_classes=5,
                                head_zeroinit=False, gelu="erf"),
}


def _randomised(spec: ViTSpec) -> VisionTransformer:
    model = VisionTransformer(spec).eval()
    with torch.no_grad():  # the class token / posemb start at zero; make every tensor matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _pixels(spec: ViTSpec, batch: int = 2) -> torch.Tensor:
    return torch.rand(batch, spec.in_chans, *spec.img_size) * 2 - 1


@pytest.fixture(params=sorted(SPECS))
def spec(request: pytest.FixtureRequest) -> ViTSpec:
    return SPECS[request.param]


# ------------------------------------------------------------------------------------------------------------ config
def test_config_fields_are_the_spec_fields(spec: ViTSpec) -> None:
    config = HubViTConfig.from_spec(spec)
    assert config.to_spec() == spec
    assert config.num_classes == config.num_labels == spec.num_classes
    data = config.to_dict()
    restored = AutoConfig.for_model(data.pop("model_type"), **data)
    assert isinstance(restored, HubViTConfig) and restored.to_spec() == spec


def test_from_spec_keywords_override_spec_fields(spec: ViTSpec) -> None:
    # was: TypeError "got multiple values for keyword argument 'num_classes'"
    config = HubViTConfig.from_spec(spec, num_classes=3, img_size=64)
    assert config.to_spec() == spec.replace(num_classes=3, img_size=(64, 64))
    assert config.num_labels == 3


def test_default_config_is_the_paper_simplevit_s16() -> None:
    assert HubViTConfig().to_spec() == hub_vit.MODELS["simplevit_s16"].spec


def test_config_from_fields_equals_the_registered_model() -> None:
    # Defaults are switches, not S/16's normalised values: the pre-logits layer is as wide as the model (True), and
    # the class token follows pool_type; a Ti/16 written out field by field is timm's simplevit_ti16.
    config = HubViTConfig(width=192, depth=12, mlp_dim=768, num_heads=3, patch_size=16)
    assert config.rep_size == 192 and config.to_spec() == hub_vit.MODELS["simplevit_ti16"].spec
    assert HubViTConfig(posemb="learn", pool_type="tok").class_token is True
    with pytest.raises(ValueError, match=r"no 'variant' field.*ViTSpec.from_variant\('Ti/16'"):
        HubViTConfig(variant="Ti/16")


def test_config_json_serves_timm_too(spec: ViTSpec) -> None:
    d = HubViTConfig.from_spec(spec, id2label={i: f"c{i}" for i in range(5)}).to_dict()
    assert d["model_type"] == "hub_vit" and d["num_classes"] == 5 and d["label_names"] == [f"c{i}" for i in range(5)]
    assert ViTSpec.from_dict(d["model_args"]) == spec
    assert d["pretrained_cfg"]["input_size"] == [3, *spec.img_size] and d["pretrained_cfg"]["mean"] == [0.5] * 3
    assert d["architecture"] == "hub_vit"  # mu/8 is not a registered size


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(pool_type="cls"), "valid choices: 'tok', 'gap', 'map'"),
    (dict(posemb="rope"), "valid choices: 'learn', 'sincos2d'"),
    (dict(gelu="relu"), "valid choices: 'tanh', 'erf'"),
    (dict(width=30, num_heads=4), "not divisible"),
    (dict(img_size=230), "not divisible by the patch size 16"),
    (dict(widht=384), "did you mean 'width'"),
    (dict(num_classes=3, id2label={0: "a", 1: "b"}), "disagrees with id2label"),
    (dict(drop_path_rate=1.0), r"drop_path_rate must be a number in \[0, 1\), got 1.0"),
    # transformers' ViT dropout, which these blocks do not have, was stored and silently did nothing
    (dict(hidden_dropout_prob=0.1), "hidden_dropout_prob=0.1: hub-vit models have no dropout inside the blocks"),
])
def test_bad_config_values_raise_clear_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        HubViTConfig(**kwargs)


def test_assigned_config_values_are_checked() -> None:
    # was: `config.width = "x"` and `config.pool_type = "xx"` accepted, failing later when a model was built or the
    # config printed
    from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError

    config = HubViTConfig()
    with pytest.raises(StrictDataclassFieldValidationError, match="expected int, got str"):
        config.width = "x"
    config.pool_type = "xx"  # a value of the right type: checked by validate(), which save_pretrained runs
    with pytest.raises(StrictDataclassClassValidationError, match="unknown pool_type 'xx'; valid choices"):
        config.validate()


def test_from_pretrained_names_the_field_meant_and_takes_timms_regularisation() -> None:
    # was: TypeError "__init__() got an unexpected keyword argument 'image_size'" (ViT's name), and drop_path_rate
    # refused the same way although the model implements it
    from hub_vit.catalog import default_model_folder

    folder = default_model_folder()
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['image_size'\] \(did you mean 'img_size'\?\)"):
        AutoModelForImageClassification.from_pretrained(folder, image_size=64)
    with pytest.raises(ValueError, match="attention_probs_dropout_prob=0.1: hub-vit models have no dropout"):
        AutoModelForImageClassification.from_pretrained(folder, attention_probs_dropout_prob=0.1)
    model = AutoModelForImageClassification.from_pretrained(folder, drop_path_rate=0.2, drop_rate=0.1)
    assert model.vit.head_drop.p == 0.1
    assert model.vit.blocks[-1].drop_path.drop_prob == pytest.approx(0.2)  # rising linearly to the rate
    model.train()
    x = torch.randn(2, 3, 32, 32).clamp(-1, 1)
    assert not torch.equal(model(x).logits, model(x).logits)  # regularisation acts in training
    model.eval()
    assert torch.equal(model(x).logits, model(x).logits)


def test_a_changed_spec_is_not_saved_under_the_loaded_name(tmp_path) -> None:
    # was: a model loaded as simplevit_digits with depth=2 saved architecture 'simplevit_digits', which names another
    # model to every card and tool that reads it
    import json

    from hub_vit.catalog import default_model_folder

    AutoModelForImageClassification.from_pretrained(default_model_folder(), depth=2).save_pretrained(tmp_path / "d2")
    assert json.loads((tmp_path / "d2" / "config.json").read_text())["architecture"] == "hub_vit"
    AutoModelForImageClassification.from_pretrained(default_model_folder()).save_pretrained(tmp_path / "same")
    assert json.loads((tmp_path / "same" / "config.json").read_text())["architecture"] == "simplevit_digits"


def test_another_models_config_is_named_by_its_type(tmp_path) -> None:
    # a transformers ViT folder (convert writes one as `native/`) loaded with hub-vit's class was refused as a typo:
    # "unknown HubViTConfig field 'image_size' (did you mean 'img_size'?)"
    from transformers import ViTConfig

    ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="this config is of model_type 'vit', not 'hub_vit': load it with "
                                         r"transformers' Auto classes \(AutoModelForImageClassification\)"):
        HubViTConfig.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------------------------ models
def test_timm_and_transformers_front_doors_give_identical_logits(spec: ViTSpec) -> None:
    timm_model = timm.create_model("hub_vit", **spec.to_dict()).eval()
    with torch.no_grad():
        for p in timm_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf = HubViTForImageClassification(HubViTConfig.from_spec(spec)).eval()
    missing = hf.load_state_dict(timm_model.state_dict())  # plain timm keys, no prefix
    assert not missing.missing_keys and not missing.unexpected_keys
    x = _pixels(spec)
    with torch.no_grad():
        assert torch.equal(hf(pixel_values=x).logits, timm_model(x))


def test_output_attentions_and_hidden_states(spec: ViTSpec) -> None:
    model = HubViTForImageClassification.from_vit(_randomised(spec)).eval()
    x = _pixels(spec, batch=3)
    with torch.no_grad():
        fused = model(x).logits
        out = model(x, output_attentions=True, output_hidden_states=True)
    assert fused.shape == (3, spec.num_classes)
    assert (out.logits - fused).abs().max() <= 1e-5
    tokens = spec.num_patches + spec.num_prefix_tokens
    assert len(out.attentions) == spec.depth and len(out.hidden_states) == spec.depth + 1
    for attn in out.attentions:
        assert attn.shape == (3, spec.num_heads, tokens, tokens)
        torch.testing.assert_close(attn.sum(-1), torch.ones(3, spec.num_heads, tokens), atol=1e-5, rtol=0)
    assert all(h.shape == (3, tokens, spec.width) for h in out.hidden_states)
    assert model(x).attentions is None and model(x).hidden_states is None


def test_base_model_returns_pre_logits_as_pooler_output(spec: ViTSpec, tmp_path) -> None:
    vit = _randomised(spec)
    HubViTForImageClassification.from_vit(vit).save_pretrained(tmp_path)
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(base, HubViTModel)
    x = _pixels(spec)
    with torch.no_grad():
        out = base(x)
        expected = vit.forward_head(vit.forward_features(x), pre_logits=True)
    torch.testing.assert_close(out.pooler_output, expected, atol=1e-6, rtol=0)
    assert out.last_hidden_state.shape == (2, spec.num_patches + spec.num_prefix_tokens, spec.width)
    assert out.pooler_output.shape == (2, spec.head_hidden_size)


def test_save_pretrained_round_trip_is_exact(spec: ViTSpec, tmp_path) -> None:
    from safetensors.torch import load_file

    model = HubViTForImageClassification.from_vit(_randomised(spec), id2label={i: f"k{i}" for i in range(5)})
    model.save_pretrained(tmp_path)
    on_disk = load_file(tmp_path / "model.safetensors")
    assert set(on_disk) == set(model.vit.state_dict())  # plain timm keys, no `vit.` prefix
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path)
    assert isinstance(loaded, HubViTForImageClassification) and loaded.config.id2label[4] == "k4"
    assert loaded.config.to_spec() == model.config.to_spec()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    loaded.save_pretrained(tmp_path / "again")  # a model that came from from_pretrained writes the same keys
    assert set(load_file(tmp_path / "again" / "model.safetensors")) == set(on_disk)
    # the same folder is a timm local-dir checkpoint
    timm_model = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = _pixels(spec)
    with torch.no_grad():
        assert torch.equal(timm_model(x), loaded.eval()(x).logits)


def test_a_model_saved_alone_loads_its_image_processor(tmp_path) -> None:
    # transformers' save_pretrained writes no preprocessor_config.json, the only file AutoImageProcessor reads: a model
    # saved alone (a fine-tuning script's last line) had no processor ("Can't load image processor")
    spec = SPECS["map"]  # a 32x48 input
    cfg = dict(crop_pct=1.0, interpolation="bicubic", mean=(0.1, 0.2, 0.3), std=(0.5, 0.4, 0.3))
    model = HubViTForImageClassification.from_vit(_randomised(spec), pretrained_cfg=cfg)
    model.save_pretrained(tmp_path / "alone")
    # and its labels.txt (was: none, so a transformers save was no whole hub-vit folder for Triton's repository)
    assert (tmp_path / "alone" / "labels.txt").read_text().splitlines() == [
        model.config.id2label[i] for i in range(model.config.num_labels)]
    processor = AutoImageProcessor.from_pretrained(tmp_path / "alone")
    # the reference: timm's own eval transform for the same folder
    timm_model = timm.create_model(f"local-dir:{tmp_path / 'alone'}", pretrained=True)
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=timm_model))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (61, 83, 3), dtype=np.uint8))
    torch.testing.assert_close(processor(image)["pixel_values"][0], transform(image), atol=1e-6, rtol=0)
    # a processor saved into the folder first is kept, not replaced by the model's; the class reads it, and so does
    # AutoImageProcessor before transformers 5.25, which reads a folder with a timm `pretrained_cfg` in config.json
    # as a timm checkpoint: from that data config, the one timm's transform reads
    HubViTImageProcessor.from_pretrained_cfg({**timm_model.pretrained_cfg, "crop_pct": 0.5}).save_pretrained(
        tmp_path / "both")
    model.save_pretrained(tmp_path / "both")
    assert HubViTImageProcessor.from_pretrained(tmp_path / "both").crop_pct == 0.5
    auto = AutoImageProcessor.from_pretrained(tmp_path / "both")
    assert isinstance(auto, HubViTImageProcessor)
    assert auto.crop_pct == (0.5 if version.parse(transformers.__version__) < version.parse("5.25") else 1.0)
    if auto.crop_pct == 1.0:  # the model's data config, whole (was the processor's defaults: 224 px, bilinear)
        torch.testing.assert_close(auto(image)["pixel_values"][0], transform(image), atol=1e-6, rtol=0)


def test_saving_over_a_model_folder_leaves_a_folder_hub_vit_loads(tmp_path, caplog) -> None:
    # was: labels.txt kept the old model's 10 digit names beside a 2-class head, and load_model_folder refused the
    # folder ("labels.txt disagrees with config.json id2label: 10 lines against 2 entries")
    import shutil

    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder, read_labels

    folder = tmp_path / "digits"
    shutil.copytree(default_model_folder(), folder)
    parity = AutoModelForImageClassification.from_pretrained(
        folder, id2label={0: "even", 1: "odd"}, label2id={"even": 0, "odd": 1}, ignore_mismatched_sizes=True)
    parity.save_pretrained(folder)
    assert read_labels(folder) == ["even", "odd"]
    assert load_model_folder(folder)[1].labels == ["even", "odd"]
    AutoModel.from_pretrained(folder).save_pretrained(folder)  # a backbone has no classes to name
    assert not (folder / "labels.txt").exists()
    assert load_model_folder(folder)[0].spec.num_classes == 0
    # the folder's processor is kept, and one sized for another input than the model's is named
    with caplog.at_level("WARNING"):
        AutoModelForImageClassification.from_pretrained(folder, img_size=64, num_labels=2).save_pretrained(folder)
    assert "preprocessor_config.json in" in caplog.text and "prepares 32x32 images, but the model saved there " \
        "takes 64x64" in caplog.text


def test_a_sharded_save_is_named_as_such(tmp_path, caplog) -> None:
    # was: saved silently, then "model.safetensors is missing" from hub-vit's loader (timm: "missing keys (44)")
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder

    model = AutoModelForImageClassification.from_pretrained(default_model_folder())
    with caplog.at_level("WARNING"):
        model.save_pretrained(tmp_path, max_shard_size="200KB")
    assert "the weights were saved in shards (max_shard_size)" in caplog.text
    with pytest.raises(FileNotFoundError, match=r"holds its weights in shards \(model.safetensors.index.json"):
        load_model_folder(tmp_path)
    assert AutoModelForImageClassification.from_pretrained(tmp_path).config.num_labels == 10  # transformers' own


def test_new_head_on_load_keeps_the_backbone(tmp_path) -> None:
    spec = SPECS["vit"]
    vit = _randomised(spec)
    HubViTForImageClassification.from_vit(vit).save_pretrained(tmp_path)
    model = HubViTForImageClassification.from_pretrained(tmp_path, num_labels=3, ignore_mismatched_sizes=True)
    assert model.vit.head.weight.shape == (3, spec.width) and model.config.num_classes == 3
    assert torch.equal(model.vit.pos_embed, vit.pos_embed)
    assert torch.equal(model.vit.blocks[0].attn.qkv.weight, vit.blocks[0].attn.qkv.weight)
    assert torch.isfinite(model.vit.head.weight).all()


@pytest.mark.parametrize("name", ["vit", "map"])
def test_from_pretrained_at_another_size_resamples_learned_posemb(name: str, tmp_path) -> None:
    # transformers used to fail on vit.pos_embed, or with ignore_mismatched_sizes=True re-initialise it silently.
    # References: the saved model itself on 64x64 inputs (it resamples its embedding per forward) and, for the
    # square grid, timm's loader with img_size=64.
    spec = SPECS[name]  # "map" is 32x48: a non-square grid
    original = _randomised(spec)
    HubViTForImageClassification.from_vit(original).save_pretrained(tmp_path)
    x = torch.randn(2, 3, 64, 64)
    expected = original(x)
    if name == "vit":
        timm_model = timm.create_model(f"local-dir:{tmp_path}", pretrained=True, img_size=64).eval()
        torch.testing.assert_close(timm_model(x), expected, rtol=0, atol=1e-6)
    for model in (AutoModelForImageClassification.from_pretrained(tmp_path, img_size=64),  # config carries it
                  HubViTForImageClassification.from_pretrained(tmp_path, img_size=64)):  # the kwarg itself
        assert model.config.img_size == [64, 64] and model.vit.pos_embed.shape[1] == 64 + spec.posemb_on_cls
        torch.testing.assert_close(model.eval()(x).logits, expected, rtol=0, atol=1e-6)
    tuned = AutoModelForImageClassification.from_pretrained(tmp_path, img_size=64, num_labels=3,
                                                            ignore_mismatched_sizes=True)
    torch.testing.assert_close(tuned.vit.pos_embed, model.vit.pos_embed, rtol=0, atol=0)
    assert tuned.vit.head.out_features == 3


def test_from_pretrained_reads_the_saved_config_once_and_none_never(tmp_path, monkeypatch) -> None:
    """Each read of a Hub repo's config is a request (offline: huggingface_hub's retries, about 23 s); hub-vit's checks
    read it once per load, and a load with no path (`state_dict` and `config` given) asks for nothing."""
    reads: list[object] = []
    original = HubViTConfig.get_config_dict.__func__

    def counted(cls, path, **kwargs):
        reads.append(path)
        return original(cls, path, **kwargs)

    monkeypatch.setattr(HubViTConfig, "get_config_dict", classmethod(counted))
    spec = SPECS["vit"]
    model = HubViTForImageClassification.from_vit(_randomised(spec))
    model.save_pretrained(tmp_path)
    config = HubViTConfig.from_pretrained(tmp_path)
    reads.clear()
    HubViTForImageClassification.from_pretrained(tmp_path, config=config)
    assert reads == [tmp_path]
    reads.clear()
    HubViTForImageClassification.from_pretrained(tmp_path, config=HubViTConfig.from_pretrained(tmp_path, img_size=64))
    assert reads.count(tmp_path) == 2  # the config above, then the load's one read (a resample to 64 px)
    reads.clear()
    loaded = HubViTForImageClassification.from_pretrained(None, config=config, state_dict=model.state_dict())
    assert reads == []
    assert torch.equal(loaded.vit.pos_embed, model.vit.pos_embed)


@pytest.fixture()
def unreachable_hub(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The Hub at an address that never resolves (RFC 2606 `.invalid`), on any machine; every metadata request
    huggingface_hub would make (for a file it does not have, retried for about 23 s when it fails) is recorded."""
    from huggingface_hub import file_download

    asked: list[str] = []

    def metadata(url: str, *args, **kwargs):
        asked.append(url)
        raise AssertionError(f"asked the Hub for {url}")

    for switch in ("HUB_VIT_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    monkeypatch.setattr(file_download, "get_hf_file_metadata", metadata)
    return asked


def _hub_cache(root, repo_id: str, model: HubViTForImageClassification):
    """`model` saved in huggingface_hub's cache layout under `root`, as a download of `repo_id` leaves it."""
    revision = "0" * 40
    repo = root / f"models--{repo_id.replace('/', '--')}"
    model.save_pretrained(repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return root


def test_a_cached_hub_repo_loads_from_the_cache_at_once_while_the_hub_is_unreachable(tmp_path, unreachable_hub,
                                                                                      caplog) -> None:
    model = HubViTForImageClassification.from_vit(_randomised(SPECS["vit"]))
    cache = _hub_cache(tmp_path, "hub-vit-test/tiny", model)
    with caplog.at_level("WARNING"):
        loaded = HubViTForImageClassification.from_pretrained("hub-vit-test/tiny", cache_dir=cache)
    assert unreachable_hub == []  # no request, so none of huggingface_hub's retries
    assert torch.equal(loaded.vit.pos_embed, model.vit.pos_embed)
    assert "cannot resolve 'hub.invalid'" in caplog.text and "from the local cache only" in caplog.text


def test_an_uncached_hub_repo_fails_at_once_naming_the_hub_and_the_cache(tmp_path, unreachable_hub) -> None:
    from hub_vit.network import HubUnreachableError

    with pytest.raises(HubUnreachableError, match=r"cannot load 'hub-vit-test/absent': cannot reach the Hugging "
                                                  r"Face Hub at http://hub\.invalid.*the local cache") as refused:
        HubViTForImageClassification.from_pretrained("hub-vit-test/absent", cache_dir=tmp_path)
    assert unreachable_hub == []
    assert f"the local cache ({tmp_path}) does not hold it" in str(refused.value)
    # was: huggingface_hub's advice to set local_files_only=False, which the caller never set
    assert "local_files_only" not in str(refused.value)


@pytest.mark.parametrize("cls", [HubViTConfig, HubViTImageProcessor], ids=["config", "processor"])
def test_the_config_and_processor_of_a_hub_repo_load_from_the_cache_at_once_while_the_hub_is_unreachable(
        cls, tmp_path, unreachable_hub, caplog) -> None:
    # was: the configuration and image processor asked the Hub anyway: 23 s / 47 s of retries, then transformers'
    # advice to check the connection, where the model class failed at once naming the Hub and the cache
    from hub_vit.network import HubUnreachableError

    model = HubViTForImageClassification.from_vit(_randomised(SPECS["vit"]))
    cache = _hub_cache(tmp_path / "cache", "hub-vit-test/tiny", model)
    with caplog.at_level("WARNING"):
        loaded = cls.from_pretrained("hub-vit-test/tiny", cache_dir=cache)
    assert isinstance(loaded, cls) and "from the local cache only" in caplog.text
    with pytest.raises(HubUnreachableError, match=r"cannot load 'hub-vit-test/absent': cannot reach the Hugging "
                                                  r"Face Hub at http://hub\.invalid.*the local cache .* does not hold"):
        cls.from_pretrained("hub-vit-test/absent", cache_dir=cache)
    assert unreachable_hub == []


def test_a_timm_name_says_how_to_load_its_weights(tmp_path, unreachable_hub) -> None:
    # was: the Hub's failure alone, for a name a user has just used with timm.create_model
    from hub_vit.network import HubUnreachableError

    with pytest.raises(HubUnreachableError, match=r"'simplevit_s16' names a hub-vit model in timm, not a folder or a "
                                                  r"Hugging Face Hub repository: timm.create_model\('simplevit_s16', "
                                                  r"pretrained=True\) .*`hub-vit convert simplevit_s16 -o FOLDER`"):
        HubViTForImageClassification.from_pretrained("simplevit_s16", cache_dir=tmp_path)
    with pytest.raises(HubUnreachableError) as absent:
        HubViTForImageClassification.from_pretrained("hub-vit-test/absent", cache_dir=tmp_path)
    assert "names a hub-vit model" not in str(absent.value)


def test_a_missing_local_folder_is_not_taken_for_a_hub_repo(tmp_path, unreachable_hub, caplog) -> None:
    with caplog.at_level("WARNING"), pytest.raises(OSError, match="missing"):
        HubViTForImageClassification.from_pretrained(str(tmp_path / "missing"))
    assert unreachable_hub == [] and "Hugging Face Hub" not in caplog.text


def test_an_offline_switch_loads_from_the_cache_without_a_connection(tmp_path, unreachable_hub, monkeypatch) -> None:
    """HUB_VIT_OFFLINE, which huggingface_hub does not read, is honoured by hub-vit's loads too."""
    import socket

    model = HubViTForImageClassification.from_vit(_randomised(SPECS["simplevit"]))
    cache = _hub_cache(tmp_path, "hub-vit-test/tiny", model)
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    connects: list[object] = []
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: connects.append(address))
    loaded = HubViTForImageClassification.from_pretrained("hub-vit-test/tiny", cache_dir=cache)
    assert unreachable_hub == [] and connects == []
    assert torch.equal(loaded.vit.head.weight, model.vit.head.weight)


def test_labels_give_a_loss_and_gradients_flow_with_checkpointing() -> None:
    spec = SPECS["simplevit"]
    model = HubViTForImageClassification.from_vit(_randomised(spec)).train()
    model.activation_checkpointing_enable()
    # transformers checkpoints the blocks itself (its GradientCheckpointingLayer), also those of a timm-built module
    assert all(block.gradient_checkpointing for block in model.vit.blocks) and model.is_activation_checkpointing
    out = model(_pixels(spec), labels=torch.tensor([1, 4]))
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.vit.patch_embed.proj.weight.grad is not None


def test_bad_model_inputs_raise_clear_errors() -> None:
    spec = SPECS["vit"]
    model = HubViTForImageClassification.from_vit(_randomised(spec))
    with pytest.raises(ValueError, match="expected 3 input channels, got 1"):
        model(torch.zeros(1, 1, 32, 32))
    with pytest.raises(ValueError, match="not divisible by the patch size 8"):
        model(torch.zeros(1, 3, 30, 32))
    with pytest.raises(ValueError, match="pixel_values is required"):
        model()
    with pytest.raises(ValueError, match="expected normalised float pixels, got a torch.uint8 tensor"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))  # cast to float silently before
    assert model(torch.zeros(1, 3, 32, 32, dtype=torch.float64)).logits.dtype == torch.float32  # transformers casts
    with pytest.raises(TypeError, match="unexpected argument"):
        model(torch.zeros(1, 3, 32, 32), interpolate_pos_encodings=True)
    with pytest.raises(ValueError, match="num_labels >= 1"):
        HubViTForImageClassification(HubViTConfig.from_spec(spec.replace(num_classes=0)))


# ------------------------------------------------------------------------------------------------ image processor
def _independent_eval_transform(image: np.ndarray, size: int, crop_pct: float) -> torch.Tensor:
    """timm's eval recipe written out with PIL + numpy: shorter side -> floor(size / crop_pct), centre crop, [-1, 1]."""
    pil = Image.fromarray(image)
    scale = math.floor(size / crop_pct)
    w, h = pil.size
    new = (scale, int(h * scale / w)) if w <= h else (int(w * scale / h), scale)  # torchvision truncates
    pil = pil.resize(new, Image.BILINEAR)
    left, top = int(round((new[0] - size) / 2)), int(round((new[1] - size) / 2))
    arr = np.asarray(pil.crop((left, top, left + size, top + size)), dtype=np.float32) / 255.0
    return torch.from_numpy((arr - 0.5) / 0.5).permute(2, 0, 1)


def test_image_processor_is_the_eval_transform(photos: dict[str, np.ndarray]) -> None:
    processor = HubViTImageProcessor(size={"height": 224, "width": 224}, crop_pct=0.875, interpolation="bilinear")
    batch = processor([photos["astronaut"], photos["chelsea"]], return_tensors="pt").pixel_values
    assert batch.shape == (2, 3, 224, 224) and batch.dtype == torch.float32
    for i, name in enumerate(["astronaut", "chelsea"]):
        expected = _independent_eval_transform(photos[name], 224, 0.875)
        assert (batch[i] - expected).abs().max() <= 1e-6, name
    assert -1.0 <= batch.min() and batch.max() <= 1.0


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(interpolation="cubic"), "valid choices: bilinear, bicubic"),
    (dict(crop_mode="random"), "valid choices: center"),
    (dict(crop_pct=1.5), r"crop_pct must be a number in \(0, 1\]"),
    (dict(size={"shortest_edge": 224}), "height"),
])
def test_image_processor_rejects_bad_settings(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        HubViTImageProcessor(**kwargs)


def test_image_processor_refuses_extreme_aspect_ratios(photos: dict[str, np.ndarray]) -> None:
    """The shorter side is resized first: 2x200000 px (a 2 kB PNG) would become 256x25600000 before the crop."""
    from PIL import Image

    processor = HubViTImageProcessor(size={"height": 224, "width": 224}, crop_pct=0.875)
    panorama = Image.fromarray(photos["coffee"]).resize((2000, 200))  # 10:1 is fine
    assert processor(panorama)["pixel_values"].shape == (1, 3, 224, 224)
    with pytest.raises(ValueError, match=r"too extreme: a 2x200000 image would be resized to 256x25600000 "):
        processor(Image.new("RGB", (2, 200_000)))


def test_image_processor_bounds_non_square_models_too(photos: dict[str, np.ndarray]) -> None:
    """A non-square input resizes with timm's ResizeKeepRatio, which grows a thin image just the same."""
    from PIL import Image

    processor = HubViTImageProcessor(size={"height": 48, "width": 64}, crop_pct=1.0)
    panorama = Image.fromarray(photos["coffee"]).resize((2000, 200))
    assert processor(panorama)["pixel_values"].shape == (1, 3, 48, 64)
    with pytest.raises(ValueError, match=r"too extreme: a 2x200000 image would be resized to 64x6400000 "):
        processor(Image.new("RGB", (2, 200_000)))


def test_image_processor_takes_grey_arrays_like_grey_images(photos: dict[str, np.ndarray]) -> None:
    # (H, W) arrays are what numpy / a 16-bit grey PNG give; transformers' list helper refuses them
    processor = HubViTImageProcessor(size={"height": 32, "width": 32}, crop_pct=0.875)
    grey = np.asarray(Image.fromarray(photos["coffee"]).convert("L"))  # (H, W) uint8
    reference = processor(Image.fromarray(grey))["pixel_values"]
    for array in (grey, grey.astype(np.uint16) * 257, grey.astype(np.float32) / 255, torch.from_numpy(grey.copy())):
        torch.testing.assert_close(processor(array)["pixel_values"], reference, atol=1e-6, rtol=0)
    assert processor([grey, grey])["pixel_values"].shape == (2, 3, 32, 32)
    assert HubViTImageProcessor(size=32).size == {"height": 32, "width": 32}
    with pytest.raises(ValueError, match="no images given"):
        processor([])
    with pytest.raises(ValueError, match=r"fromarray\(array, .RGBA.\)"):
        processor(np.zeros((32, 32, 4), dtype=np.uint8))


@pytest.mark.parametrize(("override", "needle"), [
    (dict(crop_pct=1.5), r"crop_pct must be a number in \(0, 1\]"),
    (dict(crop_mode="middle"), "valid choices: center, squash, border"),
    (dict(interpolation="cubic"), "valid choices: bilinear, bicubic"),
])
def test_from_pretrained_overrides_are_validated(override: dict, needle: str) -> None:
    # transformers sets overrides it does not know as plain attributes after __init__ (a KeyError at call time)
    from hub_vit.catalog import default_model_folder

    with pytest.raises(ValueError, match=needle):
        AutoImageProcessor.from_pretrained(default_model_folder(), **override)
    tuned = AutoImageProcessor.from_pretrained(default_model_folder(), crop_pct=0.9, interpolation="bicubic")
    assert (tuned.crop_pct, tuned.interpolation) == (0.9, "bicubic")


def test_image_processor_rejects_wrong_channel_count() -> None:
    with pytest.raises(ValueError, match="expected an RGB or grayscale image"):
        HubViTImageProcessor()(np.zeros((32, 32, 4), dtype=np.uint8))


def test_pipeline_on_a_real_photo(tmp_path, photos: dict[str, np.ndarray]) -> None:
    from hub_vit.folder import save_model_folder

    spec = ViTSpec.from_variant("mu/16", posemb="sincos2d", pool_type="gap", rep_size=True, num_classes=4,
                                head_zeroinit=False)
    labels = ["astronaut", "cat", "coffee", "rocket"]
    folder = save_model_folder(_randomised(spec), tmp_path / "m", labels=labels,
                               pretrained_cfg=dict(crop_pct=224 / 256, interpolation="bilinear"))
    assert isinstance(AutoImageProcessor.from_pretrained(folder), HubViTImageProcessor)
    classify = pipeline("image-classification", model=str(folder))
    for name in ("astronaut", "chelsea"):
        result = classify(Image.fromarray(photos[name]), top_k=3)
        assert [set(r) for r in result] == [{"label", "score"}] * 3
        assert all(r["label"] in labels for r in result)
        scores = [r["score"] for r in result]
        assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    # the pipeline's logits are the model's logits on the processor's pixels
    model, processor = classify.model, classify.image_processor
    pixels = processor(photos["chelsea"], return_tensors="pt").pixel_values
    with torch.no_grad():
        probs = model(pixels).logits.softmax(-1)[0]
    top = classify(Image.fromarray(photos["chelsea"]), top_k=1)[0]
    assert top["label"] == labels[int(probs.argmax())] and abs(top["score"] - float(probs.max())) < 1e-5


# ------------------------------------------------------------------------------------------------------ native ViT
def test_classic_vit_as_native_transformers_vit() -> None:
    spec = SPECS["vit"]
    vit = _randomised(spec)
    native = to_native_vit(vit)
    assert isinstance(native, ViTForImageClassification)
    assert native.config.hidden_act == "gelu_pytorch_tanh" and native.config.layer_norm_eps == 1e-6
    x = _pixels(spec, batch=3)
    with torch.no_grad():
        assert (native(x).logits - vit(x)).abs().max() <= 1e-5


@pytest.mark.parametrize(("name", "needle"), [
    ("simplevit", "pool_type='gap'"),
    ("map", "pool_type='map'"),
])
def test_non_classic_spec_cannot_be_native(name: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        native_vit_config(SPECS[name])
    with pytest.raises(ValueError, match="posemb_on_cls=False"):
        native_vit_config(ViTSpec.from_variant("mu/8", img_size=32))
    with pytest.raises(ValueError, match="rep_size=32"):
        native_vit_config(SPECS["vit"].replace(rep_size=True))


def test_the_fine_tuning_recipes_string_keyed_id2label_loads_and_saves(tmp_path) -> None:
    # transformers' image-classification tutorial passes id2label={"0": "cat", ...}; from_pretrained sets it after
    # construction, unconverted, and the config's own to_dict (logging, save_pretrained) raised a bare KeyError: 0
    from hub_vit.catalog import default_model_folder

    labels = ["cat", "dog", "bird"]
    model = AutoModelForImageClassification.from_pretrained(
        default_model_folder(), num_labels=3, id2label={str(i): label for i, label in enumerate(labels)},
        label2id={label: str(i) for i, label in enumerate(labels)}, ignore_mismatched_sizes=True)
    assert "cat" in repr(model.config) and model(torch.zeros(1, 3, 32, 32)).logits.shape == (1, 3)
    model.save_pretrained(tmp_path)
    again = AutoModelForImageClassification.from_pretrained(tmp_path)
    assert again.config.id2label == {0: "cat", 1: "dog", 2: "bird"}
    from hub_vit.hf.configuration_hub_vit import label_at

    with pytest.raises(ValueError, match="id2label has no label for class 1"):  # named, not a bare KeyError
        label_at({"0": "a", "2": "c"}, 1)


def test_float_images_are_zero_to_one_whatever_their_values() -> None:
    # transformers' to_pil_image reads a float array of whole numbers as 0..255: white (all 1.0) came out black
    from hub_vit.catalog import default_model_folder

    processor = AutoImageProcessor.from_pretrained(default_model_folder())
    white = processor(np.ones((32, 32, 3), np.float32))["pixel_values"]
    assert torch.allclose(white, torch.ones_like(white))  # mean = std = 0.5: white is +1
    assert processor(torch.ones(3, 32, 32))["pixel_values"].min() == 1.0
    assert processor(np.eye(32, dtype=np.float32))["pixel_values"].max() == 1.0  # a 0/1 mask keeps its ones
    assert processor(torch.ones(3, 32, 32, dtype=torch.bfloat16))["pixel_values"].min() == 1.0  # was a TypeError
    with pytest.raises(ValueError, match=r"float images must hold values in \[0, 1\], got 127.5 .. 127.5"):
        processor(np.full((32, 32, 3), 127.5, np.float32))


def test_a_pil_float_image_in_0_1_is_refused_and_a_boolean_mask_is_white() -> None:
    # was: Pillow reads mode "F" as 0..255, so a [0, 1] float image came out black (-1 everywhere), as did a 3-D
    # bool array (0 or 1 of 255)
    from hub_vit.catalog import default_model_folder

    processor = AutoImageProcessor.from_pretrained(default_model_folder())
    with pytest.raises(ValueError, match=r"a PIL float image \(mode 'F'\) holding 0.8 .. 0.8: Pillow reads such"):
        processor(Image.fromarray(np.full((32, 32), 0.8, np.float32), "F"))
    on_255 = processor(Image.fromarray(np.full((32, 32), 0.8 * 255, np.float32), "F"))["pixel_values"]
    assert torch.allclose(on_255, processor(np.full((32, 32), 0.8, np.float32))["pixel_values"])  # Pillow's own scale
    assert processor(np.ones((32, 32, 3), bool))["pixel_values"].min() == 1.0


def test_interpolate_pos_encoding_is_accepted_as_vit_code_passes_it() -> None:
    from hub_vit.catalog import default_model_folder

    model = AutoModelForImageClassification.from_pretrained(default_model_folder())
    x = torch.randn(1, 3, 64, 64).clamp(-1, 1)
    with torch.no_grad():  # the position embedding follows the input size either way
        assert torch.equal(model(x, interpolate_pos_encoding=True).logits, model(x).logits)
        # None is ViT's own default, which generic wrappers pass on explicitly (was: refused as unexpected)
        assert torch.equal(model(x, interpolate_pos_encoding=None).logits, model(x).logits)
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['head_mask'\]"):
        model(x, head_mask=torch.ones(4))
    backbone = AutoModel.from_pretrained(default_model_folder())
    with torch.no_grad():
        backbone(x, interpolate_pos_encoding=None)
    with pytest.raises(TypeError) as refused:  # the backbone takes no labels, and does not offer them
        backbone(x, labels=torch.tensor([1]))
    assert "['labels']; valid arguments: pixel_values, output_attentions," in str(refused.value)


def test_a_head_resized_through_vit_saves_a_folder_that_loads_back(tmp_path) -> None:
    # was: config.json kept num_classes 10 and ten labels beside 3-class weights, labels.txt cut to '0', '1', '2',
    # and from_pretrained refused the folder ("config.json declares num_classes: 10, model.safetensors holds 3")
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder

    model = AutoModelForImageClassification.from_pretrained(default_model_folder())
    model.vit.reset_classifier(3)  # timm's API on the wrapped module
    model.save_pretrained(tmp_path / "three")
    again = AutoModelForImageClassification.from_pretrained(tmp_path / "three")
    assert again.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    assert again(torch.rand(2, 3, 32, 32)).logits.shape == (2, 3)
    assert load_model_folder(tmp_path / "three")[1].labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    model.vit.reset_classifier(0)
    with pytest.raises(ValueError, match=r"this classifier's head was removed \(vit.reset_classifier\(0\)\)"):
        model.save_pretrained(tmp_path / "none")
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("fields", "said"), [
    (dict(num_classes=5, num_labels=3), "num_classes=5 and num_labels=3 are the same setting"),
    (dict(width=32, hidden_size=64, num_heads=2), "hidden_size=64 and width=32 are the same setting"),
])
def test_a_field_and_its_transformers_name_at_two_values_are_refused(fields, said) -> None:
    # was: one of them silently won (5 labels; width 64)
    with pytest.raises(ValueError, match=said):
        HubViTConfig(**fields)
    assert HubViTConfig(width=32, hidden_size=32, num_heads=2).width == 32  # the same value twice is one setting


def test_a_config_made_invalid_after_construction_is_refused_before_its_folder_is_made(tmp_path) -> None:
    # was huggingface_hub's StrictDataclassClassValidationError, after transformers had made the (empty) folder
    config = HubViTConfig()
    config.pool_type = "cls"  # assignment checks only the type
    with pytest.raises(ValueError, match="invalid HubViTConfig: unknown pool_type 'cls'; valid choices: 'tok', 'gap'"):
        config.save_pretrained(tmp_path / "config")
    assert not (tmp_path / "config").exists()
