"""A model's eval transform, defined once: timm's data config, read from the model's `pretrained_cfg`.

Every consumer reads this: the catalog and the conversion writer (what a model folder records), rollout and the
demo (`hub_vit.explain.prepare_image`), the transformers image processors, training's eval transform, and the Triton
repository (its config parameters are rendered from it). The transform is timm's eval path: resize the shorter side
to `floor(size / crop_pct)` (`crop_mode` "center"; "squash" resizes both sides to that; "border" is timm's
letterbox), centre-crop `size`, scale to
[0, 1], then `(x - mean) / std`.

Defaults are Google's evaluation settings (big_vision `resize_small(size / 0.875) | central_crop | value_range(-1,
1)`; vit_jax the same), i.e. mean = std = 0.5, where timm would fall back to ImageNet's statistics: hub-vit's models
are Google's. No torch, no file I/O.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

INTERPOLATIONS: tuple[str, ...] = ("bilinear", "bicubic", "nearest", "lanczos", "box", "hamming")
CROP_MODES: tuple[str, ...] = ("center", "squash", "border")  # timm's; the Triton server serves the first two


@dataclass(frozen=True)
class DataConfig:
    """How a model's inputs are made (timm `pretrained_cfg` fields; `img_size` is (H, W), `in_chans` the C of
    `input_size`)."""

    img_size: tuple[int, int] = (224, 224)
    crop_pct: float = 0.875
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    in_chans: int = 3
    crop_mode: str = "center"

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"unknown interpolation {self.interpolation!r}; valid choices: "
                             f"{', '.join(INTERPOLATIONS)}")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"unsupported crop_mode {self.crop_mode!r}; valid choices: {', '.join(CROP_MODES)}")
        if isinstance(self.crop_pct, bool) or not (isinstance(self.crop_pct, (int, float)) and 0 < self.crop_pct <= 1):
            raise ValueError(f"crop_pct must be a number in (0, 1], got {self.crop_pct!r}")
        if len(self.img_size) != 2 or min(self.img_size) < 1:
            raise ValueError(f"img_size must be (height, width) of positive sizes, got {self.img_size!r}")
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            raise ValueError(f"mean and std need one value per input channel ({self.in_chans}), got mean={self.mean},"
                             f" std={self.std}")
        if any(s == 0 for s in self.std):
            raise ValueError(f"std must not hold 0, got {self.std}")

    @property
    def input_size(self) -> tuple[int, int, int]:
        """(C, H, W), timm's `input_size`."""
        return (self.in_chans, *self.img_size)

    @property
    def scale_size(self) -> tuple[int, int]:
        """(H, W) before the centre crop, as timm computes it: floor(size / crop_pct)."""
        return (math.floor(self.img_size[0] / self.crop_pct), math.floor(self.img_size[1] / self.crop_pct))

    def pretrained_cfg(self) -> dict[str, Any]:
        """The timm `pretrained_cfg` fields this config is read from (what a model folder records)."""
        return dict(input_size=self.input_size, crop_pct=self.crop_pct, crop_mode=self.crop_mode,
                    interpolation=self.interpolation, mean=self.mean, std=self.std)

    def timm_transform_args(self) -> dict[str, Any]:
        """Keyword arguments of `timm.data.create_transform` for this eval transform."""
        return dict(input_size=self.input_size, crop_pct=self.crop_pct, crop_mode=self.crop_mode,
                    interpolation=self.interpolation, mean=self.mean, std=self.std)

    @classmethod
    def from_pretrained_cfg(cls, cfg: dict[str, Any] | None, spec: Any = None) -> DataConfig:
        """timm's `resolve_data_config` reading of a `pretrained_cfg` (may be None or partial): each field the cfg
        has, else the model's own input size (`spec`: a `ViTSpec`) and Google's defaults. One mean / std value is
        used for every channel."""
        if cfg is not None and not isinstance(cfg, dict):
            raise ValueError(f"pretrained_cfg must be an object of timm pretrained_cfg fields, got {cfg!r}")
        cfg = dict(cfg or {})
        default = cls() if spec is None else cls(img_size=tuple(spec.img_size), in_chans=spec.in_chans,
                                                 mean=(0.5,) * spec.in_chans, std=(0.5,) * spec.in_chans)
        size = cfg.get("input_size") or default.input_size
        if not (isinstance(size, (list, tuple)) and len(size) == 3 and all(_is_int(v) and v > 0 for v in size)):
            raise ValueError(f"pretrained_cfg input_size must be (channels, height, width), positive integers, got "
                             f"{size!r}")
        chans = int(size[0])

        def number(value: Any, name: str, shown: Any = None, what: str = "a number") -> float:
            # was float(value): "could not convert string to float: 'x'", naming no field
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"pretrained_cfg {name} must be {what}, got {value if shown is None else shown!r}")
            return float(value)

        def per_channel(value: Any, name: str) -> tuple[float, ...]:
            values = tuple(number(v, name, value, "a number or a list of numbers")
                           for v in (value if isinstance(value, (list, tuple)) else [value]))
            if len(values) == 1:
                return values * chans
            if len(values) < chans:
                raise ValueError(f"pretrained_cfg {name} has {len(values)} values for {chans} input channels")
            return values[:chans]

        def text(name: str, fallback: str) -> str:
            value = cfg.get(name) or fallback
            if not isinstance(value, str):
                raise ValueError(f"pretrained_cfg {name} must be a string, got {value!r}")
            return value

        return cls(
            img_size=(int(size[1]), int(size[2])),
            crop_pct=number(cfg.get("crop_pct") or default.crop_pct, "crop_pct"),
            interpolation=text("interpolation", default.interpolation),
            mean=per_channel(cfg.get("mean", default.mean[0]), "mean"),
            std=per_channel(cfg.get("std", default.std[0]), "std"),
            in_chans=chans,
            crop_mode=text("crop_mode", default.crop_mode),
        )


def _is_int(value: Any) -> bool:
    """An integer (numpy's too), not a bool, which Python counts as one."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


GOOGLE_EVAL = DataConfig()  # Google's evaluation transform at 224: the defaults every field above falls back to

__all__ = ["CROP_MODES", "GOOGLE_EVAL", "INTERPOLATIONS", "DataConfig"]
