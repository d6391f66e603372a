"""Optimizer and learning-rate schedule matching big_vision's `optax.py` + `utils.create_learning_rate_schedule`.

big_vision (per update, `t` = number of updates already applied, starting at 0):
    s(t)   = min(1, t / warmup) * 0.5 * (1 + cos(pi * clip((t - warmup) / (total - warmup), 0, 1)))
    p     -= s(t) * (lr * adam(clip_by_global_norm(g, 1.0)) + wd * p)          (wd on `.*/kernel$` only)
hub-vit: torch AdamW(lr, betas, eps, weight_decay=wd / lr) on a param group holding exactly the kernels (conv and
linear weights), a no-decay group for biases, LayerNorm scales and embeddings, and timm's `CosineLRScheduler` with a
warm-up *prefix* (so the cosine runs over `total - warmup` steps, as big_vision's `progress` does), stepped per update.
"""

from __future__ import annotations

import logging

import torch
from timm.scheduler import CosineLRScheduler
from torch import nn

from hub_vit.train.recipe import Recipe


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two param groups: big_vision decays `kernel`s only (`wd_mults=[('.*/kernel$', 1.0)]`).

    A flax `kernel` is a Dense/Conv weight, i.e. every torch `.weight` with >= 2 dims; biases, LayerNorm scales and
    (learned) position embeddings / class tokens are left alone.
    """
    no_decay_names = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_kernel = name.endswith(".weight") and param.ndim >= 2 and name not in no_decay_names
        (decay if is_kernel else no_decay).append(param)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def make_optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """AdamW with big_vision's decoupled decay expressed in PyTorch terms (`recipe.torch_weight_decay`)."""
    groups = decay_groups(model, recipe.torch_weight_decay)
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(recipe.b1, recipe.b2), eps=recipe.eps)


def make_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe, total_steps: int) -> CosineLRScheduler:
    """Linear warm-up from 0 over `warmup_steps`, then cosine to 0 at `total_steps`; call `step_update(t)` with the
    number of updates done so far *before* each `optimizer.step()` (optax's `scale_by_schedule` reads the count
    before incrementing it, so the very first update has lr 0, exactly as in big_vision)."""
    warmup = min(recipe.warmup_steps, max(total_steps - 1, 0))
    # a cosine of 1 step makes timm log "Cosine annealing scheduler will have no effect ... t_initial = t_mul =
    # eta_mul = 1", cryptic next to the run's own warning (the warm-up fills the run); the schedule is as intended
    timm_log = logging.getLogger(CosineLRScheduler.__module__)
    level = timm_log.level
    timm_log.setLevel(logging.ERROR)
    try:
        return CosineLRScheduler(
            optimizer,
            t_initial=max(total_steps - warmup, 1),
            lr_min=0.0,
            warmup_t=warmup,
            warmup_lr_init=0.0,
            warmup_prefix=True,
            cycle_limit=1,
            t_in_epochs=False,
        )
    finally:
        timm_log.setLevel(level)


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])
