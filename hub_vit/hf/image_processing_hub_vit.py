"""`HubViTImageProcessor`: the model's own preprocessing, i.e. timm's eval transform for its data config.

Resize the shorter side to `size / crop_pct` with the configured interpolation, centre-crop to `size`, scale to
[0, 1], normalise with mean = std = 0.5 (so pixels land in [-1, 1], as Google's models expect). The transform is
built by `timm.data.create_transform`, so the transformers pipeline and `timm.data.create_transform(
**timm.data.resolve_data_config(model=m))` produce the same tensor for the same image.

Like transformers' ViT processor, every setting can be given to one call (`processor(image, do_resize=False)`) or to
`from_pretrained(folder, do_normalize=False)`; the `do_*` switches drop one step of timm's recipe.

This file is also bundled into saved model folders as transformers remote code (see `hub_vit.hf.remote_code`).
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import warnings
from typing import Any, TypedDict

import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.image_transforms import to_pil_image

from hub_vit.data_config import CROP_MODES, GOOGLE_EVAL, INTERPOLATIONS, DataConfig
from hub_vit.image_modes import to_8bit
from hub_vit.network import load_cache_only_when_unreachable
from hub_vit.resize_bound import check_resize, eval_resize

PREPROCESSOR_FILE = "preprocessor_config.json"
# Steps of the recipe a call (or the constructor) may switch off; transformers' names (ViT / CLIP processors)
FLAGS = ("do_resize", "do_center_crop", "do_rescale", "do_normalize")
# Every setting of the processor; each can also be given to one call, and to from_pretrained
SETTINGS = ("size", "crop_pct", "interpolation", "crop_mode", "image_mean", "image_std", *FLAGS)
# ViT's `resample` (PIL.Image.Resampling / transformers' PILImageResampling values) -> `interpolation`
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
CALL_OPTIONS = (*SETTINGS, "resample")
# Options of transformers' own image processors (its ImagesKwargs, and the keys of its size dicts) that this one does
# not take. from_pretrained warns about these; any other unused keyword (dtype, code_revision, model kwargs:
# pipeline() passes them all) is ignored silently, as by ViT's processor.
_FOREIGN_OPTIONS = ("rescale_factor", "crop_size", "do_pad", "pad_size", "do_convert_rgb", "default_to_square",
                    "data_format", "input_data_format", "device", "disable_grouping", "image_seq_length",
                    "height", "width", "shortest_edge", "longest_edge")


class HubViTImageProcessorKwargs(TypedDict, total=False):
    """The settings `from_pretrained(..., **overrides)` may change; transformers passes exactly these to `__init__`,
    which validates them (others would be set as unchecked attributes)."""

    size: dict[str, int] | int
    crop_pct: float
    interpolation: str
    crop_mode: str
    image_mean: list[float]
    image_std: list[float]
    do_resize: bool
    do_center_crop: bool
    do_rescale: bool
    do_normalize: bool
    resample: int


def _data_config_settings(data: DataConfig) -> dict[str, Any]:
    """The processor settings that do exactly `data`'s eval transform."""
    return dict(size={"height": data.img_size[0], "width": data.img_size[1]}, crop_pct=data.crop_pct,
                interpolation=data.interpolation, crop_mode=data.crop_mode, image_mean=list(data.mean),
                image_std=list(data.std))


