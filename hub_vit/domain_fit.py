"""Fit a model folder's out-of-domain score on images of the kind it knows (`hub-vit calibrate-domain`; `hub-vit
train` calls it on its own splits), and measure it.

    calibrate_domain(folder, images=DIR)                     # 3 in 4 images fit, 1 in 4 held out
    calibrate_domain(folder, images=TRAIN, held_out=VAL)     # a training run: its train and val splits
    calibrate_domain(..., out_of_domain=PHOTOS)              # also measured against images it should not know

Every image goes through the model's own eval transform (`hub_vit.explain.image`, as the demo and `hub-vit rollout`
prepare it). The Gaussians (`hub_vit.domain_score`) are fitted on the fit images, the conformal threshold at
`false_alarm_rate` is set on all held-out images, and the false alarms are measured on held-out images that did not
set the threshold they are checked against (`cross_checked_false_alarms`). Nothing of the held-out or out-of-domain
images is fitted. The result is written into the
folder (`hub_vit.domain.write_domain`): the statistics, and what was measured, for the weights the folder holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from hub_vit.data_config import DataConfig
from hub_vit.domain import EXAMPLE_KINDS, Domain, read_domain, record_file_in_the_way, write_domain
from hub_vit.domain_score import DomainStatistics, conformal_threshold, fewest_held_out, fit, score_blocks
from hub_vit.explain.image import load_image, own_image_files, prepare_image
from hub_vit.image_formats import OWN_FILE_FORMATS
from hub_vit.model import VisionTransformer, token_means

DEFAULT_FALSE_ALARM_RATE = 0.01
MAX_IMAGES = 10_000  # per set: the fit images, the held-out ones (evenly spread over the sorted files beyond it)
FEWEST_FIT_IMAGES = 10
HELD_OUT_EVERY = 4  # without a held-out folder: every 4th image (sorted) is held out


@dataclass(frozen=True)
class Features:
    """What one forward pass tells about each image: `logits` (N, classes), `pre_logits` (N, features: what the
    head reads) and `token_means` (N, depth, width: the domain score's features)."""

    logits: np.ndarray
    pre_logits: np.ndarray
    token_means: np.ndarray


@torch.no_grad()
def image_features(model: VisionTransformer, images: Sequence[Image.Image | Path], data: DataConfig,
                   batch_size: int = 64) -> Features:
    """`images` (PIL images, or files read with `load_image`) through the eval transform `data` and `model`."""
    model.eval()
    logits, pre_logits, means = [], [], []
    for start in range(0, len(images), batch_size):
        batch = [load_image(image, large=True, formats=OWN_FILE_FORMATS) if isinstance(image, Path) else image
                 for image in images[start:start + batch_size]]
        out = model.forward_all(torch.stack([prepare_image(image, data).tensor for image in batch]),
                                output_hidden_states=True)
        logits.append(out.logits.float().numpy())
        pre_logits.append(out.pre_logits.float().numpy())
        means.append(token_means(out.hidden_states).float().numpy())
    if not logits:
        raise ValueError("no images to compute features of")
    return Features(np.concatenate(logits), np.concatenate(pre_logits), np.concatenate(means))


def spread(files: list[Path], limit: int) -> list[Path]:
    """At most `limit` of `files`, evenly spread over them (all classes of a sorted image folder stay in)."""
    if len(files) <= limit:
        return files
    return [files[int(i)] for i in np.linspace(0, len(files) - 1, limit).round()]


def auroc(in_domain: np.ndarray, out_of_domain: np.ndarray) -> float:
    """Area under the ROC curve of telling the out-of-domain scores (higher) from the in-domain ones."""
    from sklearn.metrics import roc_auc_score

    labels = np.r_[np.zeros(len(in_domain)), np.ones(len(out_of_domain))]
    return float(roc_auc_score(labels, np.r_[in_domain, out_of_domain]))


def cross_checked_false_alarms(held_out: np.ndarray, false_alarm_rate: float) -> float | None:
    """The share of held-out in-domain scores above a threshold set without them: the scores alternate into two
    halves, each half's conformal threshold is applied to the other half, and the two shares are averaged. None when
    a half is too small to set a threshold at that rate."""
    halves = held_out[0::2], held_out[1::2]
    if min(len(half) for half in halves) < fewest_held_out(false_alarm_rate):
        return None
    shares = [float((other > conformal_threshold(half, false_alarm_rate)).mean())
              for half, other in (halves, halves[::-1])]
    return round(sum(shares) / 2, 4)


def calibrate_domain(folder: str | Path, images: str | Path, *, held_out: str | Path | None = None,
                     out_of_domain: str | Path | None = None, false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
                     knows: str | None = None, examples: str | None = None, sources: dict[str, str] | None = None,
                     max_images: int = MAX_IMAGES) -> Domain:
    """Fit, set the threshold of and measure the out-of-domain score of the model folder `folder`, and write it there
    (see the module docstring). `knows` / `examples`: what the record says the model knows (default: the folder's
    record, else guessed from its labels). `sources`: how the record describes the `images`, `held_out` and
    `out_of_domain` sets (default: the folders as given). Checked before any image is read: bad arguments raise
    ValueError naming them."""
    from hub_vit.folder import load_model_folder, read_model_config

    folder = Path(folder)
    read_model_config(folder)  # the folder named first is reported first (a transformers one too), before any image
    blocked = record_file_in_the_way(folder)  # found now, not after the fit
    if blocked is not None:
        raise IsADirectoryError(f"{str(blocked)!r} is a folder; calibrate-domain writes the file {blocked.name} "
                                "there: move the folder away")
    if examples is not None and examples not in EXAMPLE_KINDS:
        raise ValueError(f"unknown examples {examples!r}; valid: {', '.join(EXAMPLE_KINDS)}")
    if not 0 < false_alarm_rate < 1:
        raise ValueError(f"the false-alarm rate must be in (0, 1), got {false_alarm_rate}")
    if max_images < 2 * FEWEST_FIT_IMAGES:
        raise ValueError(f"max_images must be at least {2 * FEWEST_FIT_IMAGES}, got {max_images}")
    fit_files, held_files = _sets(images, held_out, max_images)
    # every folder given is checked before what their image counts allow
    ood_files = own_image_files(out_of_domain, "--out-of-domain") if out_of_domain is not None else []
    if len(held_files) < fewest_held_out(false_alarm_rate):
        raise ValueError(f"a false-alarm rate of {false_alarm_rate:.2%} needs at least "
                         f"{fewest_held_out(false_alarm_rate)} held-out images to set the threshold, got "
                         f"{len(held_files)}; give more held-out images or a higher false-alarm rate")
    for flag, given, files in (("--images", images, fit_files), ("--held-out", held_out, held_files)):
        shared = _shared(ood_files, files)
        if shared:  # was measured as it came: an AUROC of 0.5 for a set scored against itself
            raise ValueError(f"--out-of-domain {str(out_of_domain)!r} shares {len(shared)} images with {flag} "
                             f"{str(given if given is not None else images)!r}; out-of-domain images must be ones the "
                             "model should not know")

    model, info = load_model_folder(folder)
    data = DataConfig.from_pretrained_cfg(info.pretrained_cfg, info.spec)
    blocks = score_blocks(model.spec.depth)
    mean, precision = fit(image_features(model, fit_files, data).token_means, blocks)
    unthresholded = DomainStatistics(blocks, mean, precision, threshold=float("inf"))
    held = unthresholded.scores(image_features(model, held_files, data).token_means)
    statistics = DomainStatistics(blocks, mean, precision, conformal_threshold(held, false_alarm_rate))
    named = {"images": str(images), "held_out": str(held_out if held_out is not None else images),
             "out_of_domain": str(out_of_domain)} | (sources or {})
    measured: dict[str, Any] = {
        "fit_images": len(fit_files),
        "fit_source": named["images"],
        "held_out_images": len(held),
        "held_out_source": named["held_out"] + ("" if held_out is not None else
                                                f" (every {HELD_OUT_EVERY}th image, not fitted)"),
        "false_alarm_rate": false_alarm_rate,
        "check_false_alarms": cross_checked_false_alarms(held, false_alarm_rate),
    }
    if ood_files:
        ood = statistics.scores(image_features(model, ood_files, data).token_means)
        measured |= {"out_of_domain_images": len(ood), "out_of_domain_source": named["out_of_domain"],
                     "out_of_domain_flagged": round(float(statistics.out_of_domain(ood).mean()), 4),
                     "auroc": round(auroc(held, ood), 5)}
    known = read_domain(folder, info.labels)  # what the folder already says it knows, else guessed
    domain = Domain(knows=knows or known.knows, examples=examples or known.examples, statistics=statistics,
                    measured=measured)
    write_domain(folder, domain)
    return domain


def _shared(first: list[Path], second: list[Path]) -> set[Path]:
    """The files in both lists, however each was written (`data/x.png`, `./data/x.png`, a link to it)."""
    return {p.resolve() for p in first} & {p.resolve() for p in second}


def _sets(images: str | Path, held_out: str | Path | None, max_images: int) -> tuple[list[Path], list[Path]]:
    """(fit files, held-out files): the two folders, or one folder of which every HELD_OUT_EVERY-th image is held
    out; each at most `max_images`, spread evenly."""
    files = own_image_files(images, "--images")
    if held_out is not None:
        fit_files, held_files = files, own_image_files(held_out, "--held-out")
        overlap = _shared(fit_files, held_files)
        if overlap:
            raise ValueError(f"--held-out {str(held_out)!r} shares {len(overlap)} images with --images "
                             f"{str(images)!r}; held-out images must be ones the score is not fitted on")
    else:
        fit_files = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
        held_files = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    if len(fit_files) < FEWEST_FIT_IMAGES:
        raise ValueError(f"{len(fit_files)} images to fit the score on ({str(images)!r}); give at least "
                         f"{FEWEST_FIT_IMAGES} (hundreds or more, of the kind the model knows)")
    return spread(fit_files, max_images), spread(held_files, max_images)


__all__ = ["DEFAULT_FALSE_ALARM_RATE", "Features", "auroc", "calibrate_domain", "image_features", "spread"]
