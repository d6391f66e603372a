"""Card text that depends on where a model came from: `conversion.json` (written by `hub_vit.conversion.writer`) or
`training.json` (written by `hub_vit.train.loop`). Every value shown is read from those files; a field a writer did
not record is left out of the card, never filled in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from huggingface_hub import EvalResult

from hub_vit.variants import ViTSpec

from .facts import CONVERSION, TRAINING, FolderFacts, ModelFolderError
from .metrics import measured_result
from .sections import Rows, flatten, fmt_number, fmt_value

POOLS = {"tok": "class-token pooling", "gap": "global average pooling", "map": "multihead attention pooling (MAP)"}


def _dict(record: dict[str, Any] | None, key: str) -> dict[str, Any]:
    value = (record or {}).get(key)
    return value if isinstance(value, dict) else {}


def layout_family(facts: FolderFacts) -> str | None:
    """'big_vision' or 'vit_jax' for a converted folder (conversion.json `layout.family`), else None."""
    return _dict(facts.conversion, "layout").get("family")


def dataset_name(facts: FolderFacts) -> str | None:
    """The training dataset's name: training.json `dataset.name` (or `.id`), else its folder's name."""
    data = _dict(facts.training, "dataset")
    name = data.get("name") or data.get("id")
    if not name and data.get("path"):
        name = PurePath(str(data["path"])).name
    return str(name) if name else None


DATASET_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
FINE_TUNED_FROM = "fine-tuned from "  # training.json `init` for --init FOLDER/FILE (hub_vit.train.models)
IMAGE_FOLDER = "imagefolder"  # the Hub's dataset type for a folder of class sub-folders, which `hub-vit train` reads


def datasets(facts: FolderFacts) -> list[str]:
    """Dataset ids for the metadata: the catalog's (`imagenet-1k`, `sklearn-digits`), else training.json's
    `dataset.name` / `.id` if it is id-shaped (`org/name`); a free-text description or a local folder's name is not an
    id and stays in the card body only (the model index then says `imagefolder`)."""
    if facts.match is not None or facts.bundled is not None:
        return [(facts.match or facts.bundled).weights.dataset]  # type: ignore[union-attr]
    # Only a name given as such: a local folder's name ("flowers") would link to someone else's Hub dataset
    data = _dict(facts.training, "dataset")
    name = data.get("name") or data.get("id")
    return [str(name)] if name and DATASET_ID.match(str(name)) else []


def summary(facts: FolderFacts, family: str) -> str:
    spec = facts.spec
    size = (f"{family}-{spec.variant}" if spec.variant
            else f"{family} (custom size: width {spec.width}, depth {spec.depth})")
    role = "image feature extractor (no classification head)" if spec.num_classes == 0 else "image classifier"
    what = f"A {size} {role} in the hub-vit model-folder format"
    if facts.match is not None:
        w = facts.match.weights
        origin = f"Google's published checkpoint `{w.gs_url}` ({w.dataset}), converted to PyTorch by `hub-vit convert`"
    elif facts.withheld is not None:
        w = facts.withheld.weights
        origin = (f"converted by `hub-vit convert` from Google's published checkpoint `{w.gs_url}` "
                  f"({w.dataset}), but {facts.weights_note}, so the published results are not "
                  "claimed for them")
    elif facts.namesake is not None and facts.kind == "converted":
        origin = (f"converted by `hub-vit convert` from `{source_label(_dict(facts.conversion, 'source'))}`, which has "
                  f"the name and layout of Google's published checkpoint `{facts.namesake.weights.gs_url}` but whose "
                  "content was not verified to be that file, so the published results are not claimed for it")
    elif facts.namesake is not None:
        origin = (f"its `pretrained_cfg` names Google's published checkpoint `{facts.namesake.weights.gs_url}`, but "
                  f"no `{CONVERSION}` records where its weights came from, so the published results are not claimed")
    elif facts.kind == "converted":
        origin = f"converted by `hub-vit convert` from `{source_label(_dict(facts.conversion, 'source'))}`"
    elif facts.kind == "trained":
        origin = f"trained by `hub-vit train` on {dataset_name(facts) or 'the dataset in training.json'}"
    else:
        origin = "with no provenance file (conversion.json / training.json)"
    # `hub-vit serve` (Triton) answers with top-k labels, so it serves classifiers only
    exports = "ONNX and Triton" if spec.num_classes else "ONNX"
    if facts.weights_note and facts.withheld is None and facts.namesake is None:
        what_is_withheld = "conversion parity" if facts.kind == "converted" else "held-out accuracy"
        origin += f"; the {what_is_withheld} recorded then is not claimed for these weights: {facts.weights_note}"
    # `trust_remote_code=True` only works while the modules `auto_map` names ship in the folder
    transformers = ("`trust_remote_code=True`, or `import hub_vit`" if facts.has_remote_code else
                    "with `import hub_vit`; this folder ships no remote code for `trust_remote_code=True`")
    return (f"{what}: {origin}. One folder serves timm (`config.json` with `architecture` and `pretrained_cfg`) and "
            f"transformers ({transformers}), and exports to {exports}.")


def architecture_note(spec: ViTSpec, family: str) -> str:
    pos = "fixed 2-D sin-cos" if spec.posemb == "sincos2d" else "learned"
    head = "a linear head" if spec.num_classes else "no head (the pooled features are the model's output)"
    if spec.rep_size:
        output = "a linear head" if spec.num_classes else "no head (the pre-logits output is the model's output)"
        head = f"a tanh pre-logits layer of width {spec.rep_size} and {output}"
    blocks = f"{spec.depth} pre-norm transformer block{'s' if spec.depth > 1 else ''}"
    return (f"{family}: patch embedding, {pos} position embedding, {blocks}, {POOLS[spec.pool_type]}, {head}. "
            "The row of hub-vit's variant table (`ViTSpec`) this model is built from:")


# ------------------------------------------------------------------------------------------------------- conversion
def local_name(path: Any) -> str:
    """A local file as the card shows it: its name only. The directory is private to the machine that converted it
    (a home folder, a cache) and means nothing to a reader; the sha256 identifies the file."""
    return PurePath(str(path)).name


def source_label(src: dict[str, Any]) -> str:
    """The checkpoint's URL if it has one, else its file name."""
    if src.get("url"):
        return str(src["url"])
    local = src.get("path") or src.get("origin")
    return local_name(local) if local else "a Google checkpoint"


