"""OpenVINO variants of an exported graph: built from the fp32 ONNX graph, saved as OpenVINO IR, run by OpenVINO's CPU
plugin, and verified like the ONNX variants (`hub_vit.export.variants`, criterion: `hub_vit.export.criterion`).

* `openvino-fp32`: the fp32 graph, run in f32.
* `openvino-bf16`: the fp32 graph run in bf16 (`INFERENCE_PRECISION_HINT`; OpenVINO's default on CPUs with bf16
  units, AMX / avx512_bf16; elsewhere the plugin emulates it, slowly, so it is a candidate only on those CPUs).
* `openvino-int8`: static int8 by NNCF post-training quantisation (transformer preset: SmoothQuant, per-channel
  weights), calibrated on the export's calibration images. The attention output projections stay in float: their
  input (softmax(QK^T)V, merged heads) has per-channel outliers one per-tensor scale cannot hold (ViT-S/16, random
  weights, 24 photo crops: worst cosine 0.9887 / relative error 0.150 with them quantised, 0.9991 / 0.042 without).
* `openvino-int8-dynamic`: int8 weights (NNCF weight compression, symmetric, per output channel) and activations
  quantised per token at run time by the CPU plugin (`DYNAMIC_QUANTIZATION_GROUP_SIZE`): no calibration, close to
  fp32 (same model: cosine 0.9994).

The int8 variants keep OpenVINO's default precision for what stays in float (bf16 on CPUs with bf16 units): the
verification on the host judges the whole.

The IR pair (`<name>.xml` + `<name>.bin`) and `<name>.json` (the compile settings the variant was verified with) are
written together; `OpenVINOSession` reads all three. The served CPU classifier imports this file (copied beside its
model.py by `hub-vit repository`) and runs the same `OpenVINOSession` that was verified and timed, so the module
imports nothing but numpy at the top (OpenVINO and NNCF inside the functions that need them).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

OPENVINO_VARIANTS: tuple[str, ...] = ("openvino-fp32", "openvino-bf16", "openvino-int8", "openvino-int8-dynamic")
PRECISION = {"openvino-fp32": "fp32", "openvino-bf16": "bf16", "openvino-int8": "int8", "openvino-int8-dynamic": "int8"}
# activations quantised in groups of this many channels: one scale per token for rows up to ViT-S/16's 384, a few per
# token for wider models (ViT-S/16, 2 cores: 384 was the fastest of 32, 64, 128, 384; 0 turns it off, 40% slower)
DYNAMIC_GROUP_SIZE = 384
_LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Convert")


def openvino_available() -> str | None:
    """None when OpenVINO and NNCF import, else why not (with the install command)."""
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError as exc:
        return f"{exc.name or 'openvino'} is not installed (pip install 'hub-vit[serve]')"
    return None


def compile_settings(variant: str) -> dict[str, str]:
    """The CPU plugin settings a variant is compiled with (besides the thread count)."""
    if variant == "openvino-int8-dynamic":
        return {"DYNAMIC_QUANTIZATION_GROUP_SIZE": str(DYNAMIC_GROUP_SIZE)}
    if variant in ("openvino-fp32", "openvino-bf16"):
        return {"INFERENCE_PRECISION_HINT": PRECISION[variant].replace("fp", "f")}
    return {}


def _constant_nodes(model: Any) -> set[str]:
    """Names of the nodes computed from constants alone (weights and their Convert / Transpose)."""
    constant: set[str] = set()
    for op in model.get_ordered_ops():  # topological order: inputs come first
        inputs = [op.input_value(i).get_node() for i in range(op.get_input_size())]
        if op.get_type_name() == "Constant" or (inputs and all(n.get_friendly_name() in constant for n in inputs)):
            constant.add(op.get_friendly_name())
    return constant


def attention_output_projections(model: Any) -> list[str]:
    """The weight MatMuls that read an activation x activation MatMul (softmax(QK^T) V) through layout ops only."""
    constant = _constant_nodes(model)
    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        sources = [op.input_value(i).get_node() for i in range(2)]
        activations = [n for n in sources if n.get_friendly_name() not in constant]
        if len(activations) != 1:  # both activations (attention itself) or both constant
            continue
        node = activations[0]
        while node.get_type_name() in _LAYOUT_OPS:
            node = node.input_value(0).get_node()
        if node.get_type_name() == "MatMul" and not any(
                node.input_value(i).get_node().get_friendly_name() in constant for i in range(2)):
            found.append(op.get_friendly_name())
    return found


def build(variant: str, fp32_onnx: str | Path, out_xml: str | Path, calibration: np.ndarray) -> Path:
    """Write `variant` of the fp32 ONNX graph as IR at `out_xml` (+ .bin, + .json settings); returns `out_xml`.

    `calibration`: (N, C, H, W) float32 images for `openvino-int8` (ignored otherwise)."""
    import nncf
    import openvino as ov

    if variant not in OPENVINO_VARIANTS:
        raise ValueError(f"unknown OpenVINO variant {variant!r}; valid choices: {', '.join(OPENVINO_VARIANTS)}")
    model = ov.Core().read_model(str(fp32_onnx))
    if variant == "openvino-int8":
        if not len(calibration):
            raise ValueError("openvino-int8 needs calibration images; none were given")
        dataset = nncf.Dataset([calibration[i:i + 1] for i in range(len(calibration))])
        with _quiet():
            model = nncf.quantize(model, dataset, model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(calibration),
                                  ignored_scope=nncf.IgnoredScope(names=attention_output_projections(model)))
    elif variant == "openvino-int8-dynamic":
        with _quiet():
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM)
    out_xml = Path(out_xml)
    ov.save_model(model, str(out_xml), compress_to_fp16=False)  # keeps fp32 weights where nothing was quantised
    out_xml.with_suffix(".json").write_text(json.dumps({"variant": variant, "compile": compile_settings(variant)},
                                                       indent=2) + "\n", encoding="utf-8")
    return out_xml


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """NNCF's progress bars (rich, on stdout) and its info tables off: they would run through `hub-vit serve`'s
    first screen. Its warnings and errors still reach the log. Also off: torch's "No CUDA runtime is found" warning,
    which NNCF's backend probing triggers on a GPU-less host."""
    loggers = {name: logging.getLogger(name) for name in ("nncf", "torch.utils.cpp_extension")}
    levels = {name: logger.level for name, logger in loggers.items()}
    loggers["nncf"].setLevel(logging.WARNING)
    loggers["torch.utils.cpp_extension"].setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for name, logger in loggers.items():
            logger.setLevel(levels[name])


