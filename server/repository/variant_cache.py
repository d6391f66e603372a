"""The CPU flavour's chosen variants, kept between repository builds: the second `hub-vit serve` (or `hub-vit
repository`) of a model on the same host takes the graph it chose the first time instead of building, verifying and
timing every candidate again, and its exported fp32 graphs (the attention graph and the logits graph cut from it;
`exported_graphs`) instead of exporting them again.

Where: `$HUB_VIT_VARIANT_CACHE`, else `<hub-vit's cache>/cpu-variants/` (`hub_vit.conversion.download.cache_dir`:
`$HUB_VIT_CACHE`, else `$XDG_CACHE_HOME/hub_vit`, else `~/.cache/hub_vit`). One entry per key, a folder named by the
key's sha256: the chosen graph's files (`model.onnx`, or an OpenVINO variant's `.xml` / `.bin` / `.json`) and
`entry.json`: the key's parts, the selection as the manifest records it, every file's sha256, and the digest of all
of that. `hub-vit cache list` shows the entries, `hub-vit cache clear` removes them (or delete the folder).

The key holds everything the choice depends on: the model's weights (their content digest,
`hub_vit.weights_digest`) and spec; what was asked (`auto` or a variant), the batch and threads it was timed at; the
CPU's ISA flags; the versions of hub-vit, onnxruntime, openvino, nncf, torch, onnx, and of scikit-image and Pillow
(the verification photos and their crops); the recipe (`recipe_digest`: the source of the modules that build, verify
and time a variant, so a changed build of the same version, such as an editable install, is another key); the
criterion's thresholds; and the verification set (its counts, seed and the digest of the model's own images). A
change to any of them is another key: the old entry stays until cleared. `stale` says which entries this installation
on this host can never reuse (another format, library version, recipe or CPU): `hub-vit cache clear --stale` removes
those alone.

An entry is written atomically (built in a staging folder beside it, then renamed into place: `hub_vit.atomic`). One
that does not read back whole (`entry.json` unparsable or its digest wrong, a file missing, truncated or with other
bytes) is removed and rebuilt: a damaged entry is never served.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from hub_vit.atomic import replace_dir, staging_dir
from hub_vit.file_hash import sha256_file
from hub_vit.host import isa_flags

FORMAT = 1  # the entry layout; a new one is another key
ENTRY = "entry.json"
FOLDER = "cpu-variants"
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")  # an entry's folder: its key's sha256 (CacheKey.name)
_LEFTOVER = re.compile(r"\.[0-9a-f]{64}\..+")  # a killed writer's staging or moved-aside folder (hub_vit.atomic)
ENV = "HUB_VIT_VARIANT_CACHE"  # moves this cache alone (HUB_VIT_CACHE moves all of hub-vit's)
_LIBRARIES = ("hub-vit", "onnxruntime", "openvino", "nncf", "torch", "onnx", "scikit-image", "pillow")
# The modules whose code shapes a cached graph or the choice among candidates: the model's forward, the variant
# table, export (build, quantise, verify, time), OpenVINO's session and the selection itself (a package: all of it).
RECIPE = ("hub_vit.model", "hub_vit.layers", "hub_vit.variants", "hub_vit.export", "hub_vit.openvino_runtime",
          "hub_vit.server.repository.cpu_variant")


def cache_root() -> Path:
    """The folder of the entries: `$HUB_VIT_VARIANT_CACHE`, else `<hub-vit's cache>/cpu-variants`."""
    from hub_vit.conversion.download import cache_dir

    explicit = os.environ.get(ENV)
    return Path(explicit).expanduser() if explicit else cache_dir() / FOLDER


def library_versions() -> dict[str, str | None]:
    """The installed versions of the libraries a variant's build, verification and speed depend on."""
    versions: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.cache
