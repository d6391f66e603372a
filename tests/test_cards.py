"""Model cards: parse back with huggingface_hub, valid metadata, and every number traceable to a measured source.

Golden values come from outside hub-vit: the published GMACs of ViT-S/16 and ViT-B/16, the "Better plain ViT
baselines" table, the JAX fixtures' own sha256 index, and numbers the tests measure themselves (parameter count of
the loaded model, sha256 of the checkpoint file, torch's FLOP counter).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard, ModelCardData

from hub_vit.catalog import CLASSIC_VIT, MODELS, SIMPLEVIT
from hub_vit.model import VisionTransformer, count_parameters
from hub_vit.model_cards import ModelFolderError, count_macs, gmacs, render_model_card, write_model_card
from hub_vit.variants import ViTSpec
from hub_vit.weights_digest import file_digest, state_dict_digest

REPO = Path(__file__).resolve().parents[1]
JAX = REPO / "tests" / "fixtures" / "jax"
FIXTURES = {  # converted in the tests: one big_vision SimpleViT, one classic vit_jax ViT (published key names)
    "big_vision": JAX / "big_vision" / "tiny_sincos2d_gap_rep.npz",
    "vit_jax": JAX / "vit_jax" / "tiny_token_rep.published.npz",
}
# "Better plain ViT baselines for ImageNet-1k" (arXiv:2205.01580), Table 2: ImageNet val / ReaL / v2 top-1 (%)
PAPER_300EP = {"top1": 80.0, "real": 85.4, "v2": 68.3}
# Published GMACs at 224 px (ViT-S/16, ViT-B/16) and timm's benchmark tables (two decimals).
PUBLISHED_GMACS = {"S/16": 4.6, "B/16": 17.6}
TIMM_GMACS = {"S/16": 4.61, "B/16": 17.58}


# ---------------------------------------------------------------------------------------------------- helpers
NUMBER = re.compile(r"(?<![\w.\-])-?\d[\d,]*(?:\.\d+)*(?:e[-+]?\d+)?(?![\w\-])")
FENCE = re.compile(r"```.*?```", re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def numbers_in(text: str) -> list[str]:
    """Every number token of a text (dates and versions split the same way in the card and in the JSON)."""
    return [t.rstrip(",") for t in NUMBER.findall(text)]


def token_matches(token: str, value: float) -> bool:
    """True if `token` is `value` correctly rounded to the digits shown (integers exactly, `4.60` to +-0.005)."""
    plain = token.replace(",", "")
    if plain.count(".") > 1:
        return False
    mantissa, _, exponent = plain.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    half_ulp = 0.5 * 10 ** (-decimals) * 10 ** int(exponent or 0)
    return abs(float(plain) - value) <= half_ulp * (1 + 1e-9) + 1e-15


def body_of(card_text: str) -> str:
    """The card without its YAML header, fenced code (usage snippets, BibTeX) and inline code (keys, paths)."""
    body = card_text.split("\n---\n", 1)[1]
    return CODE_SPAN.sub(" ", FENCE.sub(" ", body))


def json_numbers(data: Any) -> list[float]:
    """Every number in a JSON tree: numeric leaves, and number tokens inside string leaves (dates, descriptions)."""
    out: list[float] = []
    if isinstance(data, dict):
        for value in data.values():
            out += json_numbers(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            out += json_numbers(value)
    elif isinstance(data, bool) or data is None:
        pass
    elif isinstance(data, (int, float)):
        out.append(float(data))
    elif isinstance(data, str):
        out += [float(t.replace(",", "")) for t in numbers_in(data) if t.count(".") <= 1]
    return out


def table(card_text: str, section: str) -> dict[str, str]:
    """The two-column markdown table under `## section` (or `### section`) as {label: value}."""
    part = re.split(rf"^#+ {re.escape(section)}\s*$", card_text, flags=re.M)[1]
    part = re.split(r"^#+ ", part, maxsplit=1, flags=re.M)[0]
    rows = {}
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and set(cells[1]) != {"-"}:
            rows[cells[0]] = cells[1]
    return rows


def measured_values(folder: Path) -> list[float]:
    """Everything a card may state about `folder`, from the folder's JSON and from measurements made here."""
    from hub_vit.domain import read_domain
    from hub_vit.folder import load_model_folder

    values: list[float] = []
    for name in ("config.json", "conversion.json", "training.json", "preprocessor_config.json", "domain.json"):
        if (folder / name).is_file():
            values += json_numbers(json.loads((folder / name).read_text()))
    model, info = load_model_folder(folder)
    spec = info.spec
    values += [count_parameters(model), count_macs(spec), count_macs(spec) / 1e9, len(info.labels),
               len(info.labels) - 10, spec.head_dim, spec.num_patches, spec.num_patches + spec.num_prefix_tokens]
    cfg = info.pretrained_cfg
    _, h, w = cfg["input_size"]
    values += [math.floor(h / cfg["crop_pct"]), math.floor(w / cfg["crop_pct"])]
    for m, s in zip(cfg["mean"], cfg["std"], strict=True):
        values += [(0 - m) / s, (1 - m) / s]  # the value range [0, 1] pixels are mapped to
    values += [0.0, 1.0]  # "pixels scaled to [0, 1]"
    training = folder / "training.json"
    if training.is_file():
        values.append(json.loads(training.read_text())["held_out"]["top1"] * 100)
    statistics = read_domain(folder, info.labels).statistics  # the out-of-domain score's threshold and blocks
    if statistics is not None:
        values += [statistics.threshold, *(block + 1 for block in statistics.blocks)]
    return values


def version_tokens(folder: Path) -> set[str]:
    """Dotted version strings (`0.1.0`) the card may quote: hub-vit's own and those recorded in the folder's JSON."""
    from hub_vit import __version__

    tokens = set(numbers_in(__version__))
    for name in ("conversion.json", "training.json"):
        if (folder / name).is_file():
            tokens |= set(numbers_in((folder / name).read_text()))
    return {t for t in tokens if t.count(".") > 1}


def assert_every_number_accounted(card_text: str, folder: Path, extra: list[float] = ()) -> None:
    allowed, versions = measured_values(folder) + list(extra), version_tokens(folder)
    stray = [t for t in numbers_in(body_of(card_text))
             if t not in versions and not any(token_matches(t, v) for v in allowed)]
    assert not stray, f"numbers in the card that no JSON field or measurement accounts for: {stray}"


