"""What a Triton repository needs to know of the served model: its labels and its eval transform.

The model itself is resolved by `hub_vit.resolve.resolve_model` (a registered name, a model folder, an exported ONNX
file or TensorRT engine); `serving_metadata` reduces that to `ServingMetadata`, checked against what the served
preprocessing can do. Everything the generated `config.pbtxt` files say comes from here, i.e. from the model's own
`hub_vit.data_config.DataConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hub_vit.data_config import GOOGLE_EVAL, DataConfig

if TYPE_CHECKING:
    from hub_vit.resolve import ResolvedModel

CROP_MODES = ("center", "squash")  # the crop modes the served preprocessing implements (timm's "border" is not)


@dataclass(frozen=True)
class ServingMetadata:
    """The served model's contract: classes and the eval transform (timm `pretrained_cfg` semantics)."""

    name: str
    labels: tuple[str, ...]
    input_size: tuple[int, int]  # (H, W) of pixel_values
    crop_pct: float = GOOGLE_EVAL.crop_pct
    crop_mode: str = GOOGLE_EVAL.crop_mode
    interpolation: str = GOOGLE_EVAL.interpolation
    mean: tuple[float, float, float] = GOOGLE_EVAL.mean
    std: tuple[float, float, float] = GOOGLE_EVAL.std

    def __post_init__(self) -> None:
        if not self.labels:
            raise ValueError(f"model {self.name!r} has no classes; only classifiers (num_classes > 0) can be served")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"model {self.name!r}: unsupported crop_mode {self.crop_mode!r}; valid: {CROP_MODES}")
        if len(self.mean) != 3 or len(self.std) != 3:  # the served transform normalises RGB
            raise ValueError(f"model {self.name!r}: mean and std must have 3 values (RGB), got mean={self.mean}, "
                             f"std={self.std}")
        if not 0 < self.crop_pct <= 1:
            raise ValueError(f"model {self.name!r}: crop_pct must be in (0, 1], got {self.crop_pct!r}")
        if self.crop_mode == "center" and self.input_size[0] != self.input_size[1]:
            raise ValueError(f"model {self.name!r}: crop_mode 'center' is served for square inputs only, got "
                             f"{self.input_size}; valid for non-square inputs: 'squash'")

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def data(self) -> DataConfig:
        """The eval transform as the one data config (which also checks interpolation and crop_pct)."""
        return DataConfig(img_size=self.input_size, crop_pct=self.crop_pct, interpolation=self.interpolation,
                          mean=self.mean, std=self.std, crop_mode=self.crop_mode)

    @property
    def scale_size(self) -> tuple[int, int]:
        """(H, W) before the centre crop, as timm computes it: floor(size / crop_pct)."""
        return self.data.scale_size

    @classmethod
    def from_data(cls, name: str, data: DataConfig, labels: list[str] | tuple[str, ...]) -> ServingMetadata:
        """The served view of a model's data config; only RGB models (3 channels) can be served."""
        if data.in_chans != 3:  # clients send photos; the served transform makes RGB (3, H, W)
            raise ValueError(f"model {name!r} takes {data.in_chans}-channel input {data.input_size}; only RGB "
                             "models (3 channels) can be served")
        return cls(name=name, labels=tuple(labels), input_size=data.img_size, crop_pct=data.crop_pct,
                   crop_mode=data.crop_mode, interpolation=data.interpolation, mean=data.mean,
                   std=data.std)

    @classmethod
    def from_pretrained_cfg(cls, name: str, cfg: dict[str, Any], labels: list[str] | None,
                            num_classes: int | None = None) -> ServingMetadata:
        """Read a timm `pretrained_cfg` / data config as `DataConfig.from_pretrained_cfg` does; labels default to
        `hub_vit.class_names.default_labels`."""
        from hub_vit.class_names import default_labels

        if "input_size" not in cfg:
            raise ValueError(f"model {name!r}: pretrained_cfg has no 'input_size'; keys present: {sorted(cfg)}")
        count = num_classes if num_classes is not None else cfg.get("num_classes")
        if not labels:
            labels = default_labels(int(count or 0))
        elif count is not None and len(labels) != count:
            raise ValueError(f"model {name!r}: {len(labels)} labels for {count} classes")
        return cls.from_data(name, DataConfig.from_pretrained_cfg(cfg), labels)


def serving_metadata(model: ResolvedModel) -> ServingMetadata:
    """What the repository serves for a resolved model."""
    return ServingMetadata.from_data(model.name, model.data, model.labels)



def graph_model(meta: ServingMetadata, graph: str | Path, kind: Literal["onnx", "engine"] = "onnx",
                engine_info: dict[str, Any] | None = None) -> ResolvedModel:
    """An exported graph to serve with metadata given by hand (an A/B benchmark, a test), as a resolved model."""
    from hub_vit.resolve import ResolvedModel

    path = Path(graph)
    return ResolvedModel(name=meta.name, kind=kind, labels=meta.labels, data=meta.data, origin=str(path),
                         graph=path, weights=str(path), engine_info=engine_info)


__all__ = ["CROP_MODES", "ServingMetadata", "graph_model", "serving_metadata"]
