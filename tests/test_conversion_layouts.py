"""Layouts beyond the fixtures' own files: prefixes, legacy posemb locations, an inlined MAP head, bfloat16.

Each variant is built from a Google fixture by renaming keys exactly as the legacy layout stores them (the README of
tests/fixtures/jax and big_vision's `fix_old_checkpoints` describe them); the converted model must still reproduce
Google's logits for that fixture.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hub_vit.conversion import (
    LayoutError,
    convert_arrays,
    convert_file,
    detect_layout,
    infer_spec,
    read_npz,
)
from hub_vit.conversion.layouts import convert_pre_linen_names
from hub_vit.conversion.npz_reader import bf16_void_to_float32
from hub_vit.conversion.verify import find_reference
from hub_vit.model import VisionTransformer
from hub_vit.weights import load_strict

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
VIT_TOKEN = JAX / "vit_jax" / "tiny_token.published.npz"
BV_MAP = JAX / "big_vision" / "tiny_learn_map.npz"
BV_TOK = JAX / "big_vision" / "tiny_learn_tok.npz"


def google_logits(ckpt: Path) -> tuple[np.ndarray, np.ndarray]:
    reference = find_reference(ckpt)
    assert reference is not None, f"no Google reference (*.io.npz) beside {ckpt.name}"
    with np.load(reference) as io:
        return io["inputs"], io["logits"]


def assert_google(arrays: dict[str, np.ndarray], ckpt: Path) -> None:
    inputs, logits = google_logits(ckpt)
    spec = infer_spec(arrays)
    model = VisionTransformer(spec).eval()
    load_strict(model, convert_arrays(arrays, spec))
    with torch.no_grad():
        ours = model(torch.from_numpy(inputs).permute(0, 3, 1, 2)).numpy()
    assert np.abs(ours - logits).max() <= 1e-5


def test_pre_linen_renaming_matches_flax() -> None:
    keys = ["Transformer/encoderblock_0/LayerNorm_0/scale", "Transformer/encoderblock_0/MultiHeadDotProductAttention_1"
            "/query/kernel", "Transformer/encoderblock_0/LayerNorm_2/scale", "Transformer/encoderblock_0/MlpBlock_3/"
            "Dense_0/kernel", "Transformer/encoderblock_10/LayerNorm_0/scale", "head/kernel"]
    renamed = convert_pre_linen_names(keys)
    assert renamed[keys[1]].endswith("MultiHeadDotProductAttention_0/query/kernel")
    assert renamed[keys[2]].endswith("LayerNorm_1/scale")
    assert renamed[keys[3]].endswith("MlpBlock_0/Dense_0/kernel")
    assert renamed[keys[4]] == keys[4] and renamed[keys[5]] == keys[5]
    assert convert_pre_linen_names(list(renamed.values())) == {v: v for v in renamed.values()}  # idempotent


def test_opt_target_prefix() -> None:
    arrays = {f"opt/target/{k}": v for k, v in read_npz(VIT_TOKEN).items()}
    layout = detect_layout(arrays)
    assert (layout.family, layout.prefix, layout.naming) == ("vit_jax", "opt/target/", "pre-linen")
    assert_google(arrays, VIT_TOKEN)


@pytest.mark.parametrize("where", ["Transformer/posembed_input/pos_embedding", "Transformer/pos_embedding",
                                   "pos_embedding"])
def test_legacy_big_vision_posemb_folded_into_cls(where: str) -> None:
    """A big_vision file (params/ prefix) whose posemb has the class-token slot, at any of its historical places:
    moved to the top level and slot 0 added to `cls` (fix_old_checkpoints) -- the same function as vit_jax's."""
    src = read_npz(VIT_TOKEN)
    arrays = {f"params/{k}": v for k, v in src.items() if k != "Transformer/posembed_input/pos_embedding"}
    arrays[f"params/{where}"] = src["Transformer/posembed_input/pos_embedding"]
    layout = detect_layout(arrays)
    assert layout.family == "big_vision" and layout.cls_folded and not layout.posemb_on_cls
    spec = infer_spec(arrays)
    assert not spec.posemb_on_cls and spec.grid_size == (4, 4)
    sd = convert_arrays(arrays, spec)
    expected_cls = src["cls"] + src["Transformer/posembed_input/pos_embedding"][:, :1]
    assert np.array_equal(sd["cls_token"].numpy(), expected_cls)
    assert_google(arrays, VIT_TOKEN)


