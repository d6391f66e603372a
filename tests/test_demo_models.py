"""Which models the demo and `hub-vit rollout` offer, how they load them, and what a model that cannot be shown says.

Registered checkpoints: offered exactly when `timm.create_model(name.tag, pretrained=True)` can load them offline,
i.e. when hub-vit's own download cache (`$HUB_VIT_CACHE`) holds the file, and loaded from there without a network.
The checkpoint is random weights in the exact layout of Google's SimpleViT-S/16 (as tests/test_card_evidence.py
builds it). Model folders are real folders (`save_model_folder`), a damaged one truncated on disk.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from hub_vit.demo.models import (
    DEFAULT_KEY,
    ModelCache,
    ModelLoadError,
    discover_choices,
    folder_choice,
    load_explainer,
    resolve_choice,
    served_choice,
)
from hub_vit.resolve import checkpoint_path
from tests.test_card_evidence import write_namesake

REGISTERED = "simplevit_s16.i1k_300ep"


def _cli():
    import hub_vit.cli.explain  # noqa: F401  (registers rollout / demo)
    import hub_vit.cli.serve  # noqa: F401
    from hub_vit.cli.app import app

    return app


@pytest.fixture(scope="module")
def namesake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights in the published SimpleViT-S/16 npz's exact layout, under its file name."""
    return write_namesake(tmp_path_factory.mktemp("namesake") / "vit_s16_i1k_300ep.npz")


