"""Rewrites of the OpenVINO graph the OpenVINO variants are built from.

`keys_transposed_by_matmul` (every OpenVINO variant): the attention's keys reach `q @ k^T` in a layout that is cheap
to make.

The exported attention computes `q @ k.permute(0, 2, 3, 1)`: keys (B, N, heads, head_dim) transposed element by
element to (B, heads, head_dim, N) before the MatMul, a Transpose the CPU plugin runs on its own in every block.
Here the keys take the queries' and values' layout instead, (B, heads, N, head_dim), which moves whole head_dim-long
rows, and the MatMul reads them with `transpose_b`, which its kernels do natively: the same product, value for value.
ViT-S/16 at batch 8, 2 threads, on an AMX host (OpenVINO 2026.4, profiled): the Transposes take 2.1 ms instead of 7.1
(bf16) and 0.6 ms instead of 4.5 (static int8).

`tanh_gelu_as_erf` (the int8 variants): the MLP's GELU, which the models define with the tanh approximation (Google's
ViTs: flax's `nn.gelu`), runs in its erf form, `x * Phi(x)`. The two differ by at most 4.7e-4 (at |x| = 2.70), which
the int8 rounding of the GELU's output (the next MatMul's input) covers: one step of it is 0.0076 or more on ViT-S/16.
The CPU plugin fuses either form into the MatMul before it, and runs the erf form faster: ViT-S/16 at batch 8, 2
threads, on an AMX host (OpenVINO 2026.4), static int8 takes 57.8 ms instead of 62.4 (the MLP's first MatMul 1.1-1.3
ms instead of 1.7-2.0 per block). The variant's verification judges the whole against the fp32 graph, tanh GELU and all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

KEYS_TRANSPOSED = [0, 2, 3, 1]  # (B, N, heads, head_dim) -> (B, heads, head_dim, N)
HEADS_FIRST = [0, 2, 1, 3]  # (B, N, heads, head_dim) -> (B, heads, N, head_dim)
# tanh GELU: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))), the constants as torch exports them
GELU_TANH_CONSTANTS = {"cube": 3.0, "cubic": 0.044715, "inner": float(np.sqrt(2 / np.pi)), "one": 1.0, "half": 0.5}


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


def tanh_gelu_as_erf(model: Any) -> int:
    """Rewrite, in place, every tanh-approximated GELU of `model` (an OpenVINO model: the subgraph torch exports for
    `GELU(approximate="tanh")`, `x * (0.5 * (1 + tanh(c * (x + 0.044715 * x ** 3))))`, operands in any order) as one
    `Gelu(x, "erf")`; returns how many were rewritten. Subgraphs with other constants are left alone."""
    import openvino.opset13 as ops

    rewritten = 0
    for tanh in [op for op in model.get_ordered_ops() if op.get_type_name() == "Tanh"]:
        found = _tanh_gelu(tanh)
        if found is None:
            continue
        x, last = found
        gelu = ops.gelu(x, approximation_mode="erf")
        gelu.set_friendly_name(last.get_friendly_name())
        last.output(0).replace(gelu.output(0))
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten


def _tanh_gelu(tanh: Any) -> tuple[Any, Any] | None:
    """(x, the subgraph's last node) where `tanh` is the tanh of a tanh GELU of x, else None."""
    inner = _scaled(tanh.input_value(0), GELU_TANH_CONSTANTS["inner"])  # x + 0.044715 * x ** 3
    plus_one = _only_consumer(tanh, "Add")  # 1 + tanh(...)
    if inner is None or inner.get_node().get_type_name() != "Add" or plus_one is None or \
            not _is_scalar(_other_input(plus_one, tanh.output(0)), GELU_TANH_CONSTANTS["one"]):
        return None
    for x, cubic in _operand_orders(inner.get_node()):
        power = _scaled(cubic, GELU_TANH_CONSTANTS["cubic"])  # x ** 3
        if power is not None and power.get_node().get_type_name() == "Power" and power.get_node().input_value(0) == x \
                and _is_scalar(power.get_node().input_value(1), GELU_TANH_CONSTANTS["cube"]):
            last = _half_x_times(plus_one, x)
            return (x, last) if last is not None else None
    return None


def _half_x_times(node: Any, x: Any) -> Any | None:
    """The node that multiplies `node`'s output by 0.5 and by x, in one of the three orders a GELU is written in:
    (0.5 * node) * x, (x * node) * 0.5, (0.5 * x) * node; None if there is none."""
    half = GELU_TANH_CONSTANTS["half"]
    first = _only_consumer(node, "Multiply")
    if first is None:
        return None
    other = _other_input(first, node.output(0))
    halved = other.get_node()
    if halved.get_type_name() == "Multiply" and any(a == x and _is_scalar(b, half) for a, b in _operand_orders(halved)):
        return first  # (0.5 * x) * node
    second = _only_consumer(first, "Multiply")
    if second is None:
        return None
    rest = _other_input(second, first.output(0))
    if (_is_scalar(other, half) and rest == x) or (other == x and _is_scalar(rest, half)):
        return second  # (0.5 * node) * x or (x * node) * 0.5
    return None


def _scaled(value: Any, factor: float) -> Any | None:
    """The other operand where `value` is `Multiply(other, factor)` (either order), else None."""
    node = value.get_node()
    if node.get_type_name() != "Multiply":
        return None
    return next((a for a, b in _operand_orders(node) if _is_scalar(b, factor)), None)


def _operand_orders(node: Any) -> list[tuple[Any, Any]]:
    a, b = node.input_value(0), node.input_value(1)
    return [(a, b), (b, a)]


def _other_input(node: Any, value: Any) -> Any:
    a, b = node.input_value(0), node.input_value(1)
    return b if a == value else a


def _only_consumer(node: Any, kind: str) -> Any | None:
    consumers = [target.get_node() for target in node.output(0).get_target_inputs()]
    return consumers[0] if len(consumers) == 1 and consumers[0].get_type_name() == kind else None


def _is_scalar(value: Any, expected: float) -> bool:
    """Whether `value` is a one-element Constant equal to `expected` as float32 stores it."""
    node = value.get_node()
    return node.get_type_name() == "Constant" and node.get_data().size == 1 and \
        np.float32(node.get_data().reshape(())) == np.float32(expected)


def _constant(op: Any, port: int) -> list[int] | None:
    node = op.input_value(port).get_node()
    return [int(v) for v in node.get_data()] if node.get_type_name() == "Constant" else None


__all__ = ["GELU_TANH_CONSTANTS", "HEADS_FIRST", "KEYS_TRANSPOSED", "keys_transposed_by_matmul", "tanh_gelu_as_erf"]
