"""The out-of-domain score: how unlike the images a model was calibrated on an image's features are.

A classifier answers every image with one of its classes, and its softmax confidence says little about whether the
image is of the kind it knows (the digits model calls a photo of an astronaut "9" at 96 %). This score reads the
features instead. `token_means` (B, depth, D) is each block's output averaged over its tokens
(`hub_vit.model.token_means`). For a few blocks (`score_blocks`: at a quarter, half, three quarters and all of the
depth) one Gaussian is fitted to the features of in-domain images (scikit-learn's empirical covariance and its
inverse, computed as a pseudo-inverse); an image's score is its squared Mahalanobis distance to each block's Gaussian
divided by the feature width (about 1 for an in-domain image), averaged over the blocks: the feature ensemble of Lee
et al. 2018 ("A simple unified framework for detecting out-of-distribution samples and adversarial attacks"), one
Gaussian per block instead of one per class. `bench/bench_domain.py` measured that choice against softmax
confidence, energy, Mahalanobis on the pre-logits features, relative Mahalanobis, kNN, class-conditional Gaussians
and a shrunk (Ledoit-Wolf) covariance (`bench/results/domain_digits.json`).

The covariance must be of full rank, and well estimated: its pseudo-inverse gives no weight to a direction the fit
images do not span (N centred images span at most N - 1 of D), so an image unlike them only there scores as
in-domain (the digits model fitted on its 20 samples, at width 64, called the astronaut in-domain); and with N just
above D the smallest eigenvalues of the sample covariance collapse towards 0 (Marchenko-Pastur: to about
(1 - sqrt(D / N))^2 of the true ones), so noise in those directions decides the score (by Hotelling's T^2, an
in-domain image's expected score is (N + 1) / (N - D - 2) times its value for many images: unbounded at N = D + 2,
about 2 at N = 2D). So `fit` refuses fewer than 2D images (`fewest_fit_images`) and features that span fewer than D
directions (duplicate images). A shrunk covariance would take fewer images, but it is another score than the one
measured (the bench's Ledoit-Wolf row) and shipped.

The threshold is split conformal (Vovk et al. 2005; Angelopoulos & Bates 2021): of n held-out in-domain scores the
ceil((n + 1)(1 - rate))-th smallest, so a new in-domain image scores above it with probability at most `rate`.

numpy only (scikit-learn when fitting, safetensors to read and write the file), nothing of hub_vit: `hub-vit
repository` copies this file beside the classifier step that serves the score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# the tensors of a statistics file (`domain.safetensors` in a model folder)
TENSORS = ("blocks", "mean", "precision", "threshold")


@dataclass(frozen=True)
class DomainStatistics:
    """One fitted score: `blocks` (L,) the 0-based blocks it reads, `mean` (L, D) and `precision` (L, D, D) of each
    block's Gaussian, `threshold` the score above which an image is out of domain."""

    blocks: tuple[int, ...]
    mean: np.ndarray
    precision: np.ndarray
    threshold: float

    def scores(self, token_means: np.ndarray) -> np.ndarray:
        """(B, depth, D) token means -> (B,) float32 scores (about 1 in domain; larger is less like it)."""
        features = np.asarray(token_means, dtype=np.float64)
        if features.ndim != 3 or features.shape[1] <= max(self.blocks) or features.shape[2] != self.mean.shape[1]:
            raise ValueError(f"token means of shape {features.shape} do not fit statistics fitted on blocks "
                             f"{list(self.blocks)} of width {self.mean.shape[1]}")
        centred = features[:, list(self.blocks)] - self.mean  # (B, L, D)
        squared = np.einsum("bld,lde,ble->bl", centred, self.precision.astype(np.float64), centred)  # (B, L)
        return (squared / self.mean.shape[1]).mean(axis=1).astype(np.float32)

    def out_of_domain(self, scores: np.ndarray) -> np.ndarray:
        """(B,) bool: the scores above the threshold."""
        return np.asarray(scores) > self.threshold


def score_blocks(depth: int) -> tuple[int, ...]:
    """The 0-based blocks the score reads: those at a quarter, half, three quarters and all of `depth` (all four of a
    4-block model; 2, 5, 8, 11 of a 12-block one). Four, whatever the depth, keep the statistics file small (4 D x D
    matrices: 26 MB for ViT-H) and cover the early blocks, where images unlike the training data stand out most."""
    if depth < 1:
        raise ValueError(f"a model has at least one block, got depth {depth}")
    return tuple(sorted({max(1, round(depth * k / 4)) - 1 for k in range(1, 5)}))


def fewest_fit_images(width: int) -> int:
    """The fewest images a score on features of width D is fitted on: 2D (128 at width 64; see the module
    docstring: D + 1 make the covariance invertible, not yet a usable estimate). More are better."""
    return 2 * width


