"""What a model can recognise, and when its answer is too unsure to present as one (`domain.json` in a model folder).

A classifier answers every image with one of its classes: the digits model calls a photo of a cat "8" (43 %). The
demo therefore says what each model knows, offers it only examples of its own kind, and marks an answer whose top-1
probability is below the model's threshold as "not a confident answer". The threshold is measured, never typed:
`scripts/calibrate_domain.py` takes the 5th percentile of the top-1 probability on one half of the held-out split
(95 % of in-domain images pass) and reports on the other half and on out-of-domain images; the model card shows
those numbers. Like the other records of a folder, it holds the digest of the weights it was measured on, and is not
applied to other weights.

No torch at import: the demo and the card read it cheaply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOMAIN_FILE = "domain.json"
EXAMPLE_KINDS = ("digits", "photos")
IMAGENET_CLASS_COUNTS = {1000: "ImageNet-1k", 21843: "ImageNet-21k", 11821: "ImageNet-21k (Fall 2011)"}


@dataclass(frozen=True)
class Domain:
    """`knows`: what the model recognises, as a phrase after "this model knows" ("the handwritten digits 0-9");
    `examples`: which example images fit it ('digits' or 'photos'); `threshold`: the top-1 probability below which an
    answer is marked as unsure (None: not measured for these weights); `measured`: the numbers behind it."""

    knows: str
    examples: str
    threshold: float | None = None
    measured: dict[str, Any] = field(default_factory=dict)

    def unsure(self, top1: float) -> bool:
        """Whether a top-1 probability is below the measured threshold (never, without one)."""
        return self.threshold is not None and top1 < self.threshold


def guess_domain(labels: list[str]) -> Domain:
    """A folder without `domain.json`: ImageNet heads know photos; any other head is described by its classes."""
    name = IMAGENET_CLASS_COUNTS.get(len(labels))
    if name is not None:
        return Domain(knows=f"the {len(labels):,} {name} classes (photos of objects, animals and scenes)",
                      examples="photos")
    shown = ", ".join(labels[:5]) + (", ..." if len(labels) > 5 else "")
    return Domain(knows=f"its {len(labels)} classes ({shown})", examples="photos")


def read_domain(folder: str | Path | None, labels: list[str]) -> Domain:
    """The folder's `domain.json`, its threshold kept only while `model.safetensors` holds the weights it was measured
    on; without the file, `guess_domain`. ValueError naming the file when it is not a domain record."""
    path = None if folder is None else Path(folder) / DOMAIN_FILE
    if path is None or not path.is_file():
        return guess_domain(labels)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        domain = Domain(knows=str(data["knows"]), examples=str(data["examples"]),
                        threshold=None if data.get("threshold") is None else float(data["threshold"]),
                        measured=dict(data.get("measured") or {}))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a domain record ({type(exc).__name__}: {exc}); write it with "
                         "scripts/calibrate_domain.py") from None
    if domain.examples not in EXAMPLE_KINDS:
        raise ValueError(f"{path}: unknown examples {domain.examples!r}; valid: {', '.join(EXAMPLE_KINDS)}")
    if domain.threshold is not None and not _same_weights(Path(folder), data.get("weights_digest")):
        return Domain(domain.knows, domain.examples)  # measured on other weights: no threshold for these
    return domain


def _same_weights(folder: Path, digest: Any) -> bool:
    from hub_vit.weights_digest import file_digest

    weights = folder / "model.safetensors"
    return isinstance(digest, str) and weights.is_file() and file_digest(weights) == digest


def calibrate_threshold(top1: Any, keep: float = 0.95) -> float:
    """The rule: the largest threshold that keeps a share `keep` of in-domain answers, i.e. the (1 - keep) quantile
    of their top-1 probabilities (numpy's linear interpolation). Measured on held-out images the model never saw."""
    import numpy as np

    values = np.asarray(top1, dtype=np.float64)
    if values.size == 0 or not 0 < keep <= 1:
        raise ValueError(f"need in-domain top-1 probabilities and keep in (0, 1], got {values.size} values, {keep}")
    return float(np.quantile(values, 1 - keep))


def write_domain(folder: str | Path, domain: Domain) -> Path:
    """Write `domain.json` (atomically) with the digest of the folder's current weights."""
    from hub_vit.atomic import atomic_path
    from hub_vit.weights_digest import file_digest

    path = Path(folder) / DOMAIN_FILE
    record = {"knows": domain.knows, "examples": domain.examples, "threshold": domain.threshold,
              "measured": domain.measured, "weights_digest": file_digest(Path(folder) / "model.safetensors")}
    with atomic_path(path, suffix=".json") as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


__all__ = ["DOMAIN_FILE", "Domain", "calibrate_threshold", "guess_domain", "read_domain", "write_domain"]
