"""The verification criterion every exported or served variant must pass against the fp32 PyTorch model.

It means something on any weights, trained or random:

* fp32 graphs (plain, ORT-fused): max |logit difference| <= `FP32_MAX_ABS` (1e-4).
* reduced precision (fp16, bf16, int8, any engine): for **every image**, the cosine similarity of the logits and of
  the pre-logits features (what the head reads) with fp32 >= `MIN_COSINE` (0.99), and their relative error
  ||candidate - fp32|| / ||fp32|| <= `MAX_REL_ERROR` (0.15). A random ViT's top-1 margins are hundredths of a logit,
  so top-1 agreement alone refuses a sound int8 graph there, while these two keep their meaning: a random ViT-Ti/16's
  int8 graphs measure cosine >= 0.994 and relative error <= 0.11, a damaged graph (one block's weights off) far less.
* plus top-1 agreement >= `MIN_TOP1_AGREEMENT` (99 %) where top-1 means something: over the caller's own in-domain
  images when given (`--images`), else over the photographs when the model is trained (its classes are real); on
  random weights it is reported, not judged.
* which images the cosine / relative-error bounds judge (`bounds_from`): every image, except for a calibrated
  (static int8) variant of a model with its own images. Static int8 fixes its activation ranges from calibration
  images and promises its answers inside their domain: there the bounds judge the model's own images, and the noise
  and photos are reported beside them (`extra["reported_only"]`: their worst numbers), not judged. A digits model's
  static int8 graph passed on its held-out digits for every seed tried and missed on one noise image or photo crop in
  three seeds of four (docs/export.md).

The result names each number, its bound and the margin (how far above or below the bound it is), so a refusal says
by how much. Pure numpy: the benchmark and the server's variant selection apply the same rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FP32_MAX_ABS = 1e-4
MIN_COSINE = 0.99
MAX_REL_ERROR = 0.15
MIN_TOP1_AGREEMENT = 0.99


@dataclass
class VerifyResult:
    """One variant's verification: numbers, thresholds, margins and the verdict (with the reason when it fails)."""

    variant: str
    provider: str
    n_random: int
    n_photos: int
    seed: int
    max_abs_diff: float
    mean_abs_diff: float
    top1_agreement: float  # over every verification image (reported; judged over `top1_scope`)
    thresholds: dict[str, float]
    passed: bool
    reason: str = ""
    # worst image per measure: logits_min_cosine, logits_max_rel_error, pre_logits_min_cosine, ...
    worst: dict[str, float] = field(default_factory=dict)
    margins: dict[str, float] = field(default_factory=dict)  # > 0: inside the bound by that much; < 0: outside
    top1_scope: str = "reported only"  # "own images" | "photos" | "reported only" (random weights)
    bounds_scope: str = "every image"  # the images the cosine / relative-error bounds judge: or "held-out images", ...
    top1_judged: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def per_image(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosine similarity, relative L2 error) per row of two (N, D) arrays, in float64."""
    ref, got = reference.astype(np.float64), candidate.astype(np.float64)
    ref_norm = np.linalg.norm(ref, axis=-1)
    got_norm = np.linalg.norm(got, axis=-1)
    tiny = np.finfo(np.float64).tiny  # an all-zero row: cosine 0 unless both are zero
    cos = (ref * got).sum(-1) / np.maximum(ref_norm * got_norm, tiny)
    cos = np.where((ref_norm == 0) & (got_norm == 0), 1.0, cos)
    rel = np.linalg.norm(ref - got, axis=-1) / np.maximum(ref_norm, tiny)
    return cos, rel


def judge(variant: str, precision: str, reference: np.ndarray, candidate: np.ndarray, *, provider: str,
          n_random: int, seed: int, reference_features: np.ndarray | None = None,
          candidate_features: np.ndarray | None = None, top1_from: int | None = None,
          top1_scope: str = "reported only", bounds_from: int = 0, bounds_scope: str | None = None) -> VerifyResult:
    """Apply the criterion to (N, classes) logits (and (N, features) pre-logits when given) of fp32 vs a variant.

    `top1_from`: index of the first image whose top-1 agreement is judged (those from it on: the own images, or
    the photos after the `n_random` noise images); None = reported only. `bounds_from`: index of the first image the
    cosine / relative-error bounds judge (`bounds_scope` names them; default: "every image", or "images N-..." from a
    later one); the worst numbers of the images before it go to `extra["reported_only"]`. Image indices in the reasons
    count from the first image of all.
    """
    if not 0 <= bounds_from < len(reference):
        raise ValueError(f"bounds_from must index one of the {len(reference)} images, got {bounds_from}")
    bounds_scope = bounds_scope or (f"images {bounds_from}-{len(reference) - 1}" if bounds_from else "every image")
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    max_abs, mean_abs = float(diff.max()), float(diff.mean())
    agree = float((reference.argmax(-1) == candidate.argmax(-1)).mean())
    result = VerifyResult(variant=variant, provider=provider, n_random=n_random, n_photos=len(reference) - n_random,
                          seed=seed, max_abs_diff=max_abs, mean_abs_diff=mean_abs, top1_agreement=agree,
                          thresholds={}, passed=True, bounds_scope=bounds_scope)
    pairs = {"logits": (reference, candidate)}
    if reference_features is not None and candidate_features is not None:
        pairs["pre_logits"] = (reference_features, candidate_features)
    failures: list[str] = []
    reported: dict[str, float] = {}
    for name, (ref, got) in pairs.items():
        cos, rel = per_image(ref, got)
        if bounds_from:  # (N,) -> the judged images'; the others' worst is reported
            reported[f"{name}_min_cosine"] = float(cos[:bounds_from].min())
            reported[f"{name}_max_rel_error"] = float(rel[:bounds_from].max())
            cos, rel = np.concatenate([np.full(bounds_from, np.inf), cos[bounds_from:]]), \
                np.concatenate([np.full(bounds_from, -np.inf), rel[bounds_from:]])
        result.worst[f"{name}_min_cosine"] = float(cos.min())
        result.worst[f"{name}_max_rel_error"] = float(rel.max())
        if precision == "fp32":
            continue
        result.thresholds[f"{name}_min_cosine"] = MIN_COSINE
        result.thresholds[f"{name}_max_rel_error"] = MAX_REL_ERROR
        result.margins[f"{name}_min_cosine"] = float(cos.min()) - MIN_COSINE
        result.margins[f"{name}_max_rel_error"] = MAX_REL_ERROR - float(rel.max())
        if cos.min() < MIN_COSINE:
            failures.append(f"{name} cosine similarity {cos.min():.4f} on image {int(cos.argmin())} is "
                            f"{MIN_COSINE - cos.min():.4f} below the bound {MIN_COSINE}")
        if rel.max() > MAX_REL_ERROR:
            failures.append(f"{name} relative error {rel.max():.3f} on image {int(rel.argmax())} is "
                            f"{rel.max() - MAX_REL_ERROR:.3f} above the bound {MAX_REL_ERROR}")
    if precision == "fp32":
        result.thresholds["max_abs_diff"] = FP32_MAX_ABS
        result.margins["max_abs_diff"] = FP32_MAX_ABS - max_abs
        if max_abs > FP32_MAX_ABS:
            failures.append(f"max |logit diff| {max_abs:.3g} > {FP32_MAX_ABS:g} (by {max_abs - FP32_MAX_ABS:.3g})")
    elif top1_from is not None and top1_from < len(reference):
        judged = float((reference[top1_from:].argmax(-1) == candidate[top1_from:].argmax(-1)).mean())
        result.top1_scope, result.top1_judged = top1_scope, judged
        result.thresholds["top1_agreement"] = MIN_TOP1_AGREEMENT
        result.margins["top1_agreement"] = judged - MIN_TOP1_AGREEMENT
        if judged < MIN_TOP1_AGREEMENT:
            failures.append(f"top-1 agreement {judged:.1%} < {MIN_TOP1_AGREEMENT:.0%} over "
                            f"{len(reference) - top1_from} {top1_scope} (by {MIN_TOP1_AGREEMENT - judged:.1%})")
    if reported:
        result.extra["reported_only"] = {"images": bounds_from, **reported}
    result.passed = not failures
    result.reason = "; ".join(failures)
    return result


def top1_text(result: VerifyResult | dict[str, Any]) -> str:
    """The top-1 agreement a report shows: the judged one with its scope (`99.4% (held-out images)`), else the one
    over every image, marked as reported only; the export's table and its summary line both show this."""
    data = result.to_dict() if isinstance(result, VerifyResult) else result
    if data.get("top1_judged") is not None:
        return f"{data['top1_judged']:.1%} ({data['top1_scope']})"
    return f"{data['top1_agreement']:.1%} (reported only)"


