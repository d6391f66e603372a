"""ONNX / TensorRT export of hub-vit models, each export verified against PyTorch before it is written.

* `export_onnx(model, path)`: the fp32 graph `pixel_values` -> `logits` (+ `attentions`), atomic write.
* `export_variants(model, out_dir, variants=[...])`: fp32 / ORT-optimized / fp16 / int8 / bf16, verified, + report.
* `load_source(name_or_folder_or_file)`: what `hub-vit export` reads.
* `hub_vit.export.tensorrt`: TensorRT engines (needs a GPU and `tensorrt`).
"""

from __future__ import annotations

from hub_vit.export.onnx_export import ATTENTIONS, INPUT_NAME, LOGITS, POOL_ATTENTION, export_onnx, output_names
from hub_vit.export.sources import ModelSource, load_source
from hub_vit.export.variants import DEFAULT_VARIANTS, VARIANTS, ExportReport, VariantOutcome, export_variants

__all__ = ["ATTENTIONS", "DEFAULT_VARIANTS", "INPUT_NAME", "LOGITS", "POOL_ATTENTION", "VARIANTS", "ExportReport",
           "ModelSource", "VariantOutcome", "export_onnx", "export_variants", "load_source", "output_names"]
