"""One rewrite of the OpenVINO graph every OpenVINO variant is built from: the attention's keys reach `q @ k^T` in a
layout that is cheap to make.

The exported attention computes `q @ k.permute(0, 2, 3, 1)`: keys (B, N, heads, head_dim) transposed element by
element to (B, heads, head_dim, N) before the MatMul, a Transpose the CPU plugin runs on its own in every block.
Here the keys take the queries' and values' layout instead, (B, heads, N, head_dim), which moves whole head_dim-long
rows, and the MatMul reads them with `transpose_b`, which its kernels do natively: the same product, value for value.
ViT-S/16 at batch 8, 2 threads, on an AMX host (OpenVINO 2026.4, profiled): the Transposes take 2.1 ms instead of 7.1
(bf16) and 0.6 ms instead of 4.5 (static int8).
"""

from __future__ import annotations

from typing import Any

import numpy as np

KEYS_TRANSPOSED = [0, 2, 3, 1]  # (B, N, heads, head_dim) -> (B, heads, head_dim, N)
HEADS_FIRST = [0, 2, 1, 3]  # (B, N, heads, head_dim) -> (B, heads, N, head_dim)


def keys_transposed_by_matmul(model: Any) -> int:
    """Rewrite, in place, every `MatMul(a, Transpose(k, KEYS_TRANSPOSED))` of `model` (an OpenVINO model) as
    `MatMul(a, Transpose(k, HEADS_FIRST), transpose_b=True)`; returns how many were rewritten."""
    import openvino.opset13 as ops

    rewritten = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul" or op.get_attributes()["transpose_b"]:
            continue
        transpose = op.input_value(1).get_node()
        if transpose.get_type_name() != "Transpose" or _constant(transpose, 1) != KEYS_TRANSPOSED:
            continue
        heads_first = ops.transpose(transpose.input_value(0), ops.constant(np.array(HEADS_FIRST, np.int64)))
        heads_first.set_friendly_name(transpose.get_friendly_name())
        product = ops.matmul(op.input_value(0), heads_first, op.get_attributes()["transpose_a"], True)
        product.set_friendly_name(op.get_friendly_name())  # the layer names the int8 search and its records use
        op.output(0).replace(product.output(0))
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten


def _constant(op: Any, port: int) -> list[int] | None:
    node = op.input_value(port).get_node()
    return [int(v) for v in node.get_data()] if node.get_type_name() == "Constant" else None


__all__ = ["HEADS_FIRST", "KEYS_TRANSPOSED", "keys_transposed_by_matmul"]
