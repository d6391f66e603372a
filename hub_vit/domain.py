"""What a model can recognise, and its out-of-domain score's calibration (`domain.json` and `domain.safetensors` in
a model folder).

A classifier answers every image with one of its classes: the digits model calls a photo of an astronaut "9" (96 %).
So a model folder says what the model knows (`knows`, a phrase after "this model knows"), which example images fit it
(`examples`: 'digits' or 'photos'; the demo offers only those), and, once calibrated, how to tell an image of another
kind: the statistics of `hub_vit.domain_score` (`domain.safetensors`: per-block Gaussians of in-domain features and
the threshold) with what was measured when they were fitted (`measured` in `domain.json`). `hub_vit.domain_fit` fits
them (`hub-vit calibrate-domain`, `hub-vit train`).

Like the other records of a folder, `domain.json` holds the digest of the weights the statistics were fitted on, the
sha256 of the statistics file it goes with, and how the images were prepared (`input`: the data config's size, crop
and normalisation in config.json): statistics fitted on other weights, with another statistics file or on images
prepared otherwise (a folder saved at another `img_size` keeps sincos weights unchanged, but every feature moves) are
not applied (the model's answers then say "unknown", never "in domain").

No torch at import: the demo and the card read it cheaply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub_vit.domain_score import DomainStatistics, load_statistics, save_statistics
from hub_vit.paths import listed

DOMAIN_FILE = "domain.json"
STATISTICS_FILE = "domain.safetensors"
EXAMPLE_KINDS = ("digits", "photos")
IMAGENET_CLASS_COUNTS = {1000: "ImageNet-1k", 21843: "ImageNet-21k", 11821: "ImageNet-21k (Fall 2011)"}


@dataclass(frozen=True)
class Domain:
    """`knows`: what the model recognises, as a phrase after "this model knows" ("the handwritten digits 0-9");
    `examples`: which example images fit it ('digits' or 'photos'); `statistics`: the out-of-domain score fitted for
    these weights (None: not calibrated for them); `measured`: the numbers measured when it was fitted."""

    knows: str
    examples: str
    statistics: DomainStatistics | None = None
    measured: dict[str, Any] = field(default_factory=dict)


def guess_domain(labels: list[str]) -> Domain:
    """A folder without `domain.json`: ImageNet heads know photos; any other head is described by its classes."""
    name = IMAGENET_CLASS_COUNTS.get(len(labels))
    if name is not None:
        return Domain(knows=f"the {len(labels):,} {name} classes (photos of objects, animals and scenes)",
                      examples="photos")
    return Domain(knows=f"its {len(labels)} classes ({listed(labels)})", examples="photos")


def read_domain(folder: str | Path | None, labels: list[str]) -> Domain:
    """The folder's `domain.json`, with its statistics only while `model.safetensors` holds the weights they were
    fitted on and `domain.safetensors` is the file recorded; without the record, `guess_domain`. ValueError naming
    the file when it is not a domain record, and how to replace it."""
    path = None if folder is None else Path(folder) / DOMAIN_FILE
    if path is None or not path.is_file():
        return guess_domain(labels)
    domain, data = _advised_record(path)
    statistics = Path(folder) / STATISTICS_FILE
    if not (statistics.is_file() and _same_file(statistics, data.get("statistics_sha256"))
            and _same_weights(Path(folder), data.get("weights_digest"))
            and data.get("input", _NOT_RECORDED) in (_NOT_RECORDED, prepared_input(Path(folder)))):
        return domain  # not calibrated, or for other weights / statistics file / inputs: nothing to apply
    return Domain(domain.knows, domain.examples, load_statistics(statistics), dict(data.get("measured") or {}))


# what to do about a damaged record: `hub-vit calibrate-domain` replaces it when told what the model knows
REPLACE_RECORD = ("rewrite it with `hub-vit calibrate-domain FOLDER --images DIR --knows PHRASE --examples "
                  f"{'|'.join(EXAMPLE_KINDS)}`, or delete it (then what the model knows is guessed from its labels)")


def stated_domain(folder: str | Path) -> Domain | None:
    """What the folder's `domain.json` says the model knows (`knows`, `examples`; no statistics: nothing is hashed
    or loaded, so it is cheap), None without one. ValueError naming the file and what is wrong with it."""
    path = Path(folder) / DOMAIN_FILE
    return _record(path)[0] if path.is_file() else None


def check_domain_record(folder: str | Path) -> None:
    """ValueError, as `read_domain`'s, when the folder's `domain.json` is not a domain record; cheap (nothing is
    hashed or loaded): for refusing a folder at start-up rather than on its first image."""
    path = Path(folder) / DOMAIN_FILE
    if path.is_file():
        _advised_record(path)


def _advised_record(path: Path) -> tuple[Domain, dict[str, Any]]:
    """`_record`, its ValueError saying how to replace the record (`REPLACE_RECORD`)."""
    try:
        return _record(path)
    except ValueError as exc:
        raise ValueError(f"{exc}; {REPLACE_RECORD}") from None


# the fields every record has, and the JSON type of each field `_record` reads (`measured` may be absent or null)
_REQUIRED = ("knows", "examples")
_FIELD_TYPES: dict[str, tuple[type, str]] = {"knows": (str, "a string"), "examples": (str, "a string"),
                                             "measured": (dict, "an object (names and values)")}


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words ("an array", "a number", ...)."""
    kinds = ((bool, "true/false"), (dict, "an object"), (list, "an array"), (str, "a string"), (int, "a number"),
             (float, "a number"))
    return "null" if value is None else next((name for kind, name in kinds if isinstance(value, kind)), "a value")


