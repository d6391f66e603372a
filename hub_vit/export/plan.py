"""What an export writes (`ExportPlan`: the variants, the files' stem, how the fp32 graph is exported) and what every
variant is judged on (`VerificationSet`: noise, photo crops, the model's own images), checked before anything is
built. `hub_vit.export.variants.export_variants` carries them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hub_vit.export import registry
from hub_vit.host import Host

if TYPE_CHECKING:
    import numpy as np

ALL = "all"  # every variant this host can build and that pays off on it (`registry.worth_building`)
FP32 = "fp32"  # the graph every export writes: the one a run without named variants must write


def check_stem(stem: str) -> None:
    """A stem names files inside the output folder: a path in it (`../up`, `sub/m`) would put graphs where the staging
    and the report do not follow them."""
    if not stem or stem in (".", "..") or "/" in stem or "\\" in stem or stem != stem.strip():
        raise ValueError(f"--stem {stem!r} must be a plain file name (no folder, no '/'); choose the folder with -o")


class VariantChoiceError(ValueError):
    """No variant, or one the registry does not have, was asked for; the message lists the registry's names (a
    command line that also takes `all` adds it)."""


@dataclass(frozen=True)
class ExportPlan:
    """The variants to write, in order (registry names), and how.

    `optional`: variants that may be refused (not built on this host, or failing verification) without failing the
    export: the ones `all` chose, or `--cpu-variant auto`'s candidates; never the fp32 graph, which is required
    whenever it is built. Every other variant was named, and must be written. `left_out`: variants `all` did not try
    on this host, and why (reported beside the others)."""

    variants: tuple[str, ...] = registry.names(default=True)
    optional: frozenset[str] = frozenset()
    left_out: dict[str, str] = field(default_factory=dict)
    stem: str = "model"
    opset: int = 17
    dynamic_batch: bool = True
    dynamic_size: bool = False
    attentions: bool = False  # also write `<stem>.attentions.onnx`
    token_means: bool = False  # every graph also writes `token_means`, for a served out-of-domain score
    exporter: str = "dynamo"
    providers: tuple[str, ...] | None = None  # onnxruntime execution providers of the verification
    host: Host | None = field(default=None, repr=False)  # whose needs a variant must meet (None: this machine)

    def __post_init__(self) -> None:
        names = [self.variants] if isinstance(self.variants, str) else list(self.variants)
        if not names:
            raise VariantChoiceError(f"no variant requested; valid choices: {', '.join(registry.names())}")
        unknown = [name for name in names if name not in registry.names()]
        if unknown:
            raise VariantChoiceError(f"unsupported precision/variant {', '.join(map(repr, unknown))}; valid choices: "
                                     f"{', '.join(registry.names())}")
        object.__setattr__(self, "variants", tuple(dict.fromkeys(names)))
        # every other variant is built from the fp32 graph, and a completed export replaces the earlier one: an
        # optional fp32 let `--variant all` exit 0 with nothing written in place of a good earlier export
        object.__setattr__(self, "optional", frozenset(self.optional) - {FP32})
        if self.providers is not None:
            object.__setattr__(self, "providers", tuple(self.providers) or None)
        check_stem(self.stem)
        from hub_vit.export.onnx_export import EXPORTERS

        if self.exporter not in EXPORTERS:
            raise ValueError(f"unknown exporter {self.exporter!r}; valid choices: {', '.join(map(repr, EXPORTERS))}")

    @classmethod
    def of(cls, requested: Sequence[str] | None, host: Host | None = None, **how: object) -> ExportPlan:
        """The plan for what a user names: registry names, or `all` (every variant `host` can build and that pays
        off there; the rest are reported as left out). A name given besides `all`, and the fp32 graph, must be
        written. None: nothing named, so the default variants, of which only the fp32 graph must be written (an int8
        graph that fails verification is reported, as `all` reports one, without failing the export)."""
        if requested is None:
            defaults = registry.names(default=True)
            return cls(defaults, optional=frozenset(defaults) - {FP32}, host=host, **how)  # type: ignore[arg-type]
        requested = [requested] if isinstance(requested, str) else list(requested)
        if ALL not in requested:
            return cls(tuple(requested), host=host, **how)  # type: ignore[arg-type]
        named = [name for name in requested if name != ALL]
        chosen, left_out = registry.worth_building(host)
        return cls(tuple(dict.fromkeys([*chosen, *named])), optional=frozenset(set(chosen) - set(named)),
                   left_out={name: why for name, why in left_out.items() if name not in named}, host=host,
                   **how)  # type: ignore[arg-type]

    def required(self, variant: str) -> bool:
        return variant not in self.optional

    def calibrated(self) -> bool:
        return any(registry.get(name).calibrated for name in self.variants)


@dataclass(frozen=True)
class OwnImages:
    """The model's own kind of images, prepared as its eval transform prepares them (N, C, H, W) float32; `source`
    says where they come from (a file list, a held-out split), `scope` how the report names them."""

    images: np.ndarray
    source: str
    scope: str = "own images"  # "own images" (--images) | "held-out images" (named by the model folder)


LARGEST_SEED = 2**64 - 1  # torch's generators take seeds up to this; numpy's any non-negative integer


def check_seed(seed: int | None) -> None:
    """A verification seed is None (fresh) or an integer in 0..LARGEST_SEED: numpy refused a negative one and torch
    a larger one in their own words, after the model was built."""
    if seed is not None and not 0 <= seed <= LARGEST_SEED:
        raise ValueError(f"--seed must be between 0 and {LARGEST_SEED} (2**64 - 1), got {seed}")


@dataclass(frozen=True)
class VerificationSet:
    """What every variant is judged on: `n_random` uniform noise images (a fresh seed unless `seed`), `n_photos`
    photo crops, and half of the model's `own` images (the other half joins the `n_calibration` calibration images).
    Top-1 agreement is judged on the own images, else on the photos when the model is `trained`, else reported (also
    for a model without a classifier head)."""

    n_random: int = 16
    n_photos: int = 32
    n_calibration: int = 32
    seed: int | None = None
    own: OwnImages | None = None
    trained: bool = False
    note: str = ""  # why the own images the model folder names were not used
    classifier: bool = True  # False: no classifier head (num_classes 0): its `logits` are features, no top-1 to judge

    def __post_init__(self) -> None:
        for name, count in (("n_random", self.n_random), ("n_photos", self.n_photos),
                            ("n_calibration", self.n_calibration)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:  # 2.5 was taken
                raise ValueError(f"{name} must be an integer >= 0, got {count!r}")
        if self.n_random + self.n_photos == 0:
            raise ValueError("n_random and n_photos are both 0: the verification set would be empty")
        check_seed(self.seed)

    @property
    def top1_scope(self) -> str:
        """Which images' top-1 agreement is judged: the own images', the photos' (trained model), or none (random
        weights, or no classifier head)."""
        if not self.classifier:
            return "reported only"
        if self.own is not None and len(self.own.images):
            return self.own.scope
        return "photos" if self.trained else "reported only"

    @property
    def judges_top1(self) -> bool:
        """Whether top-1 agreement is judged on some images (`top1_scope`), not only reported."""
        return self.top1_scope != "reported only"

    @property
    def calibrated_bounds_scope(self) -> str:
        """Which images the cosine / relative-error bounds judge for a calibrated (static int8) variant: the own
        images where there are some (it is promised inside its calibration's domain), else every image."""
        return self.own.scope if self.own is not None and len(self.own.images) else "every image"

    def bounds_for(self, calibrated: bool, own_from: int) -> dict[str, Any]:
        """`hub_vit.export.criterion.judge`'s `bounds_from` / `bounds_scope` for a variant (`own_from`: the first own
        image of the verification images; 0 when there are none)."""
        if calibrated and own_from:
            return {"bounds_from": own_from, "bounds_scope": self.calibrated_bounds_scope}
        return {"bounds_from": 0, "bounds_scope": "every image"}

    def describe(self) -> dict[str, object]:
        """For the report and the served manifest: the set's make-up and where its top-1 is judged."""
        own = self.own
        return {"n_random": self.n_random, "n_photos": self.n_photos, "n_calibration": self.n_calibration,
                "n_own_images": 0 if own is None else len(own.images),
                "own_images": None if own is None else own.source, "trained": self.trained,
                "top1_scope": self.top1_scope, "calibrated_bounds_scope": self.calibrated_bounds_scope,
                **({"note": self.note} if self.note else {})}


__all__ = ["ALL", "ExportPlan", "OwnImages", "VariantChoiceError", "VerificationSet", "check_seed", "check_stem"]
