"""Every published checkpoint's key/shape manifest converts and loads strictly into the right architecture.

The manifests (tests/fixtures/jax/manifests) list the exact keys and shapes of Google's real published files, taken
from `jax.eval_shape` of the repos' own code, and their published parameter counts. A zero-filled checkpoint with
those keys is built here (zeros cost nothing until converted), converted, strictly loaded into the registered timm
architecture built on the meta device (no second copy of the weights), and its parameters counted.
"""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import hub_vit  # noqa: F401
from hub_vit.catalog import MODELS
from hub_vit.conversion import convert_arrays, convert_npz_file, detect_layout, infer_spec
from hub_vit.model import count_parameters
from hub_vit.weights import load_strict

MANIFESTS = Path(__file__).resolve().parent / "fixtures" / "jax" / "manifests"
ALL = sorted(MANIFESTS.glob("*/*.json"))
assert len(ALL) == 24, len(ALL)

# Which registered hub-vit architecture each published file is (None = the generic "hub_vit" entry point).
_VIT = {"Ti_16": "vit_ti16", "S_16": "vit_s16", "B_16": "vit_b16", "B_32": "vit_b32", "L_16": "vit_l16"}


def expected_architecture(path: Path, manifest: dict) -> str:
    name = path.stem
    if path.parent.name == "vit_jax":
        if manifest["config"].get("representation_size"):
            return "hub_vit"  # the original i21k files carry a tanh pre-logits layer: no registered name has one
        return _VIT[manifest["model_name"].removeprefix("ViT-")]
    if name.startswith("siglip_img_"):
        return "hub_vit"  # MAP pooling, no head
    return {"vit_s16_i1k_224": "simplevit_s16", "vit_b16_i1k-config_224": "simplevit_b16",
            "vit_so400m14_i1k-config_224": "simplevit_so400m14"}[name]


def build_checkpoint(manifest: dict, params_field: str, prefix: str) -> dict[str, np.ndarray]:
    return {prefix + key: np.zeros(meta["shape"], dtype=np.dtype(meta["dtype"]))
            for key, meta in manifest[params_field].items()}


def check_spec_against_manifest(spec, path: Path, manifest: dict) -> None:
    if path.parent.name == "vit_jax":
        cfg = manifest["config"]
        tr = cfg["transformer"]
        assert (spec.width, spec.depth, spec.mlp_dim, spec.num_heads) == (
            cfg["hidden_size"], tr["num_layers"], tr["mlp_dim"], tr["num_heads"])
        assert spec.patch_size == cfg["patches"]["size"][0]
        assert spec.rep_size == cfg.get("representation_size")
        assert spec.pool_type == "tok" and spec.posemb_on_cls
    else:
        dec = manifest["decoded_variant"]
        assert (spec.width, spec.depth, spec.mlp_dim, spec.num_heads, spec.patch_size) == (
            dec["width"], dec["depth"], dec["mlp_dim"], dec["num_heads"], dec["patch_size"][0])
        kw = manifest["model_kw"]
        assert spec.pool_type == kw.get("pool_type", "gap")
        assert spec.posemb == kw.get("posemb", "learn")
        assert bool(spec.rep_size) == bool(kw.get("rep_size", False))
    assert spec.num_classes == (manifest["num_classes"] or 0)
    # Google's VALID patch conv drops a remainder (So400m/14 at 384 px sees a 27x27 grid = 378 px): compare grids.
    grid = manifest["image_size"] // spec.patch_size
    assert spec.grid_size == (grid, grid) or spec.posemb == "sincos2d"


def load_into_registered(state_dict: dict[str, torch.Tensor], spec, arch: str) -> torch.nn.Module:
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # copying into meta tensors is a (deliberate) no-op
        if arch == "hub_vit":
            model = timm.create_model("hub_vit", **spec.to_dict())
        else:
            assert MODELS[arch].spec.replace(img_size=spec.img_size, num_classes=spec.num_classes) == spec
            model = timm.create_model(arch, img_size=spec.img_size, num_classes=spec.num_classes)
        load_strict(model, state_dict)  # raises listing missing / unexpected / mis-shaped keys
    return model


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_manifest_converts_into_registered_architecture(path: Path) -> None:
    manifest = json.loads(path.read_text())
    prefix = manifest.get("key_prefix_in_npz", "params/").split()[0] if path.parent.name == "big_vision" else ""
    arrays = build_checkpoint(manifest, "params", prefix)
    layout = detect_layout(arrays)
    assert layout.family == path.parent.name
    assert layout.naming == ("pre-linen" if path.parent.name == "vit_jax" else "linen")
    spec = infer_spec(arrays)
    check_spec_against_manifest(spec, path, manifest)
    state_dict = convert_arrays(arrays, spec)
    del arrays
    model = load_into_registered(state_dict, spec, expected_architecture(path, manifest))
    assert count_parameters(model) == manifest["total_params"]
    assert sum(t.numel() for t in state_dict.values()) == manifest["total_params"]
    del state_dict, model
    gc.collect()


@pytest.mark.parametrize("name", ["vit_jax/ViT-Ti_16_i21k_ft_i1k_224", "big_vision/vit_s16_i1k_224",
                                  "big_vision/siglip_img_B16_224"])
def test_manifest_other_namings_and_file_path(name: str, tmp_path: Path) -> None:
    """The same weights under the Linen names / in the scan layout, written to a real npz and converted from disk."""
    path = MANIFESTS / f"{name}.json"
    manifest = json.loads(path.read_text())
    if path.parent.name == "vit_jax":
        field, prefix = "params_linen_naming", ""
    else:
        field, prefix = "params_scan_layout", manifest.get("key_prefix_in_npz", "params/").split()[0]
    rng = np.random.default_rng(0)
    arrays = {k: rng.standard_normal(v.shape, dtype=np.float32) for k, v in build_checkpoint(manifest, field,
                                                                                             prefix).items()}
    file = tmp_path / "ckpt.npz"
    np.savez(file, **arrays)
    layout = detect_layout(arrays)
    assert layout.scan == (field == "params_scan_layout")
    assert layout.naming == "linen"
    spec = infer_spec(arrays)
    check_spec_against_manifest(spec, path, manifest)
    from_file = convert_npz_file(file, spec)
    from_memory = convert_arrays(arrays, spec)
    assert from_file.keys() == from_memory.keys()
    assert all(torch.equal(from_file[k], from_memory[k]) for k in from_file)
    model = load_into_registered(from_file, spec, expected_architecture(path, manifest))
    assert count_parameters(model) == manifest["total_params"]
