"""Render a hub-vit model folder's card (`README.md`) from its JSON with `huggingface_hub.ModelCard`.

    >>> from hub_vit.model_cards import write_model_card
    >>> write_model_card(Path("out/simplevit_s16"))   # -> out/simplevit_s16/README.md, written atomically

The YAML metadata is a `ModelCardData` (library, tags, license, datasets, pipeline tag, model-index); the body is the
Jinja template `hub_vit_card.md.j2` filled from `facts.read_folder` and `sections`. Nothing in the card is typed by
hand: numbers come from the folder's JSON, the catalog or a computation from the spec.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hub_vit.atomic import atomic_path
from hub_vit.catalog import BIG_VISION_LICENSE, PAPER_AUGREG, PAPER_SIMPLEVIT, VIT_JAX_LICENSE
from hub_vit.variants import ViTSpec

from . import provenance, sections
from .citations import TITLES, arxiv_url, bibtex_for, papers_for
from .facts import CARD, FolderFacts, ModelFolderError, read_folder
from .metrics import published_results

TEMPLATE = Path(__file__).with_name("hub_vit_card.md.j2")
MARKER = "hub-vit model card"  # first HTML comment of every generated card; `hub-vit push` re-renders only these
# The marker also says who put the metadata's `license:` there, so a re-render keeps only a person's: "hub-vit" (it
# stated one from the folder), "none" (it stated none; one found later was added by hand) or "publisher" (kept).
_LICENSE_SOURCE = re.compile(rf"<!-- {MARKER}:[^\n]*?license-source: (hub-vit|none|publisher)\b")
LAYOUT_LICENSES = {"big_vision": BIG_VISION_LICENSE, "vit_jax": VIT_JAX_LICENSE}
LICENSE_NAMES = {"apache-2.0": "Apache-2.0"}  # prose for the ids the catalog uses
PROJECT_LICENSE = "apache-2.0"  # pyproject.toml `license`; weights hub-vit trains itself are released under it
# where hub-vit cannot tell the weights' license; `stated_license` keeps what the publisher writes there
ADD_LICENSE = ("Before publishing, add `license: <id>` to this card's metadata; rendering the card again "
               "(`hub-vit card`, `hub-vit push`) keeps it.")
FAMILY_TITLES = {"simplevit": "SimpleViT", "vit": "ViT"}


def _version() -> str:
    from hub_vit.version import __version__

    return __version__


def model_name(facts: FolderFacts) -> str:
    """`simplevit_s16.i1k_300ep` for a published checkpoint, the registered name for bundled weights (the default
    model, `simplevit_digits`), else the folder's name."""
    if facts.match is not None:
        return facts.match.name
    if facts.bundled is not None:
        return facts.bundled.entry.name
    path = facts.path.resolve()
    return path.parent.name if path.name == "model" else path.name  # `hub-vit train` writes <run folder>/model


def license_of(facts: FolderFacts) -> tuple[str | None, str]:
    """(license id for the metadata, or None when nothing shows it; sentence for the card).

    A license is stated only where the folder shows where its weights came from: Google's published checkpoint (by
    content), or `hub-vit train`. A file in Google's layout is not thereby Google's, and a folder with no provenance
    file could hold anything: their metadata states no license rather than a guess the Hub would display as fact.
    """
    if facts.match is not None:
        lic = facts.match.weights.license
        return lic, (f"The original weights (`{facts.match.weights.gs_url}`) were released by Google under "
                     f"{_license_name(lic)}; this converted copy keeps that license.")
    if facts.withheld is not None:
        lic = facts.withheld.weights.license
        return lic, (f"Converted from Google's published checkpoint `{facts.withheld.weights.gs_url}`, released by "
                     f"Google under {_license_name(lic)}; weights derived from it since keep that license's terms.")
    layout = provenance.layout_family(facts)
    if facts.kind == "converted":
        origin = ""
        if layout in LAYOUT_LICENSES:
            repo = "big_vision" if layout == "big_vision" else "vision_transformer (vit_jax)"
            google = _license_name(LAYOUT_LICENSES[layout])
            origin = (f"It was converted from a checkpoint in the format of Google's {repo} repository; Google "
                      f"releases its published checkpoints under {google}, but nothing shows this file is one of "
                      "them. ")
        return None, f"{origin}The license of the converted file's origin applies; this card states none. {ADD_LICENSE}"
    if facts.kind == "trained":
        lic = str(facts.pretrained_cfg.get("license") or PROJECT_LICENSE)
        # Like a withheld conversion: the record's license still binds what was derived from its weights, but the
        # card must not say this file is what `hub-vit train` wrote when its digest says otherwise.
        trained = ("Weights trained with hub-vit and released" if facts.record_describes_weights else
                   "The weights `hub-vit train` wrote were released")
        changed = ("" if facts.record_describes_weights else " This file is no longer those weights (see "
                   "Provenance); weights derived from them keep that license's terms.")
        return lic, (f"{trained} under {_license_name(lic)}, hub-vit's license.{changed} The training data, and "
                     "weights a run was initialised from, keep their own licenses (see Provenance).")
    named = facts.pretrained_cfg.get("license")
    named_note = (f" `pretrained_cfg` in `config.json` names {_license_name(str(named))}, the license of the weights "
                  "it describes, but nothing shows this folder holds those weights." if named else "")
    return None, ("No provenance file (conversion.json / training.json) records where these weights came from, so "
                  f"this card states no license.{named_note} {ADD_LICENSE}")


