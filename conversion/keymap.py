"""The mapping from canonical JAX keys to hub-vit (timm-named) state-dict keys, as one declarative table.

Each `Rule` names its torch key, the canonical JAX keys it reads, the transform, and the JAX shapes it expects
(a function of the spec). Every input and output shape is asserted. Layouts of the JAX arrays:

* Conv `embedding/kernel` is HWIO (ph, pw, C, D) -> torch OIHW (D, C, ph, pw).
* Dense kernels are (in, out) -> torch Linear (out, in): a transpose.
* Attention `query|key|value/kernel` is (D, H, d) -> (D, H*d) -> transpose; feature index = h*d + i.
  `out/kernel` is (H, d, D) -> (H*d, D) -> transpose. Biases (H, d) flatten to (H*d,).
* hub-vit fuses q/k/v as `qkv = cat([Wq, Wk, Wv])` and the MAP head's k/v as `kv = cat([Wk, Wv])`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hub_vit.variants import ViTSpec

Shape = tuple[int, ...]
MHA = "MultiHeadDotProductAttention_0"
BLOCK = "Transformer/encoderblock_{i}"


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float32))  # zero-copy view of the float32 array


def transpose_into(out: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """`out[...] = a.T`. torch's strided copy is tiled; numpy's `ascontiguousarray(a.T)` is 5-8x slower on
    ViT-L-sized kernels (it walks one side a whole row apart), which would dominate conversion time."""
    out.copy_(a.t())
    return out


def transposed(a: np.ndarray) -> torch.Tensor:
    t = _t(a)
    return transpose_into(torch.empty(t.shape[1], t.shape[0]), t)


def conv_hwio(a: list[np.ndarray]) -> torch.Tensor:
    return _t(a[0]).permute(3, 2, 0, 1).contiguous()  # (ph, pw, C, D) -> (D, C, ph, pw)


def dense(a: list[np.ndarray]) -> torch.Tensor:
    return transposed(a[0])  # (in, out) -> (out, in)


def copy(a: list[np.ndarray]) -> torch.Tensor:
    return _t(a[0]).clone()  # never alias the caller's arrays


def heads_in(a: list[np.ndarray]) -> torch.Tensor:
    """q/k/v kernels (D, H, d) each -> one (n*H*d, D) Linear weight, rows [q; k; v]."""
    width = a[0].shape[0]
    rows = [_t(k).reshape(width, -1) for k in a]  # (D, H*d) each: feature index h*d + i
    out = torch.empty(sum(r.shape[1] for r in rows), width)
    start = 0
    for r in rows:  # written in place: torch.cat of transposed views is ~50x slower
        transpose_into(out[start:start + r.shape[1]], r)
        start += r.shape[1]
    return out


def heads_bias(a: list[np.ndarray]) -> torch.Tensor:
    return torch.cat([_t(b).reshape(-1) for b in a])  # (H, d) each -> (n*H*d,)


def heads_out(a: list[np.ndarray]) -> torch.Tensor:
    k = a[0]
    return transposed(k.reshape(-1, k.shape[-1]))  # (H, d, D) -> (H*d, D) -> (D, H*d)


@dataclass(frozen=True)
class Rule:
    """One torch tensor: `torch_key` <- `transform([view[k] for k in jax_keys])`, shapes asserted both ways."""

    torch_key: str
    jax_keys: tuple[str, ...]
    transform: Callable[[list[np.ndarray]], torch.Tensor]
    jax_shapes: Callable[[ViTSpec], tuple[Shape, ...]]
    when: Callable[[ViTSpec], bool] = lambda s: True
    per_block: bool = False

    def expand(self, spec: ViTSpec) -> list[tuple[str, tuple[str, ...]]]:
        """(torch key, jax keys) for every block (per-block rules) or once."""
        if not self.per_block:
            return [(self.torch_key, self.jax_keys)]
        return [(self.torch_key.format(i=i), tuple(k.format(i=i) for k in self.jax_keys)) for i in range(spec.depth)]


def _ln(torch_prefix: str, jax_prefix: str, per_block: bool = False, when=lambda s: True) -> list[Rule]:
    return [
        Rule(f"{torch_prefix}.weight", (f"{jax_prefix}/scale",), copy, lambda s: ((s.width,),), when, per_block),
        Rule(f"{torch_prefix}.bias", (f"{jax_prefix}/bias",), copy, lambda s: ((s.width,),), when, per_block),
    ]


def _mlp(torch_prefix: str, jax_prefix: str, per_block: bool = False, when=lambda s: True) -> list[Rule]:
    return [
        Rule(f"{torch_prefix}.fc1.weight", (f"{jax_prefix}/Dense_0/kernel",), dense,
             lambda s: ((s.width, s.mlp_dim),), when, per_block),
        Rule(f"{torch_prefix}.fc1.bias", (f"{jax_prefix}/Dense_0/bias",), copy, lambda s: ((s.mlp_dim,),), when,
             per_block),
        Rule(f"{torch_prefix}.fc2.weight", (f"{jax_prefix}/Dense_1/kernel",), dense,
             lambda s: ((s.mlp_dim, s.width),), when, per_block),
        Rule(f"{torch_prefix}.fc2.bias", (f"{jax_prefix}/Dense_1/bias",), copy, lambda s: ((s.width,),), when,
             per_block),
    ]


def _qkv_shapes(n: int) -> Callable[[ViTSpec], tuple[Shape, ...]]:
    return lambda s: ((s.width, s.num_heads, s.head_dim),) * n


def _qkv_bias_shapes(n: int) -> Callable[[ViTSpec], tuple[Shape, ...]]:
    return lambda s: ((s.num_heads, s.head_dim),) * n


def _attention(torch_prefix: str, jax_prefix: str, parts: dict[str, tuple[str, ...]], per_block: bool = False,
               when=lambda s: True) -> list[Rule]:
    rules = []
    for name, sources in parts.items():
        n = len(sources)
        rules.append(Rule(f"{torch_prefix}.{name}.weight", tuple(f"{jax_prefix}/{p}/kernel" for p in sources),
                          heads_in, _qkv_shapes(n), when, per_block))
        rules.append(Rule(f"{torch_prefix}.{name}.bias", tuple(f"{jax_prefix}/{p}/bias" for p in sources),
                          heads_bias, _qkv_bias_shapes(n), when, per_block))
    rules.append(Rule(f"{torch_prefix}.proj.weight", (f"{jax_prefix}/out/kernel",), heads_out,
                      lambda s: ((s.num_heads, s.head_dim, s.width),), when, per_block))
    rules.append(Rule(f"{torch_prefix}.proj.bias", (f"{jax_prefix}/out/bias",), copy, lambda s: ((s.width,),), when,
                      per_block))
    return rules


def _is_map(s: ViTSpec) -> bool:
    return s.pool_type == "map"


# The table. Position embedding and class token are not here: they depend on the posemb convention and the target
# grid, see `convert.py::_posemb_tensors`.
RULES: tuple[Rule, ...] = (
    Rule("patch_embed.proj.weight", ("embedding/kernel",), conv_hwio,
         lambda s: ((s.patch_size, s.patch_size, s.in_chans, s.width),)),
    Rule("patch_embed.proj.bias", ("embedding/bias",), copy, lambda s: ((s.width,),)),
    *_ln("blocks.{i}.norm1", f"{BLOCK}/LayerNorm_0", per_block=True),
    *_attention("blocks.{i}.attn", f"{BLOCK}/{MHA}", {"qkv": ("query", "key", "value")}, per_block=True),
    *_ln("blocks.{i}.norm2", f"{BLOCK}/LayerNorm_1", per_block=True),
    *_mlp("blocks.{i}.mlp", f"{BLOCK}/MlpBlock_0", per_block=True),
    *_ln("norm", "Transformer/encoder_norm"),
    Rule("attn_pool.latent", ("MAPHead_0/probe",), copy, lambda s: ((1, 1, s.width),), _is_map),
    *_attention("attn_pool", f"MAPHead_0/{MHA}", {"q": ("query",), "kv": ("key", "value")}, when=_is_map),
    *_ln("attn_pool.norm", "MAPHead_0/LayerNorm_0", when=_is_map),
    *_mlp("attn_pool.mlp", "MAPHead_0/MlpBlock_0", when=_is_map),
    Rule("pre_logits.fc.weight", ("pre_logits/kernel",), dense, lambda s: ((s.width, s.rep_size),),
         lambda s: bool(s.rep_size)),
    Rule("pre_logits.fc.bias", ("pre_logits/bias",), copy, lambda s: ((s.rep_size,),), lambda s: bool(s.rep_size)),
    Rule("head.weight", ("head/kernel",), dense, lambda s: ((s.head_hidden_size, s.num_classes),),
         lambda s: s.num_classes > 0),
    Rule("head.bias", ("head/bias",), copy, lambda s: ((s.num_classes,),), lambda s: s.num_classes > 0),
)


def planned(spec: ViTSpec) -> list[tuple[Rule, str, tuple[str, ...]]]:
    """(rule, torch key, jax keys) in conversion order: parameter-major, block-minor, so that a scan-stacked array
    is read once and used for every block before the next one is read."""
    out = []
    for rule in RULES:
        if rule.when(spec):
            out.extend((rule, tk, jk) for tk, jk in rule.expand(spec))
    return out


__all__ = ["RULES", "Rule", "conv_hwio", "copy", "dense", "heads_bias", "heads_in", "heads_out", "planned",
           "transpose_into", "transposed"]
