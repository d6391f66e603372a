"""The Gradio demo: upload or pick an image, see the top-5 labels and where the model looked.

One handler (`Demo.analyze`) serves every control, so the page always shows one consistent state; models are loaded
once (`ModelCache`) and the rollout itself costs about one forward pass. Hardening (see docs/explain.md):
a readable message for any bad upload (a toast and the status line, the previous results cleared), the
server's pixel limit, a bounded queue, a file-size limit,
127.0.0.1 by default, only this package's example folders in `allowed_paths`, and uploads deleted after an hour.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.component_meta import ComponentMeta
from gradio.data_classes import ImageData
from PIL import Image

from hub_vit.class_names import numbered_labels
from hub_vit.demo.backends import IN_PROCESS, TritonLabels
from hub_vit.demo.models import ModelCache, ModelChoice, ModelLoadError, in_process_verdicts, model_domain
from hub_vit.domain import DOMAIN_FILE, EXAMPLE_KINDS, Domain
from hub_vit.explain.image import ImageReadError, load_image
from hub_vit.explain.rollout import HEAD_FUSIONS
from hub_vit.image_formats import NAMES, SUFFIXES
from hub_vit.resize_bound import MAX_RESIZED_PIXELS
from hub_vit.server.protocol import DOMAIN_SENTENCES, OUT_OF_DOMAIN, UNKNOWN_DOMAIN

log = logging.getLogger(__name__)

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
DIGIT_SAMPLES_DIR = Path(__file__).resolve().parents[1] / "assets" / "digits" / "samples"
EXAMPLE_SUFFIXES = SUFFIXES
MAX_FILE_SIZE = "10mb"
MAX_FILE_SIZE_SHOWN = "10 MB"  # MAX_FILE_SIZE in the status line's words
MAX_SIDE = 1024  # pictures shown in the page have a long side of at most MAX_SIDE ...
MIN_SIDE = 384  # ... and of at least MIN_SIDE pixels (a 128 px digit sample is shown 3x, pixels kept sharp)
# The discard-ratio slider: the rollout takes [0, 1) (`hub-vit rollout --discard-ratio`, the server's requests); in
# steps of 0.01 the slider's last value below 1 is 0.99
DISCARD_MAX, DISCARD_STEP = 0.99, 0.01
# Most pixels an upload may declare: `hub-vit serve`'s default --max-pixels (the same bound as the resize before the
# crop), checked on the header. Pillow's own 89 MP warning let an 88 MP PNG of 277 kB cost 1 GB per request.
MAX_PIXELS = MAX_RESIZED_PIXELS
# Gradio's upload and output cache (the users' photos, the overlays): every 10 minutes, files older than an hour are
# deleted, and all of them when the demo stops (Ctrl-C, SIGTERM, `hub-vit serve` exiting).
DELETE_CACHE = (600, 3600)
INTRO = """# hub-vit: where does the Vision Transformer look?
Upload an image (or pick an example) to see the model's top-5 labels and its **attention rollout** (Abnar & Zuidema
2020): attention multiplied through the blocks, read out the way the classifier reads the tokens (class token, or the
mean of all tokens for SimpleViT's global average pooling). The **class-specific map** weights each attention by its
gradient for the chosen label (Chefer et al. 2021). Only the model's centre crop is coloured; the rest is dimmed."""


def example_images() -> list[Path]:
    """The default model's digit samples (if shipped) followed by the bundled photos."""
    return [path for kind in EXAMPLE_KINDS for path in examples_of(kind)]


def examples_of(kind: str) -> list[Path]:
    """The bundled examples of one domain (`hub_vit.domain.EXAMPLE_KINDS`): 'digits' or 'photos'."""
    folder = {"digits": DIGIT_SAMPLES_DIR, "photos": EXAMPLES_DIR}[kind]
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in EXAMPLE_SUFFIXES) if folder.is_dir() else []


NO_EXAMPLES = "none"  # `Domain.examples` of a model no bundled example fits: every gallery is hidden


def domain_note(domain: Domain) -> str:
    """The line under the model picker: what the model can recognise, and how an image of another kind is told."""
    text = f"This model knows {domain.knows}."
    if domain.examples == NO_EXAMPLES:
        text += " Its classes are numbered, not named, so no example images are offered: upload one of your own."
    if domain.statistics is None:
        return text + " No out-of-domain score is calibrated for it: whether an image is of that kind is unknown."
    return text + (f" An image whose out-of-domain score is above {domain.statistics.threshold:.3g} is marked as not "
                   "the kind of image this model knows (its features measured against those of the images it knows; "
                   "see the model card).")


