"""hub-vit: Google's Vision Transformers (ViT and SimpleViT) as first-class timm and transformers models.

`import hub_vit` registers every architecture in `hub_vit.catalog.MODELS` with timm and the `hub_vit` model type
with the transformers Auto classes: at once when timm / transformers is already imported, otherwise as soon as it is
(`hub_vit.registration`). The package itself stays light: the torch-backed names below (`VisionTransformer`,
`load_model_folder`, ...) are imported on first use, so the `hub-vit` client commands start without loading torch.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# ONNX Runtime 1.29+ on Linux sends usage telemetry to Microsoft (mobile.events.data.microsoft.com) and keeps a device
# id and an event cache in ~/.cache/Microsoft from the moment it is imported, unless this is set before; hub-vit's
# exports, CPU variants, demo and served steps (templates/classifier_ort/model.py sets it too) do not phone home. A
# value the user set is kept (0 keeps ONNX Runtime's default). docs/serving.md, "Telemetry".
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from hub_vit import registration  # noqa: E402 (after the line above: nothing here may import onnxruntime first)
from hub_vit.catalog import DEFAULT_MODEL, MODELS, ModelEntry, Weights, default_model_folder, get_entry  # noqa: E402
from hub_vit.variants import SIZES, ViTSpec, parse_variant  # noqa: E402
from hub_vit.version import __version__  # noqa: E402

if TYPE_CHECKING:
    from hub_vit.folder import ModelFolderInfo, load_model_folder, save_model_folder
    from hub_vit.model import VisionTransformer, ViTOutput, count_parameters

# name -> module that defines it (imported on first access: these pull in torch)
_LAZY = {
    "ModelFolderInfo": "hub_vit.folder",
    "load_model_folder": "hub_vit.folder",
    "save_model_folder": "hub_vit.folder",
    "VisionTransformer": "hub_vit.model",
    "ViTOutput": "hub_vit.model",
    "count_parameters": "hub_vit.model",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:  # AttributeError (not another error) lets `from hub_vit import <submodule>` fall back to import
        raise AttributeError(f"module 'hub_vit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "SIZES",
    "ModelEntry",
    "ModelFolderInfo",
    "ViTOutput",
    "ViTSpec",
    "VisionTransformer",
    "Weights",
    "__version__",
    "count_parameters",
    "default_model_folder",
    "get_entry",
    "load_model_folder",
    "parse_variant",
    "save_model_folder",
]

registration.install()  # last: a hook that runs at once (timm already imported) may import hub_vit's submodules
