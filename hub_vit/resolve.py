"""One model reference: whatever a user names, turned into one resolved model.

`resolve_model(reference)` takes a registered name or `name.tag`, a hub-vit model folder (local, or on the Hugging Face
Hub as `hf-hub:ORG/NAME[@REVISION]`), an exported `.onnx` file, a TensorRT engine (`.plan` / `.engine`), a Google
`.npz` checkpoint or a weights file (with `model_name`), or None for the shipped default model, and returns a
`ResolvedModel`: the torch module or the graph path, the class names, the eval transform
(`hub_vit.data_config.DataConfig`, read from the model's `pretrained_cfg`) and where it came from.
`hub-vit export`, `serve` / `repository`, `rollout`, `classify --explain` and the demo all go through it.

`locate(reference)` is the cheap half: it checks and classifies the reference (every bad-input message below) without
loading anything, so a list of models (the demo's picker) is checked at start-up and loaded on first use. A Hub model
is fetched there (`hub_vit.hub_models.hub_folder`: into huggingface_hub's cache, once), and is a folder from then on.

Layer: above the model folder and the weight formats, below conversion / export / server / CLI / demo.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hub_vit.class_names import default_labels
from hub_vit.data_config import DataConfig
from hub_vit.hub_models import PREFIX, hub_folder, is_hub_reference, repo_name
from hub_vit.repo_id import REPO_ID

if TYPE_CHECKING:
    import torch

Kind = Literal["registered", "folder", "onnx", "engine", "npz", "weights", "module"]
ENGINE_SUFFIXES: tuple[str, ...] = (".plan", ".engine")
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".npz", ".pt", ".pth", ".bin")
# what a model given as a path may be: a model folder, an exported graph (.onnx / TensorRT engine), a weights file
PATH_KINDS: frozenset[str] = frozenset({"folder", "graph", "weights"})
RANDOM_INIT = "random init"  # `ResolvedModel.weights` of a registered name built without published weights


@dataclass(frozen=True)
class ModelRef:
    """A checked reference, nothing loaded: `target` is a registered `name[.tag]` or an absolute path; `folder` the
    model folder behind it (a folder, or a registered name whose weights ship as one); `model_name` the architecture
    of a weights file."""

    kind: Kind
    target: str
    folder: Path | None = None
    model_name: str | None = None
    hub: str | None = None  # the `hf-hub:ORG/NAME[@REVISION]` a folder was fetched for (its snapshot in the cache)

    @property
    def name(self) -> str:
        if self.kind == "registered":
            return self.target
        if self.hub is not None:  # not the snapshot's folder name, a commit hash
            return repo_name(self.hub)
        path = Path(self.target)
        return path.name if self.kind == "folder" else path.stem

    @property
    def tag(self) -> str | None:
        """The `.tag` a registered reference names, if any."""
        return self.target.partition(".")[2] or None if self.kind == "registered" else None


@dataclass
class ResolvedModel:
    """A model ready to use: exactly one of `module` (a hub-vit `VisionTransformer`) and `graph` (an ONNX file or
    TensorRT engine), plus its class names (one per class), its eval transform and its provenance."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    data: DataConfig
    origin: str  # a resolved path, or "registered model 'name.tag'"
    module: torch.nn.Module | None = None
    graph: Path | None = None
    folder: Path | None = None  # the model folder the module was loaded from, if any
    weights: str = ""  # a path, "pretrained <tag>", or RANDOM_INIT (export reports record it)
    architecture: str = ""  # the registered architecture name, or "hub_vit" for a generic spec
    pretrained_cfg: dict[str, Any] = field(default_factory=dict)
    engine_info: dict[str, Any] | None = None  # `<engine>.json` of `hub-vit export tensorrt`: profile, precision

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def onnx_path(self) -> Path | None:
        return self.graph if self.kind == "onnx" else None

    @property
    def engine_path(self) -> Path | None:
        return self.graph if self.kind == "engine" else None

    @property
    def random_weights(self) -> bool:
        return self.weights == RANDOM_INIT

    @functools.cached_property
    def weights_digest(self) -> str:
        """The module's `hub_vit.weights_digest.state_dict_digest`, computed once for this resolved model (it hashes
        every weight: seconds for a ViT-B). ValueError for a graph, which has no module."""
        if self.module is None:
            raise ValueError(f"{self.origin} is an exported graph ({self.kind}): it has no module weights to digest")
        from hub_vit.weights_digest import state_dict_digest

        return state_dict_digest(self.module.state_dict())

    def describe(self) -> dict[str, Any]:
        """Provenance for reports: kind, name, weights and (for a module) the spec."""
        spec = getattr(self.module, "spec", None)
        return {"kind": self.kind, "name": self.name, "weights": self.weights,
                **({"spec": spec.to_dict()} if spec is not None else {})}

    @classmethod
    def from_module(cls, module: torch.nn.Module, *, name: str, labels: list[str] | None = None,
                    pretrained_cfg: dict[str, Any] | None = None) -> ResolvedModel:
        """An in-memory model (tests, notebooks). `pretrained_cfg` defaults to the module's own."""
        cfg = dict(pretrained_cfg or getattr(module, "pretrained_cfg", None) or {})
        return _from_module(module, name=name, kind="module", labels=labels, cfg=cfg,
                            origin=f"in-memory module {name!r}", weights="in memory")


