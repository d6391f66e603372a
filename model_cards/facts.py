"""Everything a model card states, read from a hub-vit model folder (never typed by hand).

Sources, in order of authority: the folder's own files (`config.json`, `labels.txt`, `conversion.json` /
`training.json`, `model.safetensors`), the catalog (`hub_vit.catalog`: published checkpoints and their published
results) and computations from the spec (parameter count of the model, multiply-accumulates).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hub_vit.catalog import MODELS, ModelEntry, Weights
from hub_vit.variants import ViTSpec

from .macs import count_macs

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PREPROCESSOR = "preprocessor_config.json"
LABELS = "labels.txt"
CONVERSION = "conversion.json"
TRAINING = "training.json"
CARD = "README.md"
WEIGHTS_AS_RECORDED = "as recorded"
WEIGHTS_CHANGED = "changed"
WEIGHTS_UNRECORDED = "not recorded"


class ModelFolderError(ValueError):
    """The folder is not a usable hub-vit model folder; the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class CatalogMatch:
    """A catalog checkpoint a folder corresponds to. Its published results apply to the folder only when
    `evidence` says why the converted file is that published file; a match by name and layout alone (a file placed
    by hand, renamed, or another model's weights under Google's file name) has `evidence` None."""

    entry: ModelEntry
    weights: Weights
    evidence: str | None = None

    @property
    def name(self) -> str:
        return f"{self.entry.name}.{self.weights.tag}"

    @property
    def verified(self) -> bool:
        return self.evidence is not None


@dataclass(frozen=True)
class FolderFacts:
    path: Path
    config: dict[str, Any]
    spec: ViTSpec
    architecture: str
    pretrained_cfg: dict[str, Any]
    labels: list[str]
    conversion: dict[str, Any] | None
    training: dict[str, Any] | None
    preprocessor: dict[str, Any] | None
    num_params: int  # of the model the spec builds, checked against the tensors in model.safetensors
    macs: int  # one forward pass at the spec's image size, `model_cards.macs.count_macs`
    match: CatalogMatch | None  # the Google checkpoint this folder was converted from, its content verified
    namesake: CatalogMatch | None  # a catalog checkpoint whose name and layout the source has, content not verified
    bundled: CatalogMatch | None  # the catalog entry whose bundled weights are this very folder (the default model)
    files: frozenset[str]
    # conversion.json / training.json `weights_digest` against model.safetensors: WEIGHTS_AS_RECORDED, WEIGHTS_CHANGED,
    # WEIGHTS_UNRECORDED (a record without a digest), or None (no record)
    weights_state: str | None = None
    # the verified Google checkpoint the folder was converted from, when its weights have changed since (or the record
    # cannot show they have not): its published results are withheld, `match` is None
    withheld: CatalogMatch | None = None

    @property
    def record(self) -> dict[str, Any] | None:
        """The provenance record whose claims the card repeats: conversion.json, else training.json, else None."""
        return self.conversion if self.conversion is not None else self.training

    @property
    def record_describes_weights(self) -> bool:
        """The provenance record's claims (published results, parity, held-out accuracy) describe model.safetensors."""
        return self.weights_state == WEIGHTS_AS_RECORDED

    @property
    def weights_note(self) -> str | None:
        """Why the record's claims do not describe the folder's weights; None when they do or there is no record."""
        record = CONVERSION if self.kind == "converted" else TRAINING
        writer = "`hub-vit convert`" if self.kind == "converted" else "`hub-vit train`"
        if self.weights_state == WEIGHTS_CHANGED:
            return (f"`{WEIGHTS}` no longer holds the weights {writer} wrote (their digest differs from "
                    f"`weights_digest` in `{record}`: fine-tuned, re-saved with other values or replaced since)")
        if self.weights_state == WEIGHTS_UNRECORDED:
            again = "convert" if self.kind == "converted" else "train"
            return (f"`{record}` records no digest of the weights {writer} wrote (an earlier hub-vit wrote it), so "
                    f"nothing shows `{WEIGHTS}` still holds them; {again} again to have them checked")
        return None

    @property
    def kind(self) -> str:
        """'converted', 'trained' or 'model' (a folder with no provenance file)."""
        return "converted" if self.conversion is not None else "trained" if self.training is not None else "model"

    @property
    def family(self) -> str:
        """'simplevit' (sincos2d posemb + average pooling, "Better plain ViT baselines") or 'vit'."""
        if self.match is not None or self.bundled is not None:
            return (self.match or self.bundled).entry.family  # type: ignore[union-attr]
        return "simplevit" if self.spec.posemb == "sincos2d" and self.spec.pool_type == "gap" else "vit"

    @property
    def labels_file(self) -> bool:
        """The labels come from `labels.txt` (`card_labels`), not from `config.json`'s `label_names`."""
        return (self.path / LABELS).is_file()

    @property
    def has_remote_code(self) -> bool:
        """transformers `trust_remote_code=True` works: every module named in `auto_map` ships in the folder."""
        modules = _auto_map_modules(self.config)
        return bool(modules) and all((self.path / f"{m}.py").is_file() for m in modules)  # a folder named so: no


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: arrays nested 10^5 deep
        raise ModelFolderError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _optional_json(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    return read_json(path) if path.is_file() else None


def _auto_map_modules(config: dict[str, Any]) -> list[str]:
    """`{"AutoConfig": "configuration_hub_vit.HubViTConfig", ...}` -> `["configuration_hub_vit", ...]`."""
    auto_map = config.get("auto_map") or {}
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, (list, tuple)) else [v]) if r]
    return sorted({r.split("--")[-1].rsplit(".", 1)[0] for r in refs})