def domain_mark(domain: Domain, verdict: str, score: float | None) -> tuple[str | None, str]:
    """(the bold mark said before anything else, or None; the words added to the status line) for a verdict
    (`hub_vit.server.protocol`: in-domain, out-of-domain, unknown) and its score."""
    shown = "" if score is None else f" {score:.3g}"
    if verdict == OUT_OF_DOMAIN:
        sentence = DOMAIN_SENTENCES[OUT_OF_DOMAIN]
        return (f"{sentence[:1].upper()}{sentence[1:]}: its out-of-domain score{shown} is above the threshold; this "
                f"model knows only {domain.knows}, so the labels are guesses"), f"out of domain (score{shown})"
    if verdict == UNKNOWN_DOMAIN:
        return None, "domain unknown (no out-of-domain score calibrated)"
    return None, f"in domain (score{shown})"


def example_label(path: Path) -> str:
    """What a screen reader says for an example thumbnail: `digit 3 (held-out sample 3_0.png)`, `photo: chelsea`."""
    if path.parent == DIGIT_SAMPLES_DIR:
        return f"digit {path.stem.split('_')[0]} (held-out sample {path.name})"
    return f"photo: {path.stem}"


def refusal(message: str) -> gr.Error:
    """A `gr.Error` for an expected user error (a bad upload, an out-of-range value): one log line, no traceback."""
    log.warning("refused: %s", message)
    return gr.Error(message, print_exception=False)


class _NoStubComponentMeta(ComponentMeta):
    """Gradio's component metaclass without its side effect: for every component subclass it writes a `.pyi` stub
    next to the subclass's module (here app.pyi, which type checkers would read instead of app.py). Its other work
    applies to a subclass that defines `__init__` or `EVENTS`, which those built with this one may not."""

    def __new__(mcs, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> ComponentMeta:
        if "__init__" in attrs or "EVENTS" in attrs:
            raise TypeError(f"{name} defines __init__ or EVENTS: Gradio's ComponentMeta must build it")
        return abc.ABCMeta.__new__(mcs, name, bases, attrs)


class UploadImage(gr.Image, metaclass=_NoStubComponentMeta):
    """The upload box: a `gr.Image` that hands the uploaded file's path to the analysis without decoding it.

    Gradio's own preprocessing opens the upload with every Pillow plugin before our handler runs, and a file that is
    no image failed there: a bare red "Error" on every output, the previous image's results left standing. The
    analysis reads the file with hub-vit's reader instead (`load_image`: JPEG, PNG, WebP only), and refuses it as it
    refuses a GIF, in the status line too (`Demo._refused`). A method, not a patch of one instance: Gradio replaces a
    component by a new instance of its class per session once an update (a picked example) has set it.
    """

    is_template = True  # drawn in the page as Gradio's own image component (`Block.get_block_name`)

    def preprocess(self, payload: ImageData | None) -> Any:
        if payload is not None and self._decoded_by_the_analysis(payload):
            return payload.path
        try:
            return super().preprocess(payload)
        except gr.Error as exc:
            raise refusal(exc.message) from exc
        except Exception as exc:  # an API caller's inline (data: URL) image that Pillow cannot read
            name = getattr(payload, "orig_name", None) or "the upload"
            if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):  # it is an image
                raise refusal(f"{name!r} is too large to decode safely ({exc})") from exc
            raise refusal(f"{name!r} is not an image this demo can read ({type(exc).__name__}); "
                          f"upload {NAMES}") from exc

    def _decoded_by_the_analysis(self, payload: ImageData) -> bool:
        """Whether Gradio would only check the file and pass its path on (a file upload, no mode to convert to)."""
        inline = (payload.url or "").startswith("data:")
        return self.type == "filepath" and self.image_mode is None and payload.path is not None and not inline


class TypedSlider(gr.Slider, metaclass=_NoStubComponentMeta):
    """A slider that hands the analysis whatever its number box holds: a typed value outside the slider's range as it
    is, an emptied box as None. The analysis brings it into range and shows the value it used (`in_range`,
    `Demo.analyze_latest`). Gradio's own preprocessing raised for it before our handler ran: a red "Error" badge over
    every output and the controls blocked until the next action, a traceback in the log, and the box kept showing the
    typed value beside the previous value's results."""

    is_template = True  # drawn in the page as Gradio's own slider (`Block.get_block_name`)

    def preprocess(self, payload: float | None) -> float | None:
        return payload