def locate(reference: str | Path | None, *, model_name: str | None = None, download: bool = True,
           takes: frozenset[str] = PATH_KINDS, names_architecture: bool = True) -> ModelRef:
    """Check and classify `reference` (see the module docstring); nothing is loaded. `download=False` accepts a
    registered checkpoint only when it is in hub-vit's download cache already (or ships in the package).
    `takes`: the kinds of path the caller can use (`PATH_KINDS`: serve takes all; export no graph; rollout and the
    demo a folder only), which its refusals of a path offer. `names_architecture`: whether the caller can name a
    weights file's architecture (`model_name`, export's --model); serve and repository cannot, so their refusal of a
    weights file without one says how to make it a model folder instead."""
    if reference is None:
        return _default_ref()
    if not isinstance(reference, (str, Path)):  # e.g. a module: its repr would be taken for a path
        raise TypeError(f"a model reference is a name or a path, not a {type(reference).__name__}; an in-memory "
                        "model goes through ResolvedModel.from_module")
    text = str(reference)
    if is_hub_reference(text):
        if model_name is not None:
            raise ValueError(f"--model {model_name!r} is only for weights files; {text!r} is a Hub model folder")
        return replace(_folder_ref(hub_folder(text, download=download), text), hub=text)
    path = Path(text).expanduser()
    suffix = path.suffix.lower()  # model.ONNX is an ONNX file too
    if path.is_dir():
        ref = _folder_ref(path, text)
    elif path.is_file():
        ref = _file_ref(path, text, suffix, model_name, takes, names_architecture)
    elif suffix in (".onnx", *ENGINE_SUFFIXES, *WEIGHT_SUFFIXES) or "/" in text:
        raise ValueError(f"model path {text!r} does not exist (expected {_takes(takes)}){_hub_hint(text)}")
    else:
        if model_name is not None and model_name != text:
            raise ValueError(f"--model {model_name!r} is only for weights files; {text!r} is not a weights file")
        return _registered_ref(text, download)
    if model_name is not None and ref.kind not in ("npz", "weights"):
        raise ValueError(f"--model {model_name!r} is only for weights files; {text!r} is not a weights file")
    return ref


def resolve_model(reference: str | Path | ModelRef | None, *, model_name: str | None = None,
                  pretrained: bool | None = True, download: bool = True) -> ResolvedModel:
    """Load what `reference` names (a `ModelRef` from `locate`, or anything `locate` takes).

    `pretrained` matters only for registered names: True (serve, rollout, the demo) loads published weights (a bare
    name: its first tag) and refuses an architecture without any; False gives random weights; None (`hub-vit
    export`'s default) loads a `name.tag`'s weights and a bare name's only where they ship in the package, else
    random ones. Random weights get a non-zero head (big_vision's zero head would make every logit 0).
    `download=False` never goes to the network: a registered checkpoint must be in the download cache."""
    ref = reference if isinstance(reference, ModelRef) else locate(reference, model_name=model_name,
                                                                    download=download)
    if ref.kind == "folder":
        return _load_folder(ref.folder or Path(ref.target), kind="folder", name=ref.name)
    if ref.kind == "registered":
        return _load_registered(ref, pretrained, download)
    if ref.kind in ("onnx", "engine"):
        return _load_graph(Path(ref.target), ref.kind)
    return _load_weights(ref)


# ---------------------------------------------------------------------------------------------------- locating
def _default_ref() -> ModelRef:
    from hub_vit.catalog import DEFAULT_MODEL, default_model_folder

    folder = Path(default_model_folder())
    if not (folder / "config.json").is_file():
        raise ValueError(f"the shipped default model {DEFAULT_MODEL!r} is missing from {folder} (not trained into "
                         "this checkout yet?); pass a model name, a model folder or an .onnx file instead")
    return ModelRef("folder", str(folder.resolve()), folder=folder.resolve())