def parity(facts: FolderFacts) -> dict[str, Any] | None:
    """The parity numbers `hub-vit convert` measured (conversion.json `parity`), one row per compared output."""
    record = _dict(facts.conversion, "parity")
    if not record:
        return None
    mode = str(record.get("mode", "-"))
    reference = record.get("reference")
    against = f"`{local_name(reference)}`" if reference else PARITY_TARGETS.get(mode)
    rows: Rows = [("compared against", f"{mode}: {against}" if against else mode)]
    for name, diff in (record.get("max_abs_diff") or {}).items():
        rows.append((f"max abs diff `{name}`", fmt_number(diff)))
    if record.get("top1_agreement") is not None:
        rows.append(("top-1 agreement (fraction of inputs)", fmt_number(record["top1_agreement"])))
    for name, why in (record.get("skipped") or {}).items():
        rows.append((f"not compared: `{name}`", str(why)))
    for key in ("tolerance", "layer_norm_eps", "gelu", "passed"):
        if record.get(key) is not None:
            rows.append((key.replace("_", " "), fmt_value(record[key])))
    note = parity_note(mode, record)
    if facts.weights_note:
        note += f" These numbers describe the weights as converted, not this folder's: {facts.weights_note}."
    return {"note": note, "rows": rows}


PARITY_TARGETS = {"self-consistency": "the model's fused (SDPA) vs explicit-softmax attention paths"}


def parity_note(mode: str, record: dict[str, Any]) -> str:
    """What the parity numbers show, worded by mode: only a reference run compares against Google's outputs."""
    measured = f"Measured by `hub-vit convert` when this folder was written (`{CONVERSION}` `parity`)"
    skipped = (" Outputs listed as not compared were skipped because an option changed what they compute."
               if record.get("skipped") else "")
    if mode == "reference":
        return (f"{measured}: the PyTorch model's outputs against the reference outputs of Google's own JAX code on "
                f"the same inputs.{skipped}")
    if mode == "self-consistency":
        return (f"{measured}: a self-consistency check only, since no reference outputs of Google's code were "
                "available. Fixed random inputs ran through the model's fused (SDPA) and explicit-softmax attention "
                "paths, which must agree; this shows the converted weights compute consistently, not that they "
                f"reproduce Google's outputs.{skipped}")
    return (f"Not measured: `hub-vit convert` had no reference outputs and was run without `--verify` "
            f"(`{CONVERSION}` `parity`).")


