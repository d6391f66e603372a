"""Multiply-accumulate count of one forward pass, from the `ViTSpec` alone (no model, no tracing).

Counted: every matrix product (patch-embedding conv, q/k/v, attention scores, attention-weighted values, output
projection, MLP, MAP probe, tanh pre-logits, head). Not counted: biases, LayerNorm, softmax, GELU and position
embeddings, which together are under 0.5 %: ViT-S/16 at 224 px is 4.60 GMACs here, 4.6 in the literature and 4.61 in
timm's benchmark tables (which also count the norms); ViT-B/16 is 17.56 here, 17.6 published, 17.58 in timm.
`tests/test_cards.py` checks the count against torch's FLOP counter on real forward passes.
"""

from __future__ import annotations

from hub_vit.variants import ViTSpec, check_image_size, to_2tuple


def _attention_macs(queries: int, keys: int, width: int) -> int:
    """Scores q k^T plus the attention-weighted sum of v, over all heads: (queries, keys) per head, head_dim deep."""
    return 2 * queries * keys * width


def count_macs(spec: ViTSpec, img_size: int | tuple[int, int] | None = None) -> int:
    """MACs for one image at `img_size` (default: the spec's own size)."""
    height, width_px = to_2tuple(img_size) if img_size is not None else spec.img_size
    check_image_size((height, width_px), spec.patch_size)
    D, F = spec.width, spec.mlp_dim
    patches = (height // spec.patch_size) * (width_px // spec.patch_size)
    tokens = patches + spec.num_prefix_tokens  # N

    macs = patches * D * spec.in_chans * spec.patch_size**2  # patch conv: one (C*p*p -> D) product per patch
    per_block = (
        tokens * D * 3 * D  # qkv (N, D) x (D, 3D)
        + _attention_macs(tokens, tokens, D)  # (B, heads, N, N) scores and their product with v
        + tokens * D * D  # output projection
        + 2 * tokens * D * F  # MLP fc1 (D -> F) and fc2 (F -> D)
    )
    macs += spec.depth * per_block
    if spec.pool_type == "map":  # one learned probe query attends over the N tokens, then a residual MLP
        macs += D * D + tokens * D * 2 * D + _attention_macs(1, tokens, D) + D * D + 2 * D * F
    if spec.rep_size:
        macs += D * spec.rep_size
    macs += spec.head_hidden_size * spec.num_classes
    return macs


def gmacs(spec: ViTSpec, img_size: int | tuple[int, int] | None = None) -> float:
    """`count_macs` in units of 1e9, the unit timm's model tables use."""
    return count_macs(spec, img_size) / 1e9