def _folder_ref(path: Path, text: str) -> ModelRef:
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        graphs = sorted((p for p in path.iterdir() if p.suffix.lower() in (".onnx", *ENGINE_SUFFIXES)),
                        key=lambda p: (p.suffix.lower() != ".onnx", p.name))  # ONNX first
        # said of the file, not as advice to every caller: rollout, export and the demo need a model folder
        hint = (f"; it holds an exported file, which `hub-vit serve` and `hub-vit repository` take: {str(graphs[0])!r}"
                if graphs else _sharded(path))
        raise ValueError(f"{text!r} is not a hub-vit model folder (expected config.json and model.safetensors in "
                         f"it; make one with `hub-vit convert` or `hub-vit train`){hint}")
    return ModelRef("folder", str(path.resolve()), folder=path.resolve())


def _hub_hint(text: str) -> str:
    """For a missing path shaped like a Hub repo id (`my-org/tiny-vit`): how to name the Hub's model instead."""
    return f"; a model on the Hugging Face Hub is named {PREFIX}{text}" if REPO_ID.match(text) else ""


def _sharded(path: Path) -> str:
    """What to do with a folder whose weights transformers' `save_pretrained` split into shards (past its
    `max_shard_size`), which hub-vit's loaders, reading one `model.safetensors`, do not take; "" for any other."""
    from hub_vit.folder import SAVE_WHOLE, weight_shards  # an error's path: the folder module imports torch

    shards = weight_shards(path)
    if not shards:
        return ""
    return (f"; its weights are split into {len(shards)} shards, as save_pretrained writes them past its "
            f"max_shard_size: {SAVE_WHOLE}")


def _takes(takes: frozenset[str]) -> str:
    """What a model given as a path may be, for a caller that `takes` these `PATH_KINDS`."""
    unknown = takes - PATH_KINDS
    if unknown or not takes:
        raise ValueError(f"unknown path kind(s) {sorted(unknown)}; valid: {', '.join(sorted(PATH_KINDS))}")
    offered = {"folder": "a model folder", "graph": f"an .onnx file, a TensorRT engine ({', '.join(ENGINE_SUFFIXES)})",
               "weights": f"a weights file ({', '.join(WEIGHT_SUFFIXES)})"}
    names = [offered[kind] for kind in ("folder", "graph", "weights") if kind in takes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _file_ref(path: Path, text: str, suffix: str, model_name: str | None,
              takes: frozenset[str] = PATH_KINDS, names_architecture: bool = True) -> ModelRef:
    if suffix == ".onnx":
        return ModelRef("onnx", str(path.resolve()))
    if suffix in ENGINE_SUFFIXES:
        return ModelRef("engine", str(path.resolve()))
    if suffix in WEIGHT_SUFFIXES:
        if "weights" not in takes:  # its --model would be this command's model, not the file's architecture
            raise ValueError(f"{text!r} is a weights file; give {_takes(takes)} (of a Google .npz: `hub-vit convert "
                             "FILE -o FOLDER`; of another: hub_vit.save_model_folder(timm.create_model(NAME, "
                             "checkpoint_path=FILE), FOLDER))")
        if model_name is None and suffix != ".npz" and not names_architecture:
            raise ValueError(f"{text!r} is a weights file, which holds no architecture; give a model folder made from "
                             "it: hub_vit.save_model_folder(timm.create_model(NAME, checkpoint_path=FILE), FOLDER), "
                             f"NAME one of {', '.join(_names())} (a Google .npz names its own)")
        if model_name is None and suffix != ".npz":  # a Google .npz names its own architecture (inferred)
            raise ValueError(f"a weights file needs the architecture: pass --model NAME (in Python model_name=NAME), "
                             f"one of {', '.join(_names())}")
        if model_name is not None:
            _entry(model_name)
        return ModelRef("npz" if suffix == ".npz" else "weights", str(path.resolve()), model_name=model_name)
    raise ValueError(f"{text!r} is a file but not a model: give {_takes(takes)}")


def _names() -> list[str]:
    from hub_vit.catalog import MODELS

    return list(MODELS)


def _entry(name: str) -> Any:
    from hub_vit.catalog import MODELS

    if name not in MODELS:
        close = difflib.get_close_matches(name, list(MODELS), n=1, cutoff=0.8)  # a typo: the name meant, first
        meant = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown model {name!r}: not a file or folder, and not a registered name; {meant}valid "
                         f"names: {', '.join(MODELS)}")
    return MODELS[name]


