"""The card's tables, as (label, text) rows built from a folder's facts. Every number is formatted here, once.

Number formats (the card tests parse them back): integers with thousands separators (`22,050,664`), floats with six
significant digits (`format(x, ".6g")`), GMACs with two decimals.
"""

from __future__ import annotations

import re
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


def labels_note(labels: list[str], in_labels_file: bool, shown: int = 10) -> str:
    """The class names and the file that holds them: `labels.txt`, or where the folder has none, `config.json`'s
    `label_names` (`facts.card_labels` reads them from there), so the card never names a file the folder lacks."""
    head = ", ".join(f"`{label}`" for label in labels[:shown])
    more = f", ... ({fmt_number(len(labels) - shown)} more)" if len(labels) > shown else ""
    where = ("in `labels.txt` (line i = class i)" if in_labels_file else
             "in `config.json` `label_names` (entry i = class i; this folder has no `labels.txt`)")
    return f"{fmt_number(len(labels))} classes, {where}: {head}{more}."


DOMAIN_ROWS = (  # domain.json `measured` key -> the card's words
    ("fit_images", "in-domain images the score is fitted on"),
    ("held_out_images", "held-out in-domain images that set the threshold"),
    ("false_alarm_rate", "false-alarm rate asked for"),
    ("check_false_alarms", "false alarms measured on held-out images (2-fold)"),
    ("out_of_domain_images", "out-of-domain images measured"),
    ("out_of_domain_flagged", "share of those flagged"),
    ("auroc", "AUROC, held-out in-domain vs out-of-domain"),
)
# where hub-vit measured the choice of score (cited, not read: a card is rendered from the folder alone)
DOMAIN_BENCHMARK = "bench/results/domain_digits.json"


def domain_section(folder: Path, labels: list[str]) -> dict[str, Any] | None:
    """What the model knows and its out-of-domain score (`domain.json`, `hub_vit.domain`), with the numbers measured
    when the score was fitted on these weights. Uncalibrated for them (no record, or one for other weights), the
    section says the answers are "unknown" and how to calibrate, with no table; None for a model without classes (no
    record and no labels: a headless feature extractor answers with features, not classes)."""
    from hub_vit.domain import DOMAIN_FILE, read_domain

    recorded = (folder / DOMAIN_FILE).is_file()
    if not recorded and not labels:
        return None
    domain = read_domain(folder, labels)
    note = (f"This model knows {domain.knows}; it answers every image with one of those classes, whatever the image "
            "shows. ")
    statistics = domain.statistics
    if statistics is None:
        return {"note": note + uncalibrated_note(recorded), "rows": []}
    measured = domain.measured
    blocks = ", ".join(str(block + 1) for block in statistics.blocks)
    note += (f"Each answer also carries an out-of-domain score: the squared Mahalanobis distance of the image's "
             f"features (the mean token of blocks {blocks}) to Gaussians fitted on images it knows, per feature, "
             "averaged over the blocks (the feature ensemble of Lee et al.). Above the threshold the image is \"not "
             "the kind of image this model knows\" (served as `domain` and `domain_score`; `hub-vit classify` and "
             "the demo say so). "
             f"Fitted on {source_text(measured.get('fit_source'))}; threshold: split conformal on "
             f"{source_text(measured.get('held_out_source'))}"
             + (f"; out-of-domain images: {source_text(measured['out_of_domain_source'])}"
                if measured.get("out_of_domain_source") else "")
             + f". From `domain.json` (`hub-vit calibrate-domain`), tied to these weights by their digest; the choice "
             f"of score is measured in hub-vit's `{DOMAIN_BENCHMARK}`.")
    rows = [("out-of-domain threshold (score)", fmt_number(round(statistics.threshold, 4)))]
    rows += [(words, fmt_value(measured[key])) for key, words in DOMAIN_ROWS if key in measured]
    return {"note": note, "rows": rows}


def uncalibrated_note(recorded: bool) -> str:
    """Why the answers cannot say whether an image is of the kind the model knows, and how to make them."""
    why = ("`domain.json` holds no out-of-domain score for this model (it was fitted on other weights or on images "
           "prepared otherwise, or `domain.safetensors` is missing or not the file it records)" if recorded else
           "No out-of-domain score is calibrated for this model (the folder has no `domain.json`)")
    return (f"{why}, so its answers say \"unknown\" to whether an image is of that kind. `hub-vit calibrate-domain "
            "<this folder> --images DIR --held-out DIR` fits one on images of the kind it knows (`hub-vit train` "
            "does so on its own train and val splits).")


# a path in a record: `/`- or `\\`-separated; only its last part is shown (docs/model_cards.md: no absolute paths)
_PATH_LIKE = re.compile(r"[^\s]*[/\\][^\s]*")
_NAME_FIRST = re.compile(r"(?P<name>\S+)(?P<rest> \(.*\))?", re.S)  # `train`, `train (every 4th image, not fitted)`


def source_text(source: Any) -> str:
    """A `measured` source of domain.json as the card says it: a folder by its name alone, in backticks (records
    written before hub-vit recorded names, or `sources` given as paths, hold `data/digits/train`), prose as written
    with any path in it cut to its last part."""
    if not isinstance(source, str) or not source.strip():
        return "images `domain.json` does not name"
    bare = _NAME_FIRST.fullmatch(source.strip())
    if bare is not None:  # a folder, maybe with a note on how it was used
        return f"`{last_part(bare['name'])}`{bare['rest'] or ''}"
    return _PATH_LIKE.sub(lambda m: last_part(m.group()), source)


def last_part(path: str) -> str:
    """`data/digits/train/` -> `train`, `C:\\data\\val` -> `val`: a path's last component, the path itself if none."""
    return next((part for part in reversed(re.split(r"[/\\]", path)) if part), path)
