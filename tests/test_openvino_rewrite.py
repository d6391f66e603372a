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


# --- tanh GELU in erf form (the int8 variants) --------------------------------------------------------------------

def _gelu_graph(order: str, cubic: float = 0.044715) -> object:
    """An OpenVINO model of the tanh GELU of its input, written in one of the orders a graph can hold it:
    `half_first` (0.5 * (1 + tanh)) * x, as torch exports it; `x_first` (x * (1 + tanh)) * 0.5; `half_x` (0.5 * x) *
    (1 + tanh)."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([4, 1001], np.float32)
    scalar = lambda value: ops.constant(np.float32(value))  # noqa: E731
    inner = ops.multiply(scalar(np.sqrt(2 / np.pi)), ops.add(x, ops.multiply(scalar(cubic), ops.power(x, scalar(3)))))
    plus_one = ops.add(ops.tanh(inner), scalar(1))
    if order == "half_first":
        out = ops.multiply(x, ops.multiply(scalar(0.5), plus_one))
    elif order == "x_first":
        out = ops.multiply(ops.multiply(plus_one, x), scalar(0.5))
    else:
        out = ops.multiply(ops.multiply(x, scalar(0.5)), plus_one)
    return ov.Model([out], [x])


def _run_f32(model: object, x: np.ndarray) -> np.ndarray:
    return core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x)[0]


@pytest.mark.parametrize("order", ["half_first", "x_first", "half_x"])
def test_a_tanh_gelu_becomes_gelu_in_its_erf_form(order: str) -> None:
    x = np.linspace(-6, 6, 4 * 1001, dtype=np.float32).reshape(4, 1001)
    model = _gelu_graph(order)
    tanh_form = _run_f32(model, x)
    assert openvino_rewrite.tanh_gelu_as_erf(model) == 1
    assert [op.get_type_name() for op in model.get_ordered_ops()] == ["Parameter", "Gelu", "Result"]
    erf_form = _run_f32(model, x)
    exact = torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()  # torch's erf GELU
    approximate = torch.nn.functional.gelu(torch.from_numpy(x).double(), approximate="tanh").numpy()
    np.testing.assert_allclose(tanh_form, approximate, rtol=0, atol=2e-6)  # the graph was the tanh form
    np.testing.assert_allclose(erf_form, exact, rtol=0, atol=2e-6)
    assert 4.5e-4 < np.abs(erf_form - tanh_form).max() < 4.8e-4  # the two forms' largest difference, near |x| = 2.7


def test_other_constants_are_not_a_gelu() -> None:
    model = _gelu_graph("half_first", cubic=0.05)
    assert openvino_rewrite.tanh_gelu_as_erf(model) == 0
    assert "Tanh" in {op.get_type_name() for op in model.get_ordered_ops()}


def test_every_mlp_of_an_exported_vit_runs_its_gelu_in_erf_form(onnx_file: Path) -> None:
    model, decided = openvino_build.read_int8_model(onnx_file)
    assert decided == {"gelu_as_erf": DEPTH}
    kinds = [op.get_type_name() for op in model.get_ordered_ops()]
    assert kinds.count("Gelu") == DEPTH and "Tanh" not in kinds and "Power" not in kinds
    assert "Tanh" in {op.get_type_name() for op in openvino_build.read_model(onnx_file).get_ordered_ops()}
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    erf_form, tanh_form = _run_f32(model, x), _run_f32(openvino_build.read_model(onnx_file), x)
    assert 0 < np.abs(erf_form - tanh_form).max() < 1e-3 * np.abs(tanh_form).max()
