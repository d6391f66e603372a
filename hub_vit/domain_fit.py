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

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from hub_vit.data_config import DataConfig
from hub_vit.domain import EXAMPLE_KINDS, Domain, guess_domain, record_file_in_the_way, stated_domain, write_domain
from hub_vit.domain_score import (
    DomainStatistics,
    conformal_threshold,
    fewest_fit_images,
    fewest_held_out,
    fit,
    score_blocks,
    too_few_fit_images,
)
from hub_vit.explain.image import load_image, own_image_files, prepare_image
from hub_vit.image_formats import OWN_FILE_FORMATS
from hub_vit.model import VisionTransformer, token_means

DEFAULT_FALSE_ALARM_RATE = 0.01
MAX_IMAGES = 10_000  # per set: the fit images, the held-out ones (evenly spread over the sorted files beyond it)
# the fewest fit images depend on the model's feature width: `fewest_fit_images(width)` (128 for the digits model)
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


# called with every image file a calibration will read, before any is read (the CLI passes the training code's
# header check, a layer above this one): a file that is no image is named at once, not after minutes of features
ImageCheck = Callable[[Sequence[Path]], None]


@dataclass(frozen=True)
class Plan:
    """A calibration checked before any image is read (`plan_calibration`): the files of each set and what the
    record will say the model knows (`stated`: the folder's record; None when it has none or is replaced)."""

    folder: Path
    fit_files: list[Path]
    held_files: list[Path]
    ood_files: list[Path]
    false_alarm_rate: float
    knows: str | None
    examples: str | None
    stated: Domain | None
    named: dict[str, str]
    every_4th: bool  # no held-out folder: every HELD_OUT_EVERY-th image of --images is held out


@dataclass(frozen=True)
class FolderCalibration:
    """`calibrate_folder`'s result: the record written, and what became of the folder's model card (`card`: the
    README.md re-rendered with the new numbers; else `card_note` says why it was left as it was, or None: no card)."""

    domain: Domain
    card: Path | None = None
    card_note: str | None = None


def calibrate_domain(folder: str | Path, images: str | Path, *, held_out: str | Path | None = None,
                     out_of_domain: str | Path | None = None, false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
                     knows: str | None = None, examples: str | None = None, sources: dict[str, str] | None = None,
                     max_images: int = MAX_IMAGES, check_images: ImageCheck | None = None) -> Domain:
    """Fit, set the threshold of and measure the out-of-domain score of the model folder `folder`, and write it there
    (see the module docstring). `knows` / `examples`: what the record says the model knows (default: the folder's
    record, else guessed from its labels; given both, a damaged record is replaced). `sources`: how the record
    describes the `images`, `held_out` and `out_of_domain` sets (default: each folder's name, `source_name`, never
    its path). `check_images`:
    see `ImageCheck`. Checked before any image is decoded: bad arguments raise ValueError naming them."""
    return fit_plan(plan_calibration(folder, images, held_out=held_out, out_of_domain=out_of_domain,
                                     false_alarm_rate=false_alarm_rate, knows=knows, examples=examples,
                                     sources=sources, max_images=max_images, check_images=check_images))


def calibrate_folder(folder: str | Path, images: str | Path, **options: Any) -> FolderCalibration:
    """`calibrate_domain` (same options), and the folder's model card re-rendered with the new numbers when it is
    the card hub-vit writes for the folder (`hub-vit card`) as it was: a card edited by hand, rendered for a Hub
    repository (`--repo-id`) or by another hub-vit version is left alone, and the note says how to update it."""
    from hub_vit.model_cards.facts import CARD

    plan = plan_calibration(folder, images, **options)
    card = plan.folder / CARD
    current = _card_is_current(plan.folder)  # before the record changes: a card of the old numbers, or not
    domain = fit_plan(plan)
    update = f"`hub-vit card {shlex.quote(str(plan.folder))}` re-renders it with the new numbers"
    if not card.is_file():
        return FolderCalibration(domain)
    if not current:
        return FolderCalibration(domain, card_note=f"{card} is not the card `hub-vit card` writes for this "
                                 "folder now (edited, moved or renamed, from another hub-vit version, or for a Hub "
                                 f"repository): left as it is; {update}")
    from hub_vit.model_cards import write_model_card

    try:
        return FolderCalibration(domain, card=write_model_card(plan.folder))
    except (OSError, ValueError) as exc:  # the record is written and stays: the card is only behind it
        return FolderCalibration(domain, card_note=f"{card} was not updated ({exc}); {update}")


