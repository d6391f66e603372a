"""The hub-vit model folder: one weight file + one config that timm, transformers (local and remote code) all load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForImageClassification, ViTForImageClassification, pipeline

import hub_vit  # noqa: F401  (registers timm models and the transformers Auto classes)
from hub_vit.folder import ModelFolderInfo, check_output_folder, load_model_folder, save_model_folder
from hub_vit.hf import HubViTForImageClassification, HubViTModel
from hub_vit.hf.remote_code import BUNDLE
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

LABELS = ["tabby", "astronaut", "mug"]
SIMPLE = ViTSpec.from_variant("mu/16", posemb="sincos2d", pool_type="gap", rep_size=True, img_size=64, num_classes=3,
                              head_zeroinit=False)
CLASSIC = ViTSpec.from_variant("mu/16", posemb="learn", pool_type="tok", posemb_on_cls=True, img_size=64,
                               num_classes=3, head_zeroinit=False)


def _model(spec: ViTSpec) -> VisionTransformer:
    model = VisionTransformer(spec).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _pixels(spec: ViTSpec) -> torch.Tensor:
    return torch.rand(2, 3, *spec.img_size) * 2 - 1


def _copy(folder: Path, to: Path, leave_out: str | None = None) -> Path:
    """A copy of the model folder `folder` at `to` (less the file `leave_out`), for a test to damage one file of."""
    return Path(shutil.copytree(folder, to, ignore=shutil.ignore_patterns(leave_out) if leave_out else None))


def _edit_config(folder: Path, edit: Callable[[dict], None]) -> None:
    """`folder`'s config.json, changed in place by `edit`."""
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.fixture(scope="module")
def simple_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[VisionTransformer, Path]:
    torch.manual_seed(1)
    model = _model(SIMPLE)
    folder = save_model_folder(
        model, tmp_path_factory.mktemp("simple") / "simplevit-mu16", labels=LABELS,
        pretrained_cfg=dict(crop_pct=0.9, interpolation="bicubic", license="apache-2.0"),
        extra_files={"conversion.json": {"max_abs_diff": 0.0}, "README.md": "# card\n"},
    )
    return model, folder


def test_folder_layout_and_config_serving_both_front_doors(simple_folder) -> None:
    model, folder = simple_folder
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "preprocessor_config.json", "labels.txt", "conversion.json",
            "README.md", *BUNDLE.values()} == names
    assert set(load_file(folder / "model.safetensors")) == set(model.state_dict())  # timm keys, no prefix
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "hub_vit" and config["architectures"] == ["HubViTForImageClassification"]
    assert config["auto_map"]["AutoModelForImageClassification"] == "modeling_hub_vit.HubViTForImageClassification"
    assert config["id2label"] == {str(i): name for i, name in enumerate(LABELS)}
    assert config["architecture"] == "hub_vit" and config["num_classes"] == 3 and config["label_names"] == LABELS
    assert ViTSpec.from_dict(config["model_args"]) == SIMPLE
    pcfg = config["pretrained_cfg"]
    assert pcfg["input_size"] == [3, 64, 64] and pcfg["crop_pct"] == 0.9 and pcfg["interpolation"] == "bicubic"
    assert (folder / "labels.txt").read_text().splitlines() == LABELS
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    # found through config.json (registered class / its auto_map), see image_processing_hub_vit.processor_config
    assert "image_processor_type" not in processor and "auto_map" not in processor and processor["crop_pct"] == 0.9
    assert config["auto_map"]["AutoImageProcessor"] == "image_processing_hub_vit.HubViTImageProcessor"
    assert oct(folder.stat().st_mode & 0o777) == "0o755"