@pytest.fixture()
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Empty hub-vit and torch-hub caches, offline."""
    paths = {"hub_vit": tmp_path / "hub_vit_cache", "torch": tmp_path / "torch_home"}
    monkeypatch.setenv("HUB_VIT_CACHE", str(paths["hub_vit"]))
    monkeypatch.setenv("TORCH_HOME", str(paths["torch"]))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    return paths


def _place(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
    return target


def _folder(out: Path, *, depth: int = 2, num_classes: int = 3, seed: int = 0) -> Path:
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.folder import save_model_folder

    torch.manual_seed(seed)
    spec = ViTSpec.from_variant("mu/16", img_size=32, num_classes=num_classes, depth=depth, pool_type="gap",
                                head_zeroinit=False)
    labels = ["red", "green", "blue"][:num_classes] if num_classes else None
    return save_model_folder(VisionTransformer(spec), out, labels=labels)


def test_a_checkpoint_timm_loads_offline_is_offered_and_loaded_from_hub_vits_cache(namesake: Path, caches, tmp_path,
                                                                                  photos) -> None:
    # was: looked in torch.hub's checkpoints/ folder, where hub-vit never downloads to
    import timm

    import hub_vit.timm_plugin  # noqa: F401

    cached = _place(namesake, checkpoint_path(*REGISTERED.split(".")))
    assert str(cached).startswith(str(caches["hub_vit"]))
    reference = timm.create_model(REGISTERED, pretrained=True).eval()  # offline: the cache is all there is
    assert REGISTERED in [c.key for c in discover_choices()]
    explainer = load_explainer(resolve_choice(REGISTERED))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(explainer.model(x), reference(x))
    # `hub-vit rollout --model name.tag` takes it too (it used to say "download it once with timm.create_model")
    photo = tmp_path / "cat.png"
    Image.fromarray(photos["chelsea"]).save(photo)
    result = CliRunner().invoke(_cli(), ["rollout", str(photo), "-o", str(tmp_path / "out"), "--model", REGISTERED])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "cat_rollout.png").is_file()


def test_a_checkpoint_only_in_torch_hubs_folder_is_not_offered(namesake: Path, caches) -> None:
    # timm.create_model(..., pretrained=True) cannot load it from there (hub-vit fetches through its own cache)
    _place(namesake, caches["torch"] / "hub" / "checkpoints" / namesake.name)
    assert [c.key for c in discover_choices() if c.kind == "registered"] == []
    with pytest.raises(ValueError) as info:
        resolve_choice(REGISTERED)
    message = str(info.value)
    assert str(checkpoint_path(*REGISTERED.split("."))) in message  # where to put it, so the advice is not a circle
    assert "HUB_VIT_CACHE" in message and "curl" in message


def test_the_demo_never_downloads(namesake: Path, caches, monkeypatch: pytest.MonkeyPatch) -> None:
    # Listed at start-up, deleted before it was picked: an error naming the cache, not a download in a page request
    # (online too: HUB_VIT_OFFLINE is unset here, and any download attempt fails the test).
    from hub_vit.conversion import download

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the demo tried to download: {args}")

    monkeypatch.delenv("HUB_VIT_OFFLINE")
    monkeypatch.setattr(download, "_fetch", no_network)
    cached = _place(namesake, checkpoint_path(*REGISTERED.split(".")))
    cache = ModelCache(discover_choices())
    cached.unlink()
    with pytest.raises(ModelLoadError, match=r"no longer in hub-vit's download cache"):
        cache.get(REGISTERED)


def test_a_folder_without_a_classifier_head_is_refused_at_start_up(tmp_path: Path) -> None:
    # was: accepted, then IndexError in top_k and a bare red "Error" on every output when picked
    folder = _folder(tmp_path / "no_head", num_classes=0)
    with pytest.raises(ValueError, match=r"no classifier head \(num_classes=0\)"):
        folder_choice(folder)
    runner = CliRunner()
    result = runner.invoke(_cli(), ["demo", "--model-folder", str(folder), "--port", "1"])
    assert result.exit_code == 2 and "no classifier head" in " ".join(result.output.split()), result.output
    result = runner.invoke(_cli(), ["rollout", str(tmp_path / "x.png"), "-o", str(tmp_path / "o"), "--model",
                                    str(folder)])
    assert result.exit_code == 2 and "no classifier head" in " ".join(result.output.split()), result.output


def test_a_transformers_folder_is_refused_at_start_up(tmp_path: Path) -> None:
    # was: offered in the page ("folder: vit"), then "config.json has model_type 'vit'" when picked
    from transformers import ViTConfig, ViTForImageClassification

    folder = tmp_path / "vit"
    ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, image_size=32, patch_size=16)).save_pretrained(folder)
    with pytest.raises(ValueError, match=r"has model_type 'vit', expected 'hub_vit' \(is this a hub-vit model"):
        folder_choice(folder)
    result = CliRunner().invoke(_cli(), ["demo", "--model-folder", str(folder), "--port", "1"])
    assert result.exit_code == 2 and "model_type 'vit'" in " ".join(result.output.split()), result.output


def test_a_damaged_model_names_itself_and_the_reason(tmp_path: Path, photos) -> None:
    folder = _folder(tmp_path / "corrupt")
    weights = folder / "model.safetensors"
    intact = weights.read_bytes()
    weights.write_bytes(intact[:1000])  # truncated on disk; config.json still fine
    # refused at start-up by its header, as rollout refuses it (was: accepted, then failed on the first click)
    with pytest.raises(ValueError, match=r"model.safetensors' is not a safetensors file .*; truncated or corrupt"):
        folder_choice(folder)
    result = CliRunner().invoke(_cli(), ["demo", "--model-folder", str(folder), "--port", "1"])
    assert result.exit_code == 2 and "is not a safetensors file" in result.output, result.output
    weights.write_bytes(intact)
    choice = folder_choice(folder)
    weights.write_bytes(intact[:1000])  # damaged after start-up: named when it is loaded
    with pytest.raises(ModelLoadError) as info:
        ModelCache([choice]).get(choice.key)
    assert "'folder: corrupt'" in str(info.value) and "is not a safetensors file" in str(info.value)
    photo = tmp_path / "cat.png"
    Image.fromarray(photos["chelsea"]).save(photo)
    result = CliRunner().invoke(_cli(), ["rollout", str(photo), "-o", str(tmp_path / "o"), "--model", str(folder)])
    assert result.exit_code == 2 and "is not a safetensors file" in result.output, result.output  # was a traceback


def test_a_model_that_fails_to_load_clears_the_page(tmp_path: Path, photos) -> None:
    import gradio as gr

    from hub_vit.demo.app import Demo
    from hub_vit.demo.backends import IN_PROCESS

    good = _folder(tmp_path / "good")
    bad = _folder(tmp_path / "bad")
    demo = Demo(cache=ModelCache([folder_choice(good), folder_choice(bad)]), examples=[])
    (bad / "model.safetensors").write_bytes(b"\0" * 10)  # damaged after start-up
    photo = tmp_path / "cat.png"
    Image.fromarray(photos["chelsea"]).save(photo)
    labels, *_ = demo.analyze(str(photo), "folder: good", IN_PROCESS, "mean", 0.0, 2, None)
    assert labels
    with pytest.warns(UserWarning, match="cannot load model 'folder: bad'"):  # the toast (no Gradio queue here)
        labels, overlay, layer_view, target, class_map, status, _ = demo.analyze_new_model(
            str(photo), "folder: bad", IN_PROCESS, "mean", 0.0, 2, "red")
    assert labels is None and overlay is None and layer_view is None and class_map is None  # nothing stale left
    assert target == gr.update(choices=[], value=None)
    assert status.startswith("**Cannot load model 'folder: bad'") and "is not a safetensors file" in status


def test_imagenets_two_cranes_stay_two_labels(namesake: Path, caches) -> None:
    # timm's ImageNet-1k names have "crane" twice (134: the bird, 517: the machine); the top-5 is keyed by name
    _place(namesake, checkpoint_path(*REGISTERED.split(".")))
    explainer = load_explainer(resolve_choice(REGISTERED))
    assert explainer.labels[134] == "crane (134)" and explainer.labels[517] == "crane (517)"
    assert explainer.labels[0].startswith("tench") and len(set(explainer.labels)) == 1000  # the others unchanged
    logits = torch.zeros(1000)
    logits[[134, 517, 0, 1, 2]] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    top = dict(explainer.top_k(logits, 5))  # what the Top-5 panel gets: it had 4 entries, the bird at 4.4 %
    assert list(top)[:2] == ["crane (134)", "crane (517)"] and len(top) == 5
    assert top["crane (134)"] == pytest.approx(float(logits.softmax(0)[134]))
    assert explainer.label_index("crane (517)") == 517


def test_served_models_are_preselected(tmp_path: Path, namesake: Path, caches) -> None:
    from hub_vit.demo.models import with_choice

    folder = _folder(tmp_path / "flowers")
    assert served_choice(str(folder)).key == "folder: flowers"
    assert served_choice(None).key == DEFAULT_KEY
    # the default model by its registered name: the same folder, offered once under its existing key
    choices, key = with_choice(discover_choices(), served_choice("simplevit_digits"))
    assert key == DEFAULT_KEY and [c.key for c in choices].count(DEFAULT_KEY) == 1
    # a registered name: serve has just cached its checkpoint, the demo offers that same file
    _place(namesake, checkpoint_path(*REGISTERED.split(".")))
    choices, key = with_choice(discover_choices(), served_choice(REGISTERED))
    assert key == REGISTERED and [c.key for c in choices].count(REGISTERED) == 1
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"not really")
    assert served_choice(str(onnx)) is None  # exported: runs on the server only


def _page_config(blocks) -> dict[str, dict]:
    """The running demo's components, as the browser receives them, by elem_id."""
    with urllib.request.urlopen(f"{blocks.local_url}config", timeout=30) as response:
        config = json.loads(response.read())
    return {c["props"]["elem_id"]: c["props"] for c in config["components"] if c.get("props", {}).get("elem_id")}


