"""What to serve: a hub-vit model (default model, registered name, model folder, exported ONNX / TensorRT engine)
reduced to the metadata a Triton repository needs (labels, input size, eval transform) plus its weights.

Everything the generated `config.pbtxt` files say comes from here, i.e. from the model's own metadata.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ENGINE_SUFFIXES = (".plan", ".engine")
CROP_MODES = ("center", "squash")


@dataclass(frozen=True)
class ServingMetadata:
    """The served model's contract: classes and the eval transform (timm `pretrained_cfg` semantics)."""

    name: str
    labels: tuple[str, ...]
    input_size: tuple[int, int]  # (H, W) of pixel_values
    crop_pct: float = 0.875
    crop_mode: str = "center"
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

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
    def scale_size(self) -> tuple[int, int]:
        """(H, W) before the centre crop, as timm computes it: floor(size / crop_pct)."""
        return (math.floor(self.input_size[0] / self.crop_pct), math.floor(self.input_size[1] / self.crop_pct))

    @classmethod
    def from_pretrained_cfg(cls, name: str, cfg: dict[str, Any], labels: list[str] | None,
                            num_classes: int | None = None) -> ServingMetadata:
        """Read a timm `pretrained_cfg` / data config (`input_size`, `crop_pct`, `interpolation`, `mean`, `std`)."""
        if "input_size" not in cfg:
            raise ValueError(f"model {name!r}: pretrained_cfg has no 'input_size'; keys present: {sorted(cfg)}")
        channels, height, width = cfg["input_size"]
        if int(channels) != 3:  # clients send photos; the served transform makes RGB (3, H, W)
            raise ValueError(f"model {name!r} takes {channels}-channel input {tuple(cfg['input_size'])}; only RGB "
                             "models (3 channels) can be served")
        count = num_classes if num_classes is not None else cfg.get("num_classes")
        if not labels:
            labels = default_labels(int(count or 0))
        elif count is not None and len(labels) != count:
            raise ValueError(f"model {name!r}: {len(labels)} labels for {count} classes")
        return cls(
            name=name,
            labels=tuple(labels),
            input_size=(int(height), int(width)),
            crop_pct=float(cfg.get("crop_pct") or 0.875),
            crop_mode=str(cfg.get("crop_mode") or "center"),
            interpolation=str(cfg.get("interpolation") or "bilinear"),
            mean=tuple(float(v) for v in cfg.get("mean", (0.5, 0.5, 0.5))),
            std=tuple(float(v) for v in cfg.get("std", (0.5, 0.5, 0.5))),
        )


def default_labels(num_classes: int) -> list[str]:
    """ImageNet class names for 1k/21k heads (timm's tables), else `class_0 ...`."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset({"num_classes": num_classes})
    if subset:
        return list(ImageNetInfo(subset).label_descriptions())
    return [f"class_{i}" for i in range(num_classes)]


@dataclass
class ModelSource:
    """Metadata plus exactly one of: a torch module to export, an ONNX file, a TensorRT engine."""

    metadata: ServingMetadata
    module: torch.nn.Module | None = None
    onnx_path: Path | None = None
    engine_path: Path | None = None
    origin: str = ""
    engine_info: dict[str, Any] | None = None  # `<engine>.json` of `hub-vit export tensorrt`: batch profile, precision

    @classmethod
    def from_module(cls, module: torch.nn.Module, *, name: str, labels: list[str] | None = None,
                    pretrained_cfg: dict[str, Any] | None = None) -> ModelSource:
        """An in-memory model (tests, notebooks). `pretrained_cfg` defaults to the module's own."""
        cfg = pretrained_cfg or dict(getattr(module, "pretrained_cfg", None) or {})
        if "input_size" not in cfg and hasattr(module, "spec"):
            cfg = {**cfg, "input_size": (3, *module.spec.img_size)}
        num_classes = getattr(module, "num_classes", None)
        meta = ServingMetadata.from_pretrained_cfg(name, cfg, labels, num_classes)
        return cls(metadata=meta, module=module, origin=f"in-memory module {name!r}")


def resolve(source: str | Path | None) -> ModelSource:
    """`None` -> the shipped default model; a folder; an `.onnx` / `.plan` file; else a registered model name."""
    if source is None:
        return _default_model()
    path = Path(source).expanduser()
    if path.is_dir():
        return _from_folder(path)
    suffix = path.suffix.lower()  # model.ONNX is an ONNX file too
    if path.is_file() and suffix == ".onnx":
        return _from_exported(path, "onnx")
    if path.is_file() and suffix in ENGINE_SUFFIXES:
        return _from_exported(path, "engine")
    if path.is_file():
        raise ValueError(f"{str(source)!r} is a file but not a model: give a model folder, an .onnx file or a "
                         f"TensorRT engine ({', '.join(ENGINE_SUFFIXES)})")
    if suffix in (".onnx", *ENGINE_SUFFIXES) or "/" in str(source):
        raise ValueError(f"model path {str(source)!r} does not exist (expected a model folder, .onnx or .plan file)")
    return _from_name(str(source))


def _default_model() -> ModelSource:
    from hub_vit.catalog import DEFAULT_MODEL, default_model_folder

    folder = Path(default_model_folder())
    if not (folder / "config.json").is_file():
        raise ValueError(f"the shipped default model {DEFAULT_MODEL!r} is missing from {folder} (not trained into "
                         "this checkout yet?); pass a model name, a model folder or an .onnx file instead")
    return _from_folder(folder)


