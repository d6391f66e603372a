"""`HubViTImageProcessor`: the model's own preprocessing, i.e. timm's eval transform for its data config.

Resize the shorter side to `size / crop_pct` with the configured interpolation, centre-crop to `size`, scale to
[0, 1], normalise with mean = std = 0.5 (so pixels land in [-1, 1], as Google's models expect). The transform is
built by `timm.data.create_transform`, so the transformers pipeline and `timm.data.create_transform(
**timm.data.resolve_data_config(model=m))` produce the same tensor for the same image.

This file is also bundled into saved model folders as transformers remote code (see `hub_vit.hf.remote_code`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, TypedDict

import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.image_transforms import to_pil_image

from hub_vit.image_modes import to_8bit
from hub_vit.resize_bound import check_resize, eval_resize

PREPROCESSOR_FILE = "preprocessor_config.json"
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "box", "hamming")
CROP_MODES = ("center", "squash", "border")


class HubViTImageProcessorKwargs(TypedDict, total=False):
    """The settings `from_pretrained(..., **overrides)` may change; transformers passes exactly these to `__init__`,
    which validates them (others would be set as unchecked attributes)."""

    size: dict[str, int] | int
    crop_pct: float
    interpolation: str
    crop_mode: str
    image_mean: list[float]
    image_std: list[float]


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
    valid_kwargs = HubViTImageProcessorKwargs

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
        if isinstance(size, int) and not isinstance(size, bool):
            size = {"height": size, "width": size}
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
        """One image or a list (PIL; numpy or torch, HWC / CHW / (H, W) grey, uint8, 16-bit grey or [0, 1] floats; a
        4-D array is a batch) -> `pixel_values` (B, C, H, W)."""
        if kwargs:
            raise TypeError(f"unexpected preprocessing argument(s) {sorted(kwargs)}; valid: images, return_tensors")
        if return_tensors not in (None, "pt", "np"):
            raise ValueError(f"return_tensors must be 'pt', 'np' or None, got {return_tensors!r}")
        transform = self.transform()
        channels = len(self.image_mean)
        pixels = []
        batch_images = _flat_images(images)
        if not batch_images:
            raise ValueError("no images given; pass a PIL image, an array or a list of them")
        for image in batch_images:
            pil = image if hasattr(image, "convert") else _to_pil(_as_numpy(image))
            pil = to_8bit(pil).convert("RGB" if channels == 3 else "L")  # 16-bit grey: scaled, not clipped to white
            self._check_resize(*pil.size)
            pixels.append(transform(pil))  # (C, H, W)
        batch = torch.stack(pixels)  # (B, C, H, W)
        data = {"pixel_values": batch.numpy() if return_tensors == "np" else batch}
        return BatchFeature(data=data, tensor_type=return_tensors)

    def _check_resize(self, width: int, height: int) -> None:
        """`ValueError` if timm's resize would create too many pixels (`hub_vit.resize_bound`; only the centre mode
        keeps the aspect ratio, the other modes resize to a fixed size)."""
        scale = [math.floor(v / self.crop_pct) for v in (self.size["height"], self.size["width"])]
        if self.crop_mode == "center":
            check_resize(width, height, *eval_resize(width, height, *scale))

    def __call__(self, images: Any, **kwargs: Any) -> BatchFeature:
        return self.preprocess(images, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        keep = ("size", "crop_pct", "interpolation", "crop_mode", "image_mean", "image_std")
        out = {k: getattr(self, k) for k in keep}
        out["image_processor_type"] = type(self).__name__
        if self.auto_map:
            out["auto_map"] = self.auto_map
        return out


def _to_pil(array: np.ndarray) -> Any:
    if array.ndim == 2 and array.dtype in (np.uint8, np.uint16):
        from PIL import Image

        return Image.fromarray(array)  # mode "L" or "I;16"
    return to_pil_image(array)


def _flat_images(images: Any) -> list[Any]:
    """One image, a (B, ...) array or (nested) lists of them -> a flat list. Arrays of 2 or 3 dims are one image
    ((H, W) grey, (H, W, C) or (C, H, W)); 4 dims are a batch."""
    if hasattr(images, "convert"):  # PIL
        return [images]
    if isinstance(images, (np.ndarray, torch.Tensor)):
        if images.ndim in (2, 3):
            return [images]
        if images.ndim == 4:
            return list(images)
        raise ValueError(f"expected an image array of 2 to 4 dimensions, got shape {tuple(images.shape)}")
    if isinstance(images, (list, tuple)):
        return [image for item in images for image in _flat_images(item)]
    raise ValueError(f"cannot read a {type(images).__name__} as an image; valid: PIL image, numpy array, torch "
                     "tensor, or a list of them")


def _as_numpy(image: Any) -> np.ndarray:
    """to_pil_image takes uint8 or [0, 1] float arrays, channels first or last; (H, W) grey arrays, 16-bit ones
    included, become PIL images directly (to_8bit then scales 16-bit samples as for a 16-bit PNG)."""
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu()
        image = (image.float() if image.dtype in (torch.bfloat16, torch.float16) else image).numpy()  # numpy: no bf16
    array = np.asarray(image)
    if np.issubdtype(array.dtype, np.floating):
        array = _float_to_uint8(array)
    if array.ndim == 2:
        if array.dtype == np.bool_:
            array = array.astype(np.uint8) * 255
        return array if array.dtype in (np.uint8, np.uint16) else array[..., None]  # floats: (H, W, 1)
    if array.ndim == 3 and array.shape[0] not in (1, 3) and array.shape[-1] not in (1, 3):
        alpha = " (drop the alpha channel first: array[..., :3])" if 4 in (array.shape[0], array.shape[-1]) else ""
        raise ValueError(f"expected an RGB or grayscale image (H, W, 3) / (3, H, W) / (H, W), got shape "
                         f"{array.shape}{alpha}")
    return array


def _float_to_uint8(array: np.ndarray) -> np.ndarray:
    """Float pixels are [0, 1], as documented, whatever their values: transformers' `to_pil_image` reads a float array
    whose values are all whole numbers as 0..255, so an all-1.0 (white) image or a 0/1 mask came out black."""
    if array.size and not np.isfinite(array).all():
        raise ValueError("the float image holds NaN or infinite values")
    low, high = (float(array.min()), float(array.max())) if array.size else (0.0, 0.0)
    if low < -1e-3 or high > 1 + 1e-3:
        raise ValueError(f"float images must hold values in [0, 1], got {low:g} .. {high:g}; for 0..255 pixels pass "
                         "uint8 (array.astype(np.uint8)) or divide by 255")
    return np.round(np.clip(array, 0, 1) * 255).astype(np.uint8)


def processor_config(processor: HubViTImageProcessor) -> dict[str, Any]:
    """`preprocessor_config.json` without `image_processor_type` and `auto_map`.

    transformers then finds the processor through `config.json`: the registered class when hub_vit is imported, its
    `auto_map` entry under `trust_remote_code=True`. With an `AutoImageProcessor` auto_map in this file,
    `pipeline()`'s AutoVideoProcessor probe derives a non-existent remote "HubViTVideoProcessor" and stops to ask the
    user interactively whether to run remote code, even though hub_vit is installed.
    """
    return {k: v for k, v in processor.to_dict().items() if k not in ("image_processor_type", "auto_map")}


def write_processor_config(folder: str | os.PathLike, pretrained_cfg: dict[str, Any]) -> None:
    """`preprocessor_config.json` for the processor of a timm data config (crop, resize, mean/std). Lives here, in
    the remote-code bundle, so a model saved by the bundled classes (hub_vit not installed) writes it too."""
    config = processor_config(HubViTImageProcessor.from_pretrained_cfg(pretrained_cfg))
    with open(os.path.join(folder, PREPROCESSOR_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(config, indent=2) + "\n")


__all__ = ["PREPROCESSOR_FILE", "HubViTImageProcessor", "processor_config", "write_processor_config"]