def test_serve_demo_opens_on_the_served_model(tmp_path: Path, caches) -> None:
    # `hub-vit serve FOLDER --demo` opened the page on the default model while Triton served FOLDER
    from hub_vit.cli.serve_screen import start_demo
    from hub_vit.server.runtime.launcher import free_port

    folder = _folder(tmp_path / "flowers")
    triton = "127.0.0.1:8000"  # never asked: nothing is uploaded here
    demo = start_demo(str(folder), False, "127.0.0.1", free_port(), triton, "vit")
    try:
        props = _page_config(demo)
        assert props["model"]["value"] == "folder: flowers"
        assert ["folder: flowers", "folder: flowers"] in props["model"]["choices"]
    finally:
        demo.close()
    # an exported file runs on the server only: the page opens on the default model, and Triton's labels say so
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"not really")
    demo = start_demo(str(onnx), False, "127.0.0.1", free_port(), triton, "vit")
    try:
        assert _page_config(demo)["model"]["value"] == DEFAULT_KEY
        assert _page_config(demo)["backend"]["value"] == "in-process"
    finally:
        demo.close()
    from hub_vit.demo.backends import TritonLabels

    # behind a reverse proxy at /vit/ (serve --demo-root-path): the page asks for its files and queue under /vit
    demo = start_demo(str(folder), False, "127.0.0.1", free_port(), triton, "vit", "/vit")
    try:
        with urllib.request.urlopen(f"{demo.local_url}config", timeout=30) as response:
            assert json.loads(response.read())["root"].endswith("/vit")
    finally:
        demo.close()
    labels = TritonLabels(triton, served_name="'model.onnx'")
    assert "'model.onnx'" in labels.mismatch(DEFAULT_KEY) and "not that model's" in labels.mismatch(DEFAULT_KEY)
    assert TritonLabels(triton, served_key="folder: flowers").mismatch("folder: flowers") is None
    assert TritonLabels(triton).mismatch(DEFAULT_KEY) is None  # `hub-vit demo --triton-url`: nothing known