def in_range(value: Any, lowest: float, highest: float, what: str) -> float:
    """`value` (a slider's, as `TypedSlider` hands it on) as a number in [lowest, highest]: the nearest end of the
    range for one outside it, with a toast saying so; a refusal for what is not a number (an API caller's)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise refusal(f"{what} must be a number from {lowest:g} to {highest:g}, got {value!r}")
    used = min(max(number, lowest), highest)
    if used != number:
        gr.Warning(f"{what[:1].upper()}{what[1:]} {number:g} is outside {lowest:g} to {highest:g}: {used:g} is used.")
    return used


# Accessible names Gradio cannot set itself: an example thumbnail is an image-only button whose <img> has alt=""
# (example_labels would replace the thumbnails with text), and the result images have alt="" too; the status line is
# a live region (role=status), so a screen reader says the outcome of an analysis, or why there is none. Runs on page
# load and again whenever an image appears or changes.
RESULT_ALT = {"overlay": "attention rollout over the image (all blocks)",
              "layer-view": "attention rollout through the chosen block",
              "class-map": "class-specific rollout for the chosen label"}
_A11Y_JS = """() => {
  const examples = EXAMPLES, results = RESULTS;
  const name = () => {
    for (const img of document.querySelectorAll("[id^=examples-] img")) {
      const text = examples[decodeURIComponent((img.getAttribute("src") || "").split("/").pop())];
      if (text && img.alt !== text) {
        img.alt = text;
        img.closest("button")?.setAttribute("aria-label", "Example: " + text);
      }
    }
    for (const [id, text] of Object.entries(results)) {
      for (const img of document.querySelectorAll(`#${id} img`)) if (img.alt !== text) img.alt = text;
    }
    const status = document.querySelector("#status");  // what a screen reader says when an analysis ends
    if (status && status.getAttribute("role") !== "status") {
      status.setAttribute("role", "status");
      status.setAttribute("aria-live", "polite");
    }
  };
  new MutationObserver(name).observe(document.body, {childList: true, subtree: true, attributeFilter: ["src"]});
  name();
}"""


def a11y_js(examples: Sequence[Path]) -> str:
    """`_A11Y_JS` with the example names (by file name) and the result images' alt texts filled in."""
    names = {p.name: example_label(p) for p in examples}
    return _A11Y_JS.replace("EXAMPLES", json.dumps(names)).replace("RESULTS", json.dumps(RESULT_ALT))


