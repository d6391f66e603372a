"""hub-vit: Google's Vision Transformers (ViT and SimpleViT) as first-class timm and transformers models.

`import hub_vit` registers every architecture in `hub_vit.catalog.MODELS` with timm and the `hub_vit` model type
with the transformers Auto classes.
"""

from __future__ import annotations

from hub_vit import timm_plugin  # noqa: E402,F401  (side effect: timm registration)
from hub_vit.catalog import DEFAULT_MODEL, MODELS, ModelEntry, Weights, default_model_folder, get_entry
from hub_vit.folder import ModelFolderInfo, load_model_folder, save_model_folder
from hub_vit.model import VisionTransformer, ViTOutput, count_parameters
from hub_vit.variants import SIZES, ViTSpec, parse_variant

__version__ = "0.1.0"

try:  # transformers is a core dependency, but keep `import hub_vit` usable if its import breaks
    from hub_vit import hf  # noqa: F401  (side effect: AutoConfig / AutoModel registration)
except ImportError as exc:  # pragma: no cover - only hit with a broken transformers install
    import warnings

    warnings.warn(f"hub_vit: transformers front door unavailable ({exc})", stacklevel=2)

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
