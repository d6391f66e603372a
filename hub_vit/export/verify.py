"""PyTorch vs ONNX Runtime on the same inputs: fresh random images plus real photographs (scikit-image's bundled set).

Every exported variant is judged by `hub_vit.export.criterion` (fp32: max |logit difference| <= 1e-4; reduced
precision: per-image cosine similarity and relative error of the logits and pre-logits features, plus top-1 agreement
where the images are in-domain); the export commands write a file only if it passes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hub_vit.export.criterion import FP32_MAX_ABS, MIN_TOP1_AGREEMENT, VerifyResult, judge
from hub_vit.model import VisionTransformer

if TYPE_CHECKING:
    from hub_vit.export.plan import VerificationSet

# Colour and grey photographs that ship inside scikit-image (no download); grey ones are repeated to 3 channels.
PHOTO_NAMES: tuple[str, ...] = (
    "astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
    "stereo_motorcycle", "camera", "moon", "brick", "grass", "gravel", "coins", "clock", "cell",
)


# The calibration images are drawn from this seed on every run, whatever the verification's (fresh) seed, so a model
# exports to the same static int8 graph every time: over 60 seeds the draw moved the digits model's held-out
# pre-logits cosine between 0.9899 and 0.9981 (median 0.9962), one seed in 60 under the 0.99 bound. One past the
# largest verification seed (`plan.LARGEST_SEED`): no --seed draws the same photo crops.
CALIBRATION_SEED = 2**64


def load_photos(names: Sequence[str] = PHOTO_NAMES) -> dict[str, np.ndarray]:
    """name -> RGB uint8 (H, W, 3) from `skimage.data`; photos missing from this scikit-image build are skipped."""
    try:
        from skimage import data
    except ImportError:
        raise RuntimeError("the verification photos come from scikit-image, which is not installed: "
                           "pip install scikit-image (part of hub-vit's onnx extra)") from None

    photos: dict[str, np.ndarray] = {}
    for name in names:
        try:
            img = getattr(data, name)()
        except Exception:  # noqa: BLE001 - a photo that needs a download is simply not part of the set
            continue
        img = img[0] if isinstance(img, tuple) else img  # stereo pairs: the left view
        img = np.asarray(img)
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=-1)
        photos[name] = np.ascontiguousarray(img[..., :3]).astype(np.uint8)
    return photos


def photo_batch(size: tuple[int, int], count: int, seed: int = 0, in_chans: int = 3, centre_first: bool = True
                ) -> np.ndarray:
    """`count` (C, H, W) float32 crops in [-1, 1]: each photo centre-cropped first (`centre_first`; the same for every
    seed), then seeded random crops/flips."""
    from PIL import Image

    photos = list(load_photos().values())
    if not photos:
        raise RuntimeError("scikit-image ships no readable photos here; cannot build the verification set")
    rng = np.random.default_rng(seed)
    out = np.empty((count, in_chans, *size), dtype=np.float32)
    for i in range(count):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        if centre_first and i < len(photos):  # centre crop of the shorter side
            side, top, left, flip = min(h, w), (h - min(h, w)) // 2, (w - min(h, w)) // 2, False
        else:  # a random square crop covering 35-100 % of the shorter side
            side = int(min(h, w) * rng.uniform(0.35, 1.0))
            top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            flip = bool(rng.random() < 0.5)
        crop = Image.fromarray(img[top:top + side, left:left + side]).resize((size[1], size[0]), Image.BILINEAR)
        arr = np.asarray(crop, dtype=np.float32)  # (H, W, 3)
        if flip:
            arr = arr[:, ::-1]
        chw = arr.transpose(2, 0, 1) / 127.5 - 1.0  # (3, H, W) in [-1, 1], Google's value range
        out[i] = chw[:in_chans] if in_chans <= 3 else np.resize(chw, (in_chans, *size))
    return out


def verification_inputs(model: VisionTransformer, n_random: int = 16, n_photos: int = 32, seed: int | None = None,
                        size: tuple[int, int] | None = None, images: np.ndarray | None = None
                        ) -> tuple[np.ndarray, int]:
    """(n_random + n_photos [+ len(images)], C, H, W) float32: uniform noise in [-1, 1] from a fresh seed, photo crops,
    then the caller's own in-domain `images` (already preprocessed), if any.

    Returns the batch and the seed (recorded in reports so a failure can be reproduced).
    """
    seed = secrets.randbits(31) if seed is None else seed
    spec = model.spec
    size = tuple(size or spec.img_size)
    gen = torch.Generator().manual_seed(seed)
    noise = (torch.rand(n_random, spec.in_chans, *size, generator=gen) * 2 - 1).numpy()
    photos = photo_batch(size, n_photos, seed=seed, in_chans=spec.in_chans) if n_photos else noise[:0]
    own = noise[:0] if images is None else np.asarray(images, dtype=np.float32)
    if own.shape[1:] != noise.shape[1:]:
        raise ValueError(f"verification images have shape {own.shape[1:]}, the model takes {noise.shape[1:]}")
    return np.concatenate([noise, photos, own]).astype(np.float32), seed


def calibration_images(model: VisionTransformer, count: int, n_random: int, n_photos: int,
                       seed: int = CALIBRATION_SEED) -> tuple[np.ndarray, int]:
    """int8 calibration set: the verification set's mix of photo crops and noise, drawn from `seed` (by default the
    fixed CALIBRATION_SEED), the crops all random (the centre crops, the same for every seed, are the verification's
    alone: a variant is never judged on an image it was calibrated on); returns the images (photos first) and how many
    are photos.

    Calibrating on photos alone left the activation ranges too narrow for the noise images the verification also
    uses (digits model, one experiment: 95 % top-1 agreement with photo-only calibration, 100 % with the mix), so the
    ranges cover what the graph will be checked on.
    """
    spec = model.spec
    n_noise = round(count * n_random / max(1, n_random + n_photos))
    rng = np.random.default_rng(seed)
    noise = rng.uniform(-1, 1, (n_noise, spec.in_chans, *spec.img_size)).astype(np.float32)
    photos = photo_batch(spec.img_size, count - n_noise, seed=seed, in_chans=spec.in_chans, centre_first=False)
    return np.concatenate([photos, noise]), len(photos)


@dataclass(frozen=True)
class Evidence:
    """A `VerificationSet` made concrete for one model: the images (N, C, H, W) every variant runs on, the fp32
    PyTorch outputs they are compared with (`logits`, `pre_logits`), where top-1 agreement is judged, and the
    calibration images with the masks of those whose top-1 class counts and of the model's own among them (for the
    builds that search for the layers to keep in float)."""

    x: np.ndarray
    seed: int
    reference: dict[str, np.ndarray]
    n_own: int  # own images at the end of `x`
    top1_from: int | None  # the first image of `x` whose top-1 agreement is judged; None: reported only
    calibration: np.ndarray
    top1_counts: np.ndarray | None
    own_mask: np.ndarray | None = None  # (len(calibration),) bool: the model's own images; None: it has none

    @property
    def own_from(self) -> int:
        """The first of the own images at the end of `x` (0 when there are none: every image)."""
        return len(self.x) - self.n_own if self.n_own else 0


def gather_evidence(model: VisionTransformer, check: VerificationSet, calibrated: bool) -> Evidence:
    """The verification images and their fp32 reference for `model`; the calibration images when `calibrated`.
    The own images are shared out alternately (verification, calibration, ...), so both halves see every class of a
    class-sorted list. ValueError for a model whose logits do not depend on its input (`check_informative`)."""
    check_informative(model)
    own = None if check.own is None or not len(check.own.images) else check.own.images.astype(np.float32)
    x, seed = verification_inputs(model, n_random=check.n_random, n_photos=check.n_photos, seed=check.seed,
                                  images=None if own is None else own[0::2])
    n_own = 0 if own is None else len(own[0::2])
    # top-1 agreement is judged where the classes mean something (`VerificationSet.top1_scope`): own images, else
    # photos of a trained model; a model without a classifier head has no classes (its `logits` are its features)
    top1_from = (len(x) - n_own if n_own else check.n_random) if check.judges_top1 else None
    calibration, top1_counts, own_mask = x[:0], None, None
    if calibrated:
        mixed, n_photos = calibration_images(model, check.n_calibration, check.n_random, check.n_photos)
        own_calibration = mixed[:0] if own is None else own[1::2]
        calibration = np.concatenate([mixed, own_calibration])
        counts = np.zeros(len(calibration), bool)
        if len(own_calibration):
            counts[len(mixed):] = True
            own_mask = counts.copy()
        elif check.trained and check.classifier:
            counts[:n_photos] = True
        top1_counts = counts if counts.any() else None
    return Evidence(x, seed, torch_outputs(model, x), n_own, top1_from, calibration, top1_counts, own_mask)


@torch.no_grad()
def torch_outputs(model: VisionTransformer, x: np.ndarray, batch_size: int = 8,
                  with_attentions: bool = False) -> dict[str, np.ndarray]:
    """PyTorch reference in float32: `logits` (N, classes), `pre_logits` (N, features: what the head reads) and, if
    asked, `attentions` (N, depth, heads, T, T)."""
    was_training = model.training
    model.eval()
    logits, features, attns = [], [], []
    try:
        for i in range(0, len(x), batch_size):
            out = model.forward_all(torch.from_numpy(x[i:i + batch_size]), output_attentions=with_attentions)
            logits.append(out.logits.numpy())
            features.append(out.pre_logits.numpy())
            if with_attentions:
                attns.append(torch.stack(out.attentions, dim=1).numpy())
    finally:
        model.train(was_training)
    result = {"logits": np.concatenate(logits), "pre_logits": np.concatenate(features)}
    if with_attentions:
        result["attentions"] = np.concatenate(attns)
    return result


def ort_session(path: str | Path, providers: Sequence[str] | None = None, threads: int | None = None) -> Any:
    """An ONNX Runtime session on `providers` (default: CUDA if this onnxruntime has it, else CPU)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if providers is None:
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    check_providers(providers)
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=opts, providers=list(providers))