def recipe_digest(modules: tuple[str, ...] = RECIPE) -> str:
    """sha256 of the source of `modules` (a package: every `.py` under it), by module-relative name: what the cached
    graphs were built by, whatever the version number says."""
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"the variant cache's recipe names {name}, which is not importable")
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if spec.submodule_search_locations else [origin]
        for path in files:
            digest.update(f"{name}:{path.relative_to(origin.parent).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _model_parts(module: Any, weights: str | None) -> dict[str, Any]:
    """The parts every key holds about the model and what builds it (`weights`: the caller's digest, else computed)."""
    from hub_vit.weights_digest import state_dict_digest

    return {"weights": weights or state_dict_digest(module.state_dict()), "spec": module.spec.to_dict(),
            "libraries": library_versions(), "recipe": recipe_digest()}


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """The parts a cached choice depends on (`parts`), and their digest (`name`: the entry's folder)."""

    parts: dict[str, Any]

    @property
    def name(self) -> str:
        return _digest(self.parts)


def cache_key(module: Any, requested: str, check: Any, *, batch: int, threads: int, flags: list[str],
              token_means: bool = False, weights: str | None = None) -> CacheKey:
    """The key of `module`'s choice for `requested` on a host with `flags` (check: the `VerificationSet`;
    `token_means`: the graphs also write the out-of-domain score's features; `weights`: the module's weights digest
    where the caller has it, else computed here)."""
    from hub_vit.export import criterion

    own = None if check.own is None else hashlib.sha256(check.own.images.tobytes()).hexdigest()
    verification = check.describe() | {"seed": check.seed, "own_images_sha256": own}
    return CacheKey({
        "format": FORMAT, **_model_parts(module, weights),
        "requested": requested, "batch": batch, "threads": threads, "isa_flags": sorted(flags),
        "token_means": token_means, "verification_set": verification,
        "criterion": {"fp32_max_abs": criterion.FP32_MAX_ABS, "min_cosine": criterion.MIN_COSINE,
                      "max_rel_error": criterion.MAX_REL_ERROR, "min_top1_agreement": criterion.MIN_TOP1_AGREEMENT},
    })


def _damaged(entry: Path, record: Any) -> str | None:
    """Why the entry at `entry` cannot be served (None: it reads back whole)."""
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return f"{ENTRY} is not an entry"
    body = {key: value for key, value in record.items() if key != "digest"}
    if record.get("digest") != _digest(body):
        return f"{ENTRY} was changed after it was written"
    for name, sha256 in record["files"].items():
        path = entry / name
        if Path(name).name != name or not path.is_file():
            return f"{name} is missing"
        if sha256_file(path) != sha256:
            return f"{name} has other bytes than were written"
    return None


def load(key: CacheKey, root: Path | None = None) -> tuple[dict[str, Any], list[Path]] | None:
    """(the recorded selection, the graph's files) of `key`'s entry, or None when there is none. A damaged entry is
    removed (and None returned): the caller builds afresh."""
    entry = (root or cache_root()) / key.name
    if not entry.is_dir():
        return None
    record = _record(entry)
    why = _damaged(entry, record)
    if why is not None:
        shutil.rmtree(entry, ignore_errors=True)
        return None
    if record.get("key") != key.parts:  # a digest collision, or a hand-made entry: not this key's
        return None
    return record["selection"], [entry / name for name in record["graph"]]


def store(key: CacheKey, selection: dict[str, Any], graph: list[Path], root: Path | None = None) -> Path:
    """Keep the chosen `graph` (its files) and the `selection` under `key`; returns the entry. OSError naming the
    cache's folder (`filename`) when it cannot be written (read-only, not this user's, full): nothing half-written is
    left, and the caller goes on (it costs the next start its time, not this one its repository)."""
    root = root or cache_root()
    entry = root / key.name
    staging = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_dir(entry)
        for path in graph:
            shutil.copyfile(path, staging / path.name)
        body = {"key": key.parts, "selection": selection, "graph": [path.name for path in graph],
                "files": {path.name: sha256_file(staging / path.name) for path in graph}}
        (staging / ENTRY).write_text(json.dumps(body | {"digest": _digest(body)}, indent=2) + "\n", encoding="utf-8")
        replace_dir(staging, entry)
    except OSError as err:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise OSError(err.errno, err.strerror or str(err), str(root)) from err
    return entry


def exported_graphs(module: Any, logits: Path, attentions: Path, token_means: bool = False,
                    weights: str | None = None) -> bool:
    """The fp32 attention graph of `module` at `attentions` and the logits graph cut from it at `logits` (the CPU
    flavour's two graphs; `token_means`: both also write the out-of-domain score's features), copied from the cache
    when the same weights were exported before with the same libraries, else exported and kept; returns whether they
    came from the cache. `weights`: the module's weights digest where the caller has it (else computed here)."""
    from hub_vit.export.onnx_export import export_onnx, logits_subgraph

    key = CacheKey({"format": FORMAT, "graphs": [logits.name, attentions.name], "dynamic_batch": True,
                    "token_means": token_means, **_model_parts(module, weights)})
    hit = load(key)
    if hit is not None:
        for path in hit[1]:
            shutil.copyfile(path, logits.with_name(path.name))
        return True
    export_onnx(module, attentions, dynamic_batch=True, with_attentions=True, with_token_means=token_means)
    logits_subgraph(attentions, logits)
    try:
        store(key, {"graphs": "the fp32 attention graph and the logits graph cut from it"}, [logits, attentions])
    except OSError:  # the next build exports them again (seconds); `cpu_variant` says when its choice (minutes) is lost
        pass
    return False


def installation() -> dict[str, Any]:
    """The key parts no model or request chooses, as this installation on this host has them: the entry format, the
    library versions, the recipe and the CPU's flags (read once for a whole listing, not once per entry)."""
    return {"format": FORMAT, "libraries": library_versions(), "recipe": recipe_digest(), "isa_flags": isa_flags()}


def stale(parts: Any, here: dict[str, Any] | None = None) -> str | None:
    """Why an entry keyed by `parts` can never be reused by `here` (an `installation()`; default: this one), or None
    when a build here may still ask for it. Only the parts `installation` names are compared (the fp32 graphs' keys
    have no CPU flags). On a cache shared by hosts or environments, their entries are stale here."""
    here = here or installation()
    if not isinstance(parts, dict) or parts.get("format") != here["format"]:
        return f"another entry format (this hub-vit's is {here['format']})"
    built = parts.get("libraries")
    if built != here["libraries"]:
        built = built if isinstance(built, dict) else {}
        changed = [f"{name} {built.get(name) or 'absent'}" for name, version in here["libraries"].items()
                   if built.get(name) != version]
        return f"built with {', '.join(changed) or 'other libraries'}"
    if parts.get("recipe") != here["recipe"]:
        return "built by other hub-vit code"
    if "isa_flags" in parts and parts["isa_flags"] != here["isa_flags"]:
        return "built on another CPU"
    return None


def _record(entry: Path) -> Any:
    try:
        return json.loads((entry / ENTRY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _entry_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*") if p.is_dir() and not p.is_symlink() and _ENTRY_NAME.fullmatch(p.name))


def entries(root: Path | None = None) -> list[dict[str, Any]]:
    """Every entry: its folder, size in bytes, the variant it holds and for which request and weights, whether it
    reads back whole (`damaged`: why not) and whether this installation on this host can reuse it (`stale`: why
    not)."""
    root = root or cache_root()
    here = installation()
    found = []
    for entry in _entry_folders(root):
        record = _record(entry)
        key = record.get("key", {}) if isinstance(record, dict) else {}
        selection = record.get("selection", {}) if isinstance(record, dict) else {}
        found.append({"entry": str(entry), "bytes": sum(p.stat().st_size for p in entry.iterdir() if p.is_file()),
                      "variant": selection.get("variant") or ("fp32 graphs" if "graphs" in key else None),
                      "requested": key.get("requested"),
                      "weights": key.get("weights"), "damaged": _damaged(entry, record), "stale": stale(key, here)})
    return found


def clear(root: Path | None = None, *, only_unusable: bool = False) -> tuple[int, int]:
    """Remove every entry, and what killed writers of entries left; returns (entries removed, other things left).
    `only_unusable`: only the entries that are damaged or `stale` (the others stay, and are not counted as other
    things). Only what the cache writes is touched: the folder may be one the user named with
    `$HUB_VIT_VARIANT_CACHE` and share it with other files. OSError (naming the path) when an entry cannot be
    removed."""
    root = root or cache_root()
    if not root.is_dir():
        return 0, 0
    removed = others = 0
    here = installation() if only_unusable else None
    for path in sorted(root.iterdir()):
        is_entry = _ENTRY_NAME.fullmatch(path.name) is not None
        if not path.is_dir() or path.is_symlink() or not (is_entry or _LEFTOVER.fullmatch(path.name)):
            others += 1
            continue
        if only_unusable and is_entry:
            record = _record(path)
            if _damaged(path, record) is None and stale(record.get("key"), here) is None:
                continue
        shutil.rmtree(path)
        removed += is_entry
    return removed, others


__all__ = ["CacheKey", "cache_key", "cache_root", "clear", "entries", "exported_graphs", "installation",
           "library_versions", "load", "stale", "store"]
