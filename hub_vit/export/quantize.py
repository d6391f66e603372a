"""Graph transforms on an fp32 hub-vit ONNX file: ORT transformer fusion, fp16, int8 (dynamic / static), bf16.

Every function reads one ONNX file and writes another (callers pass temporary paths; `hub_vit.export.variants`
verifies the result before moving it into place). All of them use onnxruntime's own tooling.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hub_vit.variants import ViTSpec

# The fused ops that matter for ViT (ORT transformer optimizer names); reported per export.
FUSED_OPS: tuple[str, ...] = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "LayerNormalization",
                              "FastGelu", "BiasGelu", "Gelu")


def op_counts(path: str | Path) -> dict[str, int]:
    """op_type -> number of nodes in the graph (weights are not loaded)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return dict(collections.Counter(node.op_type for node in model.graph.node))


def optimize_transformer(src: str | Path, dst: str | Path, spec: ViTSpec, *, float16: bool = False) -> dict[str, int]:
    """ORT transformer optimizer (`model_type="vit"`): fused Attention / SkipLayerNorm / GELU; fp16 if asked.

    `opt_level=0` applies only the Python fusions, so the file stays portable between CPU and GPU providers (ORT
    applies its own graph optimisations again when a session loads it). fp16 keeps float32 inputs and outputs.
    Returns the fused-op counts.
    """
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(src), model_type="vit", num_heads=spec.num_heads, hidden_size=spec.width, opt_level=0)
    if float16:
        opt.convert_float_to_float16(keep_io_types=True)
    opt.save_model_to_file(str(dst))
    counts = op_counts(dst)
    return {op: counts.get(op, 0) for op in FUSED_OPS}


def quantize_int8_dynamic(src: str | Path, dst: str | Path, workdir: str | Path, *, signed_weights: bool = False
                          ) -> None:
    """Weights 8-bit per output channel, activations quantised on the fly (MatMul/Attention -> MatMulInteger etc.).

    `signed_weights` (variant `int8-dynamic-s8`): int8 weights within 7 bits (`reduce_range`, as int8-static), so the
    u8 x s8 kernels run: VNNI / AMX-INT8 on CPUs that have them (about 3x the u8 x u8 rate on a Cascade Lake Xeon,
    bench/results), and still no 16-bit saturation on CPUs without VNNI.

    Weights are *unsigned* (U8U8), not int8: on x86 CPUs without VNNI (AVX2, AVX-512 before Cascade Lake / Zen 4)
    ORT's u8 x s8 kernel adds pairs of products in saturating 16-bit lanes, so an int8-weight graph that verified on a
    VNNI host gives different, worse logits elsewhere (digits model: max |logit diff| 1.36, top-1 agreement 98.2% on
    an AVX2 host). U8U8 products are widened before they are added: the same integers on every CPU.

    ORT's symbolic shape inference runs first: the quantiser needs every MatMul input's type, which the fused
    contrib ops (Attention, SkipLayerNormalization) hide from plain ONNX shape inference.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = Path(workdir) / "int8-dynamic.pre.onnx"
    quant_pre_process(str(src), str(pre), skip_optimization=True)
    if signed_weights:
        quantize_dynamic(str(pre), str(dst), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
    else:
        quantize_dynamic(str(pre), str(dst), weight_type=QuantType.QUInt8, per_channel=True)
    pre.unlink(missing_ok=True)


def _calibration_reader(images: np.ndarray) -> Any:
    """onnxruntime `CalibrationDataReader`: one (1, C, H, W) image per call from a (N, C, H, W) float32 array."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._items: Iterator[dict[str, np.ndarray]] = iter({"pixel_values": img[None]} for img in images)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._items, None)

    return Reader()


def to_bf16_bits(arr: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, as the hardware conversion does."""
    u = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def quantize_int8_static(src: str | Path, dst: str | Path, calibration: np.ndarray, workdir: str | Path) -> None:
    """QDQ int8 with activation ranges calibrated on `calibration` images (MinMax), weights int8 per channel.

    Only MatMul / Conv / Gemm are quantised: softmax and LayerNorm stay float, which is where ViT activations have
    the outliers that wreck a fully-int8 graph. Shape pre-processing (ORT's `quant_pre_process`) runs first.
    Weights use 7 bits (`reduce_range`, ORT's remedy): 2 x 255 x 64 products fit the 16-bit lanes of the u8 x s8 kernel
    on CPUs without VNNI, so the graph computes the same integers on every CPU (full-range int8 weights lost 1.5
    logits and 2.3% top-1 agreement on an AVX2 host; U8U8 QDQ weights did not reach 99% either).
    """
    if len(calibration) == 0:
        raise ValueError("int8-static needs calibration images: pass --calibration N (> 0) or --images DIR")
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = Path(workdir) / "int8-static.pre.onnx"
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(dst), _calibration_reader(calibration), quant_format=QuantFormat.QDQ,
                    per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=["MatMul", "Conv", "Gemm"])
    pre.unlink(missing_ok=True)


def convert_bf16(src: str | Path, dst: str | Path) -> None:
    """bf16 weights and compute for MatMul/Gemm (Cast in, Cast out); everything else stays float32.

    Whether this runs depends on the execution provider having bfloat16 kernels; `hub_vit.export.variants` reports
    the provider's error when it has not.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    new_nodes = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            new_nodes.append(node)
            continue
        inputs = []
        for i, name in enumerate(node.input):
            if name in inits:  # weight: store it as bf16 once
                arr = numpy_helper.to_array(inits[name])
                bf = helper.make_tensor(f"{name}__bf16", TensorProto.BFLOAT16, arr.shape,
                                        to_bf16_bits(arr).tobytes(), raw=True)
                graph.initializer.append(bf)
                inputs.append(bf.name)
            else:
                cast = f"{node.name or node.output[0]}__in{i}_bf16"
                new_nodes.append(helper.make_node("Cast", [name], [cast], to=TensorProto.BFLOAT16, name=cast))
                inputs.append(cast)
        out = f"{node.output[0]}__bf16"
        new_nodes.append(helper.make_node(node.op_type, inputs, [out], name=node.name, domain=node.domain,
                                          **{a.name: helper.get_attribute_value(a) for a in node.attribute}))
        new_nodes.append(helper.make_node("Cast", [out], [node.output[0]], to=TensorProto.FLOAT,
                                          name=f"{node.name}__out_f32"))
    used = {i for n in new_nodes for i in n.input}
    keep = [init for init in graph.initializer if init.name in used]
    del graph.node[:]
    graph.node.extend(new_nodes)
    del graph.initializer[:]
    graph.initializer.extend(keep)
    del graph.value_info[:]  # stale float32 shapes of the rewired tensors
    onnx.save(model, str(dst))


__all__ = ["FUSED_OPS", "convert_bf16", "op_counts", "optimize_transformer", "quantize_int8_dynamic",
           "quantize_int8_static", "to_bf16_bits"]