def _registered_ref(name: str, download: bool) -> ModelRef:
    base, _, tag = name.partition(".")
    entry = _entry(base)
    weights = entry.weight(tag) if tag else (entry.weights[0] if entry.weights else None)  # a bad tag: valid ones
    shipped = Path(weights.file).parent if weights is not None and weights.file else None
    if shipped is not None and (shipped / "config.json").is_file():  # the default model: its folder has the labels
        return ModelRef("registered", name, folder=shipped.resolve())
    if not download and weights is not None and cached_checkpoint(base, weights.tag) is None:
        from hub_vit.conversion.download import hand_download_commands

        path = checkpoint_path(base, weights.tag)
        curl, _ = hand_download_commands(weights.url, path)
        raise ValueError(f"the checkpoint of {base}.{weights.tag} is not in hub-vit's download cache (expected at "
                         f"{path}; HUB_VIT_CACHE moves it) and is never downloaded from here. Fetch it once with "
                         f"network: `hub-vit convert {base}.{weights.tag} -o DIR` and "
                         f"`timm.create_model('{base}.{weights.tag}', pretrained=True)` both leave it there; or by "
                         f"hand: `{curl}`")
    return ModelRef("registered", name)


def checkpoint_path(name: str, tag: str) -> Path | None:
    """Where hub-vit's downloader keeps `name.tag`'s Google checkpoint (`$HUB_VIT_CACHE/downloads/...`): the file
    `timm.create_model(name.tag, pretrained=True)` loads, whether it is there or not. None for weights bundled in
    the package (the default model)."""
    from hub_vit.catalog import get_entry
    from hub_vit.conversion.download import cached_path, gs_to_https

    weights = get_entry(name).weight(tag)
    return cached_path(gs_to_https(weights.url)) if weights.gs_url else None


def cached_checkpoint(name: str, tag: str) -> Path | None:
    """`checkpoint_path(name, tag)` if the file is there, else None."""
    path = checkpoint_path(name, tag)
    return path if path is not None and path.is_file() else None


# ---------------------------------------------------------------------------------------------------- loading
def _from_module(module: Any, *, name: str, kind: Kind, labels: list[str] | None, cfg: dict[str, Any],
                 origin: str, weights: str, folder: Path | None = None, architecture: str = "") -> ResolvedModel:
    spec = getattr(module, "spec", None)
    num_classes = getattr(module, "num_classes", None)
    if num_classes is None and spec is not None:
        num_classes = spec.num_classes
    return ResolvedModel(name=name, kind=kind, labels=_labels(name, labels, int(num_classes or 0)),
                         data=DataConfig.from_pretrained_cfg(cfg, spec), origin=origin, module=module.eval(),
                         folder=folder, weights=weights, architecture=architecture, pretrained_cfg=cfg)


def _labels(name: str, labels: list[str] | tuple[str, ...] | None, num_classes: int) -> tuple[str, ...]:
    """The model's class names, one per class; a model that came without any gets `default_labels`."""
    if not labels:
        return tuple(default_labels(num_classes))
    if len(labels) != num_classes:
        raise ValueError(f"model {name!r}: {len(labels)} labels for {num_classes} classes")
    return tuple(labels)


def _load_folder(folder: Path, *, kind: Kind, name: str, weights: str = "") -> ResolvedModel:
    from hub_vit.folder import load_model_folder

    model, info = load_model_folder(folder)
    return _from_module(model, name=name, kind=kind, labels=list(info.labels or []),
                        cfg=dict(info.pretrained_cfg or {}), origin=str(folder.resolve()),
                        weights=weights or str(folder / "model.safetensors"), folder=folder.resolve(),
                        architecture=info.architecture)


def _load_registered(ref: ModelRef, pretrained: bool | None, download: bool) -> ResolvedModel:
    base, tag = ref.target.partition(".")[0], ref.tag
    entry = _entry(base)
    if pretrained is None:  # export's default: a tag's weights, or those shipped in the package, else random
        pretrained = tag is not None or ref.folder is not None
    if pretrained and not entry.weights:
        from hub_vit.catalog import MODELS

        with_weights = [name for name, other in MODELS.items() if other.weights]
        raise ValueError(f"{base!r} has no published weights to serve (architecture only): give a trained model "
                         f"folder or a registered name with weights ({', '.join(with_weights)}); to export it with "
                         "random weights, `hub-vit export onnx` without --pretrained")
    if not pretrained:
        from hub_vit.model import VisionTransformer

        model = VisionTransformer(entry.spec.replace(head_zeroinit=False))
        return _from_module(model, name=entry.name, kind="registered", labels=None, cfg={},
                            origin=f"registered model {entry.name!r}", weights=RANDOM_INIT, architecture=entry.name)
    tag = tag or entry.weights[0].tag
    target = f"{base}.{tag}"
    if ref.folder is not None:  # shipped in the package as a model folder: the same weights, with the labels
        return _load_folder(ref.folder, kind="registered", name=target, weights=f"pretrained {tag}")
    import timm

    import hub_vit.timm_plugin  # noqa: F401  (registers the hub-vit names with timm)

    overlay: dict[str, Any] = {}
    if not download:  # the cached file, named: timm never goes to the network
        path = cached_checkpoint(base, tag)
        if path is None:
            raise ValueError(f"the checkpoint of {target} is no longer in hub-vit's download cache "
                             f"({checkpoint_path(base, tag)})")
        overlay = {"pretrained_cfg_overlay": dict(file=str(path))}
    model = timm.create_model(target, pretrained=True, **overlay)  # downloads and converts Google's checkpoint
    return _from_module(model, name=target, kind="registered", labels=None, cfg=dict(model.pretrained_cfg),
                        origin=f"registered model {target!r}", weights=f"pretrained {tag}", architecture=base)