def _from_folder(folder: Path) -> ModelSource:
    if not (folder / "config.json").is_file():
        graphs = sorted((p for p in folder.iterdir() if p.suffix in (".onnx", *ENGINE_SUFFIXES)),
                        key=lambda p: (p.suffix != ".onnx", p.name))  # ONNX first
        hint = f"; to serve an exported file, name it: {str(graphs[0])!r}" if graphs else ""
        raise ValueError(f"{str(folder)!r} is not a hub-vit model folder (no config.json){hint}")
    from hub_vit.folder import load_model_folder

    model, info = load_model_folder(folder)
    cfg = {"input_size": (3, *model.spec.img_size), **dict(info.pretrained_cfg or {})}
    meta = ServingMetadata.from_pretrained_cfg(folder.name, cfg, list(info.labels or []),
                                               getattr(model, "num_classes", None))
    return ModelSource(metadata=meta, module=model.eval(), origin=str(folder.resolve()))


def _from_name(name: str) -> ModelSource:
    import timm

    import hub_vit.timm_plugin  # noqa: F401  (registers the hub-vit names with timm)
    from hub_vit.catalog import DEFAULT_MODEL, MODELS, get_entry

    base = name.split(".", 1)[0]
    if base not in MODELS:
        raise ValueError(f"unknown model {name!r}: not a file or folder, and not a registered name; "
                         f"valid names: {', '.join(MODELS)}")
    entry = get_entry(base)
    if not entry.weights:
        with_weights = [n for n in MODELS if get_entry(n).weights]
        raise ValueError(f"{base!r} has no published weights to serve (architecture only); serve a trained model "
                         f"folder, or a registered name with weights: {', '.join(with_weights)}")
    if "." in name:
        entry.weight(name.split(".", 1)[1])  # ValueError listing the valid tags
    if base == DEFAULT_MODEL:  # the shipped folder carries the labels too
        return _default_model()
    model = timm.create_model(name, pretrained=True).eval()  # downloads and converts Google's checkpoint
    meta = ServingMetadata.from_pretrained_cfg(name, dict(model.pretrained_cfg), None, model.num_classes)
    return ModelSource(metadata=meta, module=model, origin=f"registered model {name!r}")


def _from_exported(path: Path, kind: str) -> ModelSource:
    """An exported file. Metadata, first found: a hub-vit `config.json` (+ `labels.txt`) beside it (a model folder's);
    what `hub-vit export` recorded (`<engine>.json`, the `<stem>.export.json` report); for ONNX, the graph's shapes
    with Google's defaults for the transform."""
    from hub_vit.export.metadata import engine_info, find_model_metadata

    config_file, labels_file = path.parent / "config.json", path.parent / "labels.txt"
    labels = labels_file.read_text(encoding="utf-8").splitlines() if labels_file.is_file() else None
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        cfg = dict(config.get("pretrained_cfg") or {})
        labels = labels or config.get("label_names")
        num_classes = config.get("num_classes")
    elif (recorded := find_model_metadata(path)) is not None:
        cfg = dict(recorded.get("pretrained_cfg") or {})
        labels = labels or recorded.get("labels") or None
        num_classes = recorded.get("num_classes")
    elif kind == "onnx":
        cfg, num_classes = _onnx_shapes(path)
    else:
        raise ValueError(f"TensorRT engine {str(path)!r} needs its metadata (input size, labels, transform): the "
                         f"{path.name}.json that `hub-vit export tensorrt` writes beside it, or a hub-vit config.json")
    if "input_size" not in cfg and kind == "onnx":
        cfg["input_size"] = _onnx_shapes(path)[0]["input_size"]
    meta = ServingMetadata.from_pretrained_cfg(path.stem, cfg, labels, num_classes)
    if kind == "onnx":
        return ModelSource(metadata=meta, onnx_path=path.resolve(), origin=str(path.resolve()))
    return ModelSource(metadata=meta, engine_path=path.resolve(), origin=str(path.resolve()),
                       engine_info=engine_info(path))


def load_onnx_graph(path: Path) -> Any:
    """The graph of an ONNX file (weights not loaded); a corrupt or truncated file is a ValueError naming it."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        return onnx.load(str(path), load_external_data=False).graph
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{str(path)!r} is not a valid ONNX model (truncated or corrupt?): {exc}") from None


def _onnx_shapes(path: Path) -> tuple[dict[str, Any], int]:
    graph = load_onnx_graph(path)
    # An exporter may list the weights among the inputs too (keep_initializers_as_inputs): those are not fed
    initializers = {tensor.name for tensor in graph.initializer}
    fed = [tensor for tensor in graph.input if tensor.name not in initializers]
    if len(fed) != 1 or len(graph.output) < 1:
        raise ValueError(f"{str(path)!r}: expected a classifier graph with one input (pixel_values) and a logits "
                         f"output, got {len(fed)} inputs and {len(graph.output)} outputs")
    dims = [d.dim_value for d in fed[0].type.tensor_type.shape.dim]  # (B, 3, H, W)
    out = [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim]  # (B, C)
    if len(dims) != 4 or dims[1] != 3 or not dims[2] or not dims[3] or len(out) != 2 or not out[1]:
        raise ValueError(f"{str(path)!r}: expected a fixed-size (B, 3, H, W) -> (B, C) graph, got {dims} -> {out}")
    return {"input_size": (3, dims[2], dims[3])}, out[1]
