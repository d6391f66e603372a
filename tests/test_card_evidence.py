"""A card claims Google's published checkpoint, and its published ImageNet results, only with evidence that the
converted file IS that checkpoint, never for a file that merely has its name and tensor layout.

The checkpoint here is random weights with exactly the keys and shapes of big_vision's SimpleViT-S/16
(`tests/fixtures/jax/manifests/big_vision/vit_s16_i1k_224.json`, from `jax.eval_shape` of big_vision's own model),
saved under Google's file name `vit_s16_i1k_300ep.npz`. Golden values: "Better plain ViT baselines for ImageNet-1k"
(arXiv:2205.01580) Table 2, 300 epochs: ImageNet 80.0, ReaL 85.4, v2 68.3.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import ModelCard

from hub_vit import catalog
from hub_vit.conversion import download
from hub_vit.conversion.writer import convert_to_folder

MANIFEST = Path(__file__).resolve().parent / "fixtures" / "jax" / "manifests" / "big_vision" / "vit_s16_i1k_224.json"
FILE_NAME = "vit_s16_i1k_300ep.npz"  # gs://big_vision/vit_s16_i1k_300ep.npz, big_vision's README
PAPER_300EP = {"ImageNet-1k": 80.0, "ImageNet-ReaL": 85.4, "ImageNet-v2": 68.3}


def write_namesake(path: Path) -> Path:
    """Random weights in the published file's exact layout (its manifest), written to `path`."""
    manifest = json.loads(MANIFEST.read_text())
    rng = np.random.default_rng(0)
    arrays = {}
    for key, info in manifest["params"].items():
        value = rng.standard_normal(info["shape"], dtype=np.float32) * 0.02
        arrays[f"params/{key}"] = value + 1 if key.endswith("scale") else value  # LayerNorm scales near 1
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


@pytest.fixture(scope="module")
def namesake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights in the published file's exact layout, under the published file's name."""
    return write_namesake(tmp_path_factory.mktemp("namesake") / "big_vision" / FILE_NAME)


def published_claims(folder: Path) -> dict[str, object]:
    text = (folder / "README.md").read_text()
    meta = ModelCard(text).data.to_dict()
    results = {r["dataset"]["name"]: r["metrics"][0]["value"] for r in (meta.get("model-index") or [{}])[0].get(
        "results", [])}
    return {"results": results, "datasets": meta.get("datasets"), "table": "## Published results" in text,
            "google": "Google's published checkpoint `gs://big_vision/vit_s16_i1k_300ep.npz` (imagenet-1k)" in text,
            "not verified": "whose content was not verified" in text}


def test_random_weights_under_the_published_name_claim_nothing(namesake: Path, tmp_path: Path) -> None:
    folder = convert_to_folder(namesake, tmp_path / "local", progress=False).path
    assert published_claims(folder) == {"results": {}, "datasets": None, "table": False, "google": False,
                                        "not verified": True}
    assert json.loads((folder / "conversion.json").read_text())["source"]["content_verified"] is None


def test_file_placed_in_the_cache_by_hand_claims_nothing(namesake: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The offline route: the message names the cache path, the user puts a file there, and converts by name
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    dest = download.cached_path(catalog.MODELS["simplevit_s16"].weight("i1k_300ep").url)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(namesake.read_bytes())
    folder = convert_to_folder("simplevit_s16.i1k_300ep", tmp_path / "by_hand", progress=False).path
    assert published_claims(folder) == {"results": {}, "datasets": None, "table": False, "google": False,
                                        "not verified": True}


def convert_downloaded(root: Path, name: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Convert catalog `name` through hub-vit's own downloader, with a local HTTP server serving `root` in place of
    storage.googleapis.com (gs://<bucket>/<path> is fetched from <root>/<bucket>/<path>)."""
    monkeypatch.setenv("HUB_VIT_CACHE", str(out.parent / "cache"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(catalog, "GCS", base)
    monkeypatch.setattr(download, "GCS_HTTPS", base)
    try:
        return convert_to_folder(name, out, progress=False).path
    finally:
        server.shutdown()
        server.server_close()


def test_file_downloaded_by_hub_vit_from_the_catalog_url_keeps_the_claims(namesake: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """hub-vit's downloader fetches the catalog URL and records the content's sha256, which is the evidence the card
    needs."""
    folder = convert_downloaded(namesake.parent.parent, "i1k-s16-300ep", tmp_path / "downloaded", monkeypatch)  # vanity
    claims = published_claims(folder)
    assert claims == {"results": PAPER_300EP, "datasets": ["imagenet-1k"], "table": True, "google": True,
                      "not verified": False}
    source = json.loads((folder / "conversion.json").read_text())["source"]
    assert source["catalog_name"] == "simplevit_s16.i1k_300ep"  # a vanity name records its catalog name
    assert source["downloaded_sha256"] == source["sha256"]
    assert source["content_verified"]["catalog_name"] == "simplevit_s16.i1k_300ep"


def test_changed_augreg_conversion_keeps_its_citation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights changed after a verified AugReg conversion: the card withholds the record's claims but still says the
    file was derived from that checkpoint, so it keeps citing the AugReg paper (it dropped arXiv:2106.10270)."""
    import torch

    from hub_vit.folder import load_model_folder, save_model_folder

    weights = catalog.MODELS["vit_ti16"].weight("augreg_in21k_ft_in1k")
    manifest = json.loads((MANIFEST.parent.parent / "vit_jax" / "ViT-Ti_16_i21k_ft_i1k_224.json").read_text())
    rng = np.random.default_rng(0)
    params = manifest["params"].items()
    arrays = {key: rng.standard_normal(info["shape"], dtype=np.float32) * 0.02 for key, info in params}
    npz = tmp_path / "gcs" / weights.gs_url.removeprefix("gs://")
    npz.parent.mkdir(parents=True)
    np.savez(npz, **arrays)
    folder = convert_downloaded(tmp_path / "gcs", "vit_ti16.augreg_in21k_ft_in1k", tmp_path / "ti16", monkeypatch)
    assert catalog.PAPER_AUGREG.removeprefix("arXiv:") in (folder / "README.md").read_text()

    model, info = load_model_folder(folder)
    with torch.no_grad():
        model.head.weight.mul_(2)  # e.g. fine-tuned since
    save_model_folder(model, folder, labels=info.labels, pretrained_cfg=info.pretrained_cfg, overwrite=True,
                      extra_files={"conversion.json": (folder / "conversion.json").read_bytes()})
    from hub_vit.model_cards import write_model_card

    text = write_model_card(folder).read_text()
    assert "## Published results" not in text  # withheld ...
    assert catalog.PAPER_AUGREG.removeprefix("arXiv:") in text.split("```bibtex")[-1]  # ... but still cited