def assert_card_metadata(card: ModelCard, license: str | None = "apache-2.0") -> dict[str, Any]:
    """Metadata every card has; `license` None: the card must state none (the folder does not show the weights')."""
    data = card.data.to_dict()
    assert data["library_name"] == "timm"
    assert data["pipeline_tag"] == "image-classification"
    assert {"image-classification", "vision-transformer", "timm"} <= set(data["tags"])
    assert data.get("license") == license
    assert ModelCardData(**data).to_dict() == data  # the metadata round-trips through huggingface_hub
    return data


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The JAX fixtures converted by hub-vit's converter (which writes conversion.json), each with its card."""
    from hub_vit.conversion.writer import convert_to_folder

    root = tmp_path_factory.mktemp("converted")
    out = {}
    for layout, npz in FIXTURES.items():
        folder = convert_to_folder(npz, root / npz.name.split(".")[0], progress=False).path
        write_model_card(folder)
        out[layout] = folder
    return out


# ---------------------------------------------------------------------------------------------------- GMACs
@pytest.mark.parametrize("variant", sorted(PUBLISHED_GMACS))
def test_gmacs_match_published_vit_numbers(variant: str) -> None:
    spec = ViTSpec.from_variant(variant, **CLASSIC_VIT)  # ViT-S/16, ViT-B/16 at 224 px, 1000 classes
    g = gmacs(spec)
    assert round(g, 1) == PUBLISHED_GMACS[variant]
    assert abs(g - TIMM_GMACS[variant]) / TIMM_GMACS[variant] < 0.005  # timm also counts norms / softmax


@pytest.mark.parametrize("switches", [CLASSIC_VIT, SIMPLEVIT, dict(posemb="learn", pool_type="map"),
                                      dict(posemb="sincos2d", pool_type="map", rep_size=24)],
                         ids=["vit", "simplevit", "map", "map-rep"])
def test_macs_formula_equals_torch_flop_counter(switches: dict) -> None:
    """The analytic count equals what torch counts on the real forward pass (explicit attention: every matmul)."""
    from torch.utils.flop_counter import FlopCounterMode

    spec = ViTSpec.from_variant("mu/16", img_size=(48, 64), num_classes=7, **switches)
    model = VisionTransformer(spec).eval()
    with FlopCounterMode(display=False) as counter:
        model.forward_all(torch.zeros(1, 3, 48, 64), output_attentions=True)
    assert counter.get_total_flops() == 2 * count_macs(spec)  # torch counts 2 FLOPs per multiply-accumulate
    assert count_macs(spec, (64, 96)) > count_macs(spec)
    with pytest.raises(ValueError, match="not divisible by the patch size 16"):
        count_macs(spec, (50, 64))


def test_parameter_count_matches_vit_jax() -> None:
    """The card's parameter count (model built on the meta device) equals vit_jax's `models_test.py` MODEL_SIZES."""
    from hub_vit.model_cards.facts import model_num_params

    published = {"Ti/16": 5_717_416, "S/16": 22_050_664, "B/16": 86_567_656, "L/16": 304_326_632}
    for variant, count in published.items():
        assert model_num_params(ViTSpec.from_variant(variant, **CLASSIC_VIT)) == count, variant


# ---------------------------------------------------------------------------------------------------- converted
@pytest.mark.parametrize("layout", sorted(FIXTURES))
def test_converted_card_parses_and_matches_conversion_json(converted: dict[str, Path], layout: str) -> None:
    from hub_vit.folder import load_model_folder

    folder = converted[layout]
    card = ModelCard.load(folder / "README.md")
    data = assert_card_metadata(card, license=None)  # Google's layout, but nothing shows the file is Google's
    assert "model-index" not in data  # a private fixture has no published results
    conv = json.loads((folder / "conversion.json").read_text())
    text = str(card)

    arch = table(text, "Architecture")
    config = json.loads((folder / "config.json").read_text())
    for field, value in config["model_args"].items():
        shown = arch[f"`{field}`"]
        if isinstance(value, list):
            assert [int(n) for n in numbers_in(shown)] == value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            assert token_matches(numbers_in(shown)[0], value), (field, shown, value)
        elif value is not None:
            assert shown == str(value).lower()

    compute = table(text, "Compute")
    model, info = load_model_folder(folder)
    assert int(compute["parameters"].replace(",", "")) == count_parameters(model) == conv["num_parameters"]
    assert int(compute["multiply-accumulates (MACs)"].replace(",", "")) == count_macs(info.spec)

    parity = table(text, "Conversion parity")
    for name, diff in conv["parity"]["max_abs_diff"].items():
        assert token_matches(parity[f"max abs diff `{name}`"], diff), name
    assert token_matches(parity["top-1 agreement (fraction of inputs)"], conv["parity"]["top1_agreement"])
    assert token_matches(parity["tolerance"], conv["parity"]["tolerance"])

    prov = table(text, "Provenance")
    npz = FIXTURES[layout]
    golden = json.loads((JAX / "index.json").read_text())["files"][npz.relative_to(JAX).as_posix()]
    assert prov["source sha256"].strip("`") == conv["source"]["sha256"] == golden["sha256"]
    assert hashlib.sha256(npz.read_bytes()).hexdigest() == golden["sha256"]
    assert int(prov["source size (bytes)"].replace(",", "")) == golden["bytes"]
    assert prov["conversion date"] == conv["converter"]["converted_at"]
    # the weights the parity numbers describe are the folder's: the recorded digest is model.safetensors' own
    digest = file_digest(folder / "model.safetensors")
    assert prov["weights digest"] == f"`{digest}`: the same as `model.safetensors` now"
    assert conv["weights_digest"] == file_digest(folder / "model.safetensors")
    assert_every_number_accounted(text, folder)


def test_converted_card_content(converted: dict[str, Path]) -> None:
    text = (converted["vit_jax"] / "README.md").read_text()
    for snippet in ('timm.create_model("local-dir:', 'pipeline("image-classification"', "trust_remote_code=True",
                    "hub-vit export onnx", "onnxruntime", "hub-vit serve", "tritonclient", "arXiv:2010.11929",
                    "## License", "vision_transformer (vit_jax)"):
        assert snippet in text, snippet
    # a classic ViT (class token, learned position embedding) cites the ViT paper only; SimpleViT cites both
    assert "arXiv:2205.01580" not in text
    simplevit = (converted["big_vision"] / "README.md").read_text()
    assert "arXiv:2010.11929" in simplevit and "arXiv:2205.01580" in simplevit
    assert "/work/" not in text and str(REPO) not in text  # no machine-specific absolute paths
    with_repo = str(render_model_card(converted["vit_jax"], repo_id="my-org/tiny-vit"))
    assert 'timm.create_model("hf-hub:my-org/tiny-vit"' in with_repo
    assert 'model="my-org/tiny-vit", trust_remote_code=True' in with_repo
    assert "hub-vit serve hf-hub:my-org/tiny-vit\n" in with_repo and "hub-vit export onnx hf-hub:my-org/tiny-vit " in \
        with_repo  # the published card's command lines name the Hub repository, which hub-vit fetches


