"""Parity of a converted model: against Google's outputs when a reference `*.io.npz` exists, else self-consistency.

A reference file holds `inputs` (B, H, W, 3) NHWC in [-1, 1] and what Google's code computed from them (`logits`,
`pre_logits`, `pooled`, `encoded`, `block_outputs` (L, B, T, D), `patch_embeddings` (B, h, w, D)); see
tests/fixtures/jax/README.md. Every array present is compared (max abs diff) plus top-1 agreement. The tolerance
is 1e-5 in float32 on CPU, which catches an erf/tanh GELU mix-up (2-4e-4); eps is checked separately.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hub_vit.model import VisionTransformer

TOLERANCE = 1e-5
SELF_CONSISTENCY_TOLERANCE = 1e-3
_CHECKPOINT_SUFFIXES = re.compile(r"\.(published|linen|scan)$")


@dataclass
class ParityReport:
    """Max abs diff per compared array, top-1 agreement, and what was compared against."""

    mode: str  # "reference" (Google's outputs) | "self-consistency" (no reference available)
    reference: str | None
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    top1_agreement: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    tolerance: float = TOLERANCE
    layer_norm_eps: float | None = None
    gelu: str | None = None

    @property
    def measured(self) -> bool:
        return bool(self.max_abs_diff) or self.top1_agreement is not None

    @property
    def passed(self) -> bool | None:
        """True / False for a measured report; None when nothing was compared (neither passed nor failed)."""
        if not self.measured:
            return None
        return all(v <= self.tolerance for v in self.max_abs_diff.values()) and self.top1_agreement in (None, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def find_reference(checkpoint: str | Path) -> Path | None:
    """`x.npz`, `x.published.npz`, `x.linen.npz`, `x.scan.npz` -> `x.io.npz` beside it, if it exists."""
    path = Path(checkpoint)
    if not path.name.endswith(".npz") or path.name.endswith(".io.npz"):
        return None
    stem = _CHECKPOINT_SUFFIXES.sub("", path.name[: -len(".npz")])
    candidate = path.with_name(f"{stem}.io.npz")
    return candidate if candidate.is_file() else None


def _diff(ours: torch.Tensor, theirs: np.ndarray, name: str, reference: str | Path) -> float:
    if tuple(ours.shape) != tuple(theirs.shape):
        raise ValueError(f"reference outputs {str(reference)!r}: their {name!r} array has shape {tuple(theirs.shape)}, "
                         f"the converted model's {tuple(ours.shape)}; are they the outputs of this checkpoint?")
    return float((ours.double() - torch.from_numpy(np.asarray(theirs)).double()).abs().max())


class ReferenceFileError(ValueError):
    """A reference outputs file that is not a readable .npz archive: a truncated download, a text file, a lone .npy."""


def _unreadable(reference: str | Path, why: str) -> ReferenceFileError:
    return ReferenceFileError(f"reference outputs {str(reference)!r} are not a readable .npz archive: {why}; download "
                              "it again or pass another reference file (--reference)")


def check_reference_file(reference: str | Path) -> None:
    """Raise `ReferenceFileError` unless `reference` is a zip archive, as every .npz is. Cheap (the first bytes and
    the zip's end record, no array), so a bad file is named before a download or a conversion.

    np.load guesses the format from the first bytes: a half-downloaded .npz starts as a zip but has no end record
    (a BadZipFile traceback), and any file that is neither zip nor .npy is taken for a pickle ("Cannot load file
    containing pickled data"), which says nothing about what is wrong."""
    try:
        if zipfile.is_zipfile(reference):
            return
        with open(reference, "rb") as f:
            head = f.read(8)
    except OSError as exc:  # no permission: is_zipfile says False, open says why
        raise _unreadable(reference, f"cannot be read ({exc.strerror or exc})") from None
    if not head:
        why = "the file is empty"
    elif head.startswith(b"PK\x03\x04"):
        why = "truncated or damaged (zip header present, end of archive missing)"
    elif head.startswith(b"\x93NUMPY"):
        why = "it is a single .npy array, not an .npz archive"
    else:
        why = f"not a zip archive, as every .npz is (first bytes {head!r})"
    raise _unreadable(reference, why)


def _read_reference(reference: str | Path) -> dict[str, np.ndarray]:
    check_reference_file(reference)
    try:
        with np.load(reference, allow_pickle=False) as io:
            return {k: io[k] for k in io.files}
    # a whole zip with a damaged member: a bad CRC (BadZipFile), broken deflate data (zlib.error), a cut-off array
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _unreadable(reference, f"damaged ({exc})") from None


@torch.no_grad()
def model_outputs(model: VisionTransformer, inputs_nhwc: np.ndarray) -> dict[str, torch.Tensor]:
    """The same named arrays as a reference file, computed by `model` from NHWC inputs."""
    model.eval()
    x = torch.from_numpy(np.ascontiguousarray(inputs_nhwc, dtype=np.float32)).permute(0, 3, 1, 2)  # NCHW
    out = model.forward_all(x, output_hidden_states=True)
    assert out.hidden_states is not None
    return {
        "logits": out.logits,  # (B, C)
        "pre_logits": out.pre_logits,  # (B, R)
        "pooled": model.pool(out.tokens)[0],  # (B, D), before the pre-logits layer
        "encoded": out.tokens,  # (B, T, D)
        "block_outputs": torch.stack(out.hidden_states[1:]),  # (L, B, T, D)
        "patch_embeddings": model.patch_embed.proj(x).permute(0, 2, 3, 1),  # (B, h, w, D)
    }


def _nonparametric_facts(model: VisionTransformer, report: ParityReport) -> None:
    eps = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    gelus = {m.approximate for m in model.modules() if isinstance(m, torch.nn.GELU)}
    report.layer_norm_eps = eps.pop() if len(eps) == 1 else None
    report.gelu = gelus.pop() if len(gelus) == 1 else None


def compare_to_reference(model: VisionTransformer, reference: str | Path, *, function_changed: str | None = None,
                         head_changed: bool = False, pre_logits_changed: bool = False) -> ParityReport:
    """Run `model` on the reference inputs and compare every array the reference has.

    `function_changed` (e.g. the posemb was resampled) limits the comparison to the patch embeddings, which no
    option changes; `head_changed` (a new class count) skips `logits`, `pre_logits_changed` (the pre-logits layer
    dropped) `pre_logits` and `logits`: the layers before them, and so `pooled`, are compared still.
    """
    ref = _read_reference(reference)
    if "inputs" not in ref:
        raise ValueError(f"reference outputs {str(reference)!r} have no 'inputs' array (found: "
                         f"{', '.join(sorted(ref)[:6]) or 'nothing'}{', ...' if len(ref) > 6 else ''}); a reference is "
                         "the *.io.npz written with Google's model code (inputs, logits, ...), not a checkpoint")
    report = ParityReport(mode="reference", reference=str(reference))
    ours = model_outputs(model, ref["inputs"])
    for name, value in ours.items():
        if name not in ref:
            continue
        if function_changed and name != "patch_embeddings":
            report.skipped[name] = function_changed
        elif pre_logits_changed and name in ("logits", "pre_logits"):
            report.skipped[name] = "the pre-logits layer was dropped (--drop-pre-logits)"
        elif head_changed and name == "logits":
            report.skipped[name] = "the head was replaced (--num-classes)"
        else:
            report.max_abs_diff[name] = _diff(value, ref[name], name, reference)
    if "logits" in report.max_abs_diff:
        report.top1_agreement = float((ours["logits"].argmax(-1).numpy() == ref["logits"].argmax(-1)).mean())
    _nonparametric_facts(model, report)
    return report


def _relative_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference relative to the outputs' scale: untrained or synthetic weights can give values in the
    thousands, where float32 summation order alone moves the last digits (for real checkpoints the scale is ~10
    and this is ~absolute)."""
    return float((a - b).abs().max()) / max(1.0, float(a.abs().max()))


@torch.no_grad()
def self_consistency(model: VisionTransformer, batch: int = 2, seed: int = 0) -> ParityReport:
    """No reference: fixed inputs through the fused (SDPA) path and the explicit-softmax path must agree, outputs
    must be finite. The pooled features are always compared (they carry the backbone's whole computation); the
    logits too, unless the head is all zeros. (No second model is built: memory stays at one copy of the weights.)"""
    model.eval()
    spec = model.spec
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(batch, spec.in_chans, *spec.img_size)).astype(np.float32))
    tokens = model.forward_features(x)
    fused_pooled, fused = model.pool(tokens)[0], model.forward_head(tokens)  # forward()'s own head path
    explicit = model.forward_all(x, output_attentions=True)
    explicit_pooled = model.pool(explicit.tokens, return_attn=True)[0]  # a MAP head's explicit-softmax path too
    # No ground truth here, only two float32 paths through the same weights: a relative 1e-3 catches a broken
    # conversion (wrong q/k/v order gives O(1) differences) without failing on near one-hot attention.
    report = ParityReport(mode="self-consistency", reference=None, tolerance=SELF_CONSISTENCY_TOLERANCE)
    report.max_abs_diff["pooled_fused_vs_explicit_rel"] = _relative_diff(fused_pooled, explicit_pooled)
    if not torch.isfinite(fused_pooled).all() or not torch.isfinite(fused).all():
        report.max_abs_diff["non_finite_outputs"] = float("inf")
    if spec.num_classes and model.head_is_constant():
        report.skipped["logits"] = "the head's weight is all zero (freshly initialised): no logit depends on the input"
    elif spec.num_classes:
        report.max_abs_diff["logits_fused_vs_explicit_rel"] = _relative_diff(fused, explicit.logits)
        report.top1_agreement = float((fused.argmax(-1) == explicit.logits.argmax(-1)).float().mean())
    _nonparametric_facts(model, report)
    return report


def format_report(report: ParityReport) -> str:
    """Human-readable lines for the CLI."""
    lines = [f"parity ({report.mode}{': ' + report.reference if report.reference else ''}):"]
    for name, value in report.max_abs_diff.items():
        flag = "ok" if value <= report.tolerance else "FAIL"
        what = "max rel diff" if name.endswith("_rel") else "max abs diff"  # the self-check's rows are relative
        lines.append(f"  {name:<28} {what} {value:.3g}  ({flag}, tolerance {report.tolerance:g})")
    if report.top1_agreement is not None:
        lines.append(f"  top-1 agreement              {report.top1_agreement:.0%}")
    for name, why in report.skipped.items():
        lines.append(f"  {name:<28} skipped: {why}")
    lines.append(f"  LayerNorm eps {report.layer_norm_eps}, GELU approximate={report.gelu!r}")
    lines.append(verdict(report))
    return "\n".join(lines)


def verdict(report: ParityReport) -> str:
    """PASSED / FAILED, qualified when some outputs were not compared (a bare PASSED would claim them too)."""
    if report.passed is None:
        return "  NOT MEASURED"
    if not report.passed:
        return "  FAILED"
    if not report.skipped:
        return "  PASSED"
    return (f"  PASSED for the compared outputs only ({', '.join(report.max_abs_diff) or 'none'}); not compared: "
            f"{', '.join(report.skipped)}")


__all__ = ["ParityReport", "ReferenceFileError", "TOLERANCE", "check_reference_file", "compare_to_reference",
           "find_reference", "format_report", "model_outputs", "self_consistency", "verdict"]
