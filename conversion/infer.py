"""Read the architecture off a checkpoint's shapes: width, depth, heads, MLP size, patch, grid, pooling, classes.

Only shapes are used (no array is read), so inference on a lazy `NpzArchive` costs nothing. Two things a file
cannot tell are documented defaults: LayerNorm eps 1e-6 and tanh-GELU (both repos use flax's defaults), and a
sincos2d model's training resolution (224 unless given; the table is recomputed for any size anyway).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from hub_vit.catalog import MODELS
from hub_vit.variants import ViTSpec, parse_variant, to_2tuple

from .layouts import CanonicalView, canonicalize

# Fields that define the weights' structure; a disagreement between a checkpoint and a requested spec is an error.
ARCH_FIELDS = ("width", "depth", "mlp_dim", "num_heads", "patch_size", "in_chans", "posemb", "pool_type",
               "class_token", "rep_size")


class ArchitectureMismatchError(ValueError):
    """The checkpoint's architecture differs from the one the caller asked for."""


def _need(shapes: dict[str, tuple[int, ...]], key: str, ndim: int) -> tuple[int, ...]:
    if key not in shapes:
        raise KeyError(key)
    shape = shapes[key]
    if len(shape) != ndim:
        raise ValueError(f"checkpoint array {key!r} has shape {shape}, expected {ndim} dimensions")
    return shape


def source_grid(n_tokens: int, patch: int, img_size: Any = None) -> tuple[int, int]:
    """The (rows, cols) grid of a learned posemb with `n_tokens` patch entries.

    A hint (`img_size`, the resolution the checkpoint was trained at) wins when it tiles into exactly `n_tokens`
    patches (this is how non-square 48x64 checkpoints are read); otherwise the grid must be square, as it is for
    every published checkpoint and as both Google repos assume.
    """
    if img_size is not None:
        h, w = to_2tuple(img_size)
        if (h // patch) * (w // patch) == n_tokens:
            return (h // patch, w // patch)
    side = math.isqrt(n_tokens)
    if side * side != n_tokens:
        hint = f" ({img_size!r} gives {to_2tuple(img_size)[0] // patch}x{to_2tuple(img_size)[1] // patch})" \
            if img_size is not None else ""
        raise ValueError(
            f"the position embedding has {n_tokens} patch entries, which is not a square grid; pass the image size "
            f"the checkpoint was trained at as HEIGHTxWIDTH (e.g. img_size=(48, 64) / --img-size 48x64){hint}"
        )
    return (side, side)


def infer_from_view(view: CanonicalView, img_size: Any = None) -> tuple[ViTSpec, tuple[int, int] | None]:
    """(spec of the checkpoint as trained, source posemb grid or None for sincos2d)."""
    shapes, layout = view.shapes, view.layout
    try:
        ph, pw, in_chans, width = _need(shapes, "embedding/kernel", 4)
        if ph != pw:
            raise ValueError(f"non-square patches {ph}x{pw} are not supported "
                             f"(embedding/kernel {shapes['embedding/kernel']})")
        q = _need(shapes, "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel", 3)
        num_heads = q[1]
        mlp_dim = _need(shapes, "Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel", 2)[1]
    except KeyError as exc:
        raise KeyError(f"checkpoint is missing {exc.args[0]!r}, which every ViT checkpoint has") from None
    if q[0] != width or q[1] * q[2] != width:
        raise ValueError(f"query kernel shape {q} does not fit width {width} (expected ({width}, heads, head_dim))")
    pool = "map" if any(k.startswith("MAPHead_0/") for k in shapes) else ("tok" if "cls" in shapes else "gap")
    rep_size = _need(shapes, "pre_logits/kernel", 2)[1] if "pre_logits/kernel" in shapes else None
    num_classes = _need(shapes, "head/kernel", 2)[1] if "head/kernel" in shapes else 0
    grid = None
    if "pos_embedding" in shapes:
        pos = _need(shapes, "pos_embedding", 3)
        n = pos[1] - (1 if layout.posemb_on_cls else 0)
        grid = source_grid(n, ph, img_size)
        size: Any = (grid[0] * ph, grid[1] * ph)
    else:
        size = img_size if img_size is not None else 224
    spec = ViTSpec(
        width=width, depth=layout.depth, mlp_dim=mlp_dim, num_heads=num_heads, patch_size=ph, img_size=size,
        in_chans=in_chans, num_classes=num_classes, posemb="learn" if grid else "sincos2d", pool_type=pool,
        posemb_on_cls=layout.posemb_on_cls, rep_size=rep_size,
    )
    return spec, grid


def infer_spec(arrays: Mapping[str, np.ndarray], img_size: Any = None, variant: str | None = None) -> ViTSpec:
    """The `ViTSpec` a checkpoint was trained with, from its shapes. `variant` ("S/16") is checked against it."""
    view = arrays if isinstance(arrays, CanonicalView) else canonicalize(arrays)
    spec, _ = infer_from_view(view, img_size)
    if variant is not None:
        check_variant(spec, variant)
    return spec


def _arch(spec: ViTSpec) -> str:
    rep = f", pre-logits {spec.rep_size}" if spec.rep_size else ""
    return (f"width {spec.width}, depth {spec.depth}, mlp_dim {spec.mlp_dim}, {spec.num_heads} heads, patch "
            f"{spec.patch_size}, posemb {spec.posemb}, pool {spec.pool_type}{rep}")


def check_variant(spec: ViTSpec, variant: str) -> None:
    """Raise if `variant` (big_vision string, e.g. "B/16") names another size than the checkpoint has."""
    size, patch = parse_variant(variant)
    theirs = (size.width, size.depth, size.mlp_dim, size.num_heads, patch)
    ours = (spec.width, spec.depth, spec.mlp_dim, spec.num_heads, spec.patch_size)
    if theirs != ours:
        found = spec.variant or "no variant of the size table"
        raise ArchitectureMismatchError(
            f"variant {variant!r} means width {size.width}, depth {size.depth}, mlp_dim {size.mlp_dim}, "
            f"{size.num_heads} heads, patch {patch}; the checkpoint has width {spec.width}, depth {spec.depth}, "
            f"mlp_dim {spec.mlp_dim}, {spec.num_heads} heads, patch {spec.patch_size} ({found})"
        )


def check_compatible(checkpoint: ViTSpec, target: ViTSpec) -> None:
    """Raise if the weights cannot serve `target`. Image size, class count and the posemb convention may differ
    (resampled / left to `adapt_state_dict` / re-expressed exactly); structural fields may not."""
    diffs = [f"{f} {getattr(checkpoint, f)!r} (checkpoint) vs {getattr(target, f)!r} (model)"
             for f in ARCH_FIELDS if getattr(checkpoint, f) != getattr(target, f)]
    if diffs:
        raise ArchitectureMismatchError(
            f"the checkpoint ({_arch(checkpoint)}) does not fit the requested model ({_arch(target)}): "
            + "; ".join(diffs)
        )


def match_architecture(spec: ViTSpec) -> str:
    """The registered timm name whose architecture equals `spec` up to image size and class count, else "hub_vit"
    (the generic entry point that takes every spec field)."""
    def key(s: ViTSpec) -> dict[str, Any]:
        return {k: v for k, v in s.to_dict().items() if k not in ("img_size", "num_classes")}

    return next((name for name, entry in MODELS.items() if key(entry.spec) == key(spec)), "hub_vit")


__all__ = ["ARCH_FIELDS", "ArchitectureMismatchError", "check_compatible", "check_variant", "infer_from_view",
           "infer_spec", "match_architecture", "source_grid"]