def test_card_usage_snippets_run(converted: dict[str, Path], tmp_path: Path) -> None:
    """The timm and transformers snippets of the card, run as written (folder path filled in) on a real photo."""
    import subprocess
    import sys

    from PIL import Image
    from skimage import data

    folder = converted["vit_jax"]
    text = (folder / "README.md").read_text()
    assert 'timm.create_model("local-dir:path/to/tiny_token_rep", pretrained=True)' in text
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    timm_code = next(b for b in blocks if "timm.create_model" in b)
    hf_code = next(b for b in blocks if "AutoModelForImageClassification" in b)
    script = "\n".join([timm_code, hf_code]).replace(f"path/to/{folder.name}", str(folder))
    Image.fromarray(data.chelsea()).save(tmp_path / "image.jpg")
    (tmp_path / "snippets.py").write_text(script + "\nprint('SNIPPETS OK')\n")
    proc = subprocess.run([sys.executable, "snippets.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SNIPPETS OK" in proc.stdout and "'label': 'class_" in proc.stdout


# ---------------------------------------------------------------------------------------------------- published
def test_published_checkpoint_card_carries_paper_results(tmp_path: Path) -> None:
    """A folder converted from `simplevit_s16.i1k_300ep` gets the paper's numbers in model-index and a table."""
    from hub_vit.folder import save_model_folder

    entry = MODELS["simplevit_s16"]
    weights = entry.weight("i1k_300ep")
    model = VisionTransformer(entry.spec)  # the architecture of the published file; weights are not needed here
    # The evidence hub-vit's downloader leaves: it fetched the catalog URL and recorded this sha256 while downloading
    source = {"origin": "simplevit_s16.i1k_300ep", "url": weights.url, "sha256": "0" * 64,
              "catalog_name": "simplevit_s16.i1k_300ep", "downloaded_sha256": "0" * 64}
    record = {"source": source, "layout": {"family": "big_vision"},
              "weights_digest": state_dict_digest(model.state_dict())}
    folder = save_model_folder(model, tmp_path / "s16", labels=[f"c{i}" for i in range(1000)],
                               pretrained_cfg=weights.pretrained_cfg(), extra_files={"conversion.json": record})
    card = ModelCard.load(write_model_card(folder))
    data = assert_card_metadata(card)
    assert data["datasets"] == ["imagenet-1k"]
    index = data["model-index"]
    assert len(index) == 1 and index[0]["name"] == "simplevit_s16.i1k_300ep"
    by_dataset = {r["dataset"]["name"]: r for r in index[0]["results"]}
    assert {k: by_dataset[k]["metrics"][0]["value"] for k in by_dataset} == {
        "ImageNet-1k": PAPER_300EP["top1"], "ImageNet-ReaL": PAPER_300EP["real"], "ImageNet-v2": PAPER_300EP["v2"]}
    for result in index[0]["results"]:
        assert result["task"]["type"] == "image-classification"
        assert result["metrics"][0]["type"] == "accuracy"
        assert result["source"]["url"] == "https://arxiv.org/abs/2205.01580"
    assert [r.metric_value for r in card.data.eval_results] == [80.0, 85.4, 68.3]

    text = str(card)
    assert "76.5" in text and "78.5" in text  # the 90 / 150 epoch rows of the paper's table
    assert "content verified: downloaded by hub-vit from" in table(text, "Provenance")["published checkpoint"]
    compute = table(text, "Compute")
    assert compute["GMACs"] == f"{gmacs(entry.spec):.2f}"
    catalog_numbers = [v for w in entry.weights for v in w.results.values()]
    catalog_numbers += json_numbers([weights.paper, weights.gs_url] + [w.tag for w in entry.weights])
    assert_every_number_accounted(text, folder, extra=catalog_numbers)


def test_same_name_and_layout_without_download_evidence_claims_nothing(tmp_path: Path) -> None:
    """The folder above, minus the downloader's record: a file with Google's name and layout is not Google's file."""
    from hub_vit.folder import save_model_folder

    entry = MODELS["simplevit_s16"]
    weights = entry.weight("i1k_300ep")
    source = {"origin": "simplevit_s16.i1k_300ep", "url": weights.url, "sha256": "0" * 64,
              "catalog_name": "simplevit_s16.i1k_300ep", "downloaded_sha256": None}  # placed in the cache by hand
    folder = save_model_folder(VisionTransformer(entry.spec), tmp_path / "s16", labels=[f"c{i}" for i in range(1000)],
                               pretrained_cfg=weights.pretrained_cfg(),
                               extra_files={"conversion.json": {"source": source, "layout": {"family": "big_vision"}}})
    card = ModelCard.load(write_model_card(folder))
    data = assert_card_metadata(card, license=None)
    assert "model-index" not in data and "datasets" not in data
    text = str(card)
    assert "## Published results" not in text and "80.0" not in text and "85.4" not in text
    assert "Google's published checkpoint `gs://big_vision/vit_s16_i1k_300ep.npz` (imagenet-1k)" not in text
    assert "but whose content was not verified" in text
    assert table(text, "Provenance")["published checkpoint"].startswith("not verified:")


def published_folder(folder: Path, **changes: Any) -> tuple[Path, VisionTransformer]:
    """A folder `hub-vit convert` would write from `simplevit_s16.i1k_300ep` downloaded by hub-vit (the evidence its
    downloader records), with `changes` applied to conversion.json's `source` (a key set to ... is removed)."""
    from hub_vit.folder import save_model_folder

    entry = MODELS["simplevit_s16"]
    weights = entry.weight("i1k_300ep")
    model = VisionTransformer(entry.spec)
    source = {"origin": "simplevit_s16.i1k_300ep", "url": weights.url, "sha256": "0" * 64,
              "catalog_name": "simplevit_s16.i1k_300ep", "downloaded_sha256": "0" * 64, **changes}
    source = {k: v for k, v in source.items() if v is not ...}
    record = {"source": source, "layout": {"family": "big_vision"},
              "weights_digest": state_dict_digest(model.state_dict()),
              "parity": {"mode": "self-consistency", "reference": None, "max_abs_diff": {"logits": 1e-7},
                         "tolerance": 1e-3, "passed": True}}
    return save_model_folder(model, folder, labels=[f"c{i}" for i in range(1000)],
                             pretrained_cfg=weights.pretrained_cfg(), extra_files={"conversion.json": record}), model


def test_a_conversion_record_without_download_evidence_claims_nothing(tmp_path: Path) -> None:
    """A conversion.json with no `downloaded_sha256` key at all (not even null) is no evidence either: the card makes
    no published claim, rather than trusting name and layout."""
    folder, _ = published_folder(tmp_path / "s16", downloaded_sha256=...)
    card = ModelCard.load(write_model_card(folder))
    assert not card.data.eval_results and card.data.to_dict().get("license") is None
    assert table(str(card), "Provenance")["published checkpoint"].startswith("not verified:")


def test_weights_changed_after_conversion_withhold_published_results_and_parity(tmp_path: Path) -> None:
    """Fine-tuned (or otherwise re-saved with other values) after a verified conversion: the folder keeps its
    conversion.json, but the published results, the model name and the parity numbers no longer describe its
    weights, and the card says so. Re-saving the same values through transformers changes nothing."""
    from transformers import AutoModelForImageClassification

    folder, _ = published_folder(tmp_path / "s16")
    assert [r.metric_value for r in ModelCard.load(write_model_card(folder)).data.eval_results] == [80.0, 85.4, 68.3]

    hf = AutoModelForImageClassification.from_pretrained(folder)
    hf.save_pretrained(folder)  # the same tensors, written by transformers: still the converted weights
    assert [r.metric_value for r in ModelCard.load(write_model_card(folder)).data.eval_results] == [80.0, 85.4, 68.3]

    with torch.no_grad():
        hf.vit.head.bias.add_(0.01)  # a fine-tuning step's worth of change
    hf.save_pretrained(folder)
    card = ModelCard.load(write_model_card(folder))
    data = card.data.to_dict()
    assert "model-index" not in data and "datasets" not in data and not card.data.eval_results
    assert data["license"] == "apache-2.0"  # derived from Google's Apache-2.0 weights, which the record does show
    text = str(card)
    assert "## Published results" not in text and "80.0" not in text
    assert "no longer holds the weights `hub-vit convert` wrote" in text.split("\n\n")[2], text.split("\n\n")[2]
    assert "not this folder's: `model.safetensors` no longer holds" in table_note(text, "Conversion parity")
    recorded = json.loads((folder / "conversion.json").read_text())["weights_digest"]
    assert recorded != file_digest(folder / "model.safetensors")
    assert table(text, "Provenance")["weights digest"].startswith(f"`{recorded}`: **not this folder's weights**")


def test_a_conversion_record_without_weights_digest_claims_nothing(tmp_path: Path) -> None:
    """A conversion.json an earlier hub-vit wrote records no digest of the weights: nothing shows model.safetensors
    still holds them, so no published results, and the card says how to get them back (convert again)."""
    folder, _ = published_folder(tmp_path / "s16")
    record = json.loads((folder / "conversion.json").read_text())
    del record["weights_digest"]
    (folder / "conversion.json").write_text(json.dumps(record))
    card = ModelCard.load(write_model_card(folder))
    assert not card.data.eval_results
    assert "records no digest of the weights" in table(str(card), "Provenance")["weights digest"]
    assert "convert again" in table(str(card), "Provenance")["weights digest"]


def test_a_folder_without_conversion_json_is_not_said_to_be_converted(tmp_path: Path) -> None:
    """Its pretrained_cfg names a published file (saved from a timm model), but no record says where the weights
    came from: no published results, and no claim that `hub-vit convert` made it."""
    from hub_vit.folder import save_model_folder

    entry = MODELS["simplevit_s16"]
    weights = entry.weight("i1k_300ep")
    folder = save_model_folder(VisionTransformer(entry.spec), tmp_path / "s16", labels=[f"c{i}" for i in range(1000)],
                               pretrained_cfg=weights.pretrained_cfg())
    text = str(ModelCard.load(write_model_card(folder)))
    assert "## Published results" not in text and "converted by `hub-vit convert`" not in text
    assert "its `pretrained_cfg` names Google's published checkpoint" in text
    assert table(text, "Provenance")["published checkpoint"].startswith("not verified: the folder's `pretrained_cfg`")


# ---------------------------------------------------------------------------------------------------- headless
def test_headless_folder_validates_and_its_card_snippets_run(tmp_path: Path) -> None:
    """`--num-classes 0` (as for SigLIP image towers): no labels.txt, feature-extraction card, snippets that run."""
    import subprocess
    import sys

    from PIL import Image
    from skimage import data

    from hub_vit.conversion.writer import convert_to_folder
    from hub_vit.publish import validate_folder

    folder = convert_to_folder(FIXTURES["vit_jax"], tmp_path / "tower", num_classes=0, progress=False).path
    assert not (folder / "labels.txt").exists()
    plan = validate_folder(folder)  # used to refuse: "missing labels.txt"
    assert "README.md" in plan.files
    text = (folder / "README.md").read_text()
    card = ModelCard(text).data.to_dict()
    assert card["pipeline_tag"] == "image-feature-extraction" and "image-classification" not in card["tags"]
    assert "image classification" not in text and "image-classification" not in text
    assert "AutoModelForImageClassification" not in text and "(1, 0)" not in text and "hub-vit serve" not in text
    # tiny_token_rep (vit_jax/fixtures.json): representation_size 32, so 32-dim features; 1 + 16 tokens of width 64
    assert "(1, 32)" in text and "(1, 17, 64)" in text

    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    timm_code = next(b for b in blocks if "timm.create_model" in b)
    hf_code = next(b for b in blocks if "AutoModel." in b)
    check = ("\nimport torch\n"
             "assert tuple(features.shape) == (1, 32) and tuple(tokens.shape) == (1, 17, 64)\n"
             "assert tuple(outputs.pooler_output.shape) == (1, 32)\n"
             "torch.testing.assert_close(outputs.pooler_output, features, atol=1e-5, rtol=0)\n"
             "print('SNIPPETS OK')\n")
    script = "\n".join([timm_code, hf_code]).replace(f"path/to/{folder.name}", str(folder)) + check
    Image.fromarray(data.chelsea()).save(tmp_path / "image.jpg")
    (tmp_path / "snippets.py").write_text(script)
    proc = subprocess.run([sys.executable, "snippets.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SNIPPETS OK" in proc.stdout


# ---------------------------------------------------------------------------------------------------- parity
def test_parity_text_is_worded_by_mode(converted: dict[str, Path], tmp_path: Path) -> None:
    from hub_vit.conversion.writer import convert_to_folder

    google = "against the reference outputs of Google's own JAX code"
    reference = table_note((converted["vit_jax"] / "README.md").read_text(), "Conversion parity")
    assert google in reference
    lonely = tmp_path / "lonely.npz"
    shutil.copy(FIXTURES["vit_jax"], lonely)  # no .io.npz beside it: self-consistency
    folder = convert_to_folder(lonely, tmp_path / "self", verify=True, progress=False).path
    text = (folder / "README.md").read_text()
    note = table_note(text, "Conversion parity")
    assert google not in note and "self-consistency check only" in note and "not that they reproduce" in note
    assert table(text, "Conversion parity")["compared against"].startswith("self-consistency: the model's fused")

    unmeasured = convert_to_folder(lonely, tmp_path / "plain", progress=False).path  # no reference, no --verify
    assert json.loads((unmeasured / "conversion.json").read_text())["parity"]["passed"] is None  # compared nothing
    text = (unmeasured / "README.md").read_text()
    assert table_note(text, "Conversion parity").startswith("Not measured")
    rows = table(text, "Conversion parity")
    assert "passed" not in rows and not rows["compared against"].endswith(": -"), rows


def table_note(card_text: str, section: str) -> str:
    """The prose between `## section` and its table."""
    part = re.split(rf"^#+ {re.escape(section)}\s*$", card_text, flags=re.M)[1]
    return part.split("\n|", 1)[0].strip()


# ---------------------------------------------------------------------------------------------------- trained
def assert_trained_card(folder: Path, text: str) -> None:
    """model-index, the accuracy table and the recipe table equal training.json; nothing else unaccounted for."""
    card = ModelCard(text)
    data = assert_card_metadata(card)
    training = json.loads((folder / "training.json").read_text())
    held_out = training["held_out"]
    [entry] = data["model-index"]
    [result] = entry["results"]
    assert result["task"]["type"] == "image-classification"
    assert result["dataset"]["split"] == held_out["split"]
    assert result["metrics"][0]["type"] == "accuracy"
    assert math.isclose(result["metrics"][0]["value"], held_out["top1"] * 100, rel_tol=1e-9)
    measured = table(text, "Measured accuracy")
    assert token_matches(measured["top-1 accuracy (fraction)"], held_out["top1"])
    assert token_matches(measured["top-1 accuracy (%)"], held_out["top1"] * 100)
    assert token_matches(measured["cross-entropy loss"], held_out["loss"])
    assert int(measured["images evaluated"].replace(",", "")) == held_out["images"]
    recipe = table(text, "Training recipe")
    for key, value in training["recipe"].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert token_matches(numbers_in(recipe[f"`{key}`"])[0], value), key
    prov = table(text, "Provenance")
    assert token_matches(prov["wall time (s)"], training["wall_time_s"])
    assert int(prov["optimizer steps"].replace(",", "")) == training["steps"]
    assert_every_number_accounted(text, folder)


def test_trained_run_card(tmp_path: Path) -> None:
    """A real (2-step) `hub-vit train` run on the digits data: its folder's card states what training.json says."""
    from hub_vit.train import digits
    from hub_vit.train.loop import train

    data = digits.write_image_folder(tmp_path / "data")
    recipe = digits.DIGITS_RECIPE.replace(total_steps=2, warmup_steps=1, eval_every_epochs=100.0)
    result = train(recipe, data, tmp_path / "run", progress=False, dataset_info=digits.dataset_info())
    assert result.model_dir is not None
    text = write_model_card(result.model_dir).read_text()
    assert_trained_card(result.model_dir, text)
    meta = ModelCard(text).data.to_dict()
    assert meta["model-index"][0]["results"][0]["dataset"]["type"] == "imagefolder"  # free-text name, not an id
    assert "# run" in text  # titled by the run folder, not by its `model/` sub-folder
    # the calibration on the run's splits names them `train` and `val`, not the data folder's path here
    record = (result.model_dir / "domain.json").read_text()
    assert str(tmp_path) not in record and str(tmp_path) not in text
    assert "Fitted on `train`; threshold: split conformal on `val`." in " ".join(text.split())


def test_trained_card_withholds_the_accuracy_once_the_weights_change(tmp_path: Path) -> None:
    """training.json's held-out accuracy was measured on the weights the run wrote; a folder fine-tuned further (or
    given another weight file) keeps training.json, but its card claims no accuracy for weights nobody measured."""
    from hub_vit.folder import load_model_folder, save_model_folder
    from hub_vit.train import digits
    from hub_vit.train.loop import train

    data = digits.write_image_folder(tmp_path / "data")
    recipe = digits.DIGITS_RECIPE.replace(total_steps=1, warmup_steps=0, eval_every_epochs=100.0)
    folder = train(recipe, data, tmp_path / "run", progress=False).model_dir
    assert ModelCard.load(folder / "README.md").data.eval_results  # as written by the run: claimed
    model, info = load_model_folder(folder)
    with torch.no_grad():
        model.head.weight.mul_(2)
    save_model_folder(model, folder, labels=info.labels, pretrained_cfg=info.pretrained_cfg, overwrite=True,
                      extra_files={"training.json": (folder / "training.json").read_bytes()})
    card = ModelCard.load(write_model_card(folder))
    assert not card.data.eval_results and "model-index" not in card.data.to_dict()
    text = str(card)
    assert "## Measured accuracy" not in text
    assert "held-out accuracy recorded then is not claimed" in text.split("\n\n")[2]
    assert "no longer holds the weights `hub-vit train` wrote" in table(text, "Provenance")["weights digest"]
    license_note = table_note(text + "\n|", "License")  # the license binds what was derived, without saying this
    assert "Weights trained with hub-vit" not in text and "This file is no longer those weights" in license_note


def test_folder_without_provenance_states_no_license_until_its_publisher_does(tmp_path: Path) -> None:
    """Random weights saved from a registered name: nothing says whose they are, so no license in the metadata (it
    was 'trained with hub-vit, Apache-2.0'); a license the publisher writes into the metadata survives re-rendering."""
    import timm

    import hub_vit  # noqa: F401  (registers the architectures)
    from hub_vit.folder import save_model_folder

    model = timm.create_model("vit_ti16", img_size=32, num_classes=3)
    folder = save_model_folder(model, tmp_path / "mine", pretrained_cfg=model.pretrained_cfg)
    text = write_model_card(folder).read_text()
    assert "license" not in ModelCard(text).data.to_dict()
    note = table_note(text + "\n|", "License")
    assert "No provenance file" in note and "trained with hub-vit" not in text and "add `license: <id>`" in note

    (folder / "README.md").write_text(text.replace("library_name: timm", "library_name: timm\nlicense: mit", 1))
    again = write_model_card(folder).read_text()
    assert ModelCard(again).data.to_dict()["license"] == "mit"
    assert "as stated in this card's metadata by its publisher" in table_note(again + "\n|", "License")


def test_license_hub_vit_wrote_is_not_kept_as_the_publishers(tmp_path: Path) -> None:
    """Only a license a person wrote survives a re-render: not one hub-vit stated from a record that is gone, nor the
    `apache-2.0` older versions wrote into every card (their marker has no `license-source`). Before, both were kept
    and credited "as stated in this card's metadata by its publisher"."""
    from hub_vit import catalog

    folder = shutil.copytree(catalog.default_model_folder(), tmp_path / "digits_copy")
    text = write_model_card(folder).read_text()
    assert ModelCard(text).data.to_dict()["license"] == "apache-2.0" and "license-source: hub-vit" in text

    (folder / "training.json").unlink()  # the record that justified hub-vit's license
    again = write_model_card(folder).read_text()
    assert "license" not in ModelCard(again).data.to_dict() and "license-source: none" in again
    assert "by its publisher" not in again and "add `license: <id>`" in table_note(again + "\n|", "License")

    old = text.replace("; license-source: hub-vit", "", 1)  # as the version before the field rendered it
    assert "license-source" not in old
    (folder / "README.md").write_text(old)
    assert "license" not in ModelCard(write_model_card(folder).read_text()).data.to_dict()

    # A card from that version which stated no license asked for one: a license found there now is a person's.
    asked = again.replace("; license-source: none", "", 1)
    asked = asked.replace("library_name: timm", "library_name: timm\nlicense: mit", 1)
    (folder / "README.md").write_text(asked)
    kept = write_model_card(folder).read_text()
    assert ModelCard(kept).data.to_dict()["license"] == "mit" and "license-source: publisher" in kept
    assert ModelCard(write_model_card(folder).read_text()).data.to_dict()["license"] == "mit"  # and stays


def test_local_data_folder_name_is_not_published_as_a_hub_dataset(tmp_path: Path) -> None:
    # A run on ./flowers used to write `datasets: [flowers]`, a link to somebody else's Hub dataset.
    from hub_vit.train import digits
    from hub_vit.train.loop import train

    data = digits.write_image_folder(tmp_path / "flowers")
    recipe = digits.DIGITS_RECIPE.replace(total_steps=1, warmup_steps=0, eval_every_epochs=100.0)
    result = train(recipe, data, tmp_path / "run", progress=False)
    text = write_model_card(result.model_dir).read_text()
    meta = ModelCard(text).data.to_dict()
    assert "datasets" not in meta
    assert meta["model-index"][0]["results"][0]["dataset"]["type"] == "imagefolder"
    assert "flowers" in text  # still named in the card body


def test_default_model_card_is_committed_current_and_true() -> None:
    from hub_vit import catalog

    folder = catalog.default_model_folder()
    path = folder / "README.md"
    assert path.is_file(), f"the shipped default model has no card; run `hub-vit card {folder}`"
    committed = path.read_text(encoding="utf-8")
    assert committed == str(render_model_card(folder)), f"stale card: run `hub-vit card {folder}`"
    assert_trained_card(folder, committed)
    data = ModelCard.load(path).data
    assert data.datasets == ["sklearn-digits"] and data.model_name == catalog.DEFAULT_MODEL
    assert f'timm.create_model("{catalog.DEFAULT_MODEL}", pretrained=True)' in committed


def test_copy_of_the_default_model_gets_the_same_metadata(tmp_path: Path) -> None:
    """A byte-identical copy (e.g. made to push it) is the shipped model: the same datasets and model-index."""
    from hub_vit import catalog

    shipped = catalog.default_model_folder()
    copy = shutil.copytree(shipped, tmp_path / "digits_copy")
    data = render_model_card(copy).data.to_dict()
    committed = ModelCard.load(shipped / "README.md").data.to_dict()
    assert data["datasets"] == ["sklearn-digits"]
    assert data["model-index"] == committed["model-index"]
    assert data["model-index"][0]["results"][0]["dataset"]["type"] == "sklearn-digits"


# ---------------------------------------------------------------------------------------------------- failures
def test_folder_without_weights_is_refused_and_nothing_written(converted: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(converted["big_vision"], folder)
    (folder / "README.md").unlink()
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match="model.safetensors"):
        write_model_card(folder)
    assert not (folder / "README.md").exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_failed_render_keeps_the_old_card(converted: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "mismatch"
    shutil.copytree(converted["big_vision"], folder)
    before = (folder / "README.md").read_text()
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["depth"] += 1  # the spec no longer describes the weights
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match="inconsistent"):
        write_model_card(folder)
    assert (folder / "README.md").read_text() == before
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


def test_cli_card_writes_readme_and_reports_bad_folder(converted: dict[str, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    folder = tmp_path / "cli"
    shutil.copytree(converted["vit_jax"], folder)
    (folder / "README.md").unlink()
    result = CliRunner().invoke(app, ["card", str(folder)])
    assert result.exit_code == 0, result.output
    assert ModelCard.load(folder / "README.md").data.pipeline_tag == "image-classification"
    result = CliRunner().invoke(app, ["card", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["card", str(folder / "config.json")])  # was "does not exist or is not a ..."
    assert result.exit_code == 2 and "config.json' is a file; give the folder" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["card", str(folder), "--repo-id", "not a repo"])
    assert result.exit_code == 2 and "ORG/NAME" in " ".join(result.output.split())


# ------------------------------------------------------------------------- unusual folder names, unwritable disks
@pytest.mark.parametrize("name", ["Zürich ü (v2)", "it's \"q\" $HOME `x` \\n; rm -rf x [draft]"])
def test_usage_snippets_quote_the_folder_name(name: str, converted: dict[str, Path], tmp_path: Path) -> None:
    """The shell lines, run by bash with `hub-vit` printing its arguments, and the Python blocks, parsed by Python,
    get the folder name as one argument / string: `hub-vit serve path/to/Zürich ü (v2)` was a shell syntax error."""
    import ast
    import subprocess

    folder = tmp_path / name
    shutil.copytree(converted["vit_jax"], folder)
    text = str(render_model_card(folder))
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    got = {}
    for line in lines:
        proc = subprocess.run(["bash", "-c", f'hub-vit() {{ printf "%s\\0" "$@"; }}\n{line}'], capture_output=True,
                              timeout=30)
        assert proc.returncode == 0, (line, proc.stderr)
        args = proc.stdout.decode().split("\0")[:-1]
        got[args[0]] = args
    assert got == {"export": ["export", "onnx", f"path/to/{name}", "-o", f"{name}-onnx", "-v", "fp32"],
                   "serve": ["serve", f"path/to/{name}"]}
    strings = {node.value for block in re.findall(r"```python\n(.*?)```", text, re.S)
               for node in ast.walk(ast.parse(block)) if isinstance(node, ast.Constant)}
    assert {f"local-dir:path/to/{name}", f"path/to/{name}", f"{name}-onnx/model.onnx"} <= strings


def _card_dir_read_only(monkeypatch: pytest.MonkeyPatch) -> str:
    import tempfile

    real = tempfile.mkstemp

    def mkstemp(*args, prefix=None, **kwargs):
        if prefix is not None and prefix.startswith(".README.md."):  # atomic_path's temporary file
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, prefix=prefix, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return "Read-only file system"


def _card_disk_full(monkeypatch: pytest.MonkeyPatch) -> str:
    real = Path.write_text

    def write_text(self: Path, *args, **kwargs) -> int:
        if self.name.startswith(".README.md."):  # atomic_path's temporary file
            self.write_bytes(b"half a ca")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    return "No space left on device"


@pytest.mark.parametrize("break_disk", [_card_dir_read_only, _card_disk_full])
def test_cli_card_on_a_read_only_or_full_disk(break_disk, converted: dict[str, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # a traceback (EROFS arrived as a PermissionError, ENOSPC as a bare OSError); the old card must stay intact
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    folder = tmp_path / "m"
    shutil.copytree(converted["vit_jax"], folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    reason = break_disk(monkeypatch)
    result = CliRunner().invoke(app, ["card", str(folder)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.splitlines() == [f"error: cannot write to {str(folder / 'README.md')!r}: {reason}"]
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_cli_card_wrote_line_keeps_the_whole_path_on_one_line(converted: dict[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from hub_vit.cli.app import console

    _load_commands()
    monkeypatch.setattr(console, "width", 80)  # what a pipe gets
    folder = tmp_path / "a rather long folder name for a model" / "converted from a checkpoint ü [draft] (v2)"
    shutil.copytree(converted["vit_jax"], folder)
    result = CliRunner().invoke(app, ["card", str(folder)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"wrote {folder / 'README.md'}"]


# ----------------------------------------------------------------------------- what the card says it has, and where
def digits_copy(tmp_path: Path, name: str = "k1") -> Path:
    """A copy of the shipped default model (weights, labels, remote code, domain.json, its card)."""
    from hub_vit import catalog

    return Path(shutil.copytree(catalog.default_model_folder(), tmp_path / name))


def knows_section(card_text: str) -> str:
    part = re.split(r"^## What this model knows\s*$", card_text, flags=re.M)[1]
    return re.split(r"^## ", part, maxsplit=1, flags=re.M)[0]


def test_calibration_records_folder_names_not_local_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hub-vit calibrate-domain k1 --images data/digits/train --held-out data/digits/val --out-of-domain /abs/...`:
    domain.json (pushed with the folder) and the card held the paths as given; docs/model_cards.md: no local paths."""
    from hub_vit.domain_fit import calibrate_domain
    from hub_vit.train.digits import write_image_folder

    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path / "data" / "digits")
    folder = digits_copy(tmp_path)
    examples = REPO / "hub_vit" / "demo" / "examples"  # absolute, as the audit gave it
    calibrate_domain(folder, "data/digits/train", held_out="data/digits/val", out_of_domain=examples,
                     false_alarm_rate=0.05, max_images=128)
    record = (folder / "domain.json").read_text()
    measured = json.loads(record)["measured"]
    assert (measured["fit_source"], measured["held_out_source"], measured["out_of_domain_source"]) == (
        "train", "val", "examples")
    text = write_model_card(folder).read_text()
    assert "Fitted on `train`; threshold: split conformal on `val`; out-of-domain images: `examples`." in text
    for where in (record, text):
        assert "data/digits" not in where and str(REPO) not in where and str(tmp_path) not in where


def test_card_shows_only_the_last_part_of_a_path_an_older_record_holds(tmp_path: Path) -> None:
    """A domain.json written before the names were recorded (or `sources` given as paths) still renders no path."""
    folder = digits_copy(tmp_path)
    record = json.loads((folder / "domain.json").read_text())
    record["measured"] |= {"fit_source": "data/digits/train", "held_out_source": "/home/someone/data/val/ (every 4th "
                           "image, not fitted)", "out_of_domain_source": "photos from /home/someone/photos and more"}
    (folder / "domain.json").write_text(json.dumps(record))  # the statistics still apply: they are tied by sha256
    note = knows_section(str(render_model_card(folder)))
    assert ("Fitted on `train`; threshold: split conformal on `val` (every 4th image, not fitted); out-of-domain "
            "images: photos from photos and more.") in " ".join(note.split())
    assert "/home/someone" not in note and "data/digits" not in note


def test_shipped_records_name_no_local_path() -> None:
    """The shipped domain.json describes its images in words, and the committed card quotes them unchanged."""
    from hub_vit import catalog

    folder = catalog.default_model_folder()
    measured = json.loads((folder / "domain.json").read_text())["measured"]
    card = (folder / "README.md").read_text()
    for key in ("fit_source", "held_out_source", "out_of_domain_source"):
        assert "/" not in measured[key] and measured[key] in card, key


@pytest.mark.parametrize("uncalibrated", ["statistics deleted", "record for other weights", "no record"])
def test_uncalibrated_card_says_unknown_and_how_to_calibrate(uncalibrated: str, tmp_path: Path) -> None:
    """Was: an empty `| measured | value |` table (statistics not for these weights), or no section at all (no
    domain.json: a conversion, a run too small to calibrate), where docs/model_cards.md promises "unknown"."""
    folder = digits_copy(tmp_path)
    if uncalibrated == "statistics deleted":
        (folder / "domain.safetensors").unlink()
    elif uncalibrated == "record for other weights":
        record = json.loads((folder / "domain.json").read_text())
        (folder / "domain.json").write_text(json.dumps(record | {"weights_digest": "tensors-sha256:" + "0" * 64}))
    else:
        (folder / "domain.json").unlink()
        (folder / "domain.safetensors").unlink()
    text = str(render_model_card(folder))
    section = " ".join(knows_section(text).split())
    assert 'its answers say "unknown" to whether an image is of that kind' in section
    assert "`hub-vit calibrate-domain <this folder> --images DIR --held-out DIR`" in section
    assert "|" not in section  # no table, empty or not
    assert ("no `domain.json`" in section) == (uncalibrated == "no record")
    assert_every_number_accounted(text, folder)


def test_a_headless_model_without_a_record_has_no_knows_section(tmp_path: Path) -> None:
    from hub_vit.folder import save_model_folder

    spec = ViTSpec.from_variant("mu/16", img_size=32, num_classes=0, posemb="sincos2d", pool_type="gap")
    folder = save_model_folder(VisionTransformer(spec), tmp_path / "tower", labels=None)
    assert "## What this model knows" not in str(render_model_card(folder))  # no classes: nothing it answers with


@pytest.mark.parametrize("labels_file", ["deleted", "a directory"])
def test_card_names_where_the_labels_are(labels_file: str, tmp_path: Path) -> None:
    """Was "10 classes, in `labels.txt`" for a folder without one (the labels came from config.json)."""
    folder = digits_copy(tmp_path)
    (folder / "labels.txt").unlink()
    if labels_file == "a directory":
        (folder / "labels.txt").mkdir()
    text = str(render_model_card(folder))
    assert "in `labels.txt`" not in text
    assert ("10 classes, in `config.json` `label_names` (entry i = class i; this folder has no `labels.txt`): `0`, "
            "`1`,") in text


def test_card_without_remote_code_asks_for_no_trust_remote_code_and_its_snippet_runs(tmp_path: Path) -> None:
    """Was: the custom_code tag dropped, but every transformers snippet still said trust_remote_code=True, which
    needs the module the folder lacks. Its transformers snippet, run as written, classifies an image."""
    import subprocess
    import sys

    from PIL import Image

    folder = digits_copy(tmp_path)
    (folder / "modeling_hub_vit.py").unlink()
    text = str(render_model_card(folder))
    assert "custom_code" not in ModelCard(text).data.tags
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    hf_code = next(b for b in blocks if "AutoModelForImageClassification" in b)
    assert "trust_remote_code=True" not in hf_code and "import hub_vit" in hf_code
    assert "ships no remote code for `trust_remote_code=True`" in text  # the summary says the same
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(tmp_path / "image.jpg")
    (tmp_path / "snippet.py").write_text(hf_code.replace(f"path/to/{folder.name}", str(folder)) +
                                         "\nprint('SNIPPET OK', type(model).__name__)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SNIPPET OK HubViTForImageClassification" in proc.stdout


def test_cli_card_with_a_directory_named_readme(tmp_path: Path) -> None:
    """Was "output path ... is a directory; give a file name such as model.md", exit 1: card has no output option."""
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    folder = digits_copy(tmp_path, "r1")
    (folder / "README.md").unlink()
    (folder / "README.md").mkdir()
    result = CliRunner().invoke(app, ["card", str(folder)])
    message = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"README.md in {str(folder)!r} is a directory, where the model card belongs: remove or rename it" in message
    assert "model.md" not in message
    with pytest.raises(ModelFolderError, match="is a directory, where the model card belongs"):
        write_model_card(folder)
    assert (folder / "README.md").is_dir()
    result = CliRunner().invoke(app, ["card", str(folder), "--stdout"])  # nothing is written: no problem
    assert result.exit_code == 0 and result.output.startswith("---\n")


def test_rendering_a_card_without_metadata_logs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """huggingface_hub's "Repo card metadata block was not found" came out of a re-render (the old card is read for a
    license its publisher stated)."""
    import logging

    folder = digits_copy(tmp_path)
    (folder / "training.json").unlink()  # no license from the folder: the current card's is looked for
    (folder / "README.md").write_text("# a card without metadata\n")
    with caplog.at_level(logging.INFO):
        card = render_model_card(folder)
    assert "license: " not in str(card).split("\n---\n")[0]  # read, and stated none
    assert [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")] == []
    logging.getLogger("huggingface_hub.repocard").warning("still logged elsewhere")  # the level is put back
    assert [r.getMessage() for r in caplog.records][-1:] == ["still logged elsewhere"]


@pytest.mark.parametrize("top1", [7.5, "high", -0.1])
def test_a_held_out_accuracy_that_is_no_fraction_is_refused_not_published(tmp_path: Path, top1: object) -> None:
    # was: 7.5 published as "top-1 accuracy (%) | 750" (and model-index 750.0); "high" dropped the section unsaid
    folder = digits_copy(tmp_path)
    before = (folder / "README.md").read_text()
    training = json.loads((folder / "training.json").read_text())
    training["held_out"]["top1"] = top1
    (folder / "training.json").write_text(json.dumps(training))
    with pytest.raises(ModelFolderError, match=rf"training.json: held_out.top1 must be the top-1 accuracy as a "
                                               rf"fraction in \[0, 1\] .*got {re.escape(repr(top1))}"):
        write_model_card(folder)
    assert (folder / "README.md").read_text() == before


@pytest.mark.parametrize("repo_id", ["bad id", "hf-hub:org/x", "name-without-org"])
def test_an_invalid_repo_id_is_refused_not_rendered(tmp_path: Path, repo_id: str) -> None:
    # was rendered as given: `hf-hub:bad id`, `hf-hub:hf-hub:org/x` in every usage snippet
    folder = digits_copy(tmp_path)
    before = (folder / "README.md").read_text()
    with pytest.raises(ValueError, match=rf"invalid repo id {re.escape(repr(repo_id))}: expected ORG/NAME"):
        write_model_card(folder, repo_id=repo_id)
    assert (folder / "README.md").read_text() == before
    assert "hf-hub:org/x" in render_model_card(folder, repo_id="org/x").content


def test_a_missing_folder_named_like_a_hub_repo_says_how_to_get_a_local_copy(tmp_path: Path, monkeypatch) -> None:
    # was "model folder 'org/x' does not exist", where hf-hub:org/x got the `hf download` line
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    monkeypatch.chdir(tmp_path)
    _load_commands()
    for args in (["card", "org/x"], ["calibrate-domain", "org/x", "--images", str(tmp_path)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "model folder 'org/x' does not exist; for a model on the Hugging Face Hub, " \
            "make a local copy first: hf download org/x --local-dir DIR" in " ".join(result.output.split()), \
            result.output
    result = CliRunner().invoke(app, ["card", "missing"])
    assert result.exit_code == 2 and "hf download" not in result.output  # not shaped like ORG/NAME