class HubViTImageProcessor(BaseImageProcessor):
    """Eval preprocessing of a hub-vit model: resize / centre crop / [-1, 1], built from a timm data config.

    Args:
        size: `{"height": H, "width": W}` of the model input (the crop); an int is a square.
        crop_pct: fraction of the resized image kept by the centre crop (shorter side resized to size / crop_pct).
        interpolation: resize filter, one of `INTERPOLATIONS`; `resample` (ViT's name, a `PIL.Image.Resampling`
            value) is accepted instead.
        crop_mode: timm crop mode, one of `CROP_MODES` (`"center"` for Google's checkpoints).
        image_mean, image_std: per-channel normalisation (0.5 for Google's models).
        do_resize, do_center_crop, do_rescale, do_normalize: switch one step of the recipe off (transformers'
            names): no resize, no crop, pixels kept in 0..255 instead of [0, 1], no mean/std.

    Every setting can also be passed to one call, `processor(image, do_resize=False)`, without changing the processor.
    """

    model_input_names = ["pixel_values"]
    valid_kwargs = HubViTImageProcessorKwargs

    def __init__(
        self,
        size: dict[str, int] | int | None = None,
        crop_pct: float = GOOGLE_EVAL.crop_pct,
        interpolation: str | None = None,
        crop_mode: str = GOOGLE_EVAL.crop_mode,
        image_mean: list[float] | tuple[float, ...] | float = GOOGLE_EVAL.mean,
        image_std: list[float] | tuple[float, ...] | float = GOOGLE_EVAL.std,
        do_resize: bool = True,
        do_center_crop: bool = True,
        do_rescale: bool = True,
        do_normalize: bool = True,
        resample: int | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("image_processor_type", None)
        self.auto_map: dict[str, str] | None = kwargs.pop("auto_map", None)  # set in saved folders (remote code)
        super().__init__(**kwargs)
        settings = _check_settings(
            size=size, crop_pct=crop_pct, interpolation=interpolation, crop_mode=crop_mode, image_mean=image_mean,
            image_std=image_std, do_resize=do_resize, do_center_crop=do_center_crop, do_rescale=do_rescale,
            do_normalize=do_normalize, resample=resample,
        )
        self.size: dict[str, int] = settings["size"]
        self.crop_pct: float = settings["crop_pct"]
        self.interpolation: str = settings["interpolation"]
        self.crop_mode: str = settings["crop_mode"]
        self.image_mean: list[float] = settings["image_mean"]
        self.image_std: list[float] = settings["image_std"]
        self.do_resize: bool = settings["do_resize"]
        self.do_center_crop: bool = settings["do_center_crop"]
        self.do_rescale: bool = settings["do_rescale"]
        self.do_normalize: bool = settings["do_normalize"]
        # (settings, transform) for the processor's own settings: built once, rebuilt if an attribute is changed
        self._own_transform: tuple[dict[str, Any], Any] | None = None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' `from_pretrained`; a Hub repo id while the Hub cannot be reached (an offline switch on, or no
        connection within a few seconds) loads from the local cache only, at once, with a warning; not cached,
        `HubUnreachableError` says both (was: huggingface_hub's retries, 47 s, then transformers' words)."""
        path = pretrained_model_name_or_path
        return load_cache_only_when_unreachable(
            path, kwargs, lambda given: super(HubViTImageProcessor, cls).from_pretrained(path, *args, **given),
            PREPROCESSOR_FILE)

    @classmethod
    def from_dict(cls, image_processor_dict: dict[str, Any], **kwargs: Any) -> Any:
        """transformers' `from_dict` (what `from_pretrained(folder, **overrides)` calls). It passes the overrides
        named in `valid_kwargs` to `__init__` and drops the rest silently; here a dropped one that is an image
        processor option of transformers' own processors (`rescale_factor`, `crop_size`, `shortest_edge`, ...) or a
        misspelt setting is named in a warning, with the valid ones."""
        image_processor_dict = dict(image_processor_dict)
        if "pretrained_cfg" in image_processor_dict and "size" not in image_processor_dict:
            # a model folder's config.json, not its preprocessor_config.json: transformers (5.25 on) reads a local
            # folder whose config.json has a timm `pretrained_cfg` as a timm checkpoint and hands the processor that
            # file. Its data config is the processor (the defaults, 224 px, answered the digits model's 32 px images)
            image_processor_dict = _data_config_settings(
                DataConfig.from_pretrained_cfg(image_processor_dict["pretrained_cfg"]))
        if kwargs.get("resample") is not None and "interpolation" not in kwargs:
            image_processor_dict.pop("interpolation", None)  # the override replaces the saved filter
        valid = set(HubViTImageProcessorKwargs.__annotations__)
        ignored = [k for k in kwargs if k not in valid and k != "return_unused_kwargs"
                   and (k in _FOREIGN_OPTIONS or difflib.get_close_matches(k, valid, n=1, cutoff=0.8))]
        if not ignored:
            return super().from_dict(image_processor_dict, **kwargs)
        warnings.warn(f"{cls.__name__}.from_pretrained ignores {sorted(ignored)}: not settings of this processor; "
                      f"valid settings: {', '.join(CALL_OPTIONS)}", UserWarning, stacklevel=3)
        # kept from transformers, which would set the ones that name a class attribute (`rescale_factor`) on the
        # instance, where nothing reads them, and log that they "were applied"
        dropped = {k: kwargs.pop(k) for k in ignored}
        result = super().from_dict(image_processor_dict, **kwargs)
        if kwargs.get("return_unused_kwargs"):
            processor, unused = result
            return processor, {**unused, **dropped}
        return result

    @classmethod
    def from_pretrained_cfg(cls, pretrained_cfg: dict[str, Any]) -> HubViTImageProcessor:
        """Build from a timm `pretrained_cfg` / data config, read as `hub_vit.data_config.DataConfig` reads it."""
        return cls.from_data_config(DataConfig.from_pretrained_cfg(pretrained_cfg))

    @classmethod
    def from_data_config(cls, data: DataConfig) -> HubViTImageProcessor:
        """The processor doing exactly the model's one eval transform."""
        return cls(**_data_config_settings(data))

    def settings(self, **options: Any) -> dict[str, Any]:
        """This processor's settings, with one call's `options` (validated; None = the processor's own) in place."""
        own = {name: getattr(self, name) for name in SETTINGS}
        options = {k: v for k, v in options.items() if v is not None}
        if not options:
            return own
        merged = {**own, **options}
        if "resample" in options and "interpolation" not in options:
            merged["interpolation"] = None  # ViT's name for the filter replaces the processor's own
        return _check_settings(**merged, channels=len(self.image_mean))

    def data_config(self) -> dict[str, Any]:
        """The timm data config this processor implements (the kwargs of `timm.data.create_transform`); the
        `do_*` switches are not part of it (timm's recipe always has every step)."""
        return _data_config(self.settings())

    def transform(self, **options: Any) -> Any:
        """The transform for a PIL image -> (C, H, W) float tensor: timm's eval transform for this processor's data
        config, with the steps a `do_*` switch turns off left out. Built once for the processor's own settings;
        `options` (those of one call) get a transform of their own, and the processor is not changed."""
        own = self.settings()
        settings = self.settings(**options)
        if settings != own:
            return _build_transform(settings)
        cached = getattr(self, "_own_transform", None)  # (absent on a processor pickled by an older hub-vit)
        if cached is None or cached[0] != own:
            # keyed on a copy: `own` holds the attributes' own dict and lists, and `processor.size["height"] = 160`
            # (transformers' idiom) changes them in place, which a key sharing them would never see
            cached = self._own_transform = (copy.deepcopy(own), _build_transform(own))
        return cached[1]

    def preprocess(self, images: Any, return_tensors: str | None = "pt", device: str | torch.device | None = None,
                   **options: Any) -> BatchFeature:
        """One image or a list (PIL; numpy or torch, HWC / CHW / (H, W) grey, uint8, 16-bit grey or [0, 1] floats; a
        4-D array is a batch) -> `pixel_values` (B, C, H, W); `return_tensors=None` gives a list of (C, H, W)
        tensors, as ViT's processor does. `device`: where the tensors go (transformers' processors take it; the
        preparation itself runs on the CPU). `options`: any setting (`SETTINGS`, or ViT's `resample`), for this
        call."""
        unknown = sorted(set(options) - set(CALL_OPTIONS))
        if unknown:
            raise TypeError(f"unexpected preprocessing argument(s) {unknown}; valid: images, return_tensors, device, "
                            f"{', '.join(CALL_OPTIONS)}")
        target = None if device is None else torch.device(device)  # a bad name fails here, before any image work
        if target is not None and target.type != "cpu" and return_tensors == "np":
            raise ValueError(f"device={str(device)!r} needs torch tensors; numpy arrays (return_tensors='np') live on "
                             "the CPU")
        if return_tensors not in (None, "pt", "np"):
            raise ValueError(f"return_tensors must be 'pt', 'np' or None, got {return_tensors!r}")
        settings = self.settings(**options)
        transform = self.transform(**options)
        channels = len(self.image_mean)
        pixels = []
        batch_images = _flat_images(images)
        if not batch_images:
            raise ValueError("no images given; pass a PIL image, an array or a list of them")
        for image in batch_images:
            pil = _check_float_mode(image) if hasattr(image, "convert") else _to_pil(_as_numpy(image))
            pil = to_8bit(pil).convert("RGB" if channels == 3 else "L")  # 16-bit grey: scaled, not clipped to white
            if settings["do_resize"]:
                _check_resize(settings, *pil.size)
            pixels.append(transform(pil))  # (C, H, W)
        if target is not None:
            pixels = [p.to(target) for p in pixels]
        if return_tensors is None:
            return BatchFeature(data={"pixel_values": pixels})
        shapes = sorted({tuple(p.shape) for p in pixels})
        if len(shapes) > 1:
            raise ValueError(f"the images have different sizes after preprocessing ({shapes}), so they cannot form "
                             "one batch; keep do_resize / do_center_crop on, or pass return_tensors=None for a list")
        batch = torch.stack(pixels)  # (B, C, H, W)
        data = {"pixel_values": batch.numpy() if return_tensors == "np" else batch}
        return BatchFeature(data=data, tensor_type=return_tensors)

    def __call__(self, images: Any, **kwargs: Any) -> BatchFeature:
        return self.preprocess(images, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        keep = ("size", "crop_pct", "interpolation", "crop_mode", "image_mean", "image_std")
        out = {k: getattr(self, k) for k in keep}
        # a switched-off step is saved; the defaults are not, so model folders keep their preprocessor_config.json
        out.update({flag: False for flag in FLAGS if not getattr(self, flag)})
        out["image_processor_type"] = type(self).__name__
        if self.auto_map:
            out["auto_map"] = self.auto_map
        return out


def _check_settings(size: Any, crop_pct: Any, interpolation: Any, crop_mode: Any, image_mean: Any, image_std: Any,
                    do_resize: Any, do_center_crop: Any, do_rescale: Any, do_normalize: Any, resample: Any = None,
                    channels: int | None = None) -> dict[str, Any]:
    """Validate and normalise one set of settings (the constructor's, or a call's merged with the processor's).

    `channels` is the processor's channel count when checking one call's options: a call may not change it (the
    model's in_chans); a single number for `image_mean` / `image_std` applies to every channel, as in ViT.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        size = {"height": size, "width": size}
    size = dict(size or {"height": GOOGLE_EVAL.img_size[0], "width": GOOGLE_EVAL.img_size[1]})
    if set(size) != {"height", "width"} or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                   for v in size.values()):
        raise ValueError(f"size must be {{'height': H, 'width': W}} with positive integers, got {size!r} (the shorter "
                         "side is resized to size / crop_pct, then centre-cropped to size; 'shortest_edge' and "
                         "'longest_edge' are not supported)")
    if resample is not None:
        name = resample if isinstance(resample, str) else None
        if isinstance(resample, int) and not isinstance(resample, bool):  # PIL.Image.Resampling is an IntEnum
            name = RESAMPLE.get(int(resample))
        if name not in INTERPOLATIONS:
            raise ValueError(f"unknown resample {resample!r}; valid: a PIL.Image.Resampling value "
                             f"({', '.join(f'{k}={v}' for k, v in RESAMPLE.items())}) or an interpolation name")
        if interpolation is not None and interpolation != name:
            raise ValueError(f"resample={resample!r} ({name}) and interpolation={interpolation!r} disagree; pass one")
        interpolation = name
    interpolation = GOOGLE_EVAL.interpolation if interpolation is None else interpolation
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; valid choices: {', '.join(INTERPOLATIONS)}")
    if crop_mode not in CROP_MODES:
        raise ValueError(f"unknown crop_mode {crop_mode!r}; valid choices: {', '.join(CROP_MODES)}")
    if isinstance(crop_pct, bool) or not (isinstance(crop_pct, (int, float)) and 0 < crop_pct <= 1):
        raise ValueError(f"crop_pct must be a number in (0, 1], got {crop_pct!r}")
    flags = {"do_resize": do_resize, "do_center_crop": do_center_crop, "do_rescale": do_rescale,
             "do_normalize": do_normalize}
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    sequences = [len(v) for v in (image_mean, image_std) if not isinstance(v, (int, float))]
    n = channels or (sequences[0] if sequences else 3)
    stats = {}
    for name, value in (("image_mean", image_mean), ("image_std", image_std)):
        values = [value] * n if isinstance(value, (int, float)) and not isinstance(value, bool) else list(value)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise ValueError(f"{name} must be numbers, got {value!r}")
        if channels is not None and len(values) != channels:
            raise ValueError(f"{name} has {len(values)} values, but this processor's images have {channels} channels "
                             f"(the model's in_chans); pass {channels} values or one number")
        stats[name] = [float(v) for v in values]
    if len(stats["image_mean"]) != len(stats["image_std"]):
        raise ValueError(f"image_mean {stats['image_mean']} and image_std {stats['image_std']} differ in length")
    if not all(s > 0 for s in stats["image_std"]):
        raise ValueError(f"image_std must be positive, got {stats['image_std']}")
    return dict(size=size, crop_pct=float(crop_pct), interpolation=interpolation, crop_mode=crop_mode, **stats,
                **{name: bool(value) for name, value in flags.items()})


def _data_config(settings: dict[str, Any]) -> dict[str, Any]:
    """The kwargs of `timm.data.create_transform` for one set of settings (checked by `_check_settings`)."""
    return DataConfig(img_size=(settings["size"]["height"], settings["size"]["width"]),
                      crop_pct=settings["crop_pct"], interpolation=settings["interpolation"],
                      mean=tuple(settings["image_mean"]), std=tuple(settings["image_std"]),
                      in_chans=len(settings["image_mean"]), crop_mode=settings["crop_mode"]).timm_transform_args()


def _build_transform(settings: dict[str, Any]) -> Any:
    """timm's eval transform (PIL image -> normalised (C, H, W) float tensor); each `do_*` switch that is off drops
    its step from timm's own list: resize (`Resize` / `ResizeKeepRatio`), crop (`CenterCrop` / `CenterCropOrPad`),
    the [0, 1] scaling of `ToTensor` (replaced by a float tensor of the 0..255 values) and `Normalize`."""
    from timm.data import create_transform

    transform = create_transform(**_data_config(settings), is_training=False)
    if all(settings[flag] for flag in FLAGS):
        return transform
    from timm.data.transforms import CenterCropOrPad, ResizeKeepRatio
    from torchvision import transforms

    kinds = {"do_resize": (transforms.Resize, ResizeKeepRatio), "do_center_crop": (transforms.CenterCrop,
             CenterCropOrPad), "do_rescale": (transforms.ToTensor,), "do_normalize": (transforms.Normalize,)}
    steps, found = [], set()
    for step in transform.transforms:
        flag = next((name for name, types in kinds.items() if isinstance(step, types)), None)
        found.add(flag)
        if flag is None or settings[flag]:
            steps.append(step)
        elif flag == "do_rescale":
            steps.append(_unscaled_tensor)
    missing = [flag for flag in FLAGS if not settings[flag] and flag not in found]
    if missing:  # a timm whose eval transform is built from other steps: say so rather than ignore the switch
        raise RuntimeError(f"cannot apply {missing}: timm's eval transform has no such step ({transform})")
    return transforms.Compose(steps)


def _unscaled_tensor(pil: Any) -> torch.Tensor:
    """PIL image -> (C, H, W) float32 tensor of the 0..255 values: ToTensor without its division by 255."""
    from torchvision.transforms.functional import pil_to_tensor

    return pil_to_tensor(pil).float()


def _check_resize(settings: dict[str, Any], width: int, height: int) -> None:
    """`ValueError` if timm's resize would create too many pixels (`hub_vit.resize_bound`; only the centre mode
    keeps the aspect ratio, the other modes resize to a fixed size)."""
    scale = [math.floor(v / settings["crop_pct"]) for v in (settings["size"]["height"], settings["size"]["width"])]
    if settings["crop_mode"] == "center":
        check_resize(width, height, *eval_resize(width, height, *scale))


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
    if array.dtype == np.bool_:  # a mask: True is white (to_pil_image read a 3-D one as 0 or 1 of 255: black)
        array = array.astype(np.uint8) * 255
    if np.issubdtype(array.dtype, np.floating):
        array = _float_to_uint8(array)
    if array.ndim == 2:
        return array if array.dtype in (np.uint8, np.uint16) else array[..., None]  # floats: (H, W, 1)
    if array.ndim == 3 and array.shape[0] not in (1, 3) and array.shape[-1] not in (1, 3):
        # RGBA: as a PIL image it is composited onto white like every transparent image; slicing the alpha off would
        # show the colours hidden pixels keep
        alpha = (" (for RGBA pass PIL.Image.fromarray(array, 'RGBA'), channels last: transparent pixels become "
                 "white)") if 4 in (array.shape[0], array.shape[-1]) else ""
        raise ValueError(f"expected an RGB or grayscale image (H, W, 3) / (3, H, W) / (H, W), got shape "
                         f"{array.shape}{alpha}")
    return array


def _check_float_mode(image: Any) -> Any:
    """A PIL image, refused when it is a float image (mode "F") Pillow would misread: Pillow takes its values as
    0..255 (`convert("F")` of a greyscale image makes them so) and clips the rest, so one holding [0, 1], the range
    float arrays have here, came out black."""
    if getattr(image, "mode", None) != "F":
        return image
    low, high = image.getextrema()
    if not (np.isfinite(low) and np.isfinite(high)):
        raise ValueError("the float image (PIL mode 'F') holds NaN or infinite values")
    if 0 < high <= 1 or low < 0 or high > 255:
        raise ValueError(f"a PIL float image (mode 'F') holding {low:g} .. {high:g}: Pillow reads such images as "
                         "0..255 and clips the rest; pass its array (np.asarray(image)), read as [0, 1] floats, or "
                         "image.point(lambda v: v * 255) for a [0, 1] one")
    return image


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
