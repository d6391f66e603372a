"""The hub-vit model folder: one weight file and one config that timm, transformers and the rest of hub-vit all read.

    folder/
      model.safetensors          hub-vit state dict, timm key names, no prefix
      config.json                transformers keys (model_type "hub_vit", spec fields, id2label, auto_map)
                                 + timm keys (architecture, num_classes, num_features, model_args, pretrained_cfg)
      preprocessor_config.json   HubViTImageProcessor: resize / centre crop / [-1, 1]
      configuration_hub_vit.py, modeling_hub_vit.py, image_processing_hub_vit.py, hub_vit_*.py
                                 remote code generated from hub_vit's own modules (trust_remote_code=True)
      labels.txt                 one class name per line, line i = class i
      <extra files>              conversion.json / training.json / README.md (written by their owners); training.json
                                 may name the held-out images (`held_out_images`)
      native/                    classic ViT only: a native transformers ViTForImageClassification folder

`save_model_folder` writes everything into a temporary directory beside the target and renames it into place at the
end, so a failure leaves nothing behind (and `overwrite=True` never leaves a half-replaced folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from hub_vit.atomic import (
    cannot_write_in,
    disk_errors_as_os_errors,
    file_in_the_way,
    holds_cwd,
    replace_dir,
    staging_dir,
)
from hub_vit.model import VisionTransformer
from hub_vit.variants import LABELS_FILE, MODEL_TYPE, ViTSpec

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
SHARDED_INDEX = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME: weights in several files
SAVE_WHOLE = 'save the model again in one file, save_pretrained(FOLDER, max_shard_size="50GB")'
NATIVE_DIR = "native"

ExtraFile = str | bytes | Path | Mapping[str, Any] | Sequence[Any]


@dataclass(frozen=True)
class ModelFolderInfo:
    """What `load_model_folder` found besides the model.

    `config` is the parsed config.json; `pretrained_cfg` the timm data config (input size, crop, interpolation,
    mean/std); `files` maps every other file name (e.g. "conversion.json", "README.md") to its path.
    """

    path: Path
    spec: ViTSpec
    labels: list[str]
    pretrained_cfg: dict[str, Any]
    architecture: str
    config: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)

    def read_json(self, name: str) -> Any:
        """Parse an extra JSON file of the folder, e.g. `info.read_json("conversion.json")`."""
        if name not in self.files:
            raise FileNotFoundError(f"{name!r} is not in {self.path}; files: {', '.join(sorted(self.files)) or 'none'}")
        return json.loads(self.files[name].read_text(encoding="utf-8"))


def _reserved_names() -> set[str]:
    from hub_vit.hf.image_processing_hub_vit import PREPROCESSOR_FILE
    from hub_vit.hf.remote_code import BUNDLE

    return {WEIGHTS_FILE, CONFIG_FILE, PREPROCESSOR_FILE, LABELS_FILE, NATIVE_DIR, *BUNDLE.values()}


def _check_labels(labels: Sequence[str] | None, spec: ViTSpec) -> list[str] | None:
    if labels is None:
        return None
    if isinstance(labels, str):
        raise ValueError("labels must be a sequence of class names, not a single string")
    labels = list(labels)
    if len(labels) != spec.num_classes:
        raise ValueError(f"got {len(labels)} labels for a model with num_classes={spec.num_classes}; "
                         "pass exactly one name per class")
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not label.strip() or "\n" in label or "\r" in label:
            raise ValueError(f"label {i} is {label!r}; labels must be non-empty single-line strings")
    if len(set(labels)) != len(labels):
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        raise ValueError(f"labels must be unique (label2id maps names back to ids); duplicated: {dupes[:5]}")
    return labels


def check_architecture(architecture: str | None, spec: ViTSpec | None) -> str | None:
    """The timm architecture a folder of a model with `spec` records: `architecture` when it is the generic name or a
    registered one describing `spec` (beyond num_classes / img_size), else ValueError naming the valid ones; None
    given, the name `spec` is registered under. `spec` None (not known yet: a run that has not built its model):
    the name alone is checked."""
    from hub_vit.catalog import GENERIC_ARCHITECTURE, MODELS, architecture_key, timm_architecture

    if architecture is None:
        return None if spec is None else timm_architecture(spec)
    if architecture == GENERIC_ARCHITECTURE:
        return architecture
    if architecture not in MODELS:
        raise ValueError(f"unknown architecture {architecture!r}; valid: {GENERIC_ARCHITECTURE!r} or a registered "
                         f"name ({', '.join(MODELS)})")
    if spec is not None and architecture_key(MODELS[architecture].spec) != architecture_key(spec):
        raise ValueError(f"architecture {architecture!r} does not describe this model (its spec differs beyond "
                         f"num_classes / img_size); use {timm_architecture(spec)!r}")
    return architecture


def _check_pretrained_cfg(cfg: Mapping[str, Any], spec: ViTSpec) -> None:
    """ValueError for a `pretrained_cfg` given to `save_model_folder` that the folder's readers would misread: a key
    that is no timm `pretrained_cfg` field (a misspelt `crop_pctt` was saved, and `crop_pct` lost), or a mean / std
    that is not one number or one per input channel (timm's transform failed on the folder, or "could not convert
    string to float")."""
    import dataclasses
    import difflib

    from timm.models._pretrained import PretrainedCfg

    from hub_vit.data_config import DataConfig

    if not isinstance(cfg, Mapping):
        raise TypeError(f"pretrained_cfg must be a dict of timm pretrained_cfg fields, got {type(cfg).__name__}")
    fields = [f.name for f in dataclasses.fields(PretrainedCfg)]
    for key in cfg:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(fields)}"
            raise ValueError(f"pretrained_cfg key {key!r} is not a timm pretrained_cfg field{hint}")
    for name in ("mean", "std"):
        value = cfg.get(name)
        values = value if isinstance(value, (list, tuple)) else [value]
        if value is not None and (len(values) not in (1, spec.in_chans) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
            raise ValueError(f"pretrained_cfg {name} must be one number or {spec.in_chans} (one per input channel), "
                             f"got {value!r}")
    try:  # crop_pct, interpolation, crop_mode, a zero std: the one reader's checks
        DataConfig.from_pretrained_cfg({k: v for k, v in cfg.items() if k != "input_size"}, spec)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"pretrained_cfg: {exc}") from None


