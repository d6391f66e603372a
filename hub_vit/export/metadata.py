"""What a server needs besides the graph: the class names and the eval transform (timm `pretrained_cfg`).

`hub-vit export onnx` records them in its report (`<stem>.export.json`, key "model"); `hub-vit export tensorrt`
copies them into `<engine>.json`. `hub-vit serve model.onnx` / `model.plan` reads them back, so an exported file is
served with the model's own crop, interpolation, mean/std and labels, not with generic defaults and `class_0 ...`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODEL_KEY = "model"  # key of the metadata in the export report and in `<engine>.json`
REPORT_SUFFIX = ".export.json"


def model_metadata(model: Any, labels: Sequence[str] | None = None,
                   pretrained_cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"pretrained_cfg", "num_classes", "labels"} of a hub-vit model; `input_size` is the graph's (C, H, W)."""
    spec = model.spec
    cfg = dict(pretrained_cfg or getattr(model, "pretrained_cfg", None) or {})
    cfg["input_size"] = [spec.in_chans, *spec.img_size]
    cfg = json.loads(json.dumps(cfg, default=str))  # timm cfgs may hold tuples / paths: plain JSON values only
    return {"pretrained_cfg": cfg, "num_classes": int(model.num_classes), "labels": list(labels or [])}


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


__all__ = ["MODEL_KEY", "engine_info", "find_model_metadata", "model_metadata", "report_metadata"]