def drop_output(src_xml: str | Path, dst_xml: str | Path, name: str) -> Path:
    """Copy of the IR at `src_xml` (with its settings file) without output `name`; returns `dst_xml`."""
    import openvino as ov

    model = ov.Core().read_model(str(src_xml))
    for result in list(model.get_results()):
        if name in result.input_value(0).get_names() or result.get_friendly_name() == name:
            model.remove_result(result)
    dst_xml = Path(dst_xml)
    ov.save_model(model, str(dst_xml), compress_to_fp16=False)
    dst_xml.with_suffix(".json").write_text(Path(src_xml).with_suffix(".json").read_text(encoding="utf-8"),
                                            encoding="utf-8")
    return dst_xml


def served_model(onnx_file: str | Path) -> Path:
    """Where the CPU classifier of a repository keeps the OpenVINO variant chosen for its `onnx_file`:
    `model.onnx` -> `model.openvino.xml` (with its `.bin` and `.json`); the classifier runs it when it is there."""
    onnx_file = Path(onnx_file)
    return onnx_file.with_name(onnx_file.name.removesuffix(".onnx") + ".openvino.xml")


def ir_files(xml: str | Path) -> list[Path]:
    """The three files of one OpenVINO variant: `.xml`, `.bin`, `.json`."""
    xml = Path(xml)
    return [xml, xml.with_suffix(".bin"), xml.with_suffix(".json")]


class OpenVINOSession:
    """An OpenVINO CPU model with the calls the verification and timing use on an ONNX Runtime session:
    `run(None, {"pixel_values": x})` -> outputs in graph order, `get_inputs()` / `get_outputs()` (`.name`),
    `get_providers()`. `threads`: OpenVINO's inference threads (None: its default, every core)."""

    def __init__(self, xml: str | Path, threads: int | None = None) -> None:
        import openvino as ov

        settings = json.loads(Path(xml).with_suffix(".json").read_text(encoding="utf-8"))
        # unpinned: several instances of the served model, each with its share of the cores, would otherwise pin
        # their threads to the same first cores
        config: dict[str, Any] = {"ENABLE_CPU_PINNING": False, **settings.get("compile", {})}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.compiled = ov.Core().compile_model(str(xml), "CPU", config)
        self.input_names = [port.get_any_name() for port in self.compiled.inputs]
        self.names = [output.get_any_name() for output in self.compiled.outputs]
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # an ov.Type: f32, bf16, f16
        self.precision = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        wanted = str(config.get("INFERENCE_PRECISION_HINT", self.precision))
        if self.precision != wanted:  # a CPU the plugin cannot run that precision on: it falls back silently
            raise RuntimeError(f"OpenVINO {ov.__version__} runs this model at {self.precision} on this CPU, not at "
                               f"{wanted}")
        self.request = self.compiled.create_infer_request()

    def run(self, _outputs: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.request.infer(list(feeds.values()))
        return [np.array(results[output]) for output in self.compiled.outputs]  # copies: the request reuses them

    def get_inputs(self) -> list[Any]:
        return [_Named(name) for name in self.input_names]

    def get_outputs(self) -> list[Any]:
        return [_Named(name) for name in self.names]

    def get_providers(self) -> list[str]:
        return [f"OpenVINO CPU ({self.precision})"]


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


__all__ = ["DYNAMIC_GROUP_SIZE", "OPENVINO_VARIANTS", "OpenVINOSession", "attention_output_projections", "build",
           "compile_settings", "drop_output", "ir_files", "openvino_available", "served_model"]
