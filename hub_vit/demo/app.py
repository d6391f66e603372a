"""The Gradio demo: upload or pick an image, see the top-5 labels and where the model looked.

One handler (`Demo.analyze`) serves every control, so the page always shows one consistent state; models are loaded
once (`ModelCache`) and the rollout itself costs about one forward pass. Hardening (see docs/explain.md):
`gr.Error` with a readable message for any bad upload, a bounded queue, a file-size limit, 127.0.0.1 by default,
and only this package's example folders in `allowed_paths`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from hub_vit.demo.backends import IN_PROCESS, TritonLabels
from hub_vit.demo.models import ModelCache
from hub_vit.explain.image import IMAGE_FORMATS, ImageReadError, load_image
from hub_vit.explain.rollout import HEAD_FUSIONS

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
DIGIT_SAMPLES_DIR = Path(__file__).resolve().parents[1] / "assets" / "digits" / "samples"
EXAMPLE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
MAX_FILE_SIZE = "10mb"
MAX_SIDE = 1024  # pictures shown in the page have a long side of at most MAX_SIDE ...
MIN_SIDE = 384  # ... and at least MIN_SIDE pixels (a 128 px digit sample is shown 3x, pixels kept sharp)
INTRO = """# hub-vit: where does the Vision Transformer look?
Upload an image (or pick an example) to see the model's top-5 labels and its **attention rollout** (Abnar & Zuidema
2020): attention multiplied through the blocks, read out the way the classifier reads the tokens (class token, or the
mean of all tokens for SimpleViT's global average pooling). The **class-specific map** weights each attention by its
gradient for the chosen label (Chefer et al. 2021). Only the model's centre crop is coloured; the rest is dimmed."""


def example_images() -> list[Path]:
    """The default model's digit samples (if shipped) followed by the bundled photos."""
    found: list[Path] = []
    for folder in (DIGIT_SAMPLES_DIR, EXAMPLES_DIR):
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.suffix.lower() in EXAMPLE_SUFFIXES)
    return found


def _guard_upload(component: gr.Image) -> None:
    """Turn the image component's decode failure (a non-image upload) into a readable `gr.Error`.

    Gradio decodes the upload before our handler runs; without this the page shows a bare "Error".
    """
    preprocess = component.preprocess

    def checked(payload: Any) -> Any:
        try:
            return preprocess(payload)
        except gr.Error:
            raise
        except Exception as exc:
            name = getattr(payload, "orig_name", None) or "the upload"
            if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):  # it is an image
                raise gr.Error(f"{name!r} is too large to decode safely ({exc})") from exc
            raise gr.Error(f"{name!r} is not an image this demo can read ({type(exc).__name__}); "
                           f"upload one of: {', '.join(IMAGE_FORMATS)}") from exc

    component.preprocess = checked  # type: ignore[method-assign]