@pytest.mark.parametrize("record", ["{", '{"knows": "digits", "examples": "sketches"}'])
def test_a_damaged_domain_record_is_a_model_that_cannot_be_shown(tmp_path: Path, record: str, caplog) -> None:
    # was: `analyze` raised (a bare red "Error" on the page, a traceback in the log), `domain_view` went blank
    import logging

    import gradio as gr

    from hub_vit.catalog import default_model_folder
    from hub_vit.demo.app import Demo
    from hub_vit.demo.backends import IN_PROCESS

    folder = Path(shutil.copytree(default_model_folder(), tmp_path / "digits"))
    choice = folder_choice(folder)
    demo = Demo(cache=ModelCache([choice]), examples=[])
    (folder / "domain.json").write_text(record)  # damaged after start-up: named when the model is shown
    digit = str(folder / "samples" / "3_0.png")
    with caplog.at_level(logging.WARNING, logger="hub_vit.demo.app"), \
            pytest.warns(UserWarning, match="cannot load model 'folder: digits'"):  # the toast
        labels, overlay, layer_view, target, class_map, status, _ = demo.analyze_new_model(
            digit, choice.key, IN_PROCESS, "mean", 0.0, None, None)
    assert labels is None and overlay is None and layer_view is None and class_map is None
    assert target == gr.update(choices=[], value=None)
    assert status.startswith("**Cannot load model 'folder: digits'") and "domain.json" in status, status
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused: cannot load model")]
    assert len(refused) == 1 and "domain.json" in refused[0] and not any(r.exc_info for r in caplog.records)
    # and at start-up, as rollout refuses it
    with pytest.raises(ValueError, match="domain.json"):
        folder_choice(folder)
    result = CliRunner().invoke(_cli(), ["demo", "--model-folder", str(folder), "--port", "1"])
    assert result.exit_code == 2 and "domain.json" in result.output, result.output
