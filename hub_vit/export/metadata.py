"""What a server needs besides the graph: the class names and the eval transform (timm `pretrained_cfg`).

`hub-vit export onnx` records them in its report (`<stem>.export.json`, key "model"); `hub-vit export tensorrt`
copies them into `<engine>.json`. `hub-vit serve model.onnx` / `model.plan` reads them back, so an exported file is
served with the model's own crop, interpolation, mean/std and labels, not with generic defaults and `class_0 ...`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

# The readers live below the export layer, beside the resolver that uses them (`hub_vit.resolve`)
from hub_vit.exported import MODEL_KEY, REPORT_SUFFIX, engine_info, find_model_metadata, report_metadata


def model_metadata(model: Any, labels: Sequence[str] | None = None,
                   pretrained_cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"pretrained_cfg", "num_classes", "labels"} of a hub-vit model; `input_size` is the graph's (C, H, W)."""
    spec = model.spec
    cfg = dict(pretrained_cfg or getattr(model, "pretrained_cfg", None) or {})
    cfg["input_size"] = [spec.in_chans, *spec.img_size]
    cfg = json.loads(json.dumps(cfg, default=str))  # timm cfgs may hold tuples / paths: plain JSON values only
    return {"pretrained_cfg": cfg, "num_classes": int(model.num_classes), "labels": list(labels or [])}


__all__ = ["MODEL_KEY", "REPORT_SUFFIX", "engine_info", "find_model_metadata", "model_metadata", "report_metadata"]