def test_a_transformers_model_is_refused_with_the_way_to_save_it(tmp_path) -> None:
    model = HubViTForImageClassification.from_vit(_model(SIMPLE))
    with pytest.raises(TypeError, match="save_model_folder expects a hub_vit VisionTransformer, got "
                                        "HubViTForImageClassification; a transformers HubViT model writes the same "
                                        "folder with its own save_pretrained"):
        save_model_folder(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_load_model_folder_round_trip_is_exact(simple_folder) -> None:
    model, folder = simple_folder
    loaded, info = load_model_folder(folder)
    assert isinstance(info, ModelFolderInfo) and info.spec == SIMPLE and info.labels == LABELS
    assert info.pretrained_cfg["crop_pct"] == 0.9 and info.architecture == "hub_vit"
    assert sorted(info.files) == ["README.md", "conversion.json"]
    assert info.read_json("conversion.json") == {"max_abs_diff": 0.0}
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert not loaded.training


def test_timm_local_dir_and_transformers_load_the_same_weights(simple_folder) -> None:
    model, folder = simple_folder
    x = _pixels(SIMPLE)
    timm_model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    hf = AutoModelForImageClassification.from_pretrained(folder).eval()
    base = AutoModel.from_pretrained(folder).eval()
    assert isinstance(hf, HubViTForImageClassification) and isinstance(base, HubViTModel)
    with torch.no_grad():
        expected = model(x)
        assert torch.equal(timm_model(x), expected)
        assert torch.equal(hf(x).logits, expected)
        torch.testing.assert_close(base(x).pooler_output, model.forward_head(model.forward_features(x), True))
    data_cfg = timm.data.resolve_data_config(model=timm_model)
    assert data_cfg["crop_pct"] == 0.9 and data_cfg["interpolation"] == "bicubic"
    assert tuple(data_cfg["mean"]) == tuple(data_cfg["std"]) == (0.5,) * 3
    assert timm_model.pretrained_cfg["label_names"] == LABELS


def test_in_chans_adapts_a_generic_architecture_folder_as_timm_adapts_its_own(simple_folder, caplog) -> None:
    # was: a folder whose architecture is the generic `hub_vit` built a 3-channel model for in_chans=1, without a word
    model, folder = simple_folder
    grey = timm.create_model(f"local-dir:{folder}", pretrained=True, in_chans=1).eval()
    x = _pixels(SIMPLE)[:, :1]
    with torch.no_grad():  # the RGB filters summed: a grey image gives the RGB model's output for it on 3 channels
        torch.testing.assert_close(grey(x), model(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=0)
    assert "already match" not in caplog.text  # timm's notice for filters adapted before it saw them
    assert timm.create_model("hub_vit", variant="mu/16", in_chans=4).patch_embed.proj.in_channels == 4


def test_a_model_written_back_keeps_its_data_config_and_labels(simple_folder, tmp_path) -> None:
    # was: save_model_folder(model) wrote hub-vit's default data config (crop_pct 0.875, bilinear) over the model's own
    # and LABEL_i names, so reloading and saving a model changed its preprocessing without a word
    _, folder = simple_folder
    loaded, _ = load_model_folder(folder)
    built = timm.create_model(f"local-dir:{folder}", pretrained=True)
    for name, model in (("loaded", loaded), ("built", built)):
        _, info = load_model_folder(save_model_folder(model, tmp_path / name))
        assert info.pretrained_cfg["crop_pct"] == 0.9 and info.pretrained_cfg["interpolation"] == "bicubic", name
        assert info.labels == LABELS, name
    assert timm.data.resolve_data_config(model=loaded)["crop_pct"] == 0.9  # as for the model timm built


def test_registered_architecture_name_is_used_and_loads(tmp_path) -> None:
    spec = hub_vit.MODELS["vit_ti16"].spec.replace(img_size=32, num_classes=2, head_zeroinit=False)
    model = _model(spec)
    folder = save_model_folder(model, tmp_path / "ti")
    assert json.loads((folder / "config.json").read_text())["architecture"] == "vit_ti16"
    timm_model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    x = _pixels(spec)
    with torch.no_grad():
        assert torch.equal(timm_model(x), model(x))
    with pytest.raises(ValueError, match="does not describe this model"):
        save_model_folder(model, tmp_path / "wrong", architecture="simplevit_ti16")
    assert not (tmp_path / "wrong").exists()


_REMOTE_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import torch
    assert importlib.util.find_spec("hub_vit") is None, "hub_vit must not be importable here"
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline
    folder, pixels, out = sys.argv[1:4]
    model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
    processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=True)
    with torch.no_grad():
        logits = model(torch.load(pixels)).logits
    photo = Image.open(sys.argv[4])
    top = pipeline("image-classification", model=folder, trust_remote_code=True)(photo, top_k=1)[0]
    model.save_pretrained(sys.argv[5])  # the model alone, by the bundled classes: its processor must come along
    resaved = AutoImageProcessor.from_pretrained(sys.argv[5], trust_remote_code=True)
    torch.save({"logits": logits, "module": type(model).__module__, "processor": type(processor).__name__,
                "photo_pixels": processor(photo, return_tensors="pt").pixel_values, "top": top,
                "resaved_pixels": resaved(photo, return_tensors="pt").pixel_values,
                "hub_vit_loaded": [m for m in sys.modules if m.startswith("hub_vit")],
                "new_config_architecture": type(model.config)().to_dict()["architecture"],
                "resaved_architecture": json.loads(open(sys.argv[5] + "/config.json").read())["architecture"]}, out)
""")


def test_trust_remote_code_without_hub_vit(simple_folder, tmp_path, photos) -> None:
    """A fresh interpreter that cannot import hub_vit: no site .pth (so no editable finder), cwd outside the repo."""
    model, folder = simple_folder
    x = _pixels(SIMPLE)
    torch.save(x, tmp_path / "x.pt")
    Image.fromarray(photos["chelsea"]).save(tmp_path / "chelsea.png")
    (tmp_path / "remote.py").write_text(_REMOTE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_", "TRANSFORMERS_"))}
    env.update(PYTHONPATH=sysconfig.get_paths()["purelib"], HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-S", str(tmp_path / "remote.py"), str(folder), str(tmp_path / "x.pt"),
         str(tmp_path / "out.pt"), str(tmp_path / "chelsea.png"), str(tmp_path / "resaved")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    assert out["module"].startswith("transformers_modules.") and out["hub_vit_loaded"] == []
    assert out["processor"] == "HubViTImageProcessor"
    # the catalog of registered names is not bundled: a config the remote code creates names timm's generic entry
    # point (it builds any spec); a saved config keeps the name it was saved with
    assert out["new_config_architecture"] == "hub_vit"
    assert out["resaved_architecture"] == json.loads((folder / "config.json").read_text())["architecture"]
    with torch.no_grad():
        assert torch.equal(out["logits"], model(x))
        photo_logits = model(out["photo_pixels"]).softmax(-1)[0]
    assert out["top"]["label"] == LABELS[int(photo_logits.argmax())]
    from hub_vit.hf import HubViTImageProcessor

    local = HubViTImageProcessor.from_pretrained(folder)(photos["chelsea"], return_tensors="pt").pixel_values
    assert torch.equal(local, out["photo_pixels"])
    assert torch.equal(local, out["resaved_pixels"])


def test_native_vit_folder_for_classic_vit(tmp_path, photos) -> None:
    model = _model(CLASSIC)
    folder = save_model_folder(model, tmp_path / "vit", labels=LABELS, native_vit=True)
    native = ViTForImageClassification.from_pretrained(folder / "native").eval()
    assert native.config.hidden_act == "gelu_pytorch_tanh" and native.config.layer_norm_eps == 1e-6
    assert native.config.qkv_bias and native.config.id2label[1] == "astronaut"
    x = _pixels(CLASSIC)
    with torch.no_grad():
        assert (native(x).logits - model(x)).abs().max() <= 1e-5
    # the native folder needs no custom code at all, processor included
    result = pipeline("image-classification", model=str(folder / "native"))(Image.fromarray(photos["astronaut"]))
    assert {r["label"] for r in result} <= set(LABELS)


def test_native_vit_refused_for_simplevit_before_writing(tmp_path) -> None:
    with pytest.raises(ValueError, match="pool_type='gap'"):
        save_model_folder(_model(SIMPLE), tmp_path / "simple", native_vit=True)
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_model_folders_only(tmp_path, monkeypatch) -> None:
    # `hub-vit convert ckpt.npz -o FOLDER --overwrite` used to delete FOLDER with whatever it held, the checkpoint
    # being converted included
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("important")
    with pytest.raises(FileExistsError, match=r"not a hub-vit model folder .* choose another output folder"):
        save_model_folder(_model(SIMPLE), work, overwrite=True)
    assert (work / "notes.txt").read_text() == "important"
    model_dir = save_model_folder(_model(SIMPLE), tmp_path / "m")
    (model_dir / "ckpt.npz").write_bytes(b"weights")
    with pytest.raises(FileExistsError, match=r"holds .*ckpt\.npz, which replacing it would delete"):
        check_output_folder(model_dir, True, keep=[model_dir / "ckpt.npz"])
    monkeypatch.chdir(model_dir)
    with pytest.raises(FileExistsError, match="current directory"):
        save_model_folder(_model(SIMPLE), ".", overwrite=True)
    (tmp_path / "afile").write_text("")
    for blocked in (tmp_path / "afile", tmp_path / "afile" / "m"):
        with pytest.raises(NotADirectoryError, match="is a file"):
            save_model_folder(_model(SIMPLE), blocked, overwrite=True)
    (tmp_path / "empty").mkdir()
    save_model_folder(_model(SIMPLE), tmp_path / "empty", overwrite=True)  # an empty folder is fine


def test_failed_save_leaves_nothing(tmp_path) -> None:
    with pytest.raises(TypeError, match="content must be"):  # fails after the weights are already written
        save_model_folder(_model(SIMPLE), tmp_path / "m", extra_files={"notes.txt": 42})
    assert list(tmp_path.iterdir()) == []


def test_overwrite_is_all_or_nothing(tmp_path) -> None:
    first = save_model_folder(_model(SIMPLE), tmp_path / "m", labels=LABELS)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_model_folder(_model(SIMPLE), first)
    with pytest.raises(TypeError):
        save_model_folder(_model(SIMPLE), first, overwrite=True, extra_files={"bad.json": object()})
    assert (first / "labels.txt").read_text().splitlines() == LABELS and _leftovers(tmp_path) == []
    replacement = _model(SIMPLE)
    save_model_folder(replacement, first, overwrite=True, labels=["a", "b", "c"])
    loaded, info = load_model_folder(first)
    assert info.labels == ["a", "b", "c"] and torch.equal(loaded.head.weight, replacement.head.weight)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize(("kwargs", "error", "needle"), [
    (dict(labels=["a", "b"]), ValueError, "got 2 labels for a model with num_classes=3"),
    (dict(labels=["a", "a", "b"]), ValueError, "unique"),
    (dict(labels=["a", "b\nc", "d"]), ValueError, "single-line"),
    (dict(architecture="resnet50"), ValueError, "unknown architecture 'resnet50'; valid: 'hub_vit'"),
    (dict(extra_files={"config.json": "{}"}), ValueError, "reserved names"),
    (dict(extra_files={"../escape.txt": "x"}), ValueError, "relative path inside the folder"),
])
def test_bad_save_arguments(tmp_path, kwargs: dict, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        save_model_folder(_model(SIMPLE), tmp_path / "m", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_bad_folders_on_load(tmp_path, simple_folder) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        load_model_folder(tmp_path / "empty")
    native = save_model_folder(_model(CLASSIC), tmp_path / "vit", native_vit=True) / "native"
    with pytest.raises(ValueError, match="model_type 'vit', expected 'hub_vit'"):
        load_model_folder(native)
    _, folder = simple_folder
    broken = _copy(folder, tmp_path / "broken")
    (broken / "labels.txt").write_text("x\ny\n")
    with pytest.raises(ValueError, match="disagrees with config.json id2label: 2 lines against 3 entries"):
        load_model_folder(broken)
    labels = (folder / "labels.txt").read_text().splitlines()
    (broken / "labels.txt").write_text("\n".join([*labels[:2], "renamed", *labels[3:]]) + "\n")
    renamed = f"class 2 is 'renamed' in labels.txt, '{labels[2]}' in id2label"
    with pytest.raises(ValueError, match=renamed):
        load_model_folder(broken)
    # the other front doors and the publishing path refuse the same folder (were: loaded with id2label's names, and
    # `hub-vit push` would have uploaded it)
    from hub_vit.model_cards.facts import ModelFolderError
    from hub_vit.publish import validate_folder

    with pytest.raises(ValueError, match=renamed):
        timm.create_model(f"local-dir:{broken}", pretrained=True)
    with pytest.raises(ValueError, match=renamed):
        AutoModelForImageClassification.from_pretrained(broken)
    with pytest.raises(ModelFolderError, match=renamed):
        validate_folder(broken)


def test_timm_local_dir_without_its_weights_file_names_it(tmp_path, simple_folder) -> None:
    # was: timm's fallback loaded the folder's first other *.safetensors (the out-of-domain statistics) as the weights
    _, folder = simple_folder
    partial = _copy(folder, tmp_path / "partial", leave_out="model.safetensors")
    (partial / "domain.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"not a hub-vit model folder: model.safetensors is missing"):
        timm.create_model(f"local-dir:{partial}", pretrained=True)


def test_headless_model_folder(tmp_path) -> None:
    model = _model(SIMPLE.replace(num_classes=0))
    folder = save_model_folder(model, tmp_path / "features")
    assert not (folder / "labels.txt").exists()
    base = AutoModel.from_pretrained(folder).eval()
    x = _pixels(SIMPLE)
    with torch.no_grad():
        torch.testing.assert_close(base(x).pooler_output, model(x))
    loaded, info = load_model_folder(folder)
    assert info.labels == [] and loaded.spec.num_classes == 0
    assert np.isfinite(loaded(x).detach().numpy()).all()
    with pytest.raises(ValueError, match="use HubViTForImageClassification"):
        HubViTModel.from_vit(_model(SIMPLE))


def test_backbone_saved_from_a_classifier_folder_is_headless_everywhere(simple_folder, tmp_path) -> None:
    model, folder = simple_folder
    base = AutoModel.from_pretrained(folder)
    # transformers' contract (its ViTModel too): the backbone's config keeps the labels, its module has no head
    assert base.config.num_labels == model.num_classes and base.vit.num_classes == 0
    base.save_pretrained(tmp_path / "backbone")
    saved = json.loads((tmp_path / "backbone" / "config.json").read_text())
    assert saved["num_classes"] == saved["model_args"]["num_classes"] == 0  # timm's view: the file has no head
    assert len(saved["id2label"]) == model.num_classes
    timm_model = timm.create_model(f"local-dir:{tmp_path / 'backbone'}", pretrained=True).eval()
    x = _pixels(SIMPLE)
    with torch.no_grad():
        torch.testing.assert_close(timm_model(x), model.forward_head(model.forward_features(x), pre_logits=True))


def test_hf_hub_layout_loads_through_timm(simple_folder, monkeypatch) -> None:
    """timm's `hf-hub:` path reads the same config.json and model.safetensors (the hub download is faked offline)."""
    import timm.models._hub as timm_hub

    model, folder = simple_folder

    def fake_download(repo_id: str, filename: str, *args, **kwargs) -> str:
        assert repo_id == "hub-vit/simplevit-mu16"
        path = folder / filename
        if not path.is_file():
            from huggingface_hub.errors import EntryNotFoundError

            raise EntryNotFoundError(f"{filename} not in the fake repo")
        return str(path)

    monkeypatch.setattr(timm_hub, "hf_hub_download", fake_download)
    timm_model = timm.create_model("hf-hub:hub-vit/simplevit-mu16", pretrained=True).eval()
    x = _pixels(SIMPLE)
    with torch.no_grad():
        assert torch.equal(timm_model(x), model(x))
    assert timm_model.pretrained_cfg["hf_hub_id"] == "hub-vit/simplevit-mu16"


def test_remote_code_is_generated_from_the_package(tmp_path, monkeypatch) -> None:
    import importlib
    import inspect

    from hub_vit.hf.remote_code import bundle_source

    model_src = inspect.getsource(importlib.import_module("hub_vit.model"))
    bundled = bundle_source("hub_vit.model")
    assert "from hub_vit" not in bundled and "from .hub_vit_layers import Block" in bundled
    def code(text: str) -> list[str]:  # everything but the import lines
        return [line for line in text.splitlines() if "import" not in line.lower()]

    assert code(bundled) == code(model_src)  # one model definition: the bundle is the package's own code
    # a lazily imported, unbundled hub_vit module becomes a clear ImportError; a module-level one refuses to bundle
    (tmp_path / "lazy_mod.py").write_text("def f():\n    from hub_vit.cli import app\n    return app\n")
    (tmp_path / "eager_mod.py").write_text("from hub_vit.cli import app\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "raise ImportError('hub_vit.cli is not bundled" in bundle_source("lazy_mod")
    with pytest.raises(ValueError, match="imports \\['hub_vit.cli'\\] at module level"):
        bundle_source("eager_mod")


def test_shipped_folders_remote_code_is_current() -> None:
    """The shipped default model's folder carries generated copies of bundled package modules (transformers remote
    code). After a change to one of them the copies must be regenerated (`write_remote_code(folder)`); otherwise
    users loading the folder without hub_vit run old code. Two copies had drifted before this test existed."""
    from hub_vit.catalog import default_model_folder
    from hub_vit.hf.remote_code import bundle_source

    folder = default_model_folder()
    for module, file_name in BUNDLE.items():
        committed = (folder / file_name).read_text(encoding="utf-8").split("\n", 2)[2]  # after the 2-line header
        assert committed == bundle_source(module), f"stale {file_name}: run write_remote_code({str(folder)!r})"
    bundled = set(BUNDLE.values())
    generated = {p.name for p in folder.glob("*.py") if p.read_text(encoding="utf-8").startswith("# Generated by")}
    assert generated == bundled, f"generated files outside the bundle: {sorted(generated - bundled)}: delete them"


def test_remote_code_bundle_is_what_a_model_folder_needs(simple_folder) -> None:
    """The bundle is the transformers classes and the model core they import: not the catalog of Google's
    checkpoints (names, URLs, published results), which a folder holding its own weights never reads."""
    from hub_vit.hf.remote_code import bundle_source

    assert "hub_vit.catalog" not in BUNDLE
    for module in BUNDLE:
        source = bundle_source(module)
        assert "storage.googleapis.com" not in source and "gs://" not in source, module
    written = {p.name for p in simple_folder[1].glob("*.py")}
    assert written == set(BUNDLE.values())


def test_pipeline_never_asks_to_run_remote_code(monkeypatch) -> None:
    """With hub_vit installed, `pipeline()` on a model folder must not stop at transformers' interactive
    "run the custom code? [y/N]" prompt (its AutoVideoProcessor probe used to trigger it)."""
    import builtins

    from transformers import pipeline

    from hub_vit.catalog import default_model_folder

    def no_prompt(*args, **kwargs):
        raise AssertionError(f"transformers asked interactively: {args}")

    monkeypatch.setattr(builtins, "input", no_prompt)
    folder = default_model_folder()
    result = pipeline("image-classification", model=str(folder))(str(folder / "samples" / "7_0.png"))
    assert result[0]["label"] == "7"


def test_the_shipped_model_built_by_name_saves_its_class_names(tmp_path) -> None:
    # was: LABEL_0 ... LABEL_9 (its pretrained_cfg had no label_names), where local-dir: kept '0' ... '9'
    import timm

    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder, save_model_folder

    save_model_folder(timm.create_model("simplevit_digits", pretrained=True), tmp_path / "digits")
    shipped = (default_model_folder() / "labels.txt").read_text().split()
    assert load_model_folder(tmp_path / "digits")[1].labels == shipped == [str(d) for d in range(10)]


@pytest.mark.parametrize(("cfg", "said"), [
    ({"crop_pctt": 0.9}, "pretrained_cfg key 'crop_pctt' is not a timm pretrained_cfg field; did you mean 'crop_pct'?"),
    ({"mean": [0.5] * 4}, "pretrained_cfg mean must be one number or 3 (one per input channel), got [0.5, 0.5, 0.5, "),
    ({"std": "x"}, "pretrained_cfg std must be one number or 3 (one per input channel), got 'x'"),
    ({"interpolation": "cubic"}, "pretrained_cfg: unknown interpolation 'cubic'; valid choices: bilinear"),
])
def test_a_pretrained_cfg_the_folder_s_readers_would_misread_is_refused(tmp_path, cfg, said) -> None:
    # was: written as given: a misspelt key lost the setting, a 4-value mean broke timm's transform on the folder,
    # "could not convert string to float: 'x'" named no field
    import timm

    from hub_vit.folder import save_model_folder

    model = timm.create_model("simplevit_digits", pretrained=True)
    with pytest.raises(ValueError) as caught:
        save_model_folder(model, tmp_path / "out", pretrained_cfg=cfg)
    assert said in str(caught.value) and not (tmp_path / "out").exists()


def test_a_config_field_of_the_wrong_type_is_a_value_error_naming_the_field(tmp_path, simple_folder) -> None:
    # was huggingface_hub's StrictDataclassFieldValidationError (no ValueError): a traceback from `hub-vit
    # calibrate-domain`, and "cannot load model" from the CLI with the exception's class name
    from hub_vit.domain_fit import plan_calibration

    _, folder = simple_folder
    typed = _copy(folder, tmp_path / "typed")
    _edit_config(typed, lambda config: config.update(width=str(config["width"])))
    said = r"invalid HubViTConfig: Validation error for field 'width': TypeError: Field 'width' expected int, got str"
    with pytest.raises(ValueError, match=f"{typed / 'config.json'}: {said}"):
        load_model_folder(typed)
    with pytest.raises(ValueError, match=said):
        AutoModelForImageClassification.from_pretrained(typed)
    with pytest.raises(ValueError, match=f"{typed / 'config.json'}: {said}"):  # before any image is read
        plan_calibration(typed, tmp_path / "no-images")


def test_a_config_nested_too_deep_for_the_parser_is_refused_as_unreadable_json(tmp_path, simple_folder) -> None:
    # was RecursionError: a traceback from `hub-vit rollout`, exit 1 from `hub-vit repository`
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from hub_vit.model_cards.facts import ModelFolderError, read_folder

    _, folder = simple_folder
    deep = _copy(folder, tmp_path / "deep")
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="config.json' is not readable JSON"):
        load_model_folder(deep)
    with pytest.raises(ModelFolderError, match="config.json is not valid JSON"):
        read_folder(deep)
    image = tmp_path / "x.png"
    Image.new("RGB", (32, 32)).save(image)
    _load_commands()
    for args in (["rollout", "--model", str(deep), str(image), "-o", str(tmp_path / "out")],
                 ["repository", str(tmp_path / "repo"), "--model", str(deep)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "is not readable JSON" in " ".join(result.output.split()), result.output
        assert not isinstance(result.exception, RecursionError)


@pytest.mark.parametrize(("cfg", "said"), [
    ({"mean": "x"}, "pretrained_cfg mean must be a number or a list of numbers, got 'x'"),
    ({"input_size": [3, -1, 32]}, r"pretrained_cfg input_size must be \(channels, height, width\), positive integers, "
                                  r"got \[3, -1, 32\]"),
    ({"crop_pct": "0.9"}, "pretrained_cfg crop_pct must be a number, got '0.9'"),
])
def test_a_saved_pretrained_cfg_that_is_no_data_config_is_refused_on_load_naming_the_field(
        tmp_path, simple_folder, cfg, said) -> None:
    # was accepted by every loader; the first image then failed with "could not convert string to float: 'x'"
    # (naming no file or field), or timm's transform with "new(): invalid data type 'str'"
    _, folder = simple_folder
    edited = _copy(folder, tmp_path / "edited")
    _edit_config(edited, lambda config: config["pretrained_cfg"].update(cfg))
    with pytest.raises(ValueError, match=f"{edited / 'config.json'}: .*{said}"):
        load_model_folder(edited)
    with pytest.raises(ValueError, match=said):
        AutoModelForImageClassification.from_pretrained(edited)


def test_model_args_that_describe_another_model_than_the_fields_are_refused_by_every_loader(tmp_path,
                                                                                            simple_folder) -> None:
    # was: timm (which builds from model_args) refused an edited num_classes, hub-vit and transformers (which build
    # from the fields) loaded the folder as the other model
    _, folder = simple_folder
    edited = _copy(folder, tmp_path / "edited")
    classes = json.loads((folder / "config.json").read_text())["model_args"]["num_classes"]

    def one_class_more(config: dict) -> None:
        config["num_classes"] = config["model_args"]["num_classes"] = classes + 1

    _edit_config(edited, one_class_more)
    said = f"describe different models: num_classes: {classes + 1} in model_args, {classes} in the fields"
    with pytest.raises(ValueError, match=said):
        load_model_folder(edited)
    with pytest.raises(ValueError, match=said):
        AutoModelForImageClassification.from_pretrained(edited)
    with pytest.raises(ValueError):  # timm's own refusal: the weights' head is not model_args' size
        timm.create_model(f"local-dir:{edited}", pretrained=True)
