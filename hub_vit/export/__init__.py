"""ONNX / TensorRT export of hub-vit models, each export verified against PyTorch before it is written.

* `export_onnx(model, path)`: the fp32 graph `pixel_values` -> `logits` (+ `attentions`), atomic write.
* `export_variants(model, out_dir, variants=[...])`: fp32 / ORT-optimized / fp16 / int8 / bf16, verified, + report.
* `load_source(name_or_folder_or_file)`: what `hub-vit export` reads, i.e. `hub_vit.resolve.resolve_model` with
  export's weights default (a thin alias, kept because it is documented).
* `hub_vit.export.tensorrt`: TensorRT engines (needs a GPU and `tensorrt`).
"""

from __future__ import annotations

from pathlib import Path

from hub_vit.export.onnx_export import ATTENTIONS, INPUT_NAME, LOGITS, POOL_ATTENTION, export_onnx, output_names
from hub_vit.export.variants import DEFAULT_VARIANTS, VARIANTS, ExportReport, VariantOutcome, export_variants
from hub_vit.resolve import ResolvedModel, locate, resolve_model


def load_source(source: str | Path, *, model_name: str | None = None, pretrained: bool | None = None
                ) -> ResolvedModel:
    """`hub_vit.resolve.resolve_model` with `hub-vit export`'s default for registered names (`pretrained=None`: a
    `name.tag`'s published weights, a bare name's only where they ship in the package, else random weights). An
    exported graph is refused: there is no torch model in it to export."""
    ref = locate(source, model_name=model_name)
    if ref.kind in ("onnx", "engine"):
        raise ValueError(f"{str(source)!r} is already an exported file ({ref.kind}); export takes a registered name, "
                         "a model folder or a weights file (.safetensors/.npz/.pt with --model)")
    return resolve_model(ref, pretrained=pretrained)


__all__ = ["ATTENTIONS", "DEFAULT_VARIANTS", "INPUT_NAME", "LOGITS", "POOL_ATTENTION", "VARIANTS", "ExportReport",
           "VariantOutcome", "export_onnx", "export_variants", "load_source", "output_names"]
