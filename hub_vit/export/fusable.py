"""An export-only attention layout that ONNX Runtime's transformer optimizer fuses into its `Attention` op.

ORT's `FusionAttention` (the BERT/ViT pattern, `onnxruntime.transformers.fusion_attention`) recognises attention only
when q, k and v each come from their own `MatMul -> Add -> Reshape -> Transpose` chain fed by the same LayerNorm, the
scores are `Softmax(Div(MatMul(q, k^T)))` and the output is `Transpose -> Reshape -> MatMul -> Add`. The fused `qkv`
Linear + SDPA of `hub_vit.layers.Attention` exports as a Split/Gather/SDPA decomposition that it does not recognise
(0 of 12 blocks fused for S/16, measured). This module computes the same function with that layout; the weights are
views of the original `qkv` rows, so the export carries each weight once.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from hub_vit.layers import Attention
from hub_vit.model import VisionTransformer


class SplitQKVAttention(nn.Module):
    """`Attention` with separate q/k/v projections and an explicit softmax; same outputs to float32 rounding."""

    def __init__(self, attn: Attention) -> None:
        super().__init__()
        C = attn.qkv.in_features
        self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
        self.q, self.k, self.v = (nn.Linear(C, C) for _ in range(3))
        with torch.no_grad():  # qkv rows are [q; k; v], each (C, C)
            for i, lin in enumerate((self.q, self.k, self.v)):
                lin.weight.copy_(attn.qkv.weight[i * C:(i + 1) * C])
                lin.bias.copy_(attn.qkv.bias[i * C:(i + 1) * C])
        self.proj = attn.proj
        self.sqrt_d = math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor, return_attn: bool = False,
                fused: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        # `fused` is `Attention`'s switch for the SDPA kernel; this layer is always the explicit softmax
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dim
        q = self.q(x).reshape(B, N, h, d).transpose(1, 2)  # (B, h, N, d)
        k = self.k(x).reshape(B, N, h, d).permute(0, 2, 3, 1)  # (B, h, d, N): one Transpose, as ORT expects
        v = self.v(x).reshape(B, N, h, d).transpose(1, 2)  # (B, h, N, d)
        attn = (q @ k / self.sqrt_d).softmax(dim=-1)  # (B, h, N, N)
        y = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(y), (attn if return_attn else None)


def fusable_copy(model: VisionTransformer) -> VisionTransformer:
    """A deep copy of `model` (eval mode) whose blocks use `SplitQKVAttention`; the original is left untouched."""
    clone = copy.deepcopy(model).eval()
    for block in clone.blocks:
        block.attn = SplitQKVAttention(block.attn)
    return clone


__all__ = ["SplitQKVAttention", "fusable_copy"]
