"""`Explainer`: one loaded model plus its labels and input recipe; image in, labels and rollout pictures out.

Shared by `hub-vit rollout` and the Gradio demo so both show exactly the same thing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from hub_vit.data_config import DataConfig
from hub_vit.explain.grad_rollout import gradient_rollout
from hub_vit.explain.image import PreparedImage, prepare_image
from hub_vit.explain.overlay import blend
from hub_vit.explain.rollout import RolloutResult, attention_rollout


def distinct_labels(labels: list[str]) -> list[str]:
    """Each label once: a name several classes share gets its class index, `crane (134)` and `crane (517)` (timm's
    ImageNet-1k names), so a top-5 keyed by name keeps both and a picked name maps back to the right class."""
    counts = Counter(labels)
    return [f"{label} ({i})" if counts[label] > 1 else label for i, label in enumerate(labels)]


@dataclass
class Explainer:
    """A hub-vit `VisionTransformer` in eval mode, its class names and its `DataConfig`."""

    model: torch.nn.Module
    labels: list[str]
    data: DataConfig
    name: str = "model"
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model.eval()
        n = self.model.spec.num_classes
        if len(self.labels) != n:  # a folder without labels.txt, or a mismatch: fall back to class indices
            self.labels = [f"class {i}" for i in range(n)]
        self.labels = distinct_labels(self.labels)

    @property
    def depth(self) -> int:
        return self.model.spec.depth

    def prepare(self, image: Any) -> PreparedImage:
        return prepare_image(image, self.data)

    def rollout(self, prepared: PreparedImage | list[PreparedImage], head_fusion: str = "mean",
                discard_ratio: float = 0.0) -> RolloutResult:
        batch = prepared if isinstance(prepared, list) else [prepared]
        return attention_rollout(self.model, torch.stack([p.tensor for p in batch]), head_fusion, discard_ratio)

    def class_map(self, prepared: PreparedImage, label: int | None = None) -> RolloutResult:
        return gradient_rollout(self.model, prepared.tensor[None], None if label is None else [label])

    def top_k(self, logits: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
        """(num_classes,) logits of one image -> [(label, probability)] best first."""
        probs = logits.detach().float().softmax(dim=-1)
        values, idx = probs.topk(min(k, probs.numel()))
        return [(self.labels[i], float(v)) for v, i in zip(values.tolist(), idx.tolist(), strict=True)]

    def label_index(self, label: str | int) -> int:
        if isinstance(label, int) or (isinstance(label, str) and label.isdigit() and label not in self.labels):
            index = int(label)
            if not 0 <= index < len(self.labels):
                raise ValueError(f"label index {index} out of range; valid: 0..{len(self.labels) - 1}")
            return index
        if label not in self.labels:
            shown = ", ".join(repr(x) for x in self.labels[:20]) + (" ..." if len(self.labels) > 20 else "")
            raise ValueError(f"unknown label {label!r}; valid labels: {shown}")
        return self.labels.index(label)

    def overlay(self, prepared: PreparedImage, relevance: torch.Tensor, alpha: float = 0.5, colormap: str = "jet",
                max_side: int | None = None, min_side: int | None = None) -> np.ndarray:
        """(H, W, 3) uint8 at the original image's size, heat on the model's crop.

        For display (the demo): `max_side` scales big photos down, `min_side` scales tiny images (a 32 px digit) up
        with nearest-neighbour so their pixels stay visible; both keep the aspect ratio and move the crop box along.
        """
        image, box = prepared.image, prepared.box
        long_side = max(image.size)
        scale = 1.0
        if max_side is not None and long_side > max_side:  # no 24-megapixel arrays per request
            scale = max_side / long_side
        elif min_side is not None and long_side < min_side:
            scale = min_side / long_side
        if scale != 1.0:
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            resample = Image.Resampling.BILINEAR if scale < 1 else Image.Resampling.NEAREST
            image = image.resize(size, resample)
            box = (box[0] * scale, box[1] * scale, box[2] * scale, box[3] * scale)
        return blend(image, relevance, box, alpha, colormap)
