"""Reading what `hub-vit export` leaves beside an exported graph, and the graph's own signature.

`hub-vit export onnx` records the model's labels and eval transform in its report (`<stem>.export.json`, key
"model"); `hub-vit export tensorrt` copies them into `<engine>.json`. `hub_vit.resolve` reads them back, so an exported
file is served with the model's own transform and labels. No torch; `onnx` only to read a graph.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_KEY = "model"  # key of the metadata in the export report and in `<engine>.json`
REPORT_SUFFIX = ".export.json"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def report_metadata(exported: Path) -> dict[str, Any] | None:
    """The metadata of the export report beside an exported file: `<stem>.export.json` of the export that wrote it
    (`model.onnx`, `model.int8-dynamic.onnx`, `model.plan` all belong to stem `model`)."""
    for report in sorted(exported.parent.glob(f"*{REPORT_SUFFIX}")):
        stem = report.name[: -len(REPORT_SUFFIX)]
        if exported.name.startswith(stem + "."):
            data = _read_json(report)
            if data and isinstance(data.get(MODEL_KEY), dict) and data[MODEL_KEY]:
                return data[MODEL_KEY]
    return None


def engine_info(engine: Path) -> dict[str, Any] | None:
    """`<engine>.json`, written by `hub-vit export tensorrt` (TensorRT version, GPU, batch profile, precision)."""
    return _read_json(engine.with_name(engine.name + ".json"))


def find_model_metadata(exported: Path) -> dict[str, Any] | None:
    """Metadata for an exported `.onnx` or TensorRT engine, or None: an engine's own `<engine>.json`, else the
    export report beside the file (for an engine, also beside the ONNX graph it was built from)."""
    exported = Path(exported)
    info = engine_info(exported) if exported.suffix != ".onnx" else None
    if info and isinstance(info.get(MODEL_KEY), dict) and info[MODEL_KEY]:
        return info[MODEL_KEY]
    found = report_metadata(exported)
    if found is None and info and info.get("onnx"):
        found = report_metadata(Path(info["onnx"]))
    return found


def load_onnx_graph(path: Path) -> Any:
    """The graph of an ONNX file (weights not loaded); a corrupt or truncated file is a ValueError naming it."""
    import onnx
    from google.protobuf import json_format, text_format
    from google.protobuf.message import DecodeError

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except (DecodeError, ValueError, RuntimeError, json_format.Error, text_format.Error) as exc:
        # onnx.load reads a .json / .txt file as protobuf JSON / text: an export report beside the graph, say
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{str(path)!r} is not a valid ONNX model (truncated or corrupt?): {reason}") from None
    if not graph.node:  # protobuf reads many short files of other kinds as an empty model
        raise ValueError(f"{str(path)!r} is not a valid ONNX model (truncated or corrupt?): it holds no graph")
    return graph


def onnx_signature(path: Path) -> tuple[tuple[int, int, int], int]:
    """((C, H, W), classes) of a fixed-size classifier graph (B, 3, H, W) -> (B, C); ValueError naming the file
    otherwise."""
    graph = load_onnx_graph(path)
    # An exporter may list the weights among the inputs too (keep_initializers_as_inputs): those are not fed
    initializers = {tensor.name for tensor in graph.initializer}
    fed = [tensor for tensor in graph.input if tensor.name not in initializers]
    if len(fed) != 1 or len(graph.output) < 1:
        raise ValueError(f"{str(path)!r}: expected a classifier graph with one input (pixel_values) and a logits "
                         f"output, got {len(fed)} inputs and {len(graph.output)} outputs")
    dims = [d.dim_value for d in fed[0].type.tensor_type.shape.dim]  # (B, 3, H, W)
    out = [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim]  # (B, C)
    if len(dims) != 4 or dims[1] != 3 or not dims[2] or not dims[3] or len(out) != 2 or not out[1]:
        raise ValueError(f"{str(path)!r}: expected a fixed-size (B, 3, H, W) -> (B, C) graph, got {dims} -> {out}")
    return (3, dims[2], dims[3]), out[1]


__all__ = ["MODEL_KEY", "REPORT_SUFFIX", "engine_info", "find_model_metadata", "load_onnx_graph", "onnx_signature",
           "report_metadata"]