def _card_is_current(folder: Path) -> bool:
    """Whether `folder`'s README.md is exactly the card `hub-vit card` writes for the folder now."""
    from hub_vit.model_cards import render_model_card
    from hub_vit.model_cards.facts import CARD
    from hub_vit.model_cards.render import is_generated_card

    try:
        text = (folder / CARD).read_text(encoding="utf-8")
        return is_generated_card(text) and str(render_model_card(folder)) == text
    except (OSError, ValueError):  # no card, or one that cannot be rendered (a damaged record): not this card
        return False


def plan_calibration(folder: str | Path, images: str | Path, *, held_out: str | Path | None = None,
                     out_of_domain: str | Path | None = None, false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
                     knows: str | None = None, examples: str | None = None, sources: dict[str, str] | None = None,
                     max_images: int = MAX_IMAGES, check_images: ImageCheck | None = None) -> Plan:
    """Every check of `calibrate_domain` that comes before reading an image's pixels; ValueError (or an OS error
    for a folder in the way) naming the problem."""
    from hub_vit.folder import read_model_config

    folder = Path(folder)
    # the folder named first is reported first (a transformers one too), before any image
    width = _feature_width(*read_model_config(folder)[:2])
    blocked = record_file_in_the_way(folder)  # found now, not after the fit
    if blocked is not None:
        raise IsADirectoryError(f"{str(blocked)!r} is a folder; calibrate-domain writes the file {blocked.name} "
                                "there: move the folder away")
    if examples is not None and examples not in EXAMPLE_KINDS:
        raise ValueError(f"unknown examples {examples!r}; valid: {', '.join(EXAMPLE_KINDS)}")
    if knows is not None and not (knows.strip() and knows.splitlines() == [knows]):
        # was: "" kept the old phrase in silence, and a line break went into the record and the card
        raise ValueError(f"--knows must be a phrase on one line, not empty (it is shown after \"this model knows\"), "
                         f"got {knows!r}; leave --knows out to keep what the folder's record says")
    stated = None if knows and examples else _stated(folder)
    if not 0 < false_alarm_rate < 1:
        raise ValueError(f"the false-alarm rate must be in (0, 1), got {false_alarm_rate}")
    if max_images < fewest_fit_images(width):
        raise ValueError(f"max_images must be at least {fewest_fit_images(width)}, the fewest fit images for the "
                         f"model's feature width {width}, got {max_images}")
    fit_files, held_files = _sets(images, held_out)
    # every folder given is checked before what their image counts allow
    ood_files = own_image_files(out_of_domain, "--out-of-domain") if out_of_domain is not None else []
    fit_files, held_files = spread(fit_files, max_images), spread(held_files, max_images)
    if check_images is not None:  # the files read, before they are counted: ten text files are not 8 images
        check_images([*fit_files, *held_files, *ood_files])
    for flag, given, files in (("--images", images, fit_files), ("--held-out", held_out, held_files)):
        shared = _shared(ood_files, files)
        if shared:  # was measured as it came: an AUROC of 0.5 for a set scored against itself
            raise ValueError(f"--out-of-domain {str(out_of_domain)!r} shares {len(shared)} images with {flag} "
                             f"{str(given if given is not None else images)!r}; out-of-domain images must be ones the "
                             "model should not know")
    _check_counts(images, fit_files, held_files, false_alarm_rate, width)
    named = {"images": source_name(images), "held_out": source_name(held_out if held_out is not None else images),
             "out_of_domain": source_name(out_of_domain) if out_of_domain is not None else ""} | (sources or {})
    return Plan(folder, fit_files, held_files, ood_files, false_alarm_rate, knows, examples, stated, named,
                every_4th=held_out is None)


def _stated(folder: Path) -> Domain | None:
    """What the folder's record says the model knows, for the defaults of --knows and --examples. A damaged record
    is refused now, before the fit: what it said is lost, and a guess from the labels would replace it in silence."""
    try:
        return stated_domain(folder)
    except ValueError as exc:
        raise ValueError(f"{exc}; give both --knows and --examples to replace it with a new record, or delete it "
                         "to have them guessed from the model's labels") from None


def _feature_width(raw: dict[str, Any], config_path: Path) -> int:
    """The width D of the model's features (the score's), from its config.json (`raw`, read from `config_path`);
    ValueError naming the file when it is not a config a model loads from, before any image is read."""
    from hub_vit.hf.configuration_hub_vit import HubViTConfig

    try:  # as load_model_folder reads it
        config = HubViTConfig.from_dict({k: v for k, v in raw.items() if k != "transformers_version"})
        return config.weights_spec().width
    except ValueError as exc:
        raise ValueError(f"{config_path}: {exc}") from None


