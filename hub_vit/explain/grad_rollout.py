"""Class-specific, gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021, arXiv:2103.15679).

Plain rollout shows where the model looks, whatever it decides. To explain one label, weight every attention map by
the gradient of that label's logit with respect to it, keep the positive part and average the heads:
`Abar_l = mean_h (dy_c/dA_l * A_l)^+`. Relevance starts as the identity (every token is relevant to itself) and each
block adds what its attention mixes in: `R <- R + Abar_l R`, i.e. `R = (I + Abar_L) ... (I + Abar_1)`. The readout
is the same as plain rollout's (class-token row, mean of rows for GAP, gradient-weighted probe row for MAP).

The gradients come from `torch.autograd.grad` through the attention probabilities `forward_all` returns; they are
part of the autograd graph (explicit softmax), so no hooks and no `retain_grad` are needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hub_vit.explain.rollout import RolloutResult, check_pixels_tensor, model_grid, predicting, readout_row


def weighted_attention(attn: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """(B, heads, N, M) attention and its gradient -> (B, N, M): heads-mean of the positive part of grad * attn."""
    return (grad * attn).clamp(min=0).mean(dim=1)


def grad_rollout_from_attentions(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    grid_size: tuple[int, int],
    *,
    readout_type: str,
    num_prefix_tokens: int = 0,
    pool_attention: torch.Tensor | None = None,
    pool_gradient: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chefer relevance maps from attentions (B, heads, N, N) and their gradients: returns (B, grid_h, grid_w)."""
    if len(attentions) != len(gradients) or not attentions:
        raise ValueError(f"need one gradient per attention map, got {len(attentions)} maps, {len(gradients)} grads")
    B, _, N, _ = attentions[0].shape
    probe = None
    if readout_type == "map":
        if pool_attention is None or pool_gradient is None:
            raise ValueError("readout 'map' needs pool_attention and its gradient")
        probe = weighted_attention(pool_attention.float(), pool_gradient.float())[:, 0]  # (B, N)
    # relevance = r^T (I + Abar_depth) ... (I + Abar_1): carried as one row vector (N^2 per layer, not N^3).
    v = readout_row(readout_type, B, N, probe, attentions[0].device)[:, None]  # (B, 1, N)
    for attn, grad in zip(reversed(attentions), reversed(gradients), strict=True):
        v = v + v @ weighted_attention(attn.float(), grad.float())  # (B, 1, N)
    return v[:, 0, num_prefix_tokens:].reshape(B, *grid_size)


def _check_labels(labels: torch.Tensor | Sequence[int] | int | None, logits: torch.Tensor) -> torch.Tensor:
    B, C = logits.shape
    if labels is None:
        return logits.argmax(dim=-1)
    try:
        given = torch.as_tensor(labels, device=logits.device).reshape(-1)
    except (TypeError, ValueError, RuntimeError):  # "3": "new(): invalid data type 'str'"
        raise ValueError(f"labels must be integer class indices (an int, a list of them or a tensor), got "
                         f"{labels!r}") from None
    if given.is_floating_point() or given.is_complex() or given.dtype == torch.bool:
        raise ValueError(f"labels must be integer class indices, got {given.dtype} values {given.tolist()[:8]}")
    given = given.long()
    if given.numel() != 1 and given.numel() != B:
        raise ValueError(f"need one label per image: batch of {B}, got {given.numel()} labels")
    bad = sorted({int(v) for v in given if not 0 <= int(v) < C})  # the labels as given, not one per image
    if bad:
        raise ValueError(f"label(s) {bad} out of range; valid labels are 0..{C - 1}")
    return given.expand(B) if given.numel() == 1 else given


def gradient_rollout(model: torch.nn.Module, x: torch.Tensor,
                     labels: torch.Tensor | Sequence[int] | int | None = None) -> RolloutResult:
    """Class-specific maps for `labels` (one per image, or one for all; default: each image's top-1 class).

    Returns a `RolloutResult` whose `layer_maps` holds just the final map (B, 1, grid_h, grid_w). `model`: a hub-vit
    `VisionTransformer`, or a transformers HubViT model (its `.vit`). The pass runs in eval mode (`predicting`).
    """
    from hub_vit.model import vision_transformer_of

    model = vision_transformer_of(model, "gradient_rollout")
    x = check_pixels_tensor(x, "gradient_rollout")
    if model.spec.num_classes == 0:
        raise ValueError("gradient rollout needs a classifier head; this model has num_classes=0")
    if torch.is_inference_mode_enabled():  # enable_grad cannot lift it, and the backward pass would fail obscurely
        raise RuntimeError("gradient rollout needs autograd: call it outside torch.inference_mode() "
                           "(torch.no_grad() is fine)")
    with torch.enable_grad(), predicting(model):
        # The input is made a leaf that requires grad, so the graph exists even when the weights are frozen.
        x = x.detach().requires_grad_(True)
        out = model.forward_all(x, output_attentions=True)
        labels = _check_labels(labels, out.logits)
        # Images in a batch do not interact, so the summed score gives each image its own gradient.
        score = out.logits.gather(1, labels[:, None]).sum()
        inputs = list(out.attentions) + ([out.pool_attention] if out.pool_attention is not None else [])
        grads = torch.autograd.grad(score, inputs)
    with torch.no_grad():
        depth = len(out.attentions)
        maps = grad_rollout_from_attentions(
            [a.detach() for a in out.attentions], grads[:depth], model_grid(model, x),
            readout_type=model.spec.pool_type, num_prefix_tokens=model.num_prefix_tokens,
            pool_attention=None if out.pool_attention is None else out.pool_attention.detach(),
            pool_gradient=grads[depth] if out.pool_attention is not None else None,
        )
    return RolloutResult(logits=out.logits.detach(), maps=maps, layer_maps=maps[:, None])