def safetensors_numel(path: Path) -> int:
    """Number of values stored in a safetensors file, read from its header (no tensor is loaded)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())
    except Exception as exc:  # safetensors raises its own SafetensorError (not an OSError) for a damaged header
        raise ModelFolderError(f"{path} is not a readable safetensors file: {exc}") from exc


def model_num_params(spec: ViTSpec) -> int:
    """Parameter count of `VisionTransformer(spec)`, built on the meta device (nothing is allocated)."""
    import torch

    from hub_vit.model import VisionTransformer, count_parameters

    with torch.device("meta"):
        return count_parameters(VisionTransformer(spec))


def read_spec(config: dict[str, Any], path: Path) -> ViTSpec:
    args = config.get("model_args")
    if not isinstance(args, dict):
        raise ModelFolderError(f"{path} has no 'model_args' object (the ViTSpec fields timm builds the model from)")
    try:
        return ViTSpec.from_dict(args)
    except (TypeError, ValueError) as exc:
        raise ModelFolderError(f"{path}: 'model_args' is not a valid ViTSpec: {exc}") from exc


def card_labels(folder: Path, config: dict[str, Any], num_classes: int) -> list[str]:
    """The folder's labels (labels.txt, else config.json's `label_names`), checked against the head's size."""
    from hub_vit.folder import read_labels  # the one reader of labels.txt (it imports torch: not at module level)

    from_file = (folder / LABELS).is_file()
    labels = read_labels(folder) if from_file else list(config.get("label_names") or [])
    if (labels or from_file) and len(labels) != num_classes:  # an empty labels.txt too: it names no class
        raise ModelFolderError(f"{folder / LABELS} lists {len(labels)} labels but the model has {num_classes} "
                               "classes")
    id2label = config.get("id2label")
    # the names transformers answers with: no card (or push) of a folder whose files disagree
    if from_file and isinstance(id2label, dict):
        from hub_vit.hf.configuration_hub_vit import check_labels_file, saved_label_names

        try:
            check_labels_file(folder, labels, saved_label_names(id2label))
        except ValueError as exc:
            raise ModelFolderError(str(exc)) from None
    return labels