def _conversion_rows(facts: FolderFacts) -> Rows:
    conv = facts.conversion or {}
    src, layout, converter = _dict(conv, "source"), _dict(conv, "layout"), _dict(conv, "converter")
    out: Rows = []
    out.append(("source", f"`{source_label(src)}`"))
    if src.get("sha256"):
        out.append(("source sha256", f"`{src['sha256']}`"))
    if src.get("bytes") is not None:
        out.append(("source size (bytes)", fmt_number(src["bytes"])))
    if src.get("catalog_name"):
        out.append(("catalog name", f"`{src['catalog_name']}`"))
    if layout.get("description"):
        out.append(("checkpoint layout", str(layout["description"])))
    options = {k: v for k, v in (conv.get("options") or {}).items() if v not in (None, False)}
    if options:
        out.append(("conversion options", "; ".join(f"`{k}` {fmt_value(v)}" for k, v in options.items())))
    for note in conv.get("notes") or []:
        out.append(("conversion note", str(note)))
    if converter.get("converted_at"):
        out.append(("conversion date", str(converter["converted_at"])))
    if converter.get("hub_vit"):
        out.append(("converted with hub-vit", str(converter["hub_vit"])))
    return out


# --------------------------------------------------------------------------------------------------------- training
def _training_rows(facts: FolderFacts) -> Rows:
    run = facts.training or {}
    data, hw = _dict(run, "dataset"), _dict(run, "hardware")
    out: Rows = []
    if dataset_name(facts):
        out.append(("dataset", str(dataset_name(facts))))
    for key, label in (("source", "dataset source"), ("license", "dataset license"),
                       ("num_train", "training images"), ("num_val", "held-out images"),
                       ("split", "how the data was split"), ("preprocessing", "how the images were made")):
        if data.get(key) is not None:
            out.append((label, fmt_value(data[key])))
    for key, label in (("init", "initialised from"), ("steps", "optimizer steps"), ("epochs", "epochs"),
                       ("wall_time_s", "wall time (s)")):
        if run.get(key) is not None:
            value = run[key]
            if key == "init" and str(value).startswith(FINE_TUNED_FROM):  # a local path: its name only, as for sources
                value = FINE_TUNED_FROM + _init_name(str(value)[len(FINE_TUNED_FROM):])
            out.append((label, fmt_value(value)))
    if hw:
        device = hw.get("gpu") or hw.get("device")
        out.append(("hardware", f"{device}, {fmt_value(hw.get('processes'))} process(es), torch "
                                f"{hw.get('torch', '-')}, timm {hw.get('timm', '-')}"))
    if run.get("finished_utc"):
        out.append(("finished", str(run["finished_utc"])))
    if run.get("hub_vit_version"):
        out.append(("trained with hub-vit", str(run["hub_vit_version"])))
    return out


def _init_name(path: str) -> str:
    """The folder a run was fine-tuned from, as the card shows it: its name, with its run's for a `hub-vit train`
    output, which is always named `model` (`runs/s16/model` -> `s16/model`; "fine-tuned from model" told nothing)."""
    local = PurePath(path)
    return f"{local.parent.name}/{local.name}" if local.name == "model" and local.parent.name else local_name(path)


def recipe_rows(facts: FolderFacts) -> Rows:
    recipe = _dict(facts.training, "recipe")
    return flatten(recipe) if recipe else []


@dataclass(frozen=True)
class Measured:
    """The held-out accuracy a training run measured (training.json `held_out`)."""

    value: float  # as stored: a fraction in [0, 1]
    percent: float  # the same number in percent, as model-index and the paper tables state accuracy
    dataset: str  # Hub dataset id, or `imagefolder`
    dataset_name: str
    split: str
    rows: Rows
    note: str

    def eval_result(self) -> EvalResult:
        return measured_result(self.percent, dataset=self.dataset, name=self.dataset_name, split=self.split,
                               metric="top-1 accuracy")


