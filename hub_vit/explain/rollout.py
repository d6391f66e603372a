"""Attention rollout (Abnar & Zuidema 2020, arXiv:2005.00928) for every hub-vit model, batched, without hooks.

The model returns its attention probabilities explicitly (`VisionTransformer.forward_all(output_attentions=True)`
computes `softmax(q k^T / sqrt(d))` itself), so rollout works the same whatever attention kernel the fast path uses.

Per layer: fuse the heads (`mean | max | min`), optionally zero the lowest attentions of each row (`discard_ratio`),
add the identity for the residual path, renormalise every row to sum 1 (`keepdim=True`, the classic bug is dividing
by an unbroadcast row sum), then multiply the layers together: `R_l = A_l R_{l-1}`, `R_0 = I`. Row i of `R_l` says
how much of output token i (after l blocks) comes from each input token.

What the classifier reads decides which rows to use ("readout"):
* `tok` (class token): the class-token row, over the patch columns.
* `gap` (SimpleViT): the pooled feature is the mean of all token rows, so the readout is the mean of R's rows.
* `map` (attention-pooling probe): the probe's (head-fused) attention over the final tokens, times R. The probe has
  no residual connection to the tokens, so no identity is added to it.

Design choice for `discard_ratio`: per row, the `floor(discard_ratio * num_patches)` smallest attentions are set to 0,
choosing only among patch columns that are not the row's own token. The diagonal (the token itself) and prefix-token
columns (the class token) are never dropped: dropping them would cut the very path the readout follows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

# the settings and their checks live without torch (the server's stubs check parameters before any rollout)
from hub_vit.rollout_settings import (  # noqa: F401 - re-exported: this module is where rollout users look
    DEFAULT_DISCARD_RATIO,
    DEFAULT_HEAD_FUSION,
    HEAD_FUSIONS,
    READOUTS,
    HeadFusion,
    Readout,
    check_discard_ratio,
    check_head_fusion,
)


def fuse_heads(attn: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """(B, heads, N, M) -> (B, N, M) by the mean, max or min over heads."""
    check_head_fusion(head_fusion)
    if head_fusion == "mean":
        return attn.mean(dim=1)
    if head_fusion == "max":
        return attn.amax(dim=1)
    return attn.amin(dim=1)


def discard_lowest(attn: torch.Tensor, discard_ratio: float, num_prefix_tokens: int) -> torch.Tensor:
    """Zero the `floor(discard_ratio * num_patches)` smallest entries of every row of (B, N, N) `attn`.

    Candidates are patch columns other than the row's own token; the diagonal and the prefix (class-token) columns
    are never dropped. Returns a new tensor.
    """
    n = attn.shape[-1]
    k = int(check_discard_ratio(discard_ratio) * (n - num_prefix_tokens))
    if k == 0:
        return attn
    protected = torch.eye(n, dtype=torch.bool, device=attn.device)  # (N, N)
    protected[:, :num_prefix_tokens] = True
    # k <= num_patches - 1 (ratio < 1), and every row has at least num_patches - 1 candidates: never picks +inf.
    scores = attn.masked_fill(protected, float("inf"))
    drop = scores.topk(k, dim=-1, largest=False).indices  # (B, N, k)
    return attn.scatter(-1, drop, 0.0)


def residual_normalise(attn: torch.Tensor) -> torch.Tensor:
    """(B, N, N): add the identity for the skip connection, then make every row sum to 1."""
    a = attn + torch.eye(attn.shape[-1], dtype=attn.dtype, device=attn.device)
    return a / a.sum(dim=-1, keepdim=True)


def readout_row(kind: str, batch: int, num_tokens: int, probe: torch.Tensor | None = None,
                device: torch.device | None = None) -> torch.Tensor:
    """The (B, N) row vector r with which the classifier reads the final tokens, so that relevance = r^T R.

    `kind` is the model's `spec.pool_type`: 'tok' -> e_0 (the class token), 'gap' -> the uniform mean over all token
    rows (the GAP output is that mean), 'map' -> the probe's head-fused attention `probe` (B, N).
    """
    if kind == "tok":
        row = torch.zeros(batch, num_tokens, device=device)
        row[:, 0] = 1.0
        return row
    if kind == "gap":
        return torch.full((batch, num_tokens), 1.0 / num_tokens, device=device)
    if kind == "map":
        if probe is None:
            raise ValueError("readout 'map' needs the probe's pool_attention (B, heads, 1, N) from forward_all")
        return probe.float()
    raise ValueError(f"unknown readout {kind!r}; valid choices: {', '.join(map(repr, READOUTS))}")


def _layers(attentions: Sequence[torch.Tensor] | torch.Tensor | object) -> list[torch.Tensor]:
    """depth tensors (B, heads, N, N) from a sequence of them (torch or numpy: `forward_all`, transformers'
    `output_attentions`), or from one (B, depth, heads, N, N) stack (the `attentions` output of an exported
    `model.attentions.onnx`)."""
    if not isinstance(attentions, (torch.Tensor, Sequence)) and hasattr(attentions, "__array__"):
        attentions = torch.as_tensor(attentions)  # a numpy stack, as ONNX Runtime returns it
    if isinstance(attentions, torch.Tensor):
        if attentions.ndim != 5:
            raise ValueError(f"attentions as one tensor must be (batch, depth, heads, tokens, tokens), got shape "
                             f"{tuple(attentions.shape)}; or give a sequence of (batch, heads, tokens, tokens)")
        return list(attentions.unbind(1))
    layers = [torch.as_tensor(a) for a in attentions]
    for i, a in enumerate(layers):
        if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
            raise ValueError(f"attentions[{i}] must be (batch, heads, tokens, tokens), got shape {tuple(a.shape)}")
    return layers


def rollout_from_attentions(
    attentions: Sequence[torch.Tensor] | torch.Tensor,
    grid_size: tuple[int, int],
    *,
    readout_type: str,
    num_prefix_tokens: int = 0,
    pool_attention: torch.Tensor | None = None,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Per-layer rollout maps from a model's attention probabilities: returns (B, depth, grid_h, grid_w).

    `attentions`: depth tensors (B, heads, N, N), N = num_prefix_tokens + grid_h * grid_w, or one stack of them
    (B, depth, heads, N, N), as torch tensors or numpy arrays. `pool_attention`:
    (B, heads, 1, N), required for readout 'map'. Entry `[:, l]` is the rollout through blocks 1..l+1, read out as
    the classifier reads the tokens; `[:, -1]` is the full rollout. Maps are relevance mass (not rescaled): for
    'gap' and 'map' each map sums to 1, for 'tok' it sums to 1 minus what stays on the class token.
    """
    check_head_fusion(head_fusion)
    check_discard_ratio(discard_ratio)
    attentions = _layers(attentions)
    if not attentions:
        raise ValueError("no attention tensors given; call forward_all(x, output_attentions=True)")
    if pool_attention is not None:
        pool_attention = torch.as_tensor(pool_attention)
    B, _, N, _ = attentions[0].shape
    gh, gw = grid_size
    if N != num_prefix_tokens + gh * gw:
        raise ValueError(f"attention has {N} tokens but grid {gh}x{gw} + {num_prefix_tokens} prefix token(s) "
                         f"gives {num_prefix_tokens + gh * gw}")
    probe = None
    if readout_type == "map" and pool_attention is not None:
        probe = fuse_heads(pool_attention.float(), head_fusion)[:, 0]  # (B, N); no residual on the probe
        probe = probe / probe.sum(dim=-1, keepdim=True)
    row = readout_row(readout_type, B, N, probe, attentions[0].device)  # (B, N)
    fused = [discard_lowest(fuse_heads(a.float(), head_fusion), discard_ratio, num_prefix_tokens)
             for a in attentions]  # depth x (B, N, N)
    # The residual-normalised layer is A_l = D^-1 (F + I), D = diag(rowsum(F) + 1) (`residual_normalise`); a row
    # vector times it is (v / d) F + v / d, so neither F + I nor its division is built: those (B, N, N) temporaries
    # were most of a map's time.
    row_sums = [f.sum(dim=-1) + 1.0 for f in fused]  # depth x (B, N)
    # Map l is row^T A_l ... A_1 (= row^T R_l). Rather than N x N matrix products (depth N^3), carry one row vector
    # per map and push all of them down through the layers together: about depth^2 / 2 vector-matrix products
    # (N^2 each), ~N / depth times cheaper, same numbers. `chains[:, l]` is map l's vector; at layer j (top down)
    # map j starts as row^T A_j and every map above it is multiplied by A_j.
    depth = len(fused)
    chains = row.new_zeros(B, depth, N)
    for j in range(depth - 1, -1, -1):
        chains[:, j] = row
        scaled = chains[:, j:] / row_sums[j][:, None, :]  # (B, depth - j, N): v / d
        chains[:, j:] = scaled @ fused[j] + scaled  # (B, depth - j, N) @ (B, N, N)
    return chains[:, :, num_prefix_tokens:].reshape(B, depth, gh, gw)