def _license_name(lic: str) -> str:
    return LICENSE_NAMES.get(lic, f"`{lic}`")


def eval_results(facts: FolderFacts) -> list[EvalResult]:
    if facts.match is not None and facts.match.weights.results:
        return published_results(facts.match)
    measured = provenance.measured_accuracy(facts)
    return [measured.eval_result()] if measured is not None else []


def task_of(facts: FolderFacts) -> str:
    """The Hub's pipeline tag: a model without a head (num_classes 0, e.g. a SigLIP image tower) outputs features."""
    return "image-feature-extraction" if facts.spec.num_classes == 0 else "image-classification"


def task_text(spec: ViTSpec) -> str:
    if spec.num_classes == 0:
        return f"image feature extraction: {sections.fmt_number(spec.head_hidden_size)}-dim pooled features, no head"
    return f"image classification, {sections.fmt_number(spec.num_classes)} classes"


@contextlib.contextmanager
def _card_parser_quiet() -> Iterator[None]:
    """huggingface_hub logs "Repo card metadata block was not found" for a card without YAML; hub-vit reports that
    itself (push refuses the card, naming the fix; a re-render replaces it), so the library's line only got in first."""
    logger = logging.getLogger("huggingface_hub.repocard")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def parse_card(text: str) -> ModelCard:
    """`huggingface_hub.ModelCard(text)`, without the library's warning for a card that has no metadata."""
    with _card_parser_quiet():
        return ModelCard(text)


def stated_license(folder: Path) -> str | None:
    """The license a person wrote into the metadata of the folder's current card, if any: what a publisher states
    where hub-vit states none (`license_of`), kept when the card is rendered again (`hub-vit card`, `hub-vit push`).

    A license hub-vit wrote itself is not the publisher's word and is not kept: a generated card whose marker says
    `license-source: hub-vit`. Cards generated before the marker had that field state it in their prose instead:
    only one rendered without a license asks for one (`ADD_LICENSE`); the others got `apache-2.0` from hub-vit, also
    where nothing showed the weights' origin. A hand-written card's license is its author's.
    """
    path = folder / CARD
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
        lic = parse_card(text).data.to_dict().get("license")
    except Exception:  # an unreadable or hand-broken card states nothing usable; rendering replaces it
        return None
    if is_generated_card(text):
        source = _LICENSE_SOURCE.search(text)
        by_person = source.group(1) != "hub-vit" if source is not None else ADD_LICENSE in " ".join(text.split())
        if not by_person:
            return None
    return lic if isinstance(lic, str) and lic.strip() else None


class CardLicense(NamedTuple):
    id: str | None  # the metadata's `license:`; None states none
    note: str  # the License section's prose
    source: str  # who stated it, recorded in the marker: "hub-vit", "publisher" or "none"


def card_license(facts: FolderFacts) -> CardLicense:
    """`license_of`, or where it states none, the license a person gave the current card's metadata."""
    lic, note = license_of(facts)
    if lic is not None:
        return CardLicense(lic, note, "hub-vit")
    if (stated := stated_license(facts.path)) is not None:
        return CardLicense(stated, f"{_license_name(stated)}, as stated in this card's metadata by its publisher: "
                                   "hub-vit cannot tell from the folder where the weights came from.", "publisher")
    return CardLicense(None, note, "none")