def check_providers(providers: Sequence[str]) -> None:
    """Refuse execution providers this onnxruntime build does not have, naming the ones it does."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise ValueError(f"execution provider(s) {', '.join(missing)} not available in this onnxruntime "
                         f"({ort.__version__}); available: {', '.join(available)}")


def check_informative(model: VisionTransformer) -> None:
    """Refuse a model on which verification would pass whatever the graph computes: with a constant head (all-zero
    weight: a fresh `hub-vit convert --num-classes` folder, a timm state_dict) every logit is its bias, so max |diff|
    can be 0 and top-1 agreement 100 % by ties for a graph that ignores its input, on any number of images."""
    if model.head_is_constant():
        raise ValueError(
            "cannot verify this model: its classifier head's weight is all zero (freshly initialised), so its logits "
            "do not depend on the input and the comparison with ONNX Runtime would pass without testing anything. "
            "Fine-tune it first (hub-vit train --init) or export a model with a trained head")


def ort_outputs(session: Any, x: np.ndarray, batch_size: int = 8) -> dict[str, np.ndarray]:
    """Run `session` over `x` in batches; returns every graph output by name."""
    names = [o.name for o in session.get_outputs()]
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for i in range(0, len(x), batch_size):
        for name, value in zip(names, session.run(None, {"pixel_values": x[i:i + batch_size]}), strict=True):
            parts[name].append(np.asarray(value, dtype=np.float32))
    return {n: np.concatenate(v) for n, v in parts.items()}


def compare(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float, float]:
    """(max |diff|, mean |diff|, top-1 agreement) of two (N, classes) logit arrays."""
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    agree = float((reference.argmax(-1) == candidate.argmax(-1)).mean()) if reference.ndim == 2 else float("nan")
    return float(diff.max()), float(diff.mean()), agree


__all__ = ["CALIBRATION_SEED", "FP32_MAX_ABS", "MIN_TOP1_AGREEMENT", "PHOTO_NAMES", "Evidence", "VerifyResult",
           "calibration_images", "check_informative", "gather_evidence",
           "check_providers", "compare", "judge", "load_photos",
           "ort_outputs", "ort_session", "photo_batch", "torch_outputs", "verification_inputs"]
