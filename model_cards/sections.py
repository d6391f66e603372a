"""The card's tables, as (label, text) rows built from a folder's facts. Every number is formatted here, once.

Number formats (the card tests parse them back): integers with thousands separators (`22,050,664`), floats with six
significant digits (`format(x, ".6g")`), GMACs with two decimals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hub_vit.data_config import DataConfig
from hub_vit.variants import ViTSpec

from .facts import FolderFacts
from .metrics import RESULT_COLUMNS

Rows = list[tuple[str, str]]

def fmt_number(value: Any) -> str:
    """One format for every number in the card: ints grouped by thousands, floats to six significant digits."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return format(value, ".6g")
    return str(value)


def fmt_value(value: Any) -> str:
    """A JSON leaf as table text: numbers via `fmt_number`, lists comma-joined, strings in backticks if path-like."""
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v) for v in value) if value else "-"
    if value is None or value == "":  # an unset option (`randaug ""`): the same dash as null, not an empty cell
        return "-"
    if isinstance(value, str):
        return f"`{value}`" if ("/" in value or value.endswith((".npz", ".json"))) and " " not in value else value
    return fmt_number(value)


def flatten(data: Any, prefix: str = "") -> Rows:
    """Nested JSON -> rows keyed by dotted path (`parity.max_abs_logit_diff`); lists of scalars stay one row."""
    rows: Rows = []
    if isinstance(data, dict):
        for key, value in data.items():
            rows += flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in data):
        for i, value in enumerate(data):
            rows += flatten(value, f"{prefix}[{i}]")
    else:
        rows.append((f"`{prefix}`", fmt_value(data)))
    return rows


# ------------------------------------------------------------------------------------------------------------ tables
def architecture_rows(spec: ViTSpec) -> Rows:
    """Every `ViTSpec` field (the variant table's row for this model), plus the derived head width."""
    rows: Rows = [("variant", f"`{spec.variant}`" if spec.variant else "custom (not a row of the size table)")]
    for key, value in spec.to_dict().items():
        if key == "img_size":
            rows.append((f"`{key}`", f"{value[0]} x {value[1]} (height x width)"))
        elif key == "rep_size" and value is None:
            rows.append((f"`{key}`", "none (linear head on the pooled features)"))
        else:
            rows.append((f"`{key}`", fmt_number(value)))
    rows.append(("head dim (`width / num_heads`)", fmt_number(spec.head_dim)))
    return rows


def compute_rows(facts: FolderFacts) -> Rows:
    spec = facts.spec
    prefix = f" + {spec.num_prefix_tokens} class token" if spec.num_prefix_tokens else ""
    return [
        ("parameters", fmt_number(facts.num_params)),
        ("tokens per image", f"{fmt_number(spec.num_patches + spec.num_prefix_tokens)} "
                             f"({fmt_number(spec.num_patches)} patches{prefix})"),
        ("multiply-accumulates (MACs)", fmt_number(facts.macs)),
        ("GMACs", fmt_gmacs(facts.macs)),
    ]


def fmt_gmacs(macs: int) -> str:
    """Two decimals as in timm's tables; three significant digits for models below 0.1 GMACs (e.g. `0.000453`)."""
    g = macs / 1e9
    return f"{g:.2f}" if g >= 0.1 else format(g, ".3g")


def value_range(mean: list[float], std: list[float]) -> str:
    """The interval [0, 1] pixels land in after `(x - mean) / std`, e.g. `[-1, 1]` for Google's mean = std = 0.5."""
    lows = {(0.0 - m) / s for m, s in zip(mean, std, strict=True)}
    highs = {(1.0 - m) / s for m, s in zip(mean, std, strict=True)}
    if len(lows) == 1 and len(highs) == 1:
        return f"[{fmt_number(lows.pop())}, {fmt_number(highs.pop())}]"
    return "per channel: " + ", ".join(
        f"[{fmt_number((0.0 - m) / s)}, {fmt_number((1.0 - m) / s)}]" for m, s in zip(mean, std, strict=True)
    )