def _check_counts(images: str | Path, fit_files: list[Path], held_files: list[Path], false_alarm_rate: float,
                  width: int) -> None:
    """Both sets' counts, every problem in one message (so that one rerun fixes them). `width`: the model's feature
    width."""
    problems = []
    if len(held_files) < fewest_held_out(false_alarm_rate):
        problems.append(f"a false-alarm rate of {false_alarm_rate:.2%} needs at least "
                        f"{fewest_held_out(false_alarm_rate)} held-out images to set the threshold, got "
                        f"{len(held_files)}; give more held-out images or a higher false-alarm rate")
    if len(fit_files) < fewest_fit_images(width):
        problems.append(f"{len(fit_files)} images to fit the score on ({str(images)!r}): "
                        f"{too_few_fit_images(len(fit_files), width)}")
    if problems:
        raise ValueError("; and ".join(problems))


def fit_plan(plan: Plan) -> Domain:
    """Fit, threshold and measure what `plan` says, and write the record into its folder."""
    from hub_vit.folder import load_model_folder

    model, info = load_model_folder(plan.folder)
    data = DataConfig.from_pretrained_cfg(info.pretrained_cfg, info.spec)
    blocks = score_blocks(model.spec.depth)
    mean, precision = fit(image_features(model, plan.fit_files, data).token_means, blocks)
    unthresholded = DomainStatistics(blocks, mean, precision, threshold=float("inf"))
    held = unthresholded.scores(image_features(model, plan.held_files, data).token_means)
    statistics = DomainStatistics(blocks, mean, precision, conformal_threshold(held, plan.false_alarm_rate))
    measured: dict[str, Any] = {
        "fit_images": len(plan.fit_files),
        "fit_source": plan.named["images"],
        "held_out_images": len(held),
        "held_out_source": plan.named["held_out"] + (f" (every {HELD_OUT_EVERY}th image, not fitted)"
                                                     if plan.every_4th else ""),
        "false_alarm_rate": plan.false_alarm_rate,
        "check_false_alarms": cross_checked_false_alarms(held, plan.false_alarm_rate),
    }
    if plan.ood_files:
        ood = statistics.scores(image_features(model, plan.ood_files, data).token_means)
        measured |= {"out_of_domain_images": len(ood), "out_of_domain_source": plan.named["out_of_domain"],
                     "out_of_domain_flagged": round(float(statistics.out_of_domain(ood).mean()), 4),
                     "auroc": round(auroc(held, ood), 5)}
    known = plan.stated or guess_domain(info.labels)  # what the folder already says it knows, else guessed
    domain = Domain(knows=plan.knows or known.knows, examples=plan.examples or known.examples, statistics=statistics,
                    measured=measured)
    write_domain(plan.folder, domain)
    return domain


def source_name(folder: str | Path) -> str:
    """How domain.json names an image folder given as a path: its name alone. The record is published with the folder
    (`hub-vit push`) and quoted by its card, which must read the same on every machine (docs/model_cards.md: no
    absolute paths), so neither holds where the images lay here (`data/digits/train` is recorded as `train`)."""
    absolute = Path(os.path.abspath(folder))  # `.` and `..` get the name of the folder they stand for; links kept
    return absolute.name or absolute.anchor  # the root folder has no name of its own


def _shared(first: list[Path], second: list[Path]) -> set[Path]:
    """The files in both lists, however each was written (`data/x.png`, `./data/x.png`, a link to it)."""
    return {p.resolve() for p in first} & {p.resolve() for p in second}


def _sets(images: str | Path, held_out: str | Path | None) -> tuple[list[Path], list[Path]]:
    """(fit files, held-out files): the two folders, or one folder of which every HELD_OUT_EVERY-th image is held
    out."""
    files = own_image_files(images, "--images")
    if held_out is None:
        return ([f for i, f in enumerate(files) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1],
                [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1])
    held_files = own_image_files(held_out, "--held-out")
    overlap = _shared(files, held_files)
    if overlap:
        raise ValueError(f"--held-out {str(held_out)!r} shares {len(overlap)} images with --images "
                         f"{str(images)!r}; held-out images must be ones the score is not fitted on")
    return files, held_files


__all__ = ["DEFAULT_FALSE_ALARM_RATE", "Features", "FolderCalibration", "ImageCheck", "Plan", "auroc",
           "calibrate_domain", "calibrate_folder", "fit_plan", "image_features", "plan_calibration", "spread"]
