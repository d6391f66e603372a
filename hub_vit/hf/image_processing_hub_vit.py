"""`HubViTImageProcessor`: the model's own preprocessing, i.e. timm's eval transform for its data config.

Resize the shorter side to `size / crop_pct` with the configured interpolation, centre-crop to `size`, scale to
[0, 1], normalise with mean = std = 0.5 (so pixels land in [-1, 1], as Google's models expect). The transform is
built by `timm.data.create_transform`, so the transformers pipeline and `timm.data.create_transform(
**timm.data.resolve_data_config(model=m))` produce the same tensor for the same image.

This file is also bundled into saved model folders as transformers remote code (see `hub_vit.hf.remote_code`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.image_transforms import to_pil_image
from transformers.image_utils import make_flat_list_of_images

from hub_vit.image_modes import to_8bit
from hub_vit.resize_bound import check_resize, shorter_side_resize

INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "box", "hamming")
CROP_MODES = ("center", "squash", "border")


class HubViTImageProcessor(BaseImageProcessor):
    """Eval preprocessing of a hub-vit model: resize / centre crop / [-1, 1], built from a timm data config.

    Args:
        size: `{"height": H, "width": W}` of the model input (the crop).
        crop_pct: fraction of the resized image kept by the centre crop (shorter side resized to size / crop_pct).
        interpolation: resize filter, one of `INTERPOLATIONS`.
        crop_mode: timm crop mode, one of `CROP_MODES` (`"center"` for Google's checkpoints).
        image_mean, image_std: per-channel normalisation (0.5 for Google's models).
    """

    model_input_names = ["pixel_values"]

    def __init__(
        self,
        size: dict[str, int] | None = None,
        crop_pct: float = 0.875,
        interpolation: str = "bilinear",
        crop_mode: str = "center",
        image_mean: list[float] | tuple[float, ...] = (0.5, 0.5, 0.5),
        image_std: list[float] | tuple[float, ...] = (0.5, 0.5, 0.5),
        **kwargs: Any,
    ) -> None:
        kwargs.pop("image_processor_type", None)
        self.auto_map: dict[str, str] | None = kwargs.pop("auto_map", None)  # set in saved folders (remote code)
        super().__init__(**kwargs)
        size = dict(size or {"height": 224, "width": 224})
        if set(size) != {"height", "width"} or not all(isinstance(v, int) and v > 0 for v in size.values()):
            raise ValueError(f"size must be {{'height': H, 'width': W}} with positive integers, got {size!r}")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"unknown interpolation {interpolation!r}; valid choices: {', '.join(INTERPOLATIONS)}")
        if crop_mode not in CROP_MODES:
            raise ValueError(f"unknown crop_mode {crop_mode!r}; valid choices: {', '.join(CROP_MODES)}")
        if not (isinstance(crop_pct, (int, float)) and 0 < crop_pct <= 1):
            raise ValueError(f"crop_pct must be a number in (0, 1], got {crop_pct!r}")
        if len(image_mean) != len(image_std):
            raise ValueError(f"image_mean {list(image_mean)} and image_std {list(image_std)} differ in length")
        self.size = size
        self.crop_pct = float(crop_pct)
        self.interpolation = interpolation
        self.crop_mode = crop_mode
        self.image_mean = [float(m) for m in image_mean]
        self.image_std = [float(s) for s in image_std]

    @classmethod
    def from_pretrained_cfg(cls, pretrained_cfg: dict[str, Any]) -> HubViTImageProcessor:
        """Build from a timm `pretrained_cfg` / data config (`input_size`, `crop_pct`, `interpolation`, mean, std)."""
        _, height, width = pretrained_cfg["input_size"]
        return cls(
            size={"height": int(height), "width": int(width)},
            crop_pct=pretrained_cfg.get("crop_pct", 0.875),
            interpolation=pretrained_cfg.get("interpolation", "bilinear"),
            crop_mode=pretrained_cfg.get("crop_mode", "center"),
            image_mean=pretrained_cfg.get("mean", (0.5, 0.5, 0.5)),
            image_std=pretrained_cfg.get("std", (0.5, 0.5, 0.5)),
        )

    def data_config(self) -> dict[str, Any]:
        """The timm data config this processor implements (the kwargs of `timm.data.create_transform`)."""
        return dict(
            input_size=(len(self.image_mean), self.size["height"], self.size["width"]),
            interpolation=self.interpolation,
            mean=tuple(self.image_mean),
            std=tuple(self.image_std),
            crop_pct=self.crop_pct,
            crop_mode=self.crop_mode,
        )

    def transform(self) -> Any:
        """timm's eval transform (PIL image -> normalised CHW float tensor)."""
        from timm.data import create_transform

        return create_transform(**self.data_config(), is_training=False)

    def preprocess(self, images: Any, return_tensors: str | None = "pt", **kwargs: Any) -> BatchFeature:
        """One image or a list (PIL, HWC/CHW numpy or torch, uint8 or [0, 1] floats) -> `pixel_values` (B, C, H, W)."""
        if kwargs:
            raise TypeError(f"unexpected preprocessing argument(s) {sorted(kwargs)}; valid: images, return_tensors")
        if return_tensors not in (None, "pt", "np"):
            raise ValueError(f"return_tensors must be 'pt', 'np' or None, got {return_tensors!r}")
        transform = self.transform()
        channels = len(self.image_mean)
        pixels = []
        for image in make_flat_list_of_images(images):
            pil = image if hasattr(image, "convert") else to_pil_image(_as_numpy(image))
            pil = to_8bit(pil).convert("RGB" if channels == 3 else "L")  # 16-bit grey: scaled, not clipped to white
            self._check_resize(*pil.size)
            pixels.append(transform(pil))  # (C, H, W)
        batch = torch.stack(pixels)  # (B, C, H, W)
        data = {"pixel_values": batch.numpy() if return_tensors == "np" else batch}
        return BatchFeature(data=data, tensor_type=return_tensors)

    def _check_resize(self, width: int, height: int) -> None:
        """`ValueError` if timm's resize would create too many pixels (`hub_vit.resize_bound`; only the centre mode
        with a square input resizes by the shorter side, the other modes have a fixed size)."""
        scale = [math.floor(v / self.crop_pct) for v in (self.size["height"], self.size["width"])]
        if self.crop_mode == "center" and scale[0] == scale[1]:
            check_resize(width, height, *shorter_side_resize(width, height, scale[0]))

    def __call__(self, images: Any, **kwargs: Any) -> BatchFeature:
        return self.preprocess(images, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        keep = ("size", "crop_pct", "interpolation", "crop_mode", "image_mean", "image_std")
        out = {k: getattr(self, k) for k in keep}
        out["image_processor_type"] = type(self).__name__
        if self.auto_map:
            out["auto_map"] = self.auto_map
        return out


def _as_numpy(image: Any) -> np.ndarray:
    """to_pil_image takes uint8 or [0, 1] float arrays, channels first or last."""
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().numpy()
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[0] not in (1, 3) and array.shape[-1] not in (1, 3):
        raise ValueError(f"expected an RGB or grayscale image (H, W, 3) / (3, H, W), got shape {array.shape}")
    return array


__all__ = ["HubViTImageProcessor"]
