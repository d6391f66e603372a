"""Detect which of Google's checkpoint layouts a flat npz key set uses, and present it in one canonical form.

The canonical form is big_vision's current per-block Linen naming without a prefix:

    embedding/{kernel,bias}  cls  pos_embedding  Transformer/encoderblock_{i}/{LayerNorm_0,
    MultiHeadDotProductAttention_0,LayerNorm_1,MlpBlock_0}/...  Transformer/encoder_norm/...
    MAPHead_0/...  pre_logits/...  head/...

Everything else is a renaming (pre-Linen counters, prefixes), a slicing (scan-stacked blocks) or the two posemb
fixes big_vision's `fix_old_checkpoints` applies. The view is lazy: it maps canonical keys to references into the
source (`Ref`) and reads an array only when asked, so a 1.2 GB file is never held twice.

Two posemb conventions are kept apart, because both are exact and each maps onto a hub-vit spec directly:
* vit_jax files: `Transformer/posembed_input/pos_embedding` with a class-token slot, added after prepending `cls`
  -> `posemb_on_cls=True`.
* big_vision files: `pos_embedding` at the top, added to the patches only -> `posemb_on_cls=False`. Legacy
  big_vision layouts (posemb under `Transformer/posembed_input/` or `Transformer/`, or a `sqrt(N)^2+1` table) are
  fixed as `fix_old_checkpoints` does: moved to the top, and slot 0 is added to `cls`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# Checked in this order: `params/img/` before `params/` (a SigLIP two-tower file has both image and text trees).
PREFIXES: tuple[str, ...] = ("params/img/", "params/", "opt/target/", "")
VIT_JAX_POSEMB = "Transformer/posembed_input/pos_embedding"
OLD_BV_POSEMB = "Transformer/pos_embedding"
MAP_INLINED = ("probe", "MlpBlock_0", "MultiHeadDotProductAttention_0", "LayerNorm_0")
_NUMBERED = re.compile(r"^(.+)_(\d+)$")
STACK_CACHE = 3


class LayoutError(ValueError):
    """The key set is not a ViT checkpoint layout this converter knows."""


@dataclass(frozen=True)
class Layout:
    """What was detected. `family` decides the posemb convention; the rest is recorded in conversion.json."""

    family: str  # "vit_jax" | "big_vision"
    prefix: str  # "", "params/", "params/img/", "opt/target/"
    naming: str  # "pre-linen" (published vit_jax files) | "linen"
    scan: bool  # big_vision nn.scan: one stacked `Transformer/encoderblock/*` with a leading depth axis
    depth: int
    posemb: str  # where the learned posemb was found, or "none (sincos2d)"
    posemb_on_cls: bool  # canonical `pos_embedding` has a class-token slot (vit_jax)
    cls_folded: bool  # legacy: posemb slot 0 was added to `cls` (big_vision fix_old_checkpoints)
    map_head: str | None  # "MAPHead_0" | "inlined at top level" | None
    ignored_keys: int  # keys outside the chosen prefix (optimizer state, a text tower): not model weights

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        parts = [f"{self.family} npz", f"prefix {self.prefix!r}", f"{self.naming} names",
                 "scan-stacked blocks" if self.scan else "per-block", f"posemb: {self.posemb}"]
        if self.cls_folded:
            parts.append("class-token posemb slot folded into cls")
        if self.map_head:
            parts.append(f"MAP head ({self.map_head})")
        return ", ".join(parts)


@dataclass(frozen=True)
class Ref:
    """Where a canonical array comes from. `index`: scan slice; `part`: `tail` drops posemb slot 0, `cls_fold`
    adds posemb slot 0 (`extra`) to cls."""

    key: str
    index: int | None = None
    part: str = "all"
    extra: str | None = None


def shapes_of(arrays: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shapes without reading data when the source is a lazy `NpzArchive` (it has `.shapes`)."""
    shapes = getattr(arrays, "shapes", None)
    if shapes is not None:
        return dict(shapes)
    return {k: tuple(np.shape(v)) for k, v in arrays.items()}