def build_card_data(facts: FolderFacts) -> ModelCardData:
    family = facts.family
    tags = [task_of(facts), "vision-transformer", "timm", "transformers", "hub-vit", family]
    if facts.has_remote_code:
        tags.append("custom_code")
    datasets = provenance.datasets(facts)
    results = eval_results(facts)
    return ModelCardData(
        library_name="timm",  # config.json carries `architecture` + `pretrained_cfg`: timm's hf-hub layout
        pipeline_tag=task_of(facts),
        tags=tags,
        license=card_license(facts).id,
        datasets=datasets or None,
        metrics=["accuracy"] if results else None,
        model_name=model_name(facts) if results else None,
        eval_results=results or None,
    )


def card_context(facts: FolderFacts, repo_id: str | None = None) -> dict[str, Any]:
    spec, name = facts.spec, model_name(facts)
    family = FAMILY_TITLES[facts.family]
    variant = spec.variant or "custom size"
    folder_name = facts.path.resolve().name
    source = facts.match or facts.withheld  # a withheld conversion still came from that paper's checkpoint
    augreg = source is not None and source.weights.paper == PAPER_AUGREG
    papers = papers_for(simplevit=facts.family == "simplevit", augreg=augreg)
    measured = provenance.measured_accuracy(facts)
    lic = card_license(facts)
    return dict(
        marker=f"{MARKER}: generated by hub-vit {_version()} from this folder's JSON; "
               f"regenerate with `hub-vit card <this folder>`; license-source: {lic.source}",
        title=name,
        summary=provenance.summary(facts, family),
        overview=[("architecture", f"`{facts.architecture}` ({family}-{variant})" if spec.variant
                   else f"`{facts.architecture}` ({family}, {variant})"),
                  ("task", task_text(spec)),
                  ("parameters", sections.fmt_number(facts.num_params)),
                  ("GMACs", sections.fmt_gmacs(facts.macs)),
                  ("input", f"{spec.img_size[0]} x {spec.img_size[1]} RGB")],
        spec=spec,
        headless=spec.num_classes == 0,
        head_hidden_size=spec.head_hidden_size,
        num_tokens=spec.num_patches + spec.num_prefix_tokens,
        architecture_note=provenance.architecture_note(spec, family),
        architecture=sections.architecture_rows(spec),
        compute=sections.compute_rows(facts),
        preprocessing_note=("The eval transform, from `pretrained_cfg` in `config.json`; timm "
                            "(`resolve_model_data_config`) and the transformers image processor "
                            "(`preprocessor_config.json`) apply the same steps."),
        preprocessing=sections.preprocessing_rows(facts),
        published=_published(facts),
        evaluation=None if measured is None else {"note": measured.note, "rows": measured.rows},
        domain=sections.domain_section(facts.path, facts.labels),
        parity=provenance.parity(facts),
        provenance=provenance.rows(facts, _version()),
        training_recipe=provenance.recipe_rows(facts),
        repo_id=repo_id,
        # the transformers snippets ask for trust_remote_code only where the code it runs ships in the folder
        remote_code=facts.has_remote_code,
        trust_remote_code=", trust_remote_code=True" if facts.has_remote_code else "",
        **snippet_refs(folder_name, repo_id, facts.bundled.entry.name if facts.bundled is not None else None),
        triton_client=provenance.triton_client(),
        labels=facts.labels,
        labels_note=sections.labels_note(facts.labels, facts.labels_file) if facts.labels else "",
        license_note=lic.note,
        bibtex=bibtex_for(papers),
    )


def py_str(text: str) -> str:
    """`text` as a Python string literal, in the double quotes the snippets use: a folder named `a "b"`, `it's` or
    holding a backslash still pastes as valid Python (repr escapes what needs escaping)."""
    literal = repr(text)
    if literal.startswith("'") and "'" not in text and '"' not in text:  # repr chose '...' only by default
        return f'"{literal[1:-1]}"'
    return literal