def summary(result: VerifyResult | dict[str, Any]) -> str:
    """One line for a report: the worst image's numbers and the smallest margin."""
    data = result.to_dict() if isinstance(result, VerifyResult) else result
    worst = data.get("worst") or {}
    parts = [f"{key.replace('_', ' ')} {value:.4g}" for key, value in worst.items()]
    scope = data.get("bounds_scope") or "every image"
    if scope != "every image":
        parts[0] = f"on the {scope}: {parts[0]}"
    reported = (data.get("extra") or {}).get("reported_only")
    if reported:
        lowest = min(value for key, value in reported.items() if key.endswith("_min_cosine"))
        parts.append(f"the other {reported['images']} images' lowest cosine {lowest:.4g} (reported only)")
    if data.get("top1_judged") is not None:
        parts.append(f"top-1 {top1_text(data)}")
    margins = data.get("margins") or {}
    if margins:
        key = min(margins, key=margins.get)
        parts.append(f"closest bound: {key.replace('_', ' ')} by {margins[key]:+.3g}")
    return ", ".join(parts)


__all__ = ["FP32_MAX_ABS", "MAX_REL_ERROR", "MIN_COSINE", "MIN_TOP1_AGREEMENT", "VerifyResult", "judge",
           "per_image", "summary", "top1_text"]
