"""Attention rollout inside a Triton Python-backend step (copied beside its model.py): which requests ask for it,
with which settings, and the maps from the model's attention probabilities.

The maths is `hub_vit.explain.rollout.rollout_from_attentions`, the function `hub-vit rollout` and the demo use, so
served and in-process maps are the same numbers (to float32 rounding of the two attention computations). It needs
hub_vit and torch in the stub's Python, as the CPU flavour's stub has (it runs the Python that `hub-vit serve` runs).
torch is imported by the first explained request, not when the step loads: a stub that only answers plain requests
stays without it (about 270 MB of private memory and a second or two at start and at stop, per instance).

A request asks with its parameters (tritonclient: `infer(..., parameters={...})`): `explain` true, and optionally
`head_fusion` ('mean', 'max' or 'min'; default 'mean') and `discard_ratio` (a number in [0, 1); default 0), the
defaults and rules of `hub-vit rollout`. Parameters, not requested outputs, decide: behind an ensemble a step is asked
for every output the ensemble maps from it, whatever the client requested (Triton 2.51), while parameters reach it.

For another step (a PyTorch flavour, say): `asked, rest = split_explained(requests, responses, refuse)` (a bad
parameter is answered with `refuse(message)`, the step's client error), then `rollout_maps(attentions, layout...,
settings)` on its (B, depth, heads, N, N) attentions, numpy or torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hub_vit.rollout_settings import DEFAULT_DISCARD_RATIO, DEFAULT_HEAD_FUSION, check_discard_ratio, check_head_fusion
from hub_vit.server.protocol import EXPLAIN_PARAMETER as EXPLAIN

HEAD_FUSION, DISCARD_RATIO = "head_fusion", "discard_ratio"


@dataclass(frozen=True)
class ExplainSettings:
    head_fusion: str
    discard_ratio: float


def explain_settings(parameters: str | dict[str, Any]) -> ExplainSettings | None:
    """A request's parameters (the JSON string `request.parameters()` returns, or its dict) -> its rollout settings,
    or None when it does not ask (`explain` absent or false). ValueError naming the bad value and the valid ones.

    `head_fusion` / `discard_ratio` are checked even when `explain` is not set: a typo must not pass unnoticed."""
    values = json.loads(parameters) if isinstance(parameters, str) else parameters
    if not values or not any(key in values for key in (EXPLAIN, HEAD_FUSION, DISCARD_RATIO)):
        return None  # the common case: nothing to check
    explain = values.get(EXPLAIN, False)
    if not isinstance(explain, bool):
        raise ValueError(f"parameter {EXPLAIN!r} must be true or false, got {explain!r}")
    try:
        fusion = check_head_fusion(values.get(HEAD_FUSION, DEFAULT_HEAD_FUSION))
        ratio = check_discard_ratio(values.get(DISCARD_RATIO, DEFAULT_DISCARD_RATIO))
    except ValueError as err:
        raise ValueError(f"bad explanation parameter: {err}") from None
    return ExplainSettings(fusion, ratio) if explain else None


def split_explained(requests: list, responses: list, refuse: Callable[[str], Any]
                    ) -> tuple[list[tuple[int, Any, ExplainSettings]], list]:
    """One batch's requests -> ([(place, request, settings)] of those asking for an explanation, `requests` with those
    and the refused ones replaced by None, for the plain path). A request whose explanation parameters are bad is
    answered in `responses[place]` with `refuse(message)` (the message names the bad value and the valid ones); the
    rest of the batch is served."""
    asked: list[tuple[int, Any, ExplainSettings]] = []
    rest = list(requests)
    for place, request in enumerate(requests):
        try:
            settings = explain_settings(request.parameters())
        except ValueError as err:
            responses[place], rest[place] = refuse(str(err)), None
            continue
        if settings is not None:
            asked.append((place, request, settings))
            rest[place] = None
    return asked, rest


def rollout_maps(attentions: Any, grid: tuple[int, int], readout: str, num_prefix_tokens: int,
                 settings: ExplainSettings, pool_attention: Any = None) -> np.ndarray:
    """(B, depth, heads, N, N) attention probabilities (+ the MAP probe's (B, heads, 1, N)) -> (B, H', W') float32
    full-rollout maps, read out as the classifier reads its tokens (`readout`: 'tok', 'gap' or 'map')."""
    import torch  # here, not at the top: see the module's docstring

    from hub_vit.explain.rollout import rollout_from_attentions

    with torch.no_grad():
        stacked = torch.as_tensor(attentions)
        probe = None if pool_attention is None else torch.as_tensor(pool_attention)
        maps = rollout_from_attentions(list(stacked.unbind(1)), grid, readout_type=readout,
                                       num_prefix_tokens=num_prefix_tokens, pool_attention=probe,
                                       head_fusion=settings.head_fusion, discard_ratio=settings.discard_ratio)
    return maps[:, -1].cpu().numpy().astype(np.float32, copy=False)


def crop_box(width: int, height: int, resized: tuple[int, int], crop: tuple[int, int]) -> tuple[float, ...]:
    """(left, top, right, bottom) of the model's centre crop in the pixels of the `width` x `height` original, which
    was resized to `resized` (W, H) before cropping `crop` (H, W): where the map lies on the original image."""
    (new_w, new_h), (crop_h, crop_w) = resized, crop
    left, top = int(round((new_w - crop_w) / 2.0)), int(round((new_h - crop_h) / 2.0))
    sx, sy = width / new_w, height / new_h
    return (left * sx, top * sy, (left + crop_w) * sx, (top + crop_h) * sy)


def pixels_and_boxes(preprocess: Any, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One request's `image` tensor -> (B, 3, H, W) pixels as `preprocess.batch` makes them and (B, 4) float32 crop
    boxes; the BadImageError names the first bad image by its index, as `batch` does."""
    from imageprep import BadImageError

    if images.size == 0:
        return preprocess.batch(images), np.zeros((0, 4), np.float32)  # batch() names the problem
    pixels, boxes = [], []
    for index, data in enumerate(images.reshape(-1)):
        try:
            image = preprocess.decode(data if isinstance(data, bytes) else bytes(data))
            pixels.append(preprocess.pixels(image))
        except BadImageError as err:
            raise err.of_image(index) from None
        boxes.append(crop_box(*image.size, preprocess.resized_size(*image.size), preprocess.crop_size))
    return np.stack(pixels), np.asarray(boxes, dtype=np.float32)