def snippet_refs(folder_name: str, repo_id: str | None, timm_name: str | None) -> dict[str, str | None]:
    """The folder (or Hub repo) as the usage snippets write it: shell words quoted with `shlex.quote` (a folder
    named `Zürich ü (v2)` is one argument, not a syntax error) and Python strings as literals (`py_str`).

    Never an absolute path: the card is committed and published, and must read the same on every machine.
    """
    local = f"path/to/{folder_name}"
    onnx_dir = f"{folder_name}-onnx"
    return dict(
        cli_ref=shlex.quote(f"hf-hub:{repo_id}" if repo_id else local),  # every hub-vit command takes the Hub name
        cli_onnx_dir=shlex.quote(onnx_dir),
        py_hf_hub=py_str(f"hf-hub:{repo_id}") if repo_id else None,
        py_local_dir=py_str(f"local-dir:{local}"),
        py_hf_ref=py_str(repo_id or local),
        py_timm_name=py_str(timm_name) if timm_name else None,
        py_onnx_file=py_str(f"{onnx_dir}/model.onnx"),
        timm_name=timm_name,
    )


def _published(facts: FolderFacts) -> dict[str, Any] | None:
    table = sections.published_table(facts)
    if table is None:
        return None
    assert facts.match is not None  # published_table returns None without a catalog match
    paper = facts.match.weights.paper
    table["note"] = (f"Top-1 accuracy (%) published in \"{TITLES[paper]}\" ([{paper}]({arxiv_url(paper)})) for "
                     f"Google's `{facts.match.entry.name}` checkpoints, as recorded in `hub_vit.catalog`. These are "
                     "the weights this folder was converted from; the model-index metadata carries this model's row. "
                     f"{_eval_pipeline_note(paper, str(facts.pretrained_cfg.get('interpolation', 'bilinear')))}")
    return table


def _eval_pipeline_note(paper: str, interpolation: str) -> str:
    """The published numbers come from Google's TensorFlow eval pipeline, not from the Pillow transform above."""
    how = ("big_vision's TensorFlow pipeline, which resizes with area resampling (`resize_small`)"
           if paper == PAPER_SIMPLEVIT else "Google's TensorFlow input pipeline")
    return (f"The paper evaluated with {how}; the {interpolation} resize above differs slightly, so accuracy measured "
            "with it can differ a little from these numbers.")


def render_template(card_data: ModelCardData, context: dict[str, Any]) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False)
    template = env.from_string(TEMPLATE.read_text(encoding="utf-8"))
    text = template.render(card_data=card_data.to_yaml(), **context)
    while "\n\n\n" in text:  # optional sections leave blank runs behind
        text = text.replace("\n\n\n", "\n\n")
    return text


def render_model_card(folder: str | Path, repo_id: str | None = None) -> ModelCard:
    """The card for `folder` (not written). `repo_id` (ORG/NAME) turns the usage snippets into `hf-hub:` / Hub
    references; an invalid one is a ValueError (was rendered as given: `hf-hub:bad id`, `hf-hub:hf-hub:org/x`)."""
    if repo_id is not None:
        from hub_vit.repo_id import check_repo_id

        check_repo_id(repo_id)
    facts = read_folder(folder)
    card_data = build_card_data(facts)
    return ModelCard(render_template(card_data, card_context(facts, repo_id)))


def write_text_atomic(path: Path, text: str) -> Path:
    """Write via a temp file in the same folder and rename, so a reader never sees half a file."""
    with atomic_path(path, suffix=".md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def card_path(folder: Path) -> Path:
    """`folder/README.md`, where the card goes; `ModelFolderError` when a directory holds that name (the atomic
    writer's own message, "give a file name such as model.md", fits its callers with an output option, not a card:
    its name is fixed)."""
    path = folder / CARD
    if path.is_dir():
        raise ModelFolderError(f"{CARD} in {str(folder)!r} is a directory, where the model card belongs: remove or "
                               "rename it")
    return path


def write_model_card(folder: str | Path, repo_id: str | None = None) -> Path:
    """Render `folder`'s card and write it to `folder/README.md` atomically; returns the path."""
    folder = Path(folder)
    path = card_path(folder)  # before the render: nothing to do when the card cannot be written
    card = render_model_card(folder, repo_id)
    return write_text_atomic(path, str(card))


def write_card_or_remove(folder: str | Path) -> Path:
    """Write the card of a folder that was just created; if that fails, remove the folder and re-raise.

    `hub-vit convert` and `hub-vit train` call this right after `save_model_folder`, so their output is either a
    complete folder with its card or nothing at all.
    """
    folder = Path(folder)
    try:
        return write_model_card(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def is_generated_card(text: str) -> bool:
    return f"<!-- {MARKER}" in text
