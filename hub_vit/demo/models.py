"""Which models the demo (and `hub-vit rollout`) can show, and loading each one once.

Three kinds of model:
* the shipped default model (`hub_vit.catalog.default_model_folder()`),
* model folders named on the command line (`hub-vit convert` / `hub-vit train` output), loaded with
  `hub_vit.folder.load_model_folder`,
* registered names whose Google checkpoint is already in hub-vit's download cache (`name.tag`): exactly those
  `timm.create_model(name.tag, pretrained=True)` loads without a network (`hub_vit.timm_plugin` fetches through
  `hub_vit.conversion.download`, whose cache this is). They are loaded from that file; nothing is ever downloaded
  from the demo.

The list is fixed when the app starts: a browser can pick among these, never name a path of its own.
"""

from __future__ import annotations

import json
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


class ModelLoadError(ValueError):
    """A listed model could not be loaded (damaged weights, no classifier head, its checkpoint gone from the cache);
    the message names the model and the reason."""


def no_head_message(what: str) -> str:
    return (f"{what} has no classifier head (num_classes=0): the demo and `hub-vit rollout` need one for the labels "
            "and the class-specific map; give a classifier (`hub-vit convert` of a fine-tuned checkpoint, or "
            "`hub-vit train`)")


def folder_choice(folder: str | Path, key: str | None = None) -> ModelChoice:
    """A model folder given by the user; refuses anything that is not one, and a folder without a classifier head."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ValueError(f"{str(folder)!r} is not a hub-vit model folder (expected config.json and "
                         "model.safetensors in it; make one with `hub-vit convert` or `hub-vit train`)")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{str(folder)!r}: config.json is not readable JSON ({exc})") from exc
    if isinstance(config, dict) and config.get("num_classes") == 0:  # refused at start-up, not on the first click
        raise ValueError(no_head_message(f"model folder {str(folder)!r}"))
    return ModelChoice(key=key or f"folder: {path.resolve().name}", kind="folder", target=str(path.resolve()))


def checkpoint_path(name: str, tag: str) -> Path | None:
    """Where hub-vit's downloader keeps `name.tag`'s Google checkpoint (`$HUB_VIT_CACHE/downloads/...`): the file
    `timm.create_model(name.tag, pretrained=True)` loads (`hub_vit.timm_plugin._fetch`), whether it is there or not.
    None for weights bundled in the package (the default model, offered as a folder instead)."""
    from hub_vit.catalog import get_entry
    from hub_vit.conversion.download import cached_path, gs_to_https

    weights = get_entry(name).weight(tag)
    return cached_path(gs_to_https(weights.url)) if weights.gs_url else None


def cached_checkpoint(name: str, tag: str) -> Path | None:
    """`checkpoint_path(name, tag)` if the file is there, else None."""
    path = checkpoint_path(name, tag)
    return path if path is not None and path.is_file() else None


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
            from hub_vit.conversion.download import hand_download_commands

            path = checkpoint_path(name, tag)
            assert path is not None  # bundled weights returned above
            curl, _ = hand_download_commands(weights.url, path)
            raise ValueError(f"the checkpoint of {name}.{tag} is not in hub-vit's download cache (expected at "
                             f"{path}; HUB_VIT_CACHE moves it) and is never downloaded from here. Fetch it once "
                             f"with network: `hub-vit convert {name}.{tag} -o DIR` and "
                             f"`timm.create_model('{name}.{tag}', pretrained=True)` both leave it there; or by hand: "
                             f"`{curl}`")
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
    """Load the model behind `choice` (CPU, eval mode) with its labels and input recipe.

    `ModelLoadError` naming the model and the reason for anything that keeps it from being shown: damaged or missing
    files, no classifier head, a registered checkpoint no longer in the download cache."""
    try:
        explainer = _load(choice)
    except ModelLoadError:
        raise
    except Exception as exc:  # safetensors, torch, JSON and OS errors alike: one readable line, not a bare "Error"
        first = next((line for line in str(exc).splitlines() if line.strip()), "").strip()
        reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        raise ModelLoadError(f"cannot load model {choice.key!r} ({choice.target}): {reason}") from exc
    if explainer.model.spec.num_classes == 0:
        raise ModelLoadError(no_head_message(f"model {choice.key!r}"))
    return explainer


def _load(choice: ModelChoice) -> Explainer:
    if choice.kind == "folder":
        from hub_vit.folder import load_model_folder

        model, info = load_model_folder(choice.target)
        data = DataConfig.from_pretrained_cfg(dict(info.pretrained_cfg), model.spec)
        return Explainer(model=model, labels=list(info.labels or []), data=data, name=choice.key,
                         info={"path": str(info.path), "architecture": info.architecture})
    import timm

    import hub_vit.timm_plugin  # noqa: F401  (registers the names with timm)

    name, _, tag = choice.target.partition(".")
    path = cached_checkpoint(name, tag)
    if path is None:  # listed at start-up, deleted since: say so rather than download inside a page request
        raise ModelLoadError(f"cannot load model {choice.key!r}: its checkpoint is no longer in hub-vit's download "
                             f"cache ({checkpoint_path(name, tag)})")
    # The same file and conversion as `pretrained=True` alone, but named: timm never goes to the network from here
    model = timm.create_model(choice.target, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    data = DataConfig.from_pretrained_cfg(dict(model.pretrained_cfg), model.spec)
    return Explainer(model=model, labels=_imagenet_labels(model.num_classes), data=data, name=choice.key,
                     info={"architecture": choice.target})


def served_choice(model: str | None) -> ModelChoice | None:
    """What `hub-vit serve MODEL` serves, as a demo choice: the default model (None), a model folder, or a registered
    `name.tag` (serve itself has just put its checkpoint into the download cache). None for an exported .onnx /
    .plan file: the demo runs models in PyTorch and cannot show that one."""
    if model is not None and Path(model).expanduser().is_file():
        return None
    return resolve_choice(model)


def with_choice(choices: Sequence[ModelChoice], wanted: ModelChoice) -> tuple[list[ModelChoice], str]:
    """`choices` with `wanted` in it (first, if it was not there yet) and the key it goes by: the same folder or
    registered name offered twice (`default` and `simplevit_digits.sklearn_digits`) keeps the first key."""
    def same(a: ModelChoice, b: ModelChoice) -> bool:
        if a.kind != b.kind:
            return False
        return Path(a.target).resolve() == Path(b.target).resolve() if a.kind == "folder" else a.target == b.target

    for choice in choices:
        if same(choice, wanted):
            return list(choices), choice.key
    return [wanted, *choices], wanted.key


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
            if key not in self._loaded:  # a failed load (ModelLoadError) is not kept: the next request tries again
                self._loaded[key] = load_explainer(self.choices[key])
            return self._loaded[key]