def joint_attention(attentions: Sequence[torch.Tensor], head_fusion: str = "mean", discard_ratio: float = 0.0,
                    num_prefix_tokens: int = 0) -> torch.Tensor:
    """The full rollout matrix R = A_depth ... A_1 (B, N, N), row i = input-token mixture of output token i.

    `rollout_from_attentions` computes only the rows it needs; this is for inspecting every token.
    """
    B, _, N, _ = attentions[0].shape
    joint = torch.eye(N, device=attentions[0].device).expand(B, N, N)
    for attn in attentions:
        a = discard_lowest(fuse_heads(attn.float(), head_fusion), discard_ratio, num_prefix_tokens)
        joint = residual_normalise(a) @ joint  # (B, N, N)
    return joint


@dataclass(frozen=True)
class RolloutResult:
    """What `attention_rollout` returns. `maps` is `layer_maps[:, -1]`."""

    logits: torch.Tensor  # (B, num_classes)
    maps: torch.Tensor  # (B, grid_h, grid_w)
    layer_maps: torch.Tensor  # (B, depth, grid_h, grid_w): rollout through blocks 1..l+1


def check_pixels_tensor(x: object, caller: str) -> torch.Tensor:
    """`x` when it is a torch tensor, else a TypeError saying how to make one (a numpy array reached the model as
    "'numpy.ndarray' object has no attribute 'is_floating_point'")."""
    if not isinstance(x, torch.Tensor):
        hint = ": torch.from_numpy(array), channels first" if type(x).__module__ == "numpy" else ""
        raise TypeError(f"{caller} takes the pixels as a torch.Tensor (B, C, H, W) in [-1, 1], got "
                        f"{type(x).__name__}{hint}")
    return x


