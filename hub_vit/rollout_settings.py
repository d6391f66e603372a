"""Attention rollout's settings and their checks, without torch: the server's stubs check every request's parameters
with these and import torch only for the first explained request; `hub-vit rollout`'s options start from the same
defaults. The maths is `hub_vit.explain.rollout`, which re-exports these names."""

from __future__ import annotations

from typing import Literal, get_args

HeadFusion = Literal["mean", "max", "min"]
HEAD_FUSIONS: tuple[str, ...] = get_args(HeadFusion)
Readout = Literal["tok", "gap", "map"]
READOUTS: tuple[str, ...] = get_args(Readout)
# Defaults of the server's `explain` requests and of `hub-vit rollout`: the plain rollout of the paper.
DEFAULT_HEAD_FUSION: HeadFusion = "mean"
DEFAULT_DISCARD_RATIO = 0.0


def check_head_fusion(head_fusion: str) -> str:
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"unknown head_fusion {head_fusion!r}; valid choices: {', '.join(map(repr, HEAD_FUSIONS))}")
    return head_fusion


def check_discard_ratio(discard_ratio: float, name: str = "discard_ratio") -> float:
    """`discard_ratio` as a float; ValueError naming it as the caller knows it (`name`: a flag on the command line)."""
    if isinstance(discard_ratio, bool) or not isinstance(discard_ratio, (int, float)) or not 0 <= discard_ratio < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {discard_ratio!r}")
    return float(discard_ratio)


__all__ = ["DEFAULT_DISCARD_RATIO", "DEFAULT_HEAD_FUSION", "HEAD_FUSIONS", "READOUTS", "HeadFusion", "Readout",
           "check_discard_ratio", "check_head_fusion"]