def convert_pre_linen_names(keys: list[str]) -> dict[str, str]:
    """old -> new key names, as `flax.training.checkpoints.convert_pre_linen` renames a tree.

    Pre-Linen flax numbered sub-modules with one counter per parent (`LayerNorm_0, MultiHeadDotProductAttention_1,
    LayerNorm_2, MlpBlock_3`); Linen keeps one counter per class (`LayerNorm_0, MultiHeadDotProductAttention_0,
    LayerNorm_1, MlpBlock_0`). Within each parent that has numbered children of two or more classes, they are sorted
    by number and renumbered per class. Idempotent on Linen names.
    """
    children: dict[tuple[str, ...], set[str]] = {}
    for key in keys:
        parts = key.split("/")
        for depth in range(len(parts)):
            children.setdefault(tuple(parts[:depth]), set()).add(parts[depth])
    renames: dict[tuple[str, ...], dict[str, str]] = {}
    for parent, names in children.items():
        numbered = sorted(((m.group(1), int(m.group(2)), n) for n in names if (m := _NUMBERED.match(n))),
                          key=lambda t: t[1])
        if len({cls_name for cls_name, _, _ in numbered}) < 2:
            # One class only (`encoderblock_{i}`, `Dense_{i}`): both schemes agree, and renumbering would hide a
            # missing block behind a silently shorter model.
            continue
        counts: dict[str, int] = {}
        mapping = {}
        for cls_name, _, name in numbered:
            mapping[name] = f"{cls_name}_{counts.get(cls_name, 0)}"
            counts[cls_name] = counts.get(cls_name, 0) + 1
        renames[parent] = mapping
    out = {}
    for key in keys:
        parts = key.split("/")
        new = [renames.get(tuple(parts[:d]), {}).get(p, p) for d, p in enumerate(parts)]
        out[key] = "/".join(new)
    return out


def _find_prefix(shapes: dict[str, tuple[int, ...]]) -> str:
    for prefix in PREFIXES:
        if f"{prefix}embedding/kernel" in shapes:
            return prefix
    preview = ", ".join(sorted(shapes)[:8])
    raise LayoutError(
        "not a ViT checkpoint from vit_jax or big_vision: no 'embedding/kernel' under any of the prefixes "
        f"{', '.join(repr(p) for p in PREFIXES)}; the file has {len(shapes)} array{'s' if len(shapes) != 1 else ''}, "
        f"e.g. {preview}"
    )


class CanonicalView(Mapping[str, np.ndarray]):
    """canonical key -> array, read lazily from the source. `shapes` are the canonical shapes."""

    def __init__(self, source: Mapping[str, np.ndarray], layout: Layout, refs: dict[str, Ref],
                 shapes: dict[str, tuple[int, ...]]) -> None:
        self.source = source
        self.layout = layout
        self.refs = refs
        self.shapes = shapes
        self._stacks: dict[str, np.ndarray] = {}

    def _stacked(self, key: str) -> np.ndarray:
        # Up to three stacked (L, ...) arrays are cached (a fused q/k/v rule reads three): the key table walks
        # "for each parameter, for each block", so every stacked array is read from disk once and dropped when a
        # fourth one is needed.
        if key not in self._stacks:
            while len(self._stacks) >= STACK_CACHE:
                self._stacks.pop(next(iter(self._stacks)))
            self._stacks[key] = self.source[key]
        return self._stacks[key]

    def release(self) -> None:
        self._stacks.clear()

    def __getitem__(self, key: str) -> np.ndarray:
        ref = self.refs[key]
        array = self._stacked(ref.key)[ref.index] if ref.index is not None else self.source[ref.key]
        if ref.part == "tail":
            array = array[:, 1:]
        elif ref.part == "cls_fold":
            assert ref.extra is not None
            array = array + self.source[ref.extra][:, :1]
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self.refs)

    def __len__(self) -> int:
        return len(self.refs)


def _block_gap_message(found: set[int]) -> str:
    """Name the missing encoder blocks: a per-block checkpoint numbers its blocks 0, 1, 2, ... with no gap."""
    missing = [i for i in range(max(found)) if i not in found]
    listed = ", ".join(f"encoderblock_{i}" for i in missing)
    return (f"encoder block{'s' if len(missing) > 1 else ''} {listed} missing: the checkpoint has "
            f"{', '.join(f'encoderblock_{i}' for i in sorted(found))} under Transformer/, and blocks must be "
            "numbered 0, 1, 2, ... without gaps")