@contextlib.contextmanager
def predicting(model: torch.nn.Module) -> Iterator[None]:
    """`model` in eval mode for the block, its own mode again after: a map explains the prediction, and dropout or
    stochastic depth (a model built with `drop_path_rate`, left in training mode) made every call's map another."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def model_grid(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """The patch grid of input `x` (B, C, H, W) for `model` (any size that tiles into patches)."""
    patch = model.spec.patch_size
    return (x.shape[-2] // patch, x.shape[-1] // patch)


@torch.no_grad()
def attention_rollout(model: torch.nn.Module, x: torch.Tensor, head_fusion: str = "mean",
                      discard_ratio: float = 0.0) -> RolloutResult:
    """One forward pass of a hub-vit `VisionTransformer` (or a transformers HubViT model: its `.vit`) on (B, C, H, W)
    `x` in [-1, 1], and its rollout maps. The pass runs in eval mode (`predicting`)."""
    from hub_vit.model import vision_transformer_of

    model = vision_transformer_of(model, "attention_rollout")
    x = check_pixels_tensor(x, "attention_rollout")
    check_head_fusion(head_fusion)
    check_discard_ratio(discard_ratio)
    with predicting(model):
        out = model.forward_all(x, output_attentions=True)
    layer_maps = rollout_from_attentions(
        out.attentions, model_grid(model, x), readout_type=model.spec.pool_type,
        num_prefix_tokens=model.num_prefix_tokens, pool_attention=out.pool_attention,
        head_fusion=head_fusion, discard_ratio=discard_ratio,
    )
    return RolloutResult(logits=out.logits, maps=layer_maps[:, -1], layer_maps=layer_maps)
