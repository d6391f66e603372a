"""hub_vit/export/openvino_rewrite.py on a real exported ViT: every block's `q @ k^T` reads its keys through
`transpose_b`, the graph computes the same values, and what OpenVINO's CPU plugin runs no longer transposes the keys
element by element into (B, heads, head_dim, N)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hub_vit.export import openvino_build, openvino_rewrite
from hub_vit.export.plan import ExportPlan, VerificationSet
from hub_vit.export.variants import export_variants
from hub_vit.model import VisionTransformer
from hub_vit.openvino_runtime import core
from hub_vit.variants import ViTSpec

pytest.importorskip("openvino")

DEPTH, HEADS, HEAD_DIM, TOKENS = 3, 4, 16, 17  # width 64 in 4 heads; 16 patches of 8 px + the class token


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    spec = ViTSpec(width=HEADS * HEAD_DIM, depth=DEPTH, mlp_dim=128, num_heads=HEADS, patch_size=8, img_size=32,
                   num_classes=10, head_zeroinit=False)
    out = tmp_path_factory.mktemp("rewrite")
    export_variants(VisionTransformer(spec).eval(), out, ExportPlan(("fp32",)),
                    VerificationSet(n_random=2, n_photos=2, seed=0))
    return out / "model.onnx"


def _key_transposes(model: object) -> int:
    """MatMuls that read a Transpose with the keys' (B, heads, head_dim, N) permutation."""
    found = 0
    for op in model.get_ordered_ops():
        source = op.input_value(1).get_node() if op.get_type_name() == "MatMul" else None
        if source is not None and source.get_type_name() == "Transpose":
            found += list(source.input_value(1).get_node().get_data()) == openvino_rewrite.KEYS_TRANSPOSED
    return found


def _runtime_transpose_shapes(model: object) -> list[list[int]]:
    """The output shapes of the Transposes the CPU plugin runs for `model` at batch 2."""
    model.reshape([2, 3, 32, 32])
    compiled = core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": 1})
    return [list(op.get_output_shape(0)) for op in compiled.get_runtime_model().get_ordered_ops()
            if op.get_rt_info()["layerType"].astype(str) == "Transpose"]


def test_every_blocks_keys_are_read_through_transpose_b(onnx_file: Path) -> None:
    plain = core().read_model(str(onnx_file))
    assert _key_transposes(plain) == DEPTH  # what the export writes: the test would pass vacuously without it
    rewritten = openvino_build.read_model(onnx_file)
    assert _key_transposes(rewritten) == 0
    assert openvino_rewrite.keys_transposed_by_matmul(rewritten) == 0  # read again (an IR of a variant): nothing left


def test_the_rewritten_graph_computes_the_same_values(onnx_file: Path) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    f32 = {"INFERENCE_PRECISION_HINT": "f32"}
    plain = core().compile_model(core().read_model(str(onnx_file)), "CPU", f32)(x)
    rewritten = core().compile_model(openvino_build.read_model(onnx_file), "CPU", f32)(x)
    for port in range(len(plain)):
        np.testing.assert_allclose(rewritten[port], plain[port], rtol=0, atol=1e-6)


def test_the_cpu_plugin_no_longer_transposes_the_keys_element_by_element(onnx_file: Path) -> None:
    keys_transposed, heads_first = [2, HEADS, HEAD_DIM, TOKENS], [2, HEADS, TOKENS, HEAD_DIM]
    plain = _runtime_transpose_shapes(core().read_model(str(onnx_file)))
    assert plain.count(keys_transposed) == DEPTH  # what runs without the rewrite, one per block
    rewritten = _runtime_transpose_shapes(openvino_build.read_model(onnx_file))
    assert keys_transposed not in rewritten and rewritten.count(heads_first) == plain.count(heads_first) + DEPTH
