"""Which models the demo (and `hub-vit rollout`) can show, and loading each one once.

Three kinds of model:
* the shipped default model (`hub_vit.catalog.default_model_folder()`),
* model folders named on the command line (`hub-vit convert` / `hub-vit train` output), loaded with
  `hub_vit.folder.load_model_folder`,
* registered names whose Google checkpoint is already in hub-vit's download cache (`name.tag`): exactly those
  `timm.create_model(name.tag, pretrained=True)` loads without a network (`hub_vit.timm_plugin` fetches through
  `hub_vit.conversion.download`, whose cache this is). They are loaded from that file; nothing is ever downloaded
  from the demo.

The list is fixed when the app starts: a browser can pick among these, never name a path of its own. Each entry is
checked by `hub_vit.resolve.locate` at start-up and loaded by `hub_vit.resolve.resolve_model` on first use (the one
model resolver; nothing is downloaded from here: `download=False`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from PIL import Image

from hub_vit.domain import Domain, check_domain_record, read_domain
from hub_vit.explain.pipeline import Explainer
from hub_vit.hub_models import is_hub_reference
from hub_vit.paths import distinct_names
from hub_vit.resolve import ModelRef, cached_checkpoint, checkpoint_path, locate, resolve_model
from hub_vit.server.protocol import UNKNOWN_DOMAIN, domain_verdict

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


def folder_choice(folder: str | Path) -> ModelChoice:
    """A model folder given by the user (local, or `hf-hub:ORG/NAME`: fetched now); refuses anything that is not one,
    and a folder without a classifier head."""
    if is_hub_reference(str(folder)):
        return _choice(locate(str(folder)), str(folder))
    path = Path(folder).expanduser()
    if not path.exists():
        raise ValueError(f"model folder {str(folder)!r} does not exist")
    ref = locate(path) if path.is_dir() else None
    if ref is None or ref.folder is None:
        raise ValueError(f"{str(folder)!r} is not a hub-vit model folder (expected config.json and "
                         "model.safetensors in it; make one with `hub-vit convert` or `hub-vit train`)")
    return _checked_folder(ref.folder, f"folder: {ref.folder.name}", f"model folder {str(folder)!r}")


def _checked_folder(path: Path, key: str, what: str) -> ModelChoice:
    """A folder choice, refused at start-up (not on the first click) when it is not a hub-vit model's (a transformers
    or timm folder), the model has no classifier head, or its weights file is truncated or damaged (its header says
    so: read without loading a tensor), as `hub-vit rollout` and `export` refuse it. A file damaged after start-up is
    named when the model is picked."""
    from hub_vit.folder import check_model_type, read_config_json
    from hub_vit.weights_check import read_safetensors_header

    try:
        config = read_config_json(path / "config.json")
    except OSError as exc:
        raise ValueError(f"{str(path)!r}: config.json is not readable ({exc})") from exc
    check_model_type(config, path / "config.json")  # a transformers or timm folder, as rollout and serve refuse it
    if config.get("num_classes") == 0:
        raise ValueError(no_head_message(what))
    read_safetensors_header(path / "model.safetensors")  # ValueError naming the file: "truncated or corrupt"
    check_domain_record(path)  # a damaged domain.json: its verdicts cannot be given, as rollout and serve refuse it
    return ModelChoice(key=key, kind="folder", target=str(path))


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
    found: dict[Path, ModelChoice] = {}  # checked, resolved, once each
    for folder in folders:
        choice = folder_choice(folder)
        found.setdefault(Path(choice.target), choice)
    local = [path for path, choice in found.items() if not is_hub_reference(choice.key)]  # a Hub model keeps its key
    names = dict(zip(local, distinct_names(local), strict=True))
    choices += [replace(choice, key=f"folder: {names[path]}") if path in names else choice
                for path, choice in found.items()]
    return choices + registered_choices()


def resolve_choice(model: str | None, choices: Sequence[ModelChoice] = ()) -> ModelChoice:
    """For the CLI: None -> the default model; a key of `choices`; else what `hub_vit.resolve.locate` makes of it (a
    model folder, or a registered `name[.tag]` whose checkpoint is cached or shipped)."""
    if model is None or model == DEFAULT_KEY:
        default = default_model_path()
        if default is None:
            raise ValueError("no default model is shipped in this build; pass --model with a model folder or a "
                             "registered name.tag whose checkpoint is cached")
        return ModelChoice(key=DEFAULT_KEY, kind="folder", target=str(default))
    for choice in choices:
        if choice.key == model:
            return choice
    # a registered checkpoint is never downloaded here (`hub-vit convert` fetches it); a Hub model the user names is
    # fetched now, at start-up, into huggingface_hub's cache, and is a model folder from then on
    return _choice(locate(model, download=is_hub_reference(model), takes=frozenset({"folder"})), model)


def _choice(ref: ModelRef, model: str) -> ModelChoice:
    if ref.kind == "folder" and ref.folder is not None:  # a Hub model goes by its reference, not its snapshot's hash
        key = ref.hub or f"folder: {ref.folder.name}"
        return _checked_folder(ref.folder, key, f"model {model!r}" if ref.hub else f"model folder {model!r}")
    if ref.kind != "registered":
        raise ValueError(f"{model!r} is an exported or weights file ({ref.kind}); the demo and `hub-vit rollout` "
                         "run a model folder or a registered name in PyTorch")
    from hub_vit.catalog import get_entry

    entry = get_entry(ref.target.partition(".")[0])
    if not entry.weights:
        raise ValueError(f"{entry.name!r} has no published weights; pass a model folder instead")
    key = f"{entry.name}.{ref.tag or entry.weights[0].tag}"
    if ref.folder is not None:  # shipped inside the package (the default model): its folder has labels and recipe
        return _checked_folder(ref.folder, key, f"model {key!r}")
    return ModelChoice(key=key, kind="registered", target=key)


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
    if choice.kind == "registered":
        name, _, tag = choice.target.partition(".")
        if cached_checkpoint(name, tag) is None:  # listed at start-up, deleted since: say so, never download here
            raise ModelLoadError(f"cannot load model {choice.key!r}: its checkpoint is no longer in hub-vit's "
                                 f"download cache ({checkpoint_path(name, tag)})")
    model = resolve_model(choice.target, download=False)  # the one resolver: module, labels, data config
    info = ({"path": str(model.folder), "architecture": model.architecture} if model.folder is not None
            else {"architecture": choice.target})
    return Explainer(model=model.module, labels=list(model.labels), data=model.data, name=choice.key, info=info)


def model_domain(explainer: Explainer) -> Domain:
    """What the loaded model knows and its out-of-domain calibration (`hub_vit.domain.read_domain`). A damaged
    `domain.json` (since start-up) is a ModelLoadError naming the model: like damaged weights, it keeps the model
    from being shown, rather than shown with a verdict ("unknown") that hides the damage."""
    try:
        return read_domain(explainer.info.get("path"), explainer.labels)
    except ValueError as exc:
        raise ModelLoadError(f"cannot load model {explainer.name!r}: {exc}") from None


def served_choice(model: str | None) -> ModelChoice | None:
    """What `hub-vit serve MODEL` serves, as a demo choice: the default model (None), a model folder, or a registered
    `name.tag` (serve itself has just put its checkpoint into the download cache, or a Hub model into
    huggingface_hub's: neither is asked for again). None for an exported .onnx / .plan file: the demo runs models in
    PyTorch and cannot show that one."""
    if model is None:
        return resolve_choice(None)
    ref = locate(model, download=False)
    return None if ref.kind in ("onnx", "engine") else _choice(ref, model)


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


def in_process_verdicts(explainer: Explainer, images: Sequence[Image.Image],
                        domain: Domain) -> list[tuple[str, float | None]]:
    """The in-process model's out-of-domain verdict and score per image (unknown without a calibration), from the
    same features and statistics the served steps use: what the demo and `hub-vit rollout` show beside the labels."""
    if domain.statistics is None:
        return [(UNKNOWN_DOMAIN, None)] * len(images)
    from hub_vit.domain_fit import image_features

    scores = domain.statistics.scores(image_features(explainer.model, list(images), explainer.data).token_means)
    return [(domain_verdict(float(score), domain.statistics.threshold), float(score)) for score in scores]
