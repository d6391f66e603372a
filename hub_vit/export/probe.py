"""Expose a graph's pre-logits features (what the classifier head reads) as a second output, and drop it again.

Verification compares both the logits and the features before the head with fp32 (`hub_vit.export.criterion`):
a reduced-precision graph can keep the top-1 class on a random model yet have lost the features, and the other way
round. The fp32 graph gets the extra output `pre_logits` before any variant is built from it, so every variant
(fused, quantised, bf16) carries it through; the files that are written have it dropped again, so they keep the
contract `pixel_values` -> `logits` (the head reads the same tensor). OpenVINO's CPU plugin picks precisions per
graph, and an extra output can change them, so an OpenVINO variant's logits are judged on the written graph itself
(`hub_vit.export.variants`).
"""

from __future__ import annotations

from pathlib import Path

PRE_LOGITS = "pre_logits"
_HEAD_OPS = ("Gemm", "MatMul")


def head_input(path: str | Path) -> str:
    """Name of the tensor the head (the Gemm / MatMul(+Add) that writes `logits`) reads: (B, features)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    weights = {init.name for init in graph.initializer}
    node = producer.get("logits")
    if node is not None and node.op_type == "Add":  # MatMul + Add (bias): the activation side is the MatMul
        node = next((producer[i] for i in node.input if i in producer and producer[i].op_type in _HEAD_OPS), None)
    if node is None or node.op_type not in _HEAD_OPS or node.input[0] in weights:
        found = "no node" if node is None else f"a {node.op_type} node"
        raise ValueError(f"{path}: 'logits' is written by {found}, not a Gemm/MatMul head; cannot find the "
                         "pre-logits features to verify")
    return node.input[0]


def expose_pre_logits(src: str | Path, dst: str | Path, headless: bool = False) -> Path:
    """Copy of `src` with an extra output `pre_logits` (B, features) = the head's input; returns `dst`. `headless`: a
    model without a classifier head (num_classes 0), whose `logits` are the pre-logits features themselves."""
    import onnx
    from onnx import helper

    name = "logits" if headless else head_input(src)
    proto = onnx.load(str(src))
    proto.graph.node.append(helper.make_node("Identity", [name], [PRE_LOGITS], name="expose_pre_logits"))
    logits = next(o for o in proto.graph.output if o.name == "logits")
    batch = logits.type.tensor_type.shape.dim[0]
    dim = batch.dim_param or (batch.dim_value if batch.HasField("dim_value") else None)
    proto.graph.output.append(helper.make_tensor_value_info(PRE_LOGITS, logits.type.tensor_type.elem_type,
                                                            [dim, None]))
    onnx.save(proto, str(dst))
    return Path(dst)


def drop_pre_logits(src: str | Path, dst: str | Path) -> Path:
    """Copy of `src` without the `pre_logits` output and its Identity node (a graph without one is copied as is)."""
    import onnx

    proto = onnx.load(str(src))
    outputs = [o for o in proto.graph.output if o.name != PRE_LOGITS]
    nodes = [n for n in proto.graph.node if list(n.output) != [PRE_LOGITS]]
    del proto.graph.output[:]
    proto.graph.output.extend(outputs)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    onnx.save(proto, str(dst))
    return Path(dst)


__all__ = ["PRE_LOGITS", "drop_pre_logits", "expose_pre_logits", "head_input"]