@dataclass
class Demo:
    """State shared by the handlers: the model cache and the optional Triton backend."""

    cache: ModelCache
    triton: TritonLabels | None = None
    examples: list[Path] = field(default_factory=example_images)

    def backends(self) -> list[str]:
        return [IN_PROCESS] + ([self.triton.choice] if self.triton else [])

    def analyze(self, image_path: str | None, model_key: str, backend: str, head_fusion: str, discard_ratio: float,
                layer: float, target: str | None) -> tuple[Any, ...]:
        """Everything on the right-hand side of the page, from the current controls."""
        if not image_path:
            return None, None, None, gr.update(), None, "Upload an image or pick an example.", gr.update()
        try:
            explainer = self.cache.get(model_key)
        except ValueError as exc:
            raise gr.Error(str(exc)) from exc
        if head_fusion not in HEAD_FUSIONS:
            raise gr.Error(f"unknown head fusion {head_fusion!r}; valid choices: {', '.join(HEAD_FUSIONS)}")
        if not 0 <= float(discard_ratio) < 1:
            raise gr.Error(f"discard ratio must be in [0, 1), got {discard_ratio}")
        name = Path(image_path).name
        try:
            image = load_image(image_path, name=name)
        except ImageReadError as exc:
            raise gr.Error(str(exc)) from exc
        start = time.perf_counter()
        try:
            prepared = explainer.prepare(image)
        except ImageReadError as exc:  # an aspect ratio too extreme to resize
            raise gr.Error(f"{name!r}: {exc}") from exc
        result = explainer.rollout(prepared, head_fusion, float(discard_ratio))
        top = explainer.top_k(result.logits[0], 5)
        status = f"**{explainer.name}** in-process"
        if backend != IN_PROCESS:
            if self.triton is None:
                raise gr.Error(f"unknown backend {backend!r}; valid choices: {', '.join(self.backends())}")
            remote, message = self.triton.top_k(image, 5)
            status = message
            top = remote if remote is not None else top
        depth = explainer.depth
        layer_index = int(min(max(int(layer or depth), 1), depth))
        display = dict(max_side=MAX_SIDE, min_side=MIN_SIDE)
        overlay = explainer.overlay(prepared, result.maps[0], **display)
        layer_view = explainer.overlay(prepared, result.layer_maps[0, layer_index - 1], **display)
        target = target if target in explainer.labels else explainer.labels[int(result.logits[0].argmax())]
        cam = explainer.class_map(prepared, explainer.label_index(target)).maps[0]
        class_map = explainer.overlay(prepared, cam, **display)
        status += f" · rollout + class map {time.perf_counter() - start:.2f} s · crop {explainer.data.img_size}"
        return (
            {name: prob for name, prob in top},
            overlay,
            layer_view,
            gr.update(choices=explainer.labels, value=target),
            class_map,
            status,
            # Gradio needs minimum < maximum; a 1-block model gets a 1..2 slider clamped to block 1 above.
            gr.update(maximum=max(depth, 2), value=layer_index, label=f"Block (per-layer view, 1..{depth})"),
        )

    def build(self) -> gr.Blocks:
        keys = self.cache.keys
        if not keys:
            raise ValueError("no model to show: ship the default model, pass --model-folder, or cache a checkpoint")
        depth = self.cache.get(keys[0]).depth  # the first model loads now (it would on the first request anyway)
        with gr.Blocks(title="hub-vit attention rollout") as blocks:
            gr.Markdown(INTRO)
            with gr.Row():
                with gr.Column(scale=1):
                    image = gr.Image(type="filepath", label="Image", sources=["upload"], elem_id="input-image",
                                     image_mode=None, height=320)
                    _guard_upload(image)
                    model = gr.Dropdown(keys, value=keys[0], label="Model", elem_id="model")
                    backend = gr.Radio(self.backends(), value=IN_PROCESS, label="Labels from", elem_id="backend")
                    fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion", elem_id="head-fusion")
                    discard = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="Discard ratio (lowest attentions)",
                                        elem_id="discard-ratio")
                    if self.examples:
                        gr.Examples([[str(p)] for p in self.examples], inputs=[image], label="Examples",
                                    examples_per_page=24)
                with gr.Column(scale=2):
                    status = gr.Markdown("Upload an image or pick an example.", elem_id="status")
                    labels = gr.Label(num_top_classes=5, label="Top-5", elem_id="labels")
                    with gr.Row():
                        overlay = gr.Image(label="Attention rollout (all blocks)", elem_id="overlay",
                                           interactive=False, format="png", height=300)
                        layer_view = gr.Image(label="Rollout through the chosen block", elem_id="layer-view",
                                              interactive=False, format="png", height=300)
                        class_map = gr.Image(label="Class-specific (gradient-weighted) rollout", elem_id="class-map",
                                             interactive=False, format="png", height=300)
                    with gr.Row():
                        layer = gr.Slider(1, max(depth, 2), value=depth, step=1, elem_id="layer",
                                          label=f"Block (per-layer view, 1..{depth})")
                        target = gr.Dropdown([], label="Class-specific map for label", elem_id="target")
            inputs = [image, model, backend, fusion, discard, layer, target]
            outputs = [labels, overlay, layer_view, target, class_map, status, layer]
            run = dict(fn=self.analyze, inputs=inputs, outputs=outputs, trigger_mode="always_last")
            image.change(**run)
            for control in (model, backend, fusion, target):
                control.input(**run)  # user changes only: our own updates of `target` must not loop
            for slider in (discard, layer):
                slider.release(**run)
        return blocks


def launch(demo: Demo, *, host: str = "127.0.0.1", port: int | None = None, max_size: int = 16,
           concurrency: int = 2, share: bool = False, block: bool = True) -> gr.Blocks:
    """Start the server; blocks unless `block=False` (then it runs in a thread and the Blocks are returned, e.g. for
    `hub-vit serve` to run the demo next to Triton; stop it with `.close()`). Only the example folders are served
    besides Gradio's own upload cache."""
    blocks = demo.build().queue(default_concurrency_limit=concurrency, max_size=max_size)
    allowed = sorted({str(p.parent) for p in demo.examples})
    blocks.launch(server_name=host, server_port=port, max_file_size=MAX_FILE_SIZE, allowed_paths=allowed,
                  share=share, show_error=False, ssr_mode=False, prevent_thread_lock=not block)
    return blocks


def start_in_background(model_folders: Sequence[str | Path] = (), *, triton_url: str | None = None,
                        triton_model: str = "vit", host: str = "127.0.0.1", port: int | None = None) -> gr.Blocks:
    """For `hub-vit serve`: the demo in a background thread next to Triton (labels from it when `triton_url` is
    given). Returns the running Blocks; `.close()` stops it."""
    from hub_vit.demo.models import discover_choices

    triton = TritonLabels(triton_url, triton_model) if triton_url else None
    return launch(Demo(cache=ModelCache(discover_choices(model_folders)), triton=triton), host=host, port=port,
                  block=False)


__all__: Sequence[str] = ("Demo", "example_images", "launch", "start_in_background")