@dataclass
class Demo:
    """State shared by the handlers: the model cache, the optional Triton backend and the model shown first."""

    cache: ModelCache
    triton: TritonLabels | None = None
    examples: list[Path] = field(default_factory=example_images)
    selected: str | None = None  # the model the page opens with (`hub-vit serve X --demo`: X); default: the first
    _domains: dict[str, Domain] = field(default_factory=dict)

    def domain(self, model_key: str) -> Domain:
        """What the model knows (its folder's domain.json, else guessed from its labels); loads the model.
        ModelLoadError when the model or its domain.json cannot be read."""
        if model_key not in self._domains:
            explainer = self.cache.get(model_key)
            domain = model_domain(explainer)
            folder = explainer.info.get("path")
            # `guess_domain` calls every head without a domain.json a photo model; but a cat photo and its "class_3"
            # mean nothing for a head whose classes nobody named, so it is offered no examples (a domain.json that
            # says otherwise is followed)
            if numbered_labels(explainer.labels) and not (folder and (Path(folder) / DOMAIN_FILE).is_file()):
                domain = dataclasses.replace(domain, examples=NO_EXAMPLES)
            self._domains[model_key] = domain
        return self._domains[model_key]

    def domain_view(self, model_key: str) -> tuple[Any, ...]:
        """The domain line and which example gallery shows, for the picked model (every gallery of another domain
        is hidden: a digits model is offered no photos)."""
        try:
            domain = self.domain(model_key)
        except (ModelLoadError, ValueError):  # `analyze` says why the model cannot be shown
            return (gr.update(value=""), *(gr.update(visible=False) for _ in EXAMPLE_KINDS))
        return (gr.update(value=domain_note(domain)),
                *(gr.update(visible=kind == domain.examples) for kind in EXAMPLE_KINDS))

    def backends(self) -> list[str]:
        return [IN_PROCESS] + ([self.triton.choice] if self.triton else [])

    def analyze(self, image_path: str | None, model_key: str, backend: str, head_fusion: str, discard_ratio: float,
                layer: float | None, target: str | None) -> tuple[Any, ...]:
        """Everything on the right-hand side of the page, from the current controls.

        `layer` None: the model's last block; `target` None (or not one of the model's labels): the top-1 label."""
        if not image_path:
            slider = gr.update()
            if layer is None:  # a model picked with no image yet: its slider already, and a load failure said now
                try:
                    slider = self._slider(self.cache.get(model_key).depth)
                    self.domain(model_key)  # a damaged domain.json is said now too
                except ModelLoadError as exc:
                    return self._failed(exc)
                except ValueError as exc:
                    raise refusal(str(exc)) from exc
            return Demo._nothing_shown("Upload an image or pick an example.", slider)
        try:
            explainer = self.cache.get(model_key)
            domain = self.domain(model_key)  # its damaged domain.json is a model that cannot be shown, as its weights
        except ModelLoadError as exc:
            return self._failed(exc)
        except ValueError as exc:  # not one of the listed models
            raise refusal(str(exc)) from exc
        if head_fusion not in HEAD_FUSIONS:
            raise refusal(f"unknown head fusion {head_fusion!r}; valid choices: {', '.join(HEAD_FUSIONS)}")
        if not 0 <= float(discard_ratio) < 1:
            raise refusal(f"discard ratio must be in [0, 1), got {discard_ratio}")
        # a block outside the model's (typed into the box, or the 2 of a 1-block model's 1..2 slider): the nearest
        depth = explainer.depth
        layer_index = depth if layer is None else int(in_range(layer, 1, depth, "block"))
        name = Path(image_path).name
        try:
            image = load_image(image_path, name=name, max_pixels=MAX_PIXELS)
        except ImageReadError as exc:
            return self._refused(str(exc))
        start = time.perf_counter()
        try:
            prepared = explainer.prepare(image)
        except ImageReadError as exc:  # an aspect ratio too extreme to resize
            return self._refused(f"{name!r}: {exc}")
        result = explainer.rollout(prepared, head_fusion, float(discard_ratio))
        top = explainer.top_k(result.logits[0], 5)
        status = f"**{explainer.name}** in-process"
        verdict, domain_score = in_process_verdicts(explainer, [image], domain)[0]
        full_map, on = result.maps[0], prepared  # the full rollout and the image + crop box it is drawn on
        server_s = 0.0
        if backend != IN_PROCESS:
            if self.triton is None:
                raise refusal(f"unknown backend {backend!r}; valid choices: {', '.join(self.backends())}")
            asked = time.perf_counter()
            answer, status = self.triton.explain(image, 5, source=image_path, labels=explainer.labels,
                                                 head_fusion=head_fusion, discard_ratio=float(discard_ratio))
            server_s = time.perf_counter() - asked
            if answer is not None:
                top, verdict, domain_score = answer.top, answer.domain, answer.domain_score
                if answer.rollout is not None:  # the server's own map, on the crop box the server reports
                    full_map, on = answer.rollout, dataclasses.replace(prepared, box=answer.box)
                    status += "; the rollout map from the server too, per-block view and class map in-process"
                else:
                    status += "; maps from the in-process model"
            mismatch = self.triton.mismatch(model_key)
            if mismatch is None and answer is not None and not answer.page_labels:  # `demo --triton-url`: unknown
                mismatch = (f"the server's labels are not those of the in-process model {model_key!r}: it serves "
                            "another model, so its labels and the in-process maps are of different models")
            if mismatch and answer is not None:
                status += f" · **note**: {mismatch}"
        display = dict(max_side=MAX_SIDE, min_side=MIN_SIDE)
        overlay = explainer.overlay(on, full_map, **display)
        layer_view = explainer.overlay(prepared, result.layer_maps[0, layer_index - 1], **display)
        target = target if target in explainer.labels else explainer.labels[int(result.logits[0].argmax())]
        cam = explainer.class_map(prepared, explainer.label_index(target)).maps[0]
        class_map = explainer.overlay(prepared, cam, **display)
        # the in-process work apart from the server's round trip (request, queue, its model, answer), each timed
        status += f" · rollout + class map {time.perf_counter() - start - server_s:.2f} s"
        if backend != IN_PROCESS:
            status += f" · server's answer {server_s:.2f} s"
        status += f" · crop {explainer.data.img_size}"
        mark, words = domain_mark(domain, verdict, domain_score)
        status += f" · {words}"
        if mark is not None:  # not presented as a result: said first
            status = f"**{mark}.** {status}"
        return (
            dict(top),  # labels are distinct per model (`distinct_labels`): five entries, five probabilities
            overlay,
            layer_view,
            gr.update(choices=explainer.labels, value=target),
            class_map,
            status,
            self._slider(depth, layer_index),
        )

    def analyze_new_image(self, image_path: str | None, model_key: str, backend: str, head_fusion: str,
                          discard_ratio: float, layer: float | None, target: str | None) -> tuple[Any, ...]:
        """A new image (or none): the class map follows its top-1; a label picked for the previous image is not
        carried over (it would show a "class-specific" map for a class the model did not predict)."""
        return self.analyze(image_path, model_key, backend, head_fusion, discard_ratio, layer, None)

    def analyze_new_model(self, image_path: str | None, model_key: str, backend: str, head_fusion: str,
                          discard_ratio: float, layer: float | None, target: str | None) -> tuple[Any, ...]:
        """Another model: its top-1 label and its full rollout (its own depth), not the previous model's choices."""
        return self.analyze(image_path, model_key, backend, head_fusion, discard_ratio, None, None)

    def analyze_latest(self, image_path: str | None, model_key: str, backend: str, head_fusion: str,
                       discard_ratio: float | None, layer: float | None, target: str | None,
                       shown: tuple[str | None, str] | None, action: float | None = None,
                       emptied_at: float | None = None) -> tuple[Any, ...]:
        """The page's one analysis listener: what changed since the page's last analysis (`shown`: its image and
        model, a `gr.State`) says how: another model as `analyze_new_model`, another image as `analyze_new_image`,
        else the controls as they are. Returns the outputs and the new `shown`.

        `action`: the number of the page's action this run answers; `emptied_at`: that of the last time the page
        emptied the image box itself (EMPTIED_JS: an upload it refused to send), so equal numbers mean that is what
        this run answers. The image box's update comes second: an upload the analysis refuses is taken out of it;
        the discard-ratio slider's third.

        The sliders' values are their number boxes' (`TypedSlider`): one typed outside the range is used at the
        nearest end and written back into the box, so the box shows the value of the results; an emptied box (None)
        counts as the slider's minimum, which the page puts in the box when it loses focus (asking for no run), and is
        not written back while the user types there."""
        typed_discard = discard_ratio
        discard_ratio = 0.0 if typed_discard is None else in_range(typed_discard, 0.0, DISCARD_MAX, "discard ratio")
        discard = gr.update() if typed_discard is None or discard_ratio == typed_discard else \
            gr.update(value=discard_ratio)
        emptied_layer, layer = layer is None, 1 if layer is None else layer
        if image_path is None and action is not None and emptied_at == action:
            if shown is not None and shown[0] == EMPTIED:  # this page's last run emptied the box: the refusal stands
                # Its status line is kept; the results it cleared are given as cleared (None), never `gr.update()`:
                # Gradio answers an update of a component with a copy of it for the session, which draws that
                # session's later results (the next photo's overlays) into a file set of its own, outside
                # `blocks.temp_file_sets`, all its cache cleanup deletes (on schedule and when the demo stops).
                labels, overlay, layer_view, _, class_map, _, _ = self._nothing_shown("")
                return (labels, gr.update(), discard, overlay, layer_view, gr.update(), class_map, gr.update(),
                        gr.update(), (None, model_key))
            labels, *rest = self._not_uploaded()
            return (labels, gr.update(), discard, *rest, (None, model_key))
        if shown is None or model_key != shown[1]:
            handler = self.analyze_new_model
        elif image_path != shown[0]:
            handler = self.analyze_new_image
        else:
            handler = self.analyze
        outputs = handler(image_path, model_key, backend, head_fusion, discard_ratio, layer, target)
        labels, *rest = outputs
        if emptied_layer and handler != self.analyze_new_model:  # another model's slider shows its last block
            rest[-1] = {key: value for key, value in rest[-1].items() if key != "value"}
        if isinstance(outputs, _Refusal):
            # Emptied, not left in the box: a file the browser cannot draw either (text named .png) showed its
            # broken-image icon there. Emptying fires the box's `change` as an over-limit file's does (EMPTIED_JS);
            # EMPTIED in `shown` tells that run it is this one's doing.
            return (labels, gr.update(value=None), discard, *rest, (EMPTIED, model_key))
        return (labels, gr.update(), discard, *rest, (image_path, model_key))

    @staticmethod
    def _slider(depth: int, value: int | None = None) -> Any:
        # Gradio needs minimum < maximum; a 1-block model gets a 1..2 slider clamped to block 1 in `analyze`.
        return gr.update(maximum=max(depth, 2), value=depth if value is None else value,
                         label=f"Block (per-layer view, 1..{depth})")

    @staticmethod
    def _nothing_shown(status: str, slider: Any = None) -> tuple[Any, ...]:
        """`analyze`'s outputs with no result: no labels, maps or label choices, `status` in the status line, and the
        block slider as `slider` updates it (None: as it is)."""
        return None, None, None, gr.update(choices=[], value=None), None, status, \
            gr.update() if slider is None else slider

    @staticmethod
    def _refused(message: str) -> tuple[Any, ...]:
        """An upload the page cannot analyse (a format it does not read, damaged, too large): a toast and the status
        line say why, and the previous image's results are cleared. (A raised `gr.Error` put a red "Error" badge
        over every output, left the previous image's status under them and blocked the controls until the next good
        upload, and the reason went with the toast.) `analyze_latest` empties the image box too."""
        log.warning("refused: %s", message)
        gr.Warning(message)
        return _Refusal(Demo._nothing_shown(f"**Not analysed:** {message}"))

    @staticmethod
    def _not_uploaded() -> tuple[Any, ...]:
        """The page emptied the image box on its own: Gradio's page refuses to send a file over MAX_FILE_SIZE (its
        toast names the file and the limit), leaving the previous image's results under an empty box. They are
        cleared and the status line says why, as for any refused upload; no second toast."""
        message = f"the file was not uploaded (the page takes files up to {MAX_FILE_SIZE_SHOWN})"
        log.warning("refused: %s", message)  # the server never sees the file: its name is in the page's toast only
        return Demo._nothing_shown(f"**Not analysed:** {message}.")

    @staticmethod
    def _failed(exc: ModelLoadError) -> tuple[Any, ...]:
        """A model that cannot be shown: a toast and the status line say why, and the previous model's results are
        cleared rather than left looking current."""
        message = str(exc)
        log.warning("refused: %s", message)  # one line, as for a refused upload: the reason, no traceback
        gr.Warning(message)
        return Demo._nothing_shown(f"**{message[:1].upper()}{message[1:]}**")

    def build(self) -> gr.Blocks:
        keys = self.cache.keys
        if not keys:
            raise ValueError("no model to show: ship the default model, pass --model-folder, or cache a checkpoint")
        first = self.selected if self.selected in keys else keys[0]
        depth = self.cache.get(first).depth  # the first model loads now (it would on the first request anyway)
        with gr.Blocks(title="hub-vit attention rollout", delete_cache=DELETE_CACHE,
                       analytics_enabled=gradio_analytics_opted_in()) as blocks:
            gr.Markdown(INTRO)
            with gr.Row():
                with gr.Column(scale=1):
                    image = UploadImage(type="filepath", label="Image", sources=["upload"], elem_id="input-image",
                                        image_mode=None, height=320)
                    model = gr.Dropdown(keys, value=first, label="Model", elem_id="model")
                    shown = self.domain(first)
                    knows = gr.Markdown(domain_note(shown), elem_id="domain")
                    backend = gr.Radio(self.backends(), value=IN_PROCESS, label="Labels from", elem_id="backend")
                    fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion", elem_id="head-fusion")
                    discard = TypedSlider(0.0, DISCARD_MAX, value=0.0, step=DISCARD_STEP, elem_id="discard-ratio",
                                          label="Discard ratio (lowest attentions)")
                with gr.Column(scale=2):
                    status = gr.Markdown("Upload an image or pick an example.", elem_id="status")
                    labels = gr.Label(num_top_classes=5, label="Top-5", elem_id="labels")
                    with gr.Row():
                        overlay = gr.Image(label="Attention rollout (all blocks)", elem_id="overlay",
                                           interactive=False, format="png", height=300, buttons=RESULT_BUTTONS)
                        layer_view = gr.Image(label="Rollout through the chosen block", elem_id="layer-view",
                                              interactive=False, format="png", height=300, buttons=RESULT_BUTTONS)
                        class_map = gr.Image(label="Class-specific (gradient-weighted) rollout", elem_id="class-map",
                                             interactive=False, format="png", height=300, buttons=RESULT_BUTTONS)
                    with gr.Row():
                        layer = TypedSlider(1, max(depth, 2), value=depth, step=1, elem_id="layer",
                                            label=f"Block (per-layer view, 1..{depth})")
                        target = gr.Dropdown([], label="Class-specific map for label", elem_id="target")
                    # The examples under the results, not under the controls: where the columns stack (a phone), the
                    # status line came after the whole gallery, out of sight of the image box and the controls
                    galleries, example_sets = [], []  # one gallery per domain; only the picked model's is visible
                    for kind in EXAMPLE_KINDS:
                        paths = [p for p in self.examples if p in examples_of(kind)]
                        with gr.Column(visible=kind == shown.examples and bool(paths),
                                       elem_id=f"examples-{kind}") as gallery:
                            if paths:
                                example_sets.append(gr.Examples(
                                    [[str(p)] for p in paths], inputs=[image], label=f"Examples ({kind})",
                                    examples_per_page=24, elem_id=f"examples-{kind}-gallery"))
                        galleries.append(gallery)
            # Every action that asks for an analysis numbers it in the browser (`action`); one listener on that number
            # runs the analysis. Gradio runs one listener's events of a page one after another, and `always_last`
            # folds the actions taken meanwhile into one run with the controls as they are then. So the page shows
            # its newest analysis: separate listeners computed at once, and an upload that finished after the example
            # picked next put the upload's labels and maps beside the example's picture.
            action = gr.Number(visible=False, precision=0)
            # The action that is the page emptying the image box; 0: none (actions are numbered from 1). Not None:
            # then EMPTIED_JS's answer to the page's first upload (nothing emptied) changed it, a second run.
            emptied_at = gr.Number(0, visible=False, precision=0)
            shown = gr.State(None)  # (image, model) of the page's last analysis: what the next one resets
            ask = dict(fn=None, inputs=None, outputs=[action], js=NEXT_ACTION_JS, queue=False)
            # A new image is an upload, a removal or a picked example. Not `image.change`: in Gradio 6.31 it fires
            # twice for an upload in place of a shown image and for a picked example; the second run doubled the cost
            # and rewrote the first run's result files (Gradio names them by their content) while the browser was
            # reading them.
            image.upload(**ask)
            image.clear(**{**ask, "js": REMOVED_JS})
            # A file over the size limit is never sent: the page shows a toast and empties the box, which fires
            # `change` with no value and neither `upload` nor `clear` (Gradio 6.31). Only that `change` is an action
            # (EMPTIED_JS), numbered in `emptied_at` so that the run says why nothing is shown.
            image.change(fn=None, inputs=[image], outputs=[emptied_at], js=EMPTIED_JS, queue=False)
            emptied_at.change(fn=None, inputs=[emptied_at], outputs=[action], js="(n) => n", queue=False)
            for examples in example_sets:
                examples.load_input_event.then(**ask)
            # User actions only, so the app's own updates of `target` and `layer` never ask for a run. In Gradio
            # 6.31 a dropdown pick fires, with the mouse, `input` twice and `change` and `select` once each; with the
            # keyboard (arrow keys, Enter) `input` and `change` once, and no `select`, which left a keyboard pick
            # unanalysed. `model` is never updated by the app, so its `change` is the user's pick; `target` is, so
            # its `input` asks, counted once per pick (PICK_JS). A slider fires `input` for the keyboard (arrow keys,
            # typing in its number box) as well as for the mouse, where `release` missed the keyboard entirely.
            model.change(**ask)
            # Outside the queue: it only reads the model's domain, and it must not count as a second analysis run
            model.change(self.domain_view, inputs=[model], outputs=[knows, *galleries], queue=False)
            target.input(**{**ask, "inputs": [target], "js": PICK_JS})
            for control in (backend, fusion, discard, layer):
                control.input(**ask)
            results = [labels, overlay, layer_view, target, class_map, status, layer]
            action.change(self.analyze_latest,
                          inputs=[image, model, backend, fusion, discard, layer, target, shown, action, emptied_at],
                          outputs=[results[0], image, discard, *results[1:], shown], trigger_mode="always_last",
                          show_progress_on=results)  # not over the upload box, which only a refusal empties
        return blocks