def _check_extra_files(extra_files: Mapping[str, ExtraFile] | None) -> dict[str, ExtraFile]:
    extra = dict(extra_files or {})
    reserved = _reserved_names()
    for name in extra:
        parts = PurePosixPath(name).parts if isinstance(name, str) else ()
        if not parts or name.startswith("/") or ".." in parts or "\\" in name:
            raise ValueError(f"extra file name {name!r} must be a relative path inside the folder")
        if parts[0] in reserved:
            raise ValueError(f"extra file {name!r} would overwrite a file the folder format owns; reserved names: "
                             f"{', '.join(sorted(reserved))}")
    return extra


def _write_extra(path: Path, content: ExtraFile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Path):
        shutil.copyfile(content, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    elif isinstance(content, (Mapping, list, tuple)):
        path.write_text(json.dumps(content, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    else:
        raise TypeError(f"extra file {path.name!r}: content must be str, bytes, a Path or JSON data, "
                        f"got {type(content).__name__}")


def _write_folder(model: VisionTransformer, out: Path, labels: list[str] | None, pretrained_cfg: dict | None,
                  architecture: str, extra: dict[str, ExtraFile], native_vit: bool) -> None:
    from safetensors import safe_open

    from hub_vit.hf.configuration_hub_vit import data_config, label_at
    from hub_vit.hf.image_processing_hub_vit import write_processor_config
    from hub_vit.hf.modeling_hub_vit import HubViTForImageClassification, HubViTModel

    spec = model.spec
    cfg_kwargs: dict[str, Any] = dict(architecture=architecture, pretrained_cfg=data_config(spec, pretrained_cfg))
    if labels is not None:
        cfg_kwargs["id2label"] = dict(enumerate(labels))
        cfg_kwargs["label2id"] = {name: i for i, name in enumerate(labels)}
    wrapper_cls = HubViTForImageClassification if spec.num_classes else HubViTModel
    wrapper = wrapper_cls.from_vit(model, **cfg_kwargs)
    with disk_errors_as_os_errors(out / WEIGHTS_FILE):
        wrapper.save_pretrained(out)  # config.json, model.safetensors (plain timm keys), remote code

    with safe_open(str(out / WEIGHTS_FILE), framework="pt") as f:  # the one weight file must be complete
        written = set(f.keys())
    expected = set(model.state_dict())
    if written != expected:
        raise RuntimeError(f"{WEIGHTS_FILE} keys differ from the model: missing {sorted(expected - written)[:5]}, "
                           f"unexpected {sorted(written - expected)[:5]}")

    write_processor_config(out, wrapper.config.pretrained_cfg)  # (imported with the transformers classes above)
    if spec.num_classes:
        id2label = wrapper.config.id2label
        (out / LABELS_FILE).write_text("".join(f"{label_at(id2label, i)}\n" for i in range(spec.num_classes)),
                                       encoding="utf-8")
    for name, content in extra.items():
        _write_extra(out / name, content)
    if native_vit:
        from hub_vit.hf.native_vit import native_image_processor, to_native_vit

        native = to_native_vit(model, id2label=dict(wrapper.config.id2label), label2id=dict(wrapper.config.label2id))
        with disk_errors_as_os_errors(out / NATIVE_DIR / WEIGHTS_FILE):
            native.save_pretrained(out / NATIVE_DIR)
        native_image_processor(wrapper.config.pretrained_cfg).save_pretrained(out / NATIVE_DIR)


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """No "Writing model shards" bars: a model folder is one small write, and CLI output stays readable."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def save_model_folder(
    model: VisionTransformer,
    folder: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    pretrained_cfg: Mapping[str, Any] | None = None,
    architecture: str | None = None,
    extra_files: Mapping[str, ExtraFile] | None = None,
    native_vit: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write `model` as a hub-vit model folder (see module docstring) and return its path.

    labels: one name per class (default: the model's own, `label_names` in its `pretrained_cfg` (timm's from a model
    folder), else `LABEL_i`). pretrained_cfg: timm data config of the weights (crop_pct, interpolation, mean/std,
    license, ...; default: the model's own `pretrained_cfg`, which timm's builder and `load_model_folder` set, else
    hub-vit's defaults); input size and class count always come from the model. architecture: timm
    name for `config.json` (default: the registered name with this architecture, else the generic "hub_vit").
    extra_files: name -> str / bytes / Path (copied) / JSON data. native_vit: also write `native/` (classic ViT only).
    Atomic: written into a temporary directory beside `folder` and renamed into place at the end.
    """
    if not isinstance(model, VisionTransformer):
        hint = ("; a transformers HubViT model writes the same folder with its own save_pretrained"
                if hasattr(model, "vit") else "")
        raise TypeError(f"save_model_folder expects a hub_vit VisionTransformer, got {type(model).__name__}{hint}")
    folder = Path(folder)
    spec = model.spec
    # what the model was built or loaded with: writing a model back must not change its preprocessing (crop_pct 1.0
    # was saved as the default 0.875) or drop its class names
    own = dict(getattr(model, "pretrained_cfg", None) or {})
    own_labels = own.pop("label_names", None)
    own.pop("label_descriptions", None)
    if labels is None and own_labels is not None and len(own_labels) == spec.num_classes:
        labels = list(own_labels)
    if pretrained_cfg is None:
        pretrained_cfg = own
    else:
        _check_pretrained_cfg(pretrained_cfg, spec)
    checked_labels = _check_labels(labels, spec)
    arch = check_architecture(architecture, spec)
    extra = _check_extra_files(extra_files)
    if native_vit:
        from hub_vit.hf.native_vit import native_vit_config

        native_vit_config(spec)  # raises now, naming the switch, before anything is written
    check_output_folder(folder, overwrite)
    folder.parent.mkdir(parents=True, exist_ok=True)

    tmp = staging_dir(folder)  # also removes what a killed writer of `folder` left
    try:
        with _quiet_progress():
            _write_folder(model, tmp, checked_labels, dict(pretrained_cfg) if pretrained_cfg else None, arch, extra,
                          native_vit)
        replace_dir(tmp, folder)  # overwrite: the old folder stays until the new one is in place
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def read_config_json(path: Path) -> dict[str, Any]:
    """A model's config.json as a dict; ValueError naming the file when it is not a JSON object (was the parser's bare
    "Expecting property name ...: line 1 column 2", naming no file)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: arrays nested 10^5 deep
        raise ValueError(f"{str(path)!r} is not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{str(path)!r} holds a JSON {type(raw).__name__}, not an object of config fields")
    return raw


def read_folder_config(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parsed `config.json` of a hub-vit model folder (`model_type` 'hub_vit'), without loading the model; None
    when `folder` is not one or its config cannot be read."""
    try:
        config = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) and config.get("model_type") == MODEL_TYPE else None


def is_model_folder(folder: Path) -> bool:
    """A hub-vit model folder: `config.json` with `model_type` 'hub_vit'."""
    return read_folder_config(folder) is not None


def check_output_folder(folder: str | os.PathLike[str], overwrite: bool, keep: Sequence[Path] = ()) -> None:
    """Raise (before any work) if `folder` cannot become a model folder: it exists without `overwrite`, a file is in
    the way, or, with `overwrite`, it is not an empty folder or a hub-vit model folder (replacing deletes everything in
    it) or it holds one of the `keep` paths (e.g. the checkpoint being converted)."""
    folder = Path(folder)
    blocker = file_in_the_way(folder)
    if blocker is not None:
        raise NotADirectoryError(f"output folder {str(folder)!r} cannot be created: {str(blocker)!r} is a file")
    # the folder is written beside its place and renamed into it: its parent must take a new entry (a read-only
    # destination was found after a download and a conversion)
    why = cannot_write_in(folder.parent)
    if why is not None:
        raise PermissionError(f"output folder {str(folder)!r} cannot be written: {why}")
    if not folder.exists():
        return
    if not overwrite and (not any(folder.iterdir()) or is_model_folder(folder)):  # else: --overwrite would not help
        raise FileExistsError(f"output folder {str(folder)!r} already exists; choose another or pass overwrite=True "
                              "(--overwrite) to replace it")
    if holds_cwd(folder):
        raise FileExistsError(f"output folder {str(folder)!r} is the current directory or holds it; replacing it "
                              "would leave this shell in a deleted folder: choose another output folder")
    resolved = folder.resolve()
    inside = [str(k) for k in keep if resolved == Path(k).resolve() or resolved in Path(k).resolve().parents]
    if inside:
        raise FileExistsError(f"output folder {str(folder)!r} holds {', '.join(inside)}, which replacing it would "
                              "delete; choose another output folder")
    if any(folder.iterdir()) and not is_model_folder(folder):
        raise FileExistsError(f"output folder {str(folder)!r} is not a hub-vit model folder (no config.json with "
                              "model_type 'hub_vit'); overwrite replaces model folders only, and would delete "
                              "everything in it: choose another output folder")


TRAINING_RECORD = "training.json"  # written by `hub-vit train` (hub_vit.train.loop)
DIGITS_HELD_OUT = "digits:val"  # scikit-learn's digits, the held-out split (hub_vit.digits_data)


@dataclass(frozen=True)
class HeldOutImages:
    """Images a trained model never trained on, named by its folder: training.json `dataset.held_out_images`, either
    a folder of images (class sub-folders, as `hub-vit train` reads its `val` split; relative to the model folder or
    absolute) or `digits:val` (scikit-learn's digits, the split `hub_vit.digits_data` makes: the shipped model's).
    The export and the CPU flavour judge a reduced-precision variant's top-1 on them."""

    folder: Path | None = None
    generated: str | None = None  # DIGITS_HELD_OUT

    def describe(self) -> str:
        if self.generated == DIGITS_HELD_OUT:
            return "held-out split of scikit-learn's digits (training.json)"
        return f"held-out images in {self.folder} (training.json)"


def held_out_images(folder: str | os.PathLike[str]) -> HeldOutImages | None:
    """What the model folder names as its held-out images, or None (no training record, or it names none). A
    named folder that is missing is returned as named: the caller says so. ValueError for a value that is neither a
    folder nor a known generated set."""
    path = Path(folder) / TRAINING_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dataset = record.get("dataset") if isinstance(record, dict) else None
    named = dataset.get("held_out_images") if isinstance(dataset, dict) else None
    if named is None:
        return None
    if not isinstance(named, str) or not named.strip():
        raise ValueError(f"{path}: dataset.held_out_images must name a folder of images or {DIGITS_HELD_OUT!r}, "
                         f"got {named!r}")
    if named == DIGITS_HELD_OUT:
        return HeldOutImages(generated=named)
    return HeldOutImages(folder=Path(folder) / Path(named).expanduser())  # an absolute path replaces the base


def read_labels(folder: str | os.PathLike[str]) -> list[str]:
    """labels.txt of a model folder (one name per line)."""
    path = Path(folder) / LABELS_FILE
    return path.read_text(encoding="utf-8").splitlines() if path.is_file() else []


def not_a_folder(folder: Path) -> OSError | None:
    """Why `folder`, given as a model folder, is not one at all, or None when it is a folder: NotADirectoryError for a
    file (an image, a weights file given where the folder goes), FileNotFoundError for nothing there."""
    if folder.is_dir():
        return None
    if folder.exists():
        return NotADirectoryError(f"model folder {str(folder)!r} is a file; give the folder that holds config.json "
                                  "and model.safetensors")
    from hub_vit.repo_id import REPO_ID

    # shaped like a Hub repo id (`my-org/tiny-vit`): `card`, `push` and `calibrate-domain` change a folder, so they take
    # a local copy of a Hub model, never the Hub's name
    hint = (f"; for a model on the Hugging Face Hub, make a local copy first: hf download {folder} --local-dir DIR"
            if REPO_ID.match(str(folder)) else "")
    return FileNotFoundError(f"model folder {str(folder)!r} does not exist{hint}")


def weight_shards(folder: Path) -> list[Path]:
    """The files of weights transformers' `save_pretrained` split into shards (past its `max_shard_size`), which
    hub-vit's loaders, reading one `model.safetensors`, do not take; [] for any other folder."""
    if not (folder / SHARDED_INDEX).is_file():
        return []
    return sorted(folder.glob("model-*-of-*.safetensors"))


def model_folder_files(folder: str | os.PathLike[str]) -> tuple[Path, Path]:
    """(config.json, model.safetensors) of the model folder `folder`; FileNotFoundError naming what is missing.
    Cheap: callers that read other inputs first check the folder with it before they do."""
    folder = Path(folder)
    problem = not_a_folder(folder)
    if problem is not None:
        raise problem
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not weights_path.is_file() and weight_shards(folder):
        raise FileNotFoundError(f"{folder} holds its weights in shards ({SHARDED_INDEX}, save_pretrained with a "
                                f"max_shard_size below the model's size); a hub-vit model folder holds one "
                                f"{WEIGHTS_FILE}, which timm reads too: {SAVE_WHOLE}")
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"{folder} is not a hub-vit model folder: {path.name} is missing")
    return config_path, weights_path


def check_model_type(config: Mapping[str, Any], config_path: Path) -> None:
    """ValueError unless `config` (the parsed `config_path`) is a hub-vit model's: a transformers or timm folder names
    its own model_type (or none)."""
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{config_path} has model_type {config.get('model_type')!r}, expected {MODEL_TYPE!r} (is "
                         "this a hub-vit model folder?)")


def read_model_config(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], Path, Path]:
    """(config.json parsed, its path, the weights file's path) of the hub-vit model folder `folder`, without loading
    the model: FileNotFoundError naming what is missing, ValueError for a config that is not a hub-vit model's."""
    config_path, weights_path = model_folder_files(folder)
    raw = read_config_json(config_path)
    check_model_type(raw, config_path)
    return raw, config_path, weights_path


