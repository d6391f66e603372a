"""`hub_vit.resolve`: the one model reference. Each kind of reference resolves to the model, its labels, its data
config and its origin; each bad reference gets a message naming the problem and the valid choices.

Golden values: Google's own outputs for the tiny vit_jax checkpoint (`tests/fixtures/jax/vit_jax/*.io.npz`, see its
PROVENANCE.md); timm's ImageNet class list for default labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hub_vit.catalog import default_model_folder
from hub_vit.data_config import GOOGLE_EVAL, DataConfig
from hub_vit.model import VisionTransformer
from hub_vit.resolve import RANDOM_INIT, ResolvedModel, locate, resolve_model
from hub_vit.variants import ViTSpec

TINY = ViTSpec(img_size=(32, 32), patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3,
               pool_type="gap", posemb="sincos2d")
LABELS = ["ant", "bee", "cat"]
CFG = {"input_size": (3, 32, 32), "crop_pct": 0.9, "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from hub_vit.folder import save_model_folder

    torch.manual_seed(0)
    return save_model_folder(VisionTransformer(TINY.replace(head_zeroinit=False)),
                             tmp_path_factory.mktemp("resolve") / "tiny", labels=LABELS, pretrained_cfg=CFG)


@pytest.fixture(scope="module")
def bare_onnx(tmp_path_factory) -> Path:
    """An .onnx file with nothing beside it."""
    from hub_vit.export import export_onnx

    torch.manual_seed(0)
    return export_onnx(VisionTransformer(TINY.replace(head_zeroinit=False)).eval(),
                       tmp_path_factory.mktemp("bare") / "tiny.onnx")


def test_default_model_is_the_shipped_folder() -> None:
    model = resolve_model(None)
    folder = default_model_folder().resolve()
    assert model.kind == "folder" and model.folder == folder and model.origin == str(folder)
    assert model.labels == tuple(str(d) for d in range(10)) and model.module is not None and model.graph is None
    assert model.data == DataConfig(img_size=(32, 32), crop_pct=1.0)  # the digits recipe, recorded in its folder


def test_registered_name_of_shipped_weights_loads_its_folder() -> None:
    named = resolve_model("simplevit_digits")
    assert named.kind == "registered" and named.name == "simplevit_digits.sklearn_digits"
    assert named.weights == "pretrained sklearn_digits" and named.folder == default_model_folder().resolve()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(named.module(x), resolve_model(None).module(x))
    assert resolve_model("simplevit_digits", pretrained=False).random_weights  # --random: asked for, so given


def test_registered_name_without_weights(monkeypatch) -> None:
    random = resolve_model("simplevit_ti16", pretrained=None)  # export's default: random, announced as such
    assert random.weights == RANDOM_INIT and random.kind == "registered" and random.num_classes == 1000
    assert random.module.head.weight.abs().sum() > 0  # not big_vision's zero head: logits would all be 0
    assert random.labels[0] == "tench, Tinca tinca"  # timm's ImageNet-1k names for a 1000-class head
    assert random.data == GOOGLE_EVAL
    with pytest.raises(ValueError, match=r"'simplevit_ti16' has no published weights to serve \(architecture only\): "
                                         r"give a trained model folder or a registered name with weights "
                                         r"\(simplevit_s16, .*simplevit_digits\); to export it with random weights"):
        resolve_model("simplevit_ti16")


def test_folder(folder: Path) -> None:
    model = resolve_model(str(folder))
    assert model.kind == "folder" and model.name == "tiny" and model.folder == folder.resolve()
    assert model.labels == tuple(LABELS) and model.weights == str(folder.resolve() / "model.safetensors")
    assert model.data == DataConfig(img_size=(32, 32), crop_pct=0.9, interpolation="bicubic")
    assert model.describe()["spec"]["width"] == 32


def test_weights_file_needs_and_uses_its_architecture(folder: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from hub_vit.catalog import get_entry

    torch.manual_seed(1)
    reference = VisionTransformer(get_entry("vit_ti16").spec)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(weights))
    with pytest.raises(ValueError, match=r"a weights file needs the architecture: pass --model NAME \(in Python "
                                         r"model_name=NAME\), one of simplevit_ti16, .*vit_ti16"):
        locate(weights)
    with pytest.raises(ValueError, match=r"unknown model 'vit_nope': .* valid names: simplevit_ti16, .*vit_ti16"):
        locate(weights, model_name="vit_nope")
    # a typo names the model meant first (was only the list of 19 names)
    with pytest.raises(ValueError, match=r"unknown model 'simplevit_digit': .*; did you mean 'simplevit_digits'\? "
                                         r"valid names: simplevit_ti16, "):
        locate(weights, model_name="simplevit_digit")
    with pytest.raises(ValueError, match=r"--model 'vit_ti16' is only for weights files; .*tiny' is not a weights"):
        locate(folder, model_name="vit_ti16")
    model = resolve_model(weights, model_name="vit_ti16")
    assert model.kind == "weights" and model.name == "vit_ti16" and model.weights == str(weights.resolve())
    assert torch.equal(model.module.blocks[0].attn.qkv.weight, reference.blocks[0].attn.qkv.weight)
    # another architecture named: its size first, a few keys of each kind (was every key: 4.8 kB for a ViT-S)
    from hub_vit.weights import CheckpointMismatchError

    with pytest.raises(CheckpointMismatchError) as mismatch:
        resolve_model(weights, model_name="vit_s16")
    message = str(mismatch.value)
    assert message.startswith("checkpoint does not match the model: width 192, depth 12 (checkpoint) vs width 384, "
                              "depth 12 (model), another architecture"), message
    assert "... " in message and len(message) < 1500, message


def test_google_npz_reproduces_googles_logits(jax_fixtures: Path) -> None:
    checkpoint = jax_fixtures / "vit_jax" / "tiny_gap.linen.npz"
    reference = np.load(jax_fixtures / "vit_jax" / "tiny_gap.io.npz")
    model = resolve_model(checkpoint)  # the architecture is read from the arrays
    assert model.kind == "npz" and model.name == "tiny_gap.linen" and model.num_classes == 10
    assert model.labels == tuple(f"class_{i}" for i in range(10)) and model.data.img_size == (64, 64)
    with torch.no_grad():
        logits = model.module(torch.from_numpy(reference["inputs"]).permute(0, 3, 1, 2).contiguous())
    np.testing.assert_allclose(logits.numpy(), reference["logits"], atol=1e-4, rtol=1e-4)


def test_bare_onnx_takes_its_shapes_from_the_graph(bare_onnx: Path) -> None:
    model = resolve_model(bare_onnx)
    assert model.kind == "onnx" and model.onnx_path == bare_onnx.resolve() and model.module is None
    assert model.engine_path is None and model.name == "tiny" and model.origin == str(bare_onnx.resolve())
    assert model.labels == ("class_0", "class_1", "class_2")
    assert model.data == DataConfig(img_size=(32, 32))  # Google's transform at the graph's size
    no_module = r"tiny\.onnx is an exported graph \(onnx\): it has no module weights to digest"
    with pytest.raises(ValueError, match=no_module):
        model.weights_digest  # noqa: B018 - the property is what is tested


def test_onnx_beside_a_model_folder_takes_its_labels_and_transform(folder: Path, bare_onnx: Path,
                                                                    tmp_path: Path) -> None:
    import shutil

    inside = tmp_path / "exported"
    shutil.copytree(folder, inside)
    shutil.copyfile(bare_onnx, inside / "model.onnx")
    model = resolve_model(inside / "model.onnx")
    assert model.kind == "onnx" and model.labels == tuple(LABELS) and model.data.interpolation == "bicubic"


def test_engine_needs_its_metadata(tmp_path: Path) -> None:
    engine = tmp_path / "model.plan"
    engine.write_bytes(b"not parsed here")
    with pytest.raises(ValueError, match=r"TensorRT engine .*model\.plan' needs its metadata .* the model\.plan\.json "
                                         r"that `hub-vit export tensorrt` writes beside it"):
        resolve_model(engine)
    info = {"precision": "fp16", "profile": {"min": [1, 3, 32, 32], "max": [8, 3, 32, 32]},
            "model": {"pretrained_cfg": CFG, "num_classes": 3, "labels": LABELS}}
    (tmp_path / "model.plan.json").write_text(json.dumps(info))
    model = resolve_model(engine)
    assert model.kind == "engine" and model.engine_path == engine.resolve() and model.onnx_path is None
    assert model.labels == tuple(LABELS) and model.data.crop_pct == 0.9 and model.engine_info["precision"] == "fp16"


def test_in_memory_module() -> None:
    module = VisionTransformer(TINY)
    model = ResolvedModel.from_module(module, name="mem", labels=LABELS)
    assert model.kind == "module" and model.module is module and model.data == DataConfig(img_size=(32, 32))
    with pytest.raises(ValueError, match=r"model 'mem': 2 labels for 3 classes"):
        ResolvedModel.from_module(module, name="mem", labels=["a", "b"])


def test_bad_references_name_the_problem_and_the_choices(tmp_path: Path, bare_onnx: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown model 'no_such_model': not a file or folder, and not a registered "
                                         r"name; valid names: simplevit_ti16, .*vit_b16"):
        locate("no_such_model")
    with pytest.raises(ValueError, match=r"model 'simplevit_s16' has no pretrained tag 'nope'; valid tags: i1k_90ep"):
        locate("simplevit_s16.nope")
    with pytest.raises(ValueError, match=r"model path '.*missing\.onnx' does not exist \(expected a model folder"):
        locate(str(tmp_path / "missing.onnx"))
    with pytest.raises(ValueError, match=r"model path 'runs/nothing' does not exist"):
        locate("runs/nothing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"notes\.txt' is a file but not a model: give a model folder, an \.onnx file, "
                                         r"a TensorRT engine \(\.plan, \.engine\) or a weights file \(\.safetensors"):
        locate(tmp_path / "notes.txt")
    (tmp_path / "model.onnx").write_bytes(bare_onnx.read_bytes())
    with pytest.raises(ValueError, match=r"is not a hub-vit model folder \(expected config\.json and "
                                         r"model\.safetensors in it; .*\); it holds an exported file, which "
                                         r"`hub-vit serve` and `hub-vit repository` take: '.*model\.onnx'"):
        locate(tmp_path)
    (tmp_path / "broken.onnx").write_bytes(b"\x08garbage")
    with pytest.raises(ValueError, match=r"broken\.onnx' is not a valid ONNX model \(truncated or corrupt\?\)"):
        resolve_model(tmp_path / "broken.onnx")


def test_a_folder_of_sharded_weights_says_how_to_save_it_whole(tmp_path: Path) -> None:
    # was: "not a hub-vit model folder (expected config.json and model.safetensors in it)" for a folder transformers'
    # save_pretrained had just written, its weights split into shards
    from transformers import AutoModelForImageClassification  # hub_vit, imported above, registers its model type

    model = AutoModelForImageClassification.from_pretrained(default_model_folder())
    model.save_pretrained(tmp_path / "sharded", max_shard_size="300KB")
    with pytest.raises(ValueError, match=r"is not a hub-vit model folder .*; its weights are split into [2-9] shards, "
                                         r"as save_pretrained writes them past its max_shard_size: save the model "
                                         r'again in one file, save_pretrained\(FOLDER, max_shard_size="50GB"\)'):
        locate(tmp_path / "sharded")
    model.save_pretrained(tmp_path / "whole", max_shard_size="50GB")  # the advice, followed
    assert resolve_model(tmp_path / "whole").kind == "folder"


def test_no_download_accepts_only_cached_checkpoints(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"the checkpoint of simplevit_s16\.i1k_90ep is not in hub-vit's download "
                                         r"cache \(expected at .*cache.*\) and is never downloaded from here"):
        locate("simplevit_s16.i1k_90ep", download=False)
    assert locate("simplevit_s16.i1k_90ep").kind == "registered"  # downloading allowed: checked on loading only
    assert locate("simplevit_digits", download=False).folder == default_model_folder().resolve()  # shipped


def test_a_module_is_not_taken_for_a_path():
    for call in (locate, resolve_model):
        with pytest.raises(TypeError, match="a model reference is a name or a path, not a Linear; an in-memory model "
                                            "goes through ResolvedModel.from_module"):
            call(torch.nn.Linear(2, 2))
