"""Which models the demo (and `hub-vit rollout`) can show, and loading each one once.

Three kinds of model:
* the shipped default model (`hub_vit.catalog.default_model_folder()`),
* model folders named on the command line (`hub-vit convert` / `hub-vit train` output), loaded with
  `hub_vit.folder.load_model_folder`,
* registered names whose Google checkpoint is already in the local timm/torch-hub cache (`name.tag`); nothing is
  downloaded from the demo.

The list is fixed when the app starts: a browser can pick among these, never name a path of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hub_vit.explain.image import DataConfig
from hub_vit.explain.pipeline import Explainer
from hub_vit.paths import distinct_names

DEFAULT_KEY = "default"


@dataclass(frozen=True)
class ModelChoice:
    """One entry of the model picker: `key` is what the user sees and picks."""

    key: str
    kind: Literal["folder", "registered"]
    target: str  # a folder path, or a registered `name.tag`


def default_model_path() -> Path | None:
    """The shipped default model folder, or None when this build has none (yet)."""
    try:
        from hub_vit.catalog import default_model_folder
    except ImportError:
        return None
    try:
        path = Path(default_model_folder())
    except (FileNotFoundError, ValueError):
        return None
    return path if (path / "config.json").is_file() else None


def folder_choice(folder: str | Path, key: str | None = None) -> ModelChoice:
    """A model folder given by the user; refuses anything that is not one."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ValueError(f"{str(folder)!r} is not a hub-vit model folder (expected config.json and "
                         "model.safetensors in it; make one with `hub-vit convert` or `hub-vit train`)")
    return ModelChoice(key=key or f"folder: {path.resolve().name}", kind="folder", target=str(path.resolve()))


def cached_checkpoint(name: str, tag: str) -> Path | None:
    """Where timm's downloader keeps `name.tag`'s Google checkpoint, if it is already there."""
    import torch

    from hub_vit.catalog import get_entry

    weights = get_entry(name).weight(tag)
    if not weights.gs_url:  # bundled in the package (the default model): offered as a folder instead
        return None
    path = Path(torch.hub.get_dir()) / "checkpoints" / weights.url.rsplit("/", 1)[-1]
    return path if path.is_file() else None


def registered_choices() -> list[ModelChoice]:
    """Registered `name.tag`s whose checkpoint file is in the local cache."""
    from hub_vit.catalog import MODELS

    return [ModelChoice(key=f"{e.name}.{w.tag}", kind="registered", target=f"{e.name}.{w.tag}")
            for e in MODELS.values() for w in e.weights if cached_checkpoint(e.name, w.tag)]


def discover_choices(folders: Sequence[str | Path] = ()) -> list[ModelChoice]:
    """The default model (if shipped), the given folders, then cached registered checkpoints."""
    choices: list[ModelChoice] = []
    default = default_model_path()
    if default is not None:
        choices.append(ModelChoice(key=DEFAULT_KEY, kind="folder", target=str(default)))
    found = {Path(folder_choice(folder).target): None for folder in folders}  # checked, resolved, once each
    for path, name in zip(found, distinct_names(list(found)), strict=True):
        choices.append(folder_choice(path, key=f"folder: {name}"))
    return choices + registered_choices()


def resolve_choice(model: str | None, choices: Sequence[ModelChoice] = ()) -> ModelChoice:
    """For the CLI: None -> the default model; a folder path; a registered `name.tag`; or a key of `choices`."""
    if model is None or model == DEFAULT_KEY:
        default = default_model_path()
        if default is None:
            raise ValueError("no default model is shipped in this build; pass --model with a model folder or a "
                             "registered name.tag whose checkpoint is cached")
        return ModelChoice(key=DEFAULT_KEY, kind="folder", target=str(default))
    for choice in choices:
        if choice.key == model:
            return choice
    if Path(model).expanduser().is_dir():
        return folder_choice(model)
    from hub_vit.catalog import MODELS

    name, _, tag = model.partition(".")
    if name in MODELS:
        entry = MODELS[name]
        tag = tag or (entry.weights[0].tag if entry.weights else "")
        if not tag:
            raise ValueError(f"{name!r} has no published weights; pass a model folder instead")
        weights = entry.weight(tag)  # raises, listing the valid tags
        if weights.file and Path(weights.file).parent.joinpath("config.json").is_file():
            # shipped inside the package (the default model): its folder has the labels and the input recipe
            return folder_choice(Path(weights.file).parent, key=f"{name}.{tag}")
        if cached_checkpoint(name, tag) is None:
            raise ValueError(f"the checkpoint of {name}.{tag} is not in the local cache; download it once with "
                             f"`timm.create_model('{name}.{tag}', pretrained=True)` or convert it to a folder")
        return ModelChoice(key=f"{name}.{tag}", kind="registered", target=f"{name}.{tag}")
    raise ValueError(f"{model!r} is neither a model folder nor a registered name; valid names: {', '.join(MODELS)}")


def _imagenet_labels(num_classes: int) -> list[str]:
    from timm.data import ImageNetInfo

    subset = {1000: "imagenet-1k", 21843: "imagenet-21k-goog"}.get(num_classes)
    if subset is None:
        return [f"class {i}" for i in range(num_classes)]
    info = ImageNetInfo(subset)
    return [info.index_to_description(i) for i in range(num_classes)]


def load_explainer(choice: ModelChoice) -> Explainer:
    """Load the model behind `choice` (CPU, eval mode) with its labels and input recipe."""
    if choice.kind == "folder":
        from hub_vit.folder import load_model_folder

        model, info = load_model_folder(choice.target)
        data = DataConfig.from_pretrained_cfg(dict(info.pretrained_cfg), model.spec)
        return Explainer(model=model, labels=list(info.labels or []), data=data, name=choice.key,
                         info={"path": str(info.path), "architecture": info.architecture})
    import timm

    import hub_vit.timm_plugin  # noqa: F401  (registers the names with timm)

    model = timm.create_model(choice.target, pretrained=True)  # from the local cache (checked when listed)
    data = DataConfig.from_pretrained_cfg(dict(model.pretrained_cfg), model.spec)
    return Explainer(model=model, labels=_imagenet_labels(model.num_classes), data=data, name=choice.key,
                     info={"architecture": choice.target})


class ModelCache:
    """Loads each model once; safe to call from the demo's worker threads."""

    def __init__(self, choices: Sequence[ModelChoice]) -> None:
        self.choices = {c.key: c for c in choices}
        self._loaded: dict[str, Explainer] = {}
        self._lock = threading.Lock()

    @property
    def keys(self) -> list[str]:
        return list(self.choices)

    def get(self, key: str) -> Explainer:
        if key not in self.choices:
            raise ValueError(f"unknown model {key!r}; valid choices: {', '.join(self.choices) or 'none'}")
        with self._lock:  # one load at a time; a second request for the same model waits and reuses it
            if key not in self._loaded:
                self._loaded[key] = load_explainer(self.choices[key])
            return self._loaded[key]
