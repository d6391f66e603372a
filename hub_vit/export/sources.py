"""What `hub-vit export` can read: a registered model name, a hub-vit model folder, or a weights file + a name.

`load_source("vit_s16")`, `load_source("runs/digits")`, `load_source("w.safetensors", model_name="vit_s16")`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub_vit.model import VisionTransformer

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".npz", ".pt", ".pth", ".bin")
RANDOM_INIT = "random init"  # `ModelSource.weights` of a registered name exported without published weights


@dataclass
class ModelSource:
    """The model to export plus where it came from (recorded in the export report) and its labels, if known."""

    model: VisionTransformer
    kind: str  # "registered" | "folder" | "weights"
    name: str
    weights: str  # a path, "pretrained <tag>", or RANDOM_INIT
    labels: list[str] = field(default_factory=list)
    pretrained_cfg: dict[str, Any] = field(default_factory=dict)

    @property
    def random_weights(self) -> bool:
        return self.weights == RANDOM_INIT

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "weights": self.weights, "spec": self.model.spec.to_dict()}


def _entry(name: str) -> Any:
    from hub_vit.catalog import MODELS, get_entry

    try:
        return get_entry(name)
    except KeyError:
        raise ValueError(f"unknown model {name!r}: not a registered name, a model folder or a weights file "
                         f"({', '.join(WEIGHT_SUFFIXES)}); registered names: {', '.join(MODELS)}") from None


def load_source(source: str | Path, *, model_name: str | None = None, pretrained: bool | None = None) -> ModelSource:
    """Build the model to export.

    * a folder -> `hub_vit.folder.load_model_folder` (weights, spec and labels from the folder);
    * a weights file -> the registered architecture `model_name` with those weights loaded strictly;
    * a registered name (optionally `name.tag`) -> timm's builder. `pretrained=None`: a `name.tag` loads that tag's
      published weights (downloaded, or `DownloadError` offline); a bare name loads weights only when the entry
      ships them in the package (no download), otherwise the weights are random. `pretrained=False` (`--random`)
      always gives random weights. Random weights get a non-zero head (big_vision initialises it to zero, which
      would make every logit 0 and verification vacuous).
    """
    path = Path(source)
    if path.is_dir():
        from hub_vit.folder import load_model_folder

        model, info = load_model_folder(path)
        return ModelSource(model, "folder", info.architecture, str(path / "model.safetensors"), list(info.labels),
                           dict(info.pretrained_cfg))
    if path.suffix.lower() in WEIGHT_SUFFIXES:
        if not path.is_file():
            raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
        if model_name is None:
            from hub_vit.catalog import MODELS

            raise ValueError(f"a weights file needs the architecture: pass --model NAME (one of {', '.join(MODELS)})")
        from hub_vit.conversion import load_checkpoint
        from hub_vit.weights import load_adapted_state_dict

        entry = _entry(model_name)
        model = VisionTransformer(entry.spec)
        load_adapted_state_dict(model, load_checkpoint(path, spec=entry.spec))
        return ModelSource(model.eval(), "weights", entry.name, str(path))
    name = str(source)
    if model_name is not None and model_name != name:
        raise ValueError(f"--model {model_name!r} is only for weights files; {name!r} is not a weights file")
    entry = _entry(name)
    tag = name.split(".", 1)[1] if "." in name else None
    if tag is not None:
        entry.weight(tag)  # ValueError listing the valid tags
    if pretrained is None:
        pretrained = _pretrained_by_default(entry, tag)
    if pretrained and not entry.weights:
        raise ValueError(f"{entry.name!r} has no published weights (architecture only); drop --pretrained to export "
                         "it with random weights, or export a trained model folder")
    if pretrained:
        import timm

        import hub_vit  # noqa: F401  (registers the timm entry points)

        model = timm.create_model(name, pretrained=True)
        # Weights shipped in a model folder (the default model) carry their class names beside them.
        weights_file = (model.pretrained_cfg or {}).get("file")
        labels_file = Path(weights_file).parent / "labels.txt" if weights_file else None
        labels = labels_file.read_text(encoding="utf-8").splitlines() if labels_file and labels_file.is_file() else []
        return ModelSource(model.eval(), "registered", name, f"pretrained {tag or entry.weights[0].tag}", labels,
                           pretrained_cfg=dict(model.pretrained_cfg))
    model = VisionTransformer(entry.spec.replace(head_zeroinit=False))
    return ModelSource(model.eval(), "registered", entry.name, RANDOM_INIT)


def _pretrained_by_default(entry: Any, tag: str | None) -> bool:
    """Whether a registered name loads published weights when neither --pretrained nor --random is given.

    A `name.tag` names published weights, so it gets them: exporting random weights under it (the old default for
    tags not shipped in the package) looked like a pretrained export, exit 0. A bare name gets the weights the
    package ships (no download), else random weights, as documented.
    """
    if tag is not None:
        return True
    return any(getattr(w, "file", "") and Path(w.file).is_file() for w in entry.weights)


__all__ = ["RANDOM_INIT", "WEIGHT_SUFFIXES", "ModelSource", "load_source"]
