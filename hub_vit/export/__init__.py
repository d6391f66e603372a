"""ONNX / TensorRT export of hub-vit models, each export verified against PyTorch before it is written.

* `export_onnx(model, path)`: the fp32 graph `pixel_values` -> `logits` (+ `attentions`), atomic write.
* `export_variants(model, out_dir, ExportPlan(variants=(...)))`: the variants of `hub_vit.export.registry`
  (fp32 / fused / fp16 / int8 / bf16 ONNX graphs, OpenVINO IR), verified, + report.
* `load_source(name_or_folder_or_file)`: what `hub-vit export` reads, i.e. `hub_vit.resolve.resolve_model` with
  export's weights default (a thin alias, kept because it is documented).
* `hub_vit.export.tensorrt`: TensorRT engines (needs a GPU and `tensorrt`).

The names load on first use: `hub_vit.export.registry` (what the command line lists) must not pull in torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub_vit.export.onnx_export import ATTENTIONS, INPUT_NAME, LOGITS, POOL_ATTENTION, export_onnx, output_names
    from hub_vit.export.plan import ExportPlan, OwnImages, VerificationSet
    from hub_vit.export.variants import ExportReport, VariantOutcome, export_variants
    from hub_vit.resolve import ResolvedModel

# name -> module that defines it (imported on first access: these pull in torch)
_LAZY = {
    **dict.fromkeys(("ATTENTIONS", "INPUT_NAME", "LOGITS", "POOL_ATTENTION", "export_onnx", "output_names"),
                    "hub_vit.export.onnx_export"),
    **dict.fromkeys(("ExportReport", "VariantOutcome", "export_variants"), "hub_vit.export.variants"),
    **dict.fromkeys(("ExportPlan", "OwnImages", "VerificationSet"), "hub_vit.export.plan"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:  # AttributeError (not another error) lets `from hub_vit.export import <submodule>` fall back
        raise AttributeError(f"module 'hub_vit.export' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def load_source(source: str | Path, *, model_name: str | None = None, pretrained: bool | None = None
                ) -> ResolvedModel:
    """`hub_vit.resolve.resolve_model` with `hub-vit export`'s default for registered names (`pretrained=None`: a
    `name.tag`'s published weights, a bare name's only where they ship in the package, else random weights). An
    exported graph is refused: there is no torch model in it to export."""
    from hub_vit.resolve import locate, resolve_model

    ref = locate(source, model_name=model_name, takes=frozenset({"folder", "weights"}))
    if ref.kind in ("onnx", "engine"):
        raise ValueError(f"{str(source)!r} is already an exported file ({ref.kind}); export takes a registered name, "
                         "a model folder or a weights file (.safetensors/.npz/.pt with --model)")
    if pretrained is not None and ref.kind != "registered":  # was ignored: a folder exported its own weights anyway
        what = "a model folder" if ref.kind == "folder" else "a weights file"
        raise ValueError(f"--{'pretrained' if pretrained else 'random'} chooses the weights of a registered name; "
                         f"{str(source)!r} is {what}, whose own weights are exported: leave the flag out")
    return resolve_model(ref, pretrained=pretrained)


__all__ = ["ATTENTIONS", "INPUT_NAME", "LOGITS", "POOL_ATTENTION", "ExportPlan", "ExportReport", "OwnImages",
           "VariantOutcome", "VerificationSet", "export_onnx", "export_variants", "load_source", "output_names"]