class _Refusal(tuple):
    """`Demo.analyze`'s outputs for an upload it refused (`Demo._refused`): `analyze_latest` empties the box too."""


# `shown`'s image after a run that emptied the image box (`Demo.analyze_latest`); never an upload's path
EMPTIED = "<emptied by the analysis>"

# The result images' titles float over their top-left corner, and once an image is shown its buttons (RESULT_BUTTONS)
# over the top-right one, on top of the title: from about 1024 to 1400 px wide "Rollout through the chosen block" read
# "Rollout through the chos". Kept clear of the buttons (about 50 px: two of them) while they are there, the title
# wraps instead.
CSS = ", ".join(f"#{elem_id}:has(.icon-button-wrapper) > label[data-testid=block-label]" for elem_id in RESULT_ALT) \
    + " { max-width: calc(100% - 64px); }"

# The result images' corner buttons: not Gradio's "share", which only works on Hugging Face Spaces ("Must be on
# Spaces to share.")
RESULT_BUTTONS = ["download", "fullscreen"]

# The page's next action number (`Demo.build`): an event that runs only this, in the browser, sets `action` to it.
NEXT_ACTION_JS = "() => { window.hubVitActions = (window.hubVitActions || 0) + 1; return window.hubVitActions; }"
# The same for "Remove Image", which also marks the `change` (with no value) that follows it as the user's removal.
REMOVED_JS = f"() => {{ window.hubVitRemoved = true; return ({NEXT_ACTION_JS})(); }}"
# The image box's `change`: an action only when the box was emptied and not by "Remove Image" (an upload the page did
# not send); its number, else the number held (unchanged: nothing is asked). Every other `change` (an upload, an
# example) is already asked for by `upload` or the examples.
EMPTIED_JS = """(value) => {
  const removed = window.hubVitRemoved;
  window.hubVitRemoved = false;
  if (value !== null || removed) return window.hubVitEmptiedAt ?? 0;
  window.hubVitActions = (window.hubVitActions || 0) + 1;
  window.hubVitEmptiedAt = window.hubVitActions;
  return window.hubVitEmptiedAt;
}"""
# The same, for a dropdown's `input`, which a mouse pick fires twice: the second event of a pick (the same value within
# half a second) returns the number unchanged, which asks for nothing.
PICK_JS = """(value) => {
  const now = performance.now(), last = window.hubVitPick;
  window.hubVitPick = {value, at: now};
  if (last && last.value === value && now - last.at < 500) return window.hubVitActions;
  window.hubVitActions = (window.hubVitActions || 0) + 1;
  return window.hubVitActions;
}"""