def measured_accuracy(facts: FolderFacts) -> Measured | None:
    if not facts.record_describes_weights:
        return None  # measured on the weights `hub-vit train` wrote, which this folder may no longer hold
    held = _dict(facts.training, "held_out")
    top1 = held.get("top1")
    if top1 is None:
        return None
    # a fraction, as `hub-vit train` records it: 7.5 was published as 750 %, and "high" dropped the section unsaid
    if isinstance(top1, bool) or not isinstance(top1, (int, float)) or not 0 <= top1 <= 1:
        raise ModelFolderError(f"{facts.path / TRAINING}: held_out.top1 must be the top-1 accuracy as a fraction in "
                               f"[0, 1] (as hub-vit train records it), got {top1!r}")
    value = float(top1)
    percent = round(value * 100, 10)  # round off float noise (0.9722 * 100 = 97.22000000000001)
    split = str(held.get("split") or "held-out")
    rows: Rows = [("top-1 accuracy (%)", fmt_number(percent)), ("top-1 accuracy (fraction)", fmt_number(value))]
    for key, label in (("loss", "cross-entropy loss"), ("images", "images evaluated")):
        if held.get(key) is not None:
            rows.append((label, fmt_number(held[key])))
    return Measured(
        value=value, percent=percent, dataset=(datasets(facts) or [IMAGE_FOLDER])[0],
        dataset_name=dataset_name(facts) or (datasets(facts) or [IMAGE_FOLDER])[0], split=split, rows=rows,
        note=(f"Measured by `hub-vit train` at the end of the run on the held-out `{split}` split, which the model "
              f"never trained on; stored in `{TRAINING}` (`held_out`)."),
    )


# ---------------------------------------------------------------------------------------------------------- shared
def rows(facts: FolderFacts, version: str) -> Rows:
    out: Rows = []
    if facts.match is not None:
        out.append(("published checkpoint", f"`{facts.match.name}` in `hub_vit.catalog`; content verified: "
                                            f"{facts.match.evidence}"))
    elif facts.namesake is not None:
        where = ("the source has the name and layout of" if facts.kind == "converted"
                 else "the folder's `pretrained_cfg` names")
        out.append(("published checkpoint", f"not verified: {where} `{facts.namesake.name}` in `hub_vit.catalog`, "
                                            "but no record shows hub-vit downloaded it from the catalog's URL (and "
                                            "the catalog has no hash of it to compare), so the published results "
                                            "are not claimed"))
    if facts.kind == "converted":
        out += _conversion_rows(facts)
    elif facts.kind == "trained":
        out += _training_rows(facts)
    if facts.weights_state is not None:
        digest = (facts.record or {}).get("weights_digest")
        state = ("the same as `model.safetensors` now" if facts.record_describes_weights
                 else f"**not this folder's weights**: {facts.weights_note}")
        out.append(("weights digest", f"`{digest}`: {state}" if digest else state))
    out.append(("card generated by hub-vit", version))
    return out


def triton_client() -> str:
    """A raw tritonclient call against `hub-vit serve` (ensemble `vit`: encoded image bytes in, top-k labels out)."""
    return (
        "import numpy as np\n"
        "import tritonclient.http as httpclient\n\n"
        'client = httpclient.InferenceServerClient("127.0.0.1:8000")\n'
        'image = np.array([[open("image.jpg", "rb").read()]], dtype=np.object_)  # (batch, 1) encoded JPEG/PNG/WebP\n'
        'request = httpclient.InferInput("image", list(image.shape), "BYTES")\n'
        "request.set_data_from_numpy(image)\n"
        'result = client.infer("vit", [request])  # the server decodes, resizes and normalises\n'
        'print(result.as_numpy("labels")[0], result.as_numpy("scores")[0])  # top-k, best first\n\n'
        "# with hub-vit installed: `hub-vit classify image.jpg`, or\n"
        "# from hub_vit.server.client import Classifier; Classifier(\"127.0.0.1:8000\").classify([\"image.jpg\"])"
    )