def canonicalize(arrays: Mapping[str, np.ndarray]) -> CanonicalView:
    """Detect the layout of a flat npz key set and return the lazy canonical view (`view.layout` says what)."""
    shapes = shapes_of(arrays)
    prefix = _find_prefix(shapes)
    if f"{prefix}conv_root/kernel" in shapes or any(k.startswith(f"{prefix}block1/") for k in shapes):
        raise LayoutError("hybrid ResNet+ViT checkpoints (R50+ViT, R26+S/32, ...) are not supported; "
                          "only plain ViT / SimpleViT checkpoints can be converted")
    own = [k for k in shapes if k.startswith(prefix)]
    renamed = convert_pre_linen_names([k[len(prefix):] for k in own])
    naming = "pre-linen" if any(old != new for old, new in renamed.items()) else "linen"
    refs: dict[str, Ref] = {}
    cshapes: dict[str, tuple[int, ...]] = {}
    for key in own:
        new = renamed[key[len(prefix):]]
        refs[new] = Ref(key)
        cshapes[new] = shapes[key]

    # MAP head inlined at the top level (ViT-G development checkpoints): move it under MAPHead_0.
    map_head = "MAPHead_0" if any(k.startswith("MAPHead_0/") for k in refs) else None
    if "probe" in refs:
        map_head = "inlined at top level"
        for key in [k for k in refs if k.split("/")[0] in MAP_INLINED]:
            refs[f"MAPHead_0/{key}"], cshapes[f"MAPHead_0/{key}"] = refs.pop(key), cshapes.pop(key)

    # Scan layout: `Transformer/encoderblock/<leaf>` of shape (L, ...) -> L per-block references.
    stacked = [k for k in refs if k.startswith("Transformer/encoderblock/")]
    per_block = {int(m.group(1)) for k in refs if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}
    if stacked and per_block:
        raise LayoutError("checkpoint mixes scan-stacked 'Transformer/encoderblock/*' and per-block "
                          "'Transformer/encoderblock_{i}/*' keys; expected one of the two")
    if stacked:
        depths = {cshapes[k][0] if cshapes[k] else 0 for k in stacked}
        if len(depths) != 1 or 0 in depths:
            raise LayoutError(f"scan-stacked blocks disagree on the depth axis: leading sizes {sorted(depths)}")
        depth = depths.pop()
        for key in stacked:
            ref, shape = refs.pop(key), cshapes.pop(key)
            leaf = key[len("Transformer/encoderblock/"):]
            for i in range(depth):
                refs[f"Transformer/encoderblock_{i}/{leaf}"] = Ref(ref.key, index=i)
                cshapes[f"Transformer/encoderblock_{i}/{leaf}"] = shape[1:]
    else:
        depth = len(per_block)
        if per_block != set(range(depth)):
            raise LayoutError(_block_gap_message(per_block))
    if depth == 0:
        raise LayoutError("checkpoint has no encoder blocks ('Transformer/encoderblock_{i}/...' or scan-stacked "
                          "'Transformer/encoderblock/...')")

    family = "vit_jax" if VIT_JAX_POSEMB in refs and prefix in ("", "opt/target/") else "big_vision"
    posemb, on_cls, folded = "none (sincos2d)", False, False
    if family == "vit_jax":
        posemb = VIT_JAX_POSEMB
        refs["pos_embedding"], cshapes["pos_embedding"] = refs.pop(VIT_JAX_POSEMB), cshapes.pop(VIT_JAX_POSEMB)
        on_cls = "cls" in refs  # vit_jax adds the posemb after prepending cls; gap models have no cls and no slot
    else:
        for where in (VIT_JAX_POSEMB, OLD_BV_POSEMB, "pos_embedding"):
            if where in refs:
                if "pos_embedding" in refs and where != "pos_embedding":
                    raise LayoutError(f"checkpoint has both 'pos_embedding' and legacy '{where}'")
                posemb = "top level" if where == "pos_embedding" else f"{where} (legacy, moved to top level)"
                refs["pos_embedding"], cshapes["pos_embedding"] = refs.pop(where), cshapes.pop(where)
                break
        pos_shape = cshapes.get("pos_embedding")
        if pos_shape is not None and len(pos_shape) == 3:
            n = pos_shape[1]
            if math.isqrt(n) ** 2 + 1 == n:  # fix_old_checkpoints: combined cls+posemb table, fold slot 0 into cls
                folded = "cls" in refs
                pos_ref = refs["pos_embedding"]
                refs["pos_embedding"] = Ref(pos_ref.key, pos_ref.index, "tail")
                cshapes["pos_embedding"] = (pos_shape[0], n - 1, pos_shape[2])
                if folded:
                    refs["cls"] = Ref(refs["cls"].key, refs["cls"].index, "cls_fold", extra=pos_ref.key)

    layout = Layout(family=family, prefix=prefix, naming=naming, scan=bool(stacked), depth=depth, posemb=posemb,
                    posemb_on_cls=on_cls, cls_folded=folded, map_head=map_head,
                    ignored_keys=len(shapes) - len(own))
    return CanonicalView(arrays, layout, refs, cshapes)


def detect_layout(arrays: Mapping[str, np.ndarray]) -> Layout:
    """Just the `Layout` of a key set (reads headers only when `arrays` is an `NpzArchive`)."""
    return canonicalize(arrays).layout


__all__ = ["CanonicalView", "Layout", "LayoutError", "PREFIXES", "Ref", "canonicalize", "convert_pre_linen_names",
           "detect_layout", "shapes_of"]
