"""The transformers front door: `HubViTConfig`, `HubViTModel`, `HubViTForImageClassification`,
`HubViTImageProcessor`, registered with the Auto classes when `hub_vit` is imported.

    >>> import hub_vit
    >>> from transformers import AutoModelForImageClassification, pipeline
    >>> model = AutoModelForImageClassification.from_pretrained("path/to/hub-vit-folder")
    >>> pipeline("image-classification", model="path/to/hub-vit-folder")(image)

See docs/transformers.md.
"""

from __future__ import annotations

from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
)

from hub_vit.hf.configuration_hub_vit import HubViTConfig, data_config, timm_architecture
from hub_vit.hf.image_processing_hub_vit import HubViTImageProcessor
from hub_vit.hf.modeling_hub_vit import HubViTForImageClassification, HubViTModel, HubViTPreTrainedModel

# exist_ok: a second `import` of a reloaded module (tests, notebooks) must not fail
AutoConfig.register(HubViTConfig.model_type, HubViTConfig, exist_ok=True)
AutoModel.register(HubViTConfig, HubViTModel, exist_ok=True)
AutoModelForImageClassification.register(HubViTConfig, HubViTForImageClassification, exist_ok=True)
_PROCESSORS = {"torchvision": HubViTImageProcessor, "pil": HubViTImageProcessor}  # one class serves both backends
AutoImageProcessor.register(HubViTConfig, image_processor_classes=_PROCESSORS, exist_ok=True)

__all__ = [
    "HubViTConfig",
    "HubViTForImageClassification",
    "HubViTImageProcessor",
    "HubViTModel",
    "HubViTPreTrainedModel",
    "data_config",
    "timm_architecture",
]
