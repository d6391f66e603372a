"""model-index entries (`huggingface_hub.EvalResult`) for published and measured results.

Published results come from `hub_vit.catalog` (`Weights.results`: the paper's top-1 on ImageNet-1k val, ImageNet-ReaL
and ImageNet-v2); measured results from the folder's `training.json`.
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub import EvalResult

from .citations import TITLES, arxiv_url
from .facts import CatalogMatch

TASK = "image-classification"


@dataclass(frozen=True)
class ResultColumn:
    column: str  # header in the card's table
    dataset_type: str  # Hub dataset id (or the conventional name where the set is not on the Hub)
    dataset_name: str
    split: str


RESULT_COLUMNS: dict[str, ResultColumn] = {  # keys of `Weights.results`
    "top1": ResultColumn("ImageNet-1k val top-1 (%)", "imagenet-1k", "ImageNet-1k", "validation"),
    "real_top1": ResultColumn("ImageNet-ReaL top-1 (%)", "imagenet-real", "ImageNet-ReaL", "validation"),
    "v2_top1": ResultColumn("ImageNet-v2 top-1 (%)", "imagenet-v2", "ImageNet-v2", "test"),
}


def published_results(match: CatalogMatch) -> list[EvalResult]:
    """One EvalResult per published number of the matched checkpoint, citing the paper it comes from."""
    paper = match.weights.paper
    out = []
    for key, value in match.weights.results.items():
        if key not in RESULT_COLUMNS:
            raise ValueError(f"catalog result key {key!r} of {match.name} has no column; known: {list(RESULT_COLUMNS)}")
        col = RESULT_COLUMNS[key]
        out.append(EvalResult(
            task_type=TASK, dataset_type=col.dataset_type, dataset_name=col.dataset_name, dataset_split=col.split,
            metric_type="accuracy", metric_name="top-1 accuracy", metric_value=value,
            source_name=f"{TITLES.get(paper, paper)} ({paper})", source_url=arxiv_url(paper),
        ))
    return out


def measured_result(value: float, *, dataset: str, name: str, split: str, metric: str) -> EvalResult:
    """A result hub-vit measured itself (e.g. held-out accuracy after `hub-vit train`). It has no source URL, so no
    `source_name` either (the Hub requires both or neither); the card's text says where it was measured."""
    return EvalResult(
        task_type=TASK, dataset_type=dataset, dataset_name=name, dataset_split=split,
        metric_type="accuracy", metric_name=metric, metric_value=value,
    )