def gradio_analytics_opted_in() -> bool:
    """Whether the page may send Gradio's usage statistics and version check to gradio.app: only when the user sets
    Gradio's own switch, GRADIO_ANALYTICS_ENABLED=True. Gradio's default is on; a demo that analyses the user's
    pictures, often on machines without a network, contacts nobody unless asked to."""
    return os.environ.get("GRADIO_ANALYTICS_ENABLED") == "True"  # Gradio's own test of the switch: exactly "True"


def launch(demo: Demo, *, host: str = "127.0.0.1", port: int | None = None, max_size: int = 16,
           concurrency: int = 2, share: bool = False, block: bool = True, root_path: str | None = None) -> gr.Blocks:
    """Start the server; blocks unless `block=False` (then it runs in a thread and the Blocks are returned, e.g. for
    `hub-vit serve` to run the demo next to Triton; stop it with `.close()`). Only the example folders are served
    besides Gradio's own upload cache. Blocking, SIGTERM stops it as Ctrl-C does, so the cache is deleted too.
    `root_path`: the path (or URL) a reverse proxy serves the demo under; None: Gradio's default, $GRADIO_ROOT_PATH."""
    blocks = demo.build().queue(default_concurrency_limit=concurrency, max_size=max_size)
    allowed = sorted({str(p.parent) for p in demo.examples})
    under = {"root_path": root_path} if root_path is not None else {}
    # quiet: its "set `share=True`" tip, and a URL line callers print themselves
    blocks.launch(server_name=host, server_port=port, max_file_size=MAX_FILE_SIZE, allowed_paths=allowed,
                  share=share, show_error=False, ssr_mode=False, prevent_thread_lock=True, js=a11y_js(demo.examples),
                  css=CSS, quiet=True, **under)
    if block:
        on_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _interrupt) if on_main else None
        try:
            blocks.block_thread()  # Ctrl-C (and SIGTERM, above): closes the server, whose shutdown empties the cache
        finally:
            if on_main:  # None: the previous handler was installed from C; the default is the closest restorable
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    return blocks


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def start_in_background(served: ModelChoice | None = None, *, triton_url: str | None = None,
                        triton_model: str = "vit", served_name: str | None = None, host: str = "127.0.0.1",
                        port: int | None = None, root_path: str | None = None) -> gr.Blocks:
    """For `hub-vit serve`: the demo in a background thread next to Triton (labels from it when `triton_url` is
    given). `served`: the served model, offered and preselected, when the demo can run it in-process; else the page
    opens on the default model and `served_name` (what the server serves) lets the status line say the labels are
    another model's. `root_path`: as `launch`'s. Returns the running Blocks; `.close()` stops it."""
    from hub_vit.demo.models import discover_choices, with_choice

    choices, key = discover_choices(), None
    if served is not None:
        choices, key = with_choice(choices, served)
    triton = (TritonLabels(triton_url, triton_model, served_key=key, served_name=served_name)
              if triton_url else None)
    return launch(Demo(cache=ModelCache(choices), triton=triton, selected=key), host=host, port=port, block=False,
                  root_path=root_path)


__all__: Sequence[str] = ("Demo", "example_images", "launch", "start_in_background")