def test_vit_jax_file_into_patches_only_spec_and_back() -> None:
    """Both posemb conventions are the same function: converting across them is exact."""
    src = read_npz(VIT_TOKEN)
    spec = infer_spec(src)
    folded = convert_arrays(src, spec.replace(posemb_on_cls=False))
    assert folded["pos_embed"].shape == (1, 16, 64)
    model = VisionTransformer(spec.replace(posemb_on_cls=False)).eval()
    load_strict(model, folded)
    inputs, logits = google_logits(VIT_TOKEN)
    with torch.no_grad():
        assert np.abs(model(torch.from_numpy(inputs).permute(0, 3, 1, 2)).numpy() - logits).max() <= 1e-5
    bv = read_npz(BV_TOK)  # big_vision tok file into a vit_jax-convention spec: zero slot, cls unchanged
    sd = convert_arrays(bv, infer_spec(bv).replace(posemb_on_cls=True))
    assert sd["pos_embed"].shape == (1, 17, 64) and not sd["pos_embed"][:, 0].any()


def test_map_head_inlined_at_top_level() -> None:
    src = read_npz(BV_MAP)
    arrays = {k.replace("params/MAPHead_0/", "params/"): v for k, v in src.items()}
    assert "params/probe" in arrays
    layout = detect_layout(arrays)
    assert layout.map_head == "inlined at top level"
    assert_google(arrays, BV_MAP)


def test_siglip_two_tower_image_prefix() -> None:
    src = read_npz(BV_MAP)
    arrays = {k.replace("params/", "params/img/"): v for k, v in src.items()}
    arrays["params/txt/Embed_0/embedding"] = np.zeros((8, 4), np.float32)  # a text tower beside it: ignored
    arrays["opt/state/count"] = np.zeros((), np.int32)
    layout = detect_layout(arrays)
    assert layout.prefix == "params/img/" and layout.ignored_keys == 2
    assert_google(arrays, BV_MAP)


def test_bfloat16_void_arrays(tmp_path: Path) -> None:
    """big_vision stores bf16 as |V2; the reader widens it like utils.recover_dtype (exact for bf16 values)."""
    src = read_npz(BV_TOK)
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in src.items()}  # truncate to bf16
    path = tmp_path / "bf16.npz"
    np.savez(path, **{k: b.view("V2") for k, b in bits.items()})
    with np.load(path) as raw:
        assert raw["params/cls"].dtype == np.dtype("V2")
    back = read_npz(path)
    for k, b in bits.items():
        expected = (b.astype(np.uint32) << 16).view(np.float32)
        assert back[k].dtype == np.float32 and np.array_equal(back[k], expected)
        assert np.abs(back[k] - src[k]).max() <= np.abs(src[k]).max() * 2**-7  # bf16 has 8 significant bits
    conv = convert_file(path)
    assert conv.spec == infer_spec(src)
    np.testing.assert_array_equal(conv.state_dict["cls_token"].numpy(), bf16_void_to_float32(bits["params/cls"]
                                                                                              .view("V2")))


def test_not_a_vit_checkpoint() -> None:
    with pytest.raises(LayoutError, match="no 'embedding/kernel' under any of the prefixes"):
        detect_layout({"foo/bar": np.zeros(3)})
    with pytest.raises(LayoutError, match="hybrid ResNet"):
        detect_layout({"embedding/kernel": np.zeros((1, 1, 3, 8)), "conv_root/kernel": np.zeros((7, 7, 3, 8))})


def test_every_array_is_read_once() -> None:
    """Bounded work: per-block and scan-stacked files alike read each stored array exactly once."""

    class Counting(dict):
        def __init__(self, arrays: dict[str, np.ndarray]) -> None:
            super().__init__(arrays)
            self.reads: list[str] = []

        def __getitem__(self, key: str) -> np.ndarray:
            self.reads.append(key)
            return dict.__getitem__(self, key)

    for ckpt in (BV_MAP, JAX / "big_vision" / "tiny_learn_map.scan.npz"):
        arrays = Counting(read_npz(ckpt))
        convert_arrays(arrays, infer_spec(arrays))
        assert sorted(arrays.reads) == sorted(arrays), f"{ckpt.name}: {len(arrays.reads)} reads of {len(arrays)}"