def _load_weights(ref: ModelRef) -> ResolvedModel:
    """A weights file into its registered architecture (`model_name`), strictly; a Google `.npz` without one into the
    architecture its arrays describe."""
    from hub_vit.model import VisionTransformer
    from hub_vit.weights import load_adapted_state_dict, weights_source

    path = Path(ref.target)
    if ref.model_name is not None:
        from hub_vit.conversion import load_checkpoint

        entry = _entry(ref.model_name)
        model = VisionTransformer(entry.spec)
        # a refusal names the file (was "the checkpoint holds NaN ...")
        load_adapted_state_dict(model, load_checkpoint(path, spec=entry.spec), source=weights_source(path))
        architecture = entry.name
    else:
        from hub_vit.conversion.convert import convert_file
        from hub_vit.conversion.infer import match_architecture

        conversion = convert_file(path)
        model = VisionTransformer(conversion.spec)
        load_adapted_state_dict(model, conversion.state_dict)
        architecture = match_architecture(conversion.spec)
    name = architecture if ref.model_name is not None else path.stem  # a Google checkpoint is known by its file
    return _from_module(model, name=name, kind=ref.kind, labels=None, cfg={}, origin=str(path),
                        weights=str(path), architecture=architecture)


def _load_graph(path: Path, kind: Kind) -> ResolvedModel:
    """An exported file. Metadata, first found: a hub-vit `config.json` (+ `labels.txt`) beside it (a model folder's);
    what `hub-vit export` recorded (`<engine>.json`, the `<stem>.export.json` report); for ONNX, the graph's shapes
    with Google's defaults for the transform."""
    from hub_vit.exported import engine_info, find_model_metadata, onnx_signature

    config_file, labels_file = path.parent / "config.json", path.parent / "labels.txt"
    labels: list[str] | None = None
    if labels_file.is_file():
        from hub_vit.folder import read_labels

        labels = read_labels(path.parent)
    if config_file.is_file():
        from hub_vit.folder import read_config_json

        config = read_config_json(config_file)
        cfg = dict(config.get("pretrained_cfg") or {})
        labels = labels or config.get("label_names")
        num_classes = config.get("num_classes")
    elif (recorded := find_model_metadata(path)) is not None:
        cfg = dict(recorded.get("pretrained_cfg") or {})
        labels = labels or recorded.get("labels") or None
        num_classes = recorded.get("num_classes")
    elif kind == "onnx":
        input_size, num_classes = onnx_signature(path)
        cfg = {"input_size": input_size}
    else:
        raise ValueError(f"TensorRT engine {str(path)!r} needs its metadata (input size, labels, transform): the "
                         f"{path.name}.json that `hub-vit export tensorrt` writes beside it, or a hub-vit config.json")
    if "input_size" not in cfg and kind == "onnx":
        cfg["input_size"] = onnx_signature(path)[0]
    if "input_size" not in cfg:
        raise ValueError(f"model {path.stem!r}: its metadata has no 'input_size'; keys present: {sorted(cfg)}")
    if num_classes is None:
        num_classes = len(labels or [])
    return ResolvedModel(name=path.stem, kind=kind, labels=_labels(path.stem, labels, int(num_classes)),
                         data=DataConfig.from_pretrained_cfg(cfg), origin=str(path.resolve()), graph=path.resolve(),
                         weights=str(path.resolve()), pretrained_cfg=cfg,
                         engine_info=engine_info(path) if kind == "engine" else None)


__all__ = ["ENGINE_SUFFIXES", "RANDOM_INIT", "WEIGHT_SUFFIXES", "Kind", "ModelRef", "ResolvedModel",
           "cached_checkpoint", "checkpoint_path", "locate", "resolve_model"]