def load_model_folder(folder: str | os.PathLike[str]) -> tuple[VisionTransformer, ModelFolderInfo]:
    """Load a hub-vit model folder into a `VisionTransformer` (eval mode, strict) plus its `ModelFolderInfo`."""
    from hub_vit.hf.configuration_hub_vit import HubViTConfig, check_labels_file, label_at
    from hub_vit.weights import WeightsFileError, load_adapted_state_dict, load_weights_file
    from hub_vit.weights_check import check_weights_file

    folder = Path(folder)
    raw, config_path, weights_path = read_model_config(folder)
    try:  # ViTSpec bounds every size field: `depth: 1000000000` is refused here, before a block is built
        config = HubViTConfig.from_dict({k: v for k, v in raw.items() if k not in ("transformers_version",)})
    except ValueError as exc:
        raise ValueError(f"{config_path}: {exc}") from None
    try:
        config.check_saved_model_args(raw.get("model_args"))
    except ValueError as exc:
        raise ValueError(f"{config_path}: {exc}") from None
    spec = config.weights_spec()  # a backbone saved by transformers keeps its labels but has no head
    check_weights_file(weights_path, spec, config=CONFIG_FILE)  # header vs config, sizes, dtypes: nothing read yet
    model = VisionTransformer(spec)
    try:
        load_adapted_state_dict(model, load_weights_file(weights_path))
    except WeightsFileError:  # a .pt / .bin the header check could not read first; its message names the file
        raise
    except ValueError as exc:  # non-finite values (the header had nothing else left to refuse)
        raise type(exc)(f"{weights_path}: {exc}") from None
    model.eval()

    labels = read_labels(folder)
    id2label = [label_at(config.id2label, i) for i in range(spec.num_classes)] if spec.num_classes else []
    check_labels_file(folder, labels, id2label)
    timm_cfg = config.timm_config()
    # the data config and class names on the model, as timm's builder puts them there for a `local-dir:` folder
    # (timm.data.resolve_data_config(model=...) reads it; save_model_folder(model) keeps both)
    model.pretrained_cfg = model.default_cfg = {**timm_cfg["pretrained_cfg"],
                                                **({"label_names": labels or id2label} if labels or id2label else {})}
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
             if p.is_file() and p.relative_to(folder).parts[0] not in _reserved_names()}
    info = ModelFolderInfo(path=folder, spec=spec, labels=labels or id2label, pretrained_cfg=timm_cfg["pretrained_cfg"],
                           architecture=timm_cfg["architecture"], config=raw, files=files)
    return model, info


__all__ = ["DIGITS_HELD_OUT", "HeldOutImages", "ModelFolderInfo", "check_architecture", "held_out_images",
           "load_model_folder", "read_folder_config", "read_labels", "save_model_folder"]