def _source_strings(facts_conv: dict[str, Any] | None, pretrained_cfg: dict[str, Any]) -> set[str]:
    """Every URL / path the folder names as its origin (conversion.json anywhere, pretrained_cfg url fields)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, str) and (value.startswith(("gs://", "http://", "https://")) or value.endswith(".npz")):
            found.add(value)

    walk(facts_conv or {})
    walk({k: pretrained_cfg.get(k) for k in ("url", "origin_url", "hf_hub_id", "file")})
    return found


def _same_architecture(a: ViTSpec, b: ViTSpec) -> bool:
    """Equal specs up to `head_zeroinit`, which only says how an untrained head starts (not in any checkpoint)."""
    return a.replace(head_zeroinit=True) == b.replace(head_zeroinit=True)


def content_evidence(source: dict[str, Any] | None, weights: Weights) -> str | None:
    """Why the converted file (conversion.json `source`) is `weights`' published file, or None when nothing shows it.

    Evidence is the content, never the name: the file's sha256 equals the catalog's (when the catalog records one),
    or hub-vit's own downloader fetched it from the catalog URL and recorded that same sha256 while downloading
    (`downloaded_sha256`, from the cache's `.sha256` sidecar). A file placed in the cache by hand has no sidecar.
    """
    source = source or {}
    sha = source.get("sha256")
    if not sha:
        return None
    if weights.sha256:  # the catalog's hash decides alone: a download that does not match it is not the file
        return "its sha256 equals the one `hub_vit.catalog` records" if sha == weights.sha256 else None
    if weights.url and source.get("url") == weights.url and source.get("downloaded_sha256") == sha:
        return f"downloaded by hub-vit from `{weights.url}`, which recorded this sha256 while downloading"
    return None


def weights_state(record: dict[str, Any] | None, weights_path: Path) -> str | None:
    """Whether `record` (conversion.json / training.json) still describes `weights_path`: the `weights_digest` it
    recorded for the weights it wrote, compared with the file's (`hub_vit.weights_digest`)."""
    from hub_vit.weights_digest import file_digest

    if record is None:
        return None
    recorded = record.get("weights_digest")
    if not isinstance(recorded, str) or not recorded:
        return WEIGHTS_UNRECORDED
    try:
        return WEIGHTS_AS_RECORDED if file_digest(weights_path) == recorded else WEIGHTS_CHANGED
    except ValueError as exc:
        raise ModelFolderError(str(exc)) from exc


def verified_catalog_weights(source: dict[str, Any] | None) -> tuple[str, str] | None:
    """(catalog name, evidence) of the published file `source` is shown to be, if any: what `hub-vit convert`
    records as conversion.json `source.content_verified`."""
    for entry in MODELS.values():
        for w in entry.weights:
            evidence = content_evidence(source, w) if w.gs_url else None
            if evidence is not None:
                return f"{entry.name}.{w.tag}", evidence
    return None


def match_catalog(spec: ViTSpec, sources: set[str], catalog_name: str | None = None,
                  source: dict[str, Any] | None = None) -> CatalogMatch | None:
    """The catalog checkpoint the folder was converted from, if any, and only if the folder still has its exact
    architecture, class count and image size (otherwise the published results do not describe this model).

    Recognised by the converter's `catalog_name`, by URL, or by file name, together with the identical spec; the
    match carries `evidence` only if `source` (conversion.json `source`) shows the content is the published file
    (`content_evidence`). A namesake with the right layout matches without evidence, and gets no published claims.
    """
    names = {s.rstrip("/").rsplit("/", 1)[-1] for s in sources}
    for entry in MODELS.values():
        for w in entry.weights:
            if not w.gs_url:  # bundled weights hub-vit trained itself (the default model): not a Google checkpoint
                continue
            named = catalog_name == f"{entry.name}.{w.tag}"
            if not (named or {w.gs_url, w.url} & sources or w.gs_url.rsplit("/", 1)[-1] in names):
                continue
            expected = entry.spec.replace(img_size=(w.img_size, w.img_size), num_classes=w.num_classes)
            if _same_architecture(expected, spec):
                return CatalogMatch(entry, w, content_evidence(source, w))
    return None


def _same_file(a: Path, b: Path) -> bool:
    """Byte-identical files (sizes first, so a file of another size is never hashed)."""
    from hub_vit.file_hash import sha256_file

    return a.is_file() and b.is_file() and a.stat().st_size == b.stat().st_size and sha256_file(a) == sha256_file(b)


def match_bundled(folder: Path) -> CatalogMatch | None:
    """The catalog entry that ships this folder's weights inside the package (`Weights.file`), if any: the shipped
    folder itself, or a copy of it anywhere (its model.safetensors byte-identical to the shipped one)."""
    here = folder.resolve()
    for entry in MODELS.values():
        for w in entry.weights:
            file = getattr(w, "file", "")
            if file and (Path(file).resolve().parent == here or _same_file(here / WEIGHTS, Path(file))):
                return CatalogMatch(entry, w, "the weights hub-vit ships in the package")
    return None


def read_folder(folder: str | Path) -> FolderFacts:
    """Collect a folder's facts; raises `ModelFolderError` naming the missing or inconsistent file."""
    from hub_vit.folder import not_a_folder  # here: the folder module imports torch, reading facts needs none

    folder = Path(folder)
    problem = not_a_folder(folder)
    if problem is not None:
        raise ModelFolderError(str(problem))
    config_path = folder / CONFIG
    if not config_path.is_file():
        raise ModelFolderError(f"{folder} has no {CONFIG}; a hub-vit model folder needs {CONFIG} and {WEIGHTS}")
    config = read_json(config_path)
    spec = read_spec(config, config_path)
    weights_path = folder / WEIGHTS
    if not weights_path.is_file():
        raise ModelFolderError(f"{folder} has no {WEIGHTS}; a hub-vit model folder needs {CONFIG} and {WEIGHTS}")
    num_params = model_num_params(spec)
    stored = safetensors_numel(weights_path)
    if stored != num_params:
        raise ModelFolderError(
            f"{weights_path} holds {stored:,} values but the spec in {CONFIG} builds a model with {num_params:,} "
            "parameters; the folder is inconsistent"
        )
    pretrained_cfg = dict(config.get("pretrained_cfg") or {})
    conversion = _optional_json(folder, CONVERSION)
    training = _optional_json(folder, TRAINING)
    source = (conversion or {}).get("source")
    source = source if isinstance(source, dict) else None
    found = match_catalog(spec, _source_strings(conversion, pretrained_cfg), (source or {}).get("catalog_name"),
                          source)
    state = weights_state(conversion if conversion is not None else training, weights_path)
    verified = found if found is not None and found.verified else None
    return FolderFacts(
        path=folder,
        config=config,
        spec=spec,
        architecture=str(config.get("architecture") or "hub_vit"),
        pretrained_cfg=pretrained_cfg,
        labels=card_labels(folder, config, spec.num_classes),
        conversion=conversion,
        training=training,
        preprocessor=_optional_json(folder, PREPROCESSOR),
        num_params=num_params,
        macs=count_macs(spec),
        match=verified if state == WEIGHTS_AS_RECORDED else None,
        namesake=found if found is not None and not found.verified else None,
        bundled=match_bundled(folder),
        files=frozenset(p.name for p in folder.iterdir()),
        weights_state=state,
        withheld=verified if state != WEIGHTS_AS_RECORDED else None,
    )