def preprocessing_rows(facts: FolderFacts) -> Rows:
    data = DataConfig.from_pretrained_cfg(facts.pretrained_cfg, facts.spec)  # the one reading of the eval transform
    (height, width), (scale_h, scale_w) = data.img_size, data.scale_size
    # timm's eval transform: resize so the crop is crop_pct of the resized image, then centre-crop
    rows: Rows = [("resize", f"{scale_h} x {scale_w} ({data.interpolation}; `floor(size / crop_pct)`)"
                   if scale_h != scale_w else f"shorter side to {scale_h} px ({data.interpolation})"),
                  ("crop", f"{data.crop_mode} crop to {height} x {width} (`crop_pct` {fmt_number(data.crop_pct)})"),
                  ("input tensor", f"NCHW float32, {data.in_chans} x {height} x {width}")]
    mean, std = list(data.mean), list(data.std)
    rows.append(("normalise", f"`(x - mean) / std` with mean {fmt_value(mean)} and std {fmt_value(std)} "
                              "on pixels scaled to [0, 1]"))
    rows.append(("value range", value_range(mean, std)))
    return rows


def published_table(facts: FolderFacts) -> dict[str, Any] | None:
    """The paper's table for every published checkpoint of this architecture, this model's row marked."""
    if facts.match is None or not facts.match.weights.results:
        return None
    entry, this = facts.match.entry, facts.match.weights
    keys = [k for k in RESULT_COLUMNS if any(k in w.results for w in entry.weights)]
    rows = []
    for w in entry.weights:
        if not w.results:
            continue
        name = f"`{entry.name}.{w.tag}`" + (" (**this model**)" if w.tag == this.tag else "")
        # one decimal, as the paper's tables print them (80.0, not 80)
        rows.append({"name": name, "values": [f"{w.results[k]:.1f}" if k in w.results else "-" for k in keys]})
    return {"columns": [RESULT_COLUMNS[k].column for k in keys], "rows": rows}


def labels_note(labels: list[str], shown: int = 10) -> str:
    head = ", ".join(f"`{label}`" for label in labels[:shown])
    more = f", ... ({fmt_number(len(labels) - shown)} more)" if len(labels) > shown else ""
    return f"{fmt_number(len(labels))} classes, in `labels.txt` (line i = class i): {head}{more}."


DOMAIN_ROWS = (  # domain.json `measured` key -> the card's words
    ("calibration_images", "held-out images that set the threshold"),
    ("test_images", "other held-out images, measured with it"),
    ("test_kept", "share of those answered with confidence"),
    ("test_top1_all", "their top-1 accuracy, all answers"),
    ("test_top1_kept", "their top-1 accuracy, confident answers only"),
    ("out_of_domain_images", "out-of-domain images"),
    ("out_of_domain_flagged", "share of those marked as not confident"),
    ("out_of_domain_median_top1", "their median top-1 probability"),
)


def domain_section(folder: Path, labels: list[str]) -> dict[str, Any] | None:
    """What the model knows and its confidence rule (`domain.json`, `hub_vit.domain`), when one was measured for
    these weights; None otherwise (no record, or the weights changed since)."""
    from hub_vit.domain import read_domain

    domain = read_domain(folder, labels)
    if domain.threshold is None:
        return None
    measured = domain.measured
    rows = [("confidence threshold (top-1 probability)", f"{domain.threshold:.4f}")]
    rows += [(words, fmt_value(measured[key])) for key, words in DOMAIN_ROWS if key in measured]
    note = (f"This model knows {domain.knows}; it answers every image with one of those classes, whatever the image "
            f"shows. An answer whose top-1 probability is below the threshold is marked as not confident (the demo "
            f"says so). Rule: {measured.get('rule', 'see domain.json')}. Out-of-domain images: "
            f"{measured.get('out_of_domain_source', 'see domain.json')}. From `domain.json` "
            "(`scripts/calibrate_domain.py`), tied to these weights by their digest.")
    return {"note": note, "rows": rows}