def too_few_fit_images(count: int, width: int) -> str:
    """Why `count` images are too few to fit a score on features of `width` (a sentence; it names what to give)."""
    fewest = fewest_fit_images(width)
    return (f"too few for the model's feature width {width}: the score needs at least {fewest}, twice the width (with "
            "fewer, their covariance is singular or dominated by noise in the directions they barely span, and an "
            f"image unlike them there passes as in-domain); give at least {fewest} images of the kind the model knows "
            "(more are better)")


def fit(token_means: np.ndarray, blocks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(N, depth, D) token means of in-domain images -> (L, D) means and (L, D, D) precisions (inverse covariances)
    of the `blocks`, float32. ValueError naming the numbers for fewer than `fewest_fit_images(D)` images, or features
    that span fewer than D directions (a singular covariance): see the module docstring."""
    from sklearn.covariance import EmpiricalCovariance

    features = np.asarray(token_means, dtype=np.float64)
    if features.ndim != 3:
        raise ValueError(f"need the token means (N, depth, D) of the fit images, got shape {features.shape}")
    count, width = len(features), features.shape[2]
    if count < fewest_fit_images(width):  # the plan refuses them before any feature; this is the library's guard
        raise ValueError(f"{count} images to fit the score on: {too_few_fit_images(count, width)}")
    means, precisions = [], []
    for block in blocks:
        estimate = EmpiricalCovariance().fit(features[:, block])
        # the rank the pseudo-inverse (scipy's pinvh) keeps: the same cut-off, relative to the largest eigenvalue
        rank = int(np.linalg.matrix_rank(estimate.covariance_, hermitian=True))
        if rank < width:
            raise ValueError(f"the features of the {count} fit images span only {rank} of the {width} feature "
                             f"directions at block {block + 1} (duplicate or near-identical images?), and the score "
                             f"would ignore the other {width - rank}; give more, and more varied, images of the kind "
                             "the model knows")
        means.append(estimate.location_)
        precisions.append(estimate.precision_)
    return np.stack(means).astype(np.float32), np.stack(precisions).astype(np.float32)


def fewest_held_out(false_alarm_rate: float) -> int:
    """The fewest held-out scores a conformal threshold at `false_alarm_rate` needs (99 at 1 %)."""
    return math.ceil((1 - false_alarm_rate) / false_alarm_rate)


def conformal_threshold(scores: np.ndarray, false_alarm_rate: float) -> float:
    """The split-conformal threshold of held-out in-domain `scores` (see the module docstring). ValueError naming
    the numbers when the rate is not in (0, 1) or there are too few scores for it."""
    values = np.sort(np.asarray(scores, dtype=np.float64).reshape(-1))
    if not 0 < false_alarm_rate < 1:
        raise ValueError(f"the false-alarm rate must be in (0, 1), got {false_alarm_rate}")
    rank = math.ceil((len(values) + 1) * (1 - false_alarm_rate))
    if rank > len(values):
        raise ValueError(f"a false-alarm rate of {false_alarm_rate:.2%} needs at least "
                         f"{fewest_held_out(false_alarm_rate)} held-out in-domain images to set its threshold, got "
                         f"{len(values)}: give more held-out images, or allow a higher false-alarm rate")
    return float(values[rank - 1])


def save_statistics(statistics: DomainStatistics, path: str | Path) -> Path:
    """Write the statistics as safetensors at `path` (the caller makes it atomic)."""
    from safetensors.numpy import save_file

    save_file({"blocks": np.asarray(statistics.blocks, dtype=np.int64),
               "mean": np.ascontiguousarray(statistics.mean, dtype=np.float32),
               "precision": np.ascontiguousarray(statistics.precision, dtype=np.float32),
               "threshold": np.asarray([statistics.threshold], dtype=np.float64)}, str(path))
    return Path(path)


def load_statistics(path: str | Path) -> DomainStatistics:
    """Read a statistics file; ValueError naming the file and what is wrong with it."""
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"{path} is not a domain statistics file ({type(exc).__name__}: {exc})") from None
    missing = [name for name in TENSORS if name not in tensors]
    if missing:
        raise ValueError(f"{path} is not a domain statistics file: it lacks {', '.join(missing)}")
    blocks, mean, precision = tensors["blocks"], tensors["mean"], tensors["precision"]
    count, width = mean.shape if mean.ndim == 2 else (-1, -1)
    if blocks.shape != (count,) or precision.shape != (count, width, width) or tensors["threshold"].shape != (1,):
        raise ValueError(f"{path}: the tensors do not fit each other (blocks {blocks.shape}, mean {mean.shape}, "
                         f"precision {precision.shape}, threshold {tensors['threshold'].shape})")
    return DomainStatistics(tuple(int(b) for b in blocks), mean, precision, float(tensors["threshold"][0]))


__all__ = ["TENSORS", "DomainStatistics", "conformal_threshold", "fewest_fit_images", "fewest_held_out", "fit",
           "load_statistics", "save_statistics", "score_blocks", "too_few_fit_images"]