def _record(path: Path) -> tuple[Domain, dict[str, Any]]:
    """(knows and examples, the whole record) of the `domain.json` at `path`; ValueError naming the file and what
    is wrong with it in the record's terms: not JSON, not an object, a field missing or of the wrong type (no advice:
    each caller knows what its user can do about it)."""
    def refused(why: str) -> ValueError:
        return ValueError(f"{path} is not a domain record: {why}")

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise refused("it is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise refused(f"it is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise refused(f"its content is {_json_kind(data)}, where a record is a JSON object with the fields "
                      f"{' and '.join(map(repr, _REQUIRED))}")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise refused(f"it lacks the field{'s' if len(missing) > 1 else ''} {' and '.join(map(repr, missing))}")
    for name, (kind, expected) in _FIELD_TYPES.items():
        value = data.get(name)
        if not (isinstance(value, kind) or (value is None and name not in _REQUIRED)):
            raise refused(f"its field {name!r} is {_json_kind(value)}, expected {expected}")
    domain = Domain(knows=data["knows"], examples=data["examples"])
    if domain.examples not in EXAMPLE_KINDS:
        raise ValueError(f"{path}: unknown examples {domain.examples!r}; valid: {', '.join(EXAMPLE_KINDS)}")
    return domain, data


_NOT_RECORDED = object()  # a record written before `input` was: its statistics are judged by the weights alone
# the fields of config.json's pretrained_cfg (timm's data config) that decide what the model's features are
_INPUT_KEYS = ("input_size", "crop_pct", "crop_mode", "interpolation", "mean", "std")


def prepared_input(folder: Path) -> dict[str, Any] | None:
    """How the folder's model prepares images (`_INPUT_KEYS` of config.json's pretrained_cfg), as `input` records it;
    None when config.json cannot be read (then no recorded input matches)."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("pretrained_cfg") or {}
        return {key: cfg.get(key) for key in _INPUT_KEYS}
    except (OSError, ValueError, AttributeError):
        return None


def _same_file(path: Path, sha256: Any) -> bool:
    from hub_vit.file_hash import sha256_file

    return isinstance(sha256, str) and sha256_file(path) == sha256


def _same_weights(folder: Path, digest: Any) -> bool:
    from hub_vit.weights_digest import file_digest

    weights = folder / "model.safetensors"
    return isinstance(digest, str) and weights.is_file() and file_digest(weights) == digest


def record_file_in_the_way(folder: Path) -> Path | None:
    """The first of the record's files (`domain.safetensors`, `domain.json`) that is a folder in `folder`, or None:
    found before either file is written, so the record is never left half-written."""
    return next((path for path in (folder / STATISTICS_FILE, folder / DOMAIN_FILE) if path.is_dir()), None)


def write_domain(folder: str | Path, domain: Domain) -> Path:
    """Write `domain.json` (and `domain.safetensors` when `domain.statistics` is given), each atomically, with the
    digest of the folder's current weights; returns the record's path. Statistics are written first, and the record
    names them by sha256, so a run stopped between the two leaves no record that applies other statistics."""
    from hub_vit.atomic import atomic_path, disk_errors_as_os_errors
    from hub_vit.file_hash import sha256_file
    from hub_vit.weights_digest import file_digest

    folder = Path(folder)
    blocked = record_file_in_the_way(folder)
    if blocked is not None:
        raise IsADirectoryError(f"{str(blocked)!r} is a folder where the file {blocked.name} belongs")
    record: dict[str, Any] = {"knows": domain.knows, "examples": domain.examples}
    if domain.examples not in EXAMPLE_KINDS:
        raise ValueError(f"unknown examples {domain.examples!r}; valid: {', '.join(EXAMPLE_KINDS)}")
    if domain.statistics is not None:
        with atomic_path(folder / STATISTICS_FILE, suffix=".safetensors") as tmp, disk_errors_as_os_errors(tmp):
            save_statistics(domain.statistics, tmp)
        record |= {"measured": domain.measured, "statistics_sha256": sha256_file(folder / STATISTICS_FILE),
                   "weights_digest": file_digest(folder / "model.safetensors"), "input": prepared_input(folder)}
    path = folder / DOMAIN_FILE
    with atomic_path(path, suffix=".json") as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


__all__ = ["DOMAIN_FILE", "EXAMPLE_KINDS", "REPLACE_RECORD", "STATISTICS_FILE", "Domain", "check_domain_record",
           "guess_domain", "read_domain", "record_file_in_the_way", "stated_domain", "write_domain"]
