"""The OpenVINO variants' builds (`hub_vit.export.registry`): OpenVINO IR from the fp32 ONNX graph, written with the
compile settings the variant is verified and served with.

* `openvino-fp32` / `openvino-bf16`: the fp32 graph, compiled with `INFERENCE_PRECISION_HINT` f32 / bf16 (OpenVINO's
  default on CPUs with bf16 units, AMX / avx512_bf16; elsewhere the plugin emulates bf16, slowly).
* `openvino-int8-dynamic`: int8 weights (NNCF weight compression, symmetric, per output channel) and activations
  quantised per token at run time by the CPU plugin (`DYNAMIC_QUANTIZATION_GROUP_SIZE`): no calibration.
* `openvino-int8`: static int8 by NNCF post-training quantisation (`NNCF_SETTINGS`: transformer model type,
  per-channel weights; symmetric activations over their min / max range; SmoothQuant where it keeps more layers in
  int8), calibrated on the export's calibration images, with the layers the criterion finds sensitive kept in float
  (`hub_vit.export.sensitivity`).

Both int8 variants run the MLP's GELU in its erf form (`hub_vit.export.openvino_rewrite.tanh_gelu_as_erf`: within
the int8 rounding of its output, and faster), recorded as `gelu_as_erf` (how many) in their settings.
What stays in float runs at OpenVINO's default precision (bf16 on CPUs with bf16 units); the verification on the
host judges the whole. Each variant is three files: `<name>.xml` + `<name>.bin` (the IR) and `<name>.json` (its
compile settings), which `hub_vit.openvino_runtime.OpenVINOSession` reads.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hub_vit.atomic import disk_errors_as_os_errors
from hub_vit.export import sensitivity
from hub_vit.export.openvino_rewrite import keys_transposed_by_matmul, tanh_gelu_as_erf
from hub_vit.openvino_runtime import core

# activations quantised in groups of this many channels: one scale per token for rows up to ViT-S/16's 384, a few per
# token for wider models (ViT-S/16, 2 cores: 384 was the fastest of 32, 64, 128, 384; 0 turns it off, 40% slower)
DYNAMIC_GROUP_SIZE = 384
# openvino-int8's quantisation, recorded in its settings. Symmetric activations (NNCF's performance preset; its mixed
# preset makes them asymmetric where they are not centred): the CPU plugin runs every MatMul on its signed AMX / VNNI
# kernel, with no zero-point term. ViT-S/16 at batch 8, 2 threads, on an AMX host (OpenVINO 2026.4): the MatMuls take
# 13 % less time (40.8 -> 35.5 ms, profiled), the whole model runs 4-11 % faster (four interleaved comparisons), and
# its calibration margin before the search rose (-0.16 -> 0.11); ViT-Ti/16 kept 4 MatMuls in float where it kept 7.
# Activation ranges: the min / max over every calibration image ("minmax"; NNCF's default for per-tensor activations
# averages each image's min / max, clipping the images whose activations reach further). The verification judges
# the worst image, so a range clipped for one image fails the variant whatever the others give. Random-weight
# ViT-S/16 and ViT-Ti/16 at seed 0 on a Zen 5 host (avx512_bf16 / VNNI): averaged ranges missed the bounds on one
# photo each (cosine 0.9849 / 0.9877) after the search kept 1 / 4 MatMuls in float on a calibration margin of 0.42
# / 0.36; min / max ranges passed with every MatMul in int8 (0.9922 / 0.9945; calibration margin 0.69 / 0.70), and
# the digits model's closest bound on its held-out digits rose from +0.0074 to +0.0086.
NNCF_SETTINGS = {"model_type": "transformer", "preset": "performance", "activations_range": "minmax"}
SMOOTH_QUANT_ALPHA = 0.95  # NNCF's default for MatMuls, where the build uses SmoothQuant (`build_static_int8`)


def read_model(onnx_file: str | Path) -> Any:
    """The OpenVINO graph of `onnx_file` (or of an IR), its attention reading the keys through `transpose_b`
    (`hub_vit.export.openvino_rewrite`): what every OpenVINO variant is built from."""
    model = core().read_model(str(onnx_file))
    keys_transposed_by_matmul(model)
    return model


def read_int8_model(onnx_file: str | Path) -> tuple[Any, dict[str, int]]:
    """The graph an int8 variant is quantised from: `read_model`'s, its tanh GELUs in erf form; with what that
    decided, for the variant's settings."""
    model = read_model(onnx_file)
    return model, {"gelu_as_erf": tanh_gelu_as_erf(model)}


def save(model: Any, out_xml: Path, compile_settings: dict[str, str], **decided: Any) -> Path:
    """Write `model` as IR at `out_xml` with its settings file (`compile`: the plugin settings it runs with, besides
    the thread count; plus what its build `decided`, e.g. the layers kept in float); returns `out_xml`."""
    import openvino as ov

    with disk_errors_as_os_errors(out_xml):
        ov.save_model(model, str(out_xml), compress_to_fp16=False)  # keeps fp32 weights where nothing was quantised
    settings = {"variant": out_xml.stem, "compile": compile_settings, **decided}
    out_xml.with_suffix(".json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return out_xml


def build_plain(fp32: Path, out_xml: Path, precision: str) -> Path:
    """The fp32 graph run at `precision` (f32 or bf16)."""
    return save(read_model(fp32), out_xml, {"INFERENCE_PRECISION_HINT": precision})


def build_dynamic_int8(fp32: Path, out_xml: Path) -> tuple[Path, dict[str, Any]]:
    """int8 weights, activations quantised at run time; returns the IR and what the build decided (`gelu_as_erf`)."""
    import nncf

    model, decided = read_int8_model(fp32)
    with quiet():
        model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM)
    return save(model, out_xml, {"DYNAMIC_QUANTIZATION_GROUP_SIZE": str(DYNAMIC_GROUP_SIZE)}, **decided), decided


def build_static_int8(fp32: Path, out_xml: Path, calibration: np.ndarray, top1_counts: np.ndarray | None,
                      own_mask: np.ndarray | None = None) -> tuple[Path, dict[str, Any]]:
    """Static int8 calibrated on `calibration` (N, C, H, W), the layers the criterion finds sensitive kept in float
    (`hub_vit.export.sensitivity.search`, judged on the same images: `top1_counts` marks those whose top-1 counts,
    `own_mask` the model's own images, which alone the bounds judge when given, as the verification does); returns the
    IR and what the build decided: `nncf` (the quantisation settings, `smooth_quant` among them), `gelu_as_erf`,
    `kept_in_float` (the layers left unquantised) and the search's rounds, with the alternative it tried
    (`search.alternatives`).

    SmoothQuant (per-channel scales that move activation outliers into the weights) is left out first: its scales
    are a multiplication on every quantised activation the CPU plugin runs on its own (ViT-S/16 at batch 8, 2
    threads, AMX host: 46.4 ms without, 48.5 ms with). Where the model quantised whole without it misses the search's
    target margin, it is quantised whole with it too, and the search goes on from the one with the higher margin."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    if not len(calibration):
        raise ValueError("openvino-int8 needs calibration images; none were given")
    model, rewritten = read_int8_model(fp32)
    dataset = nncf.Dataset([calibration[i:i + 1] for i in range(len(calibration))])
    ranges = getattr(RangeEstimatorParametersSet, NNCF_SETTINGS["activations_range"].upper())

    def quantizer(smooth_quant: bool) -> Callable[[list[str]], Any]:
        advanced = AdvancedQuantizationParameters(
            activations_range_estimator_params=ranges,
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=SMOOTH_QUANT_ALPHA if smooth_quant else -1))

        def quantize(kept: list[str]) -> Any:
            with quiet():
                return nncf.quantize(model, dataset, model_type=nncf.ModelType(NNCF_SETTINGS["model_type"]),
                                     preset=nncf.QuantizationPreset(NNCF_SETTINGS["preset"]),
                                     subset_size=len(calibration), ignored_scope=nncf.IgnoredScope(names=kept),
                                     advanced_parameters=advanced)
        return quantize

    # without SmoothQuant first; with it where the model quantised whole without it misses the search's target
    found = sensitivity.search(model, [quantizer(False), quantizer(True)], calibration, top1_counts,
                               {"ENABLE_CPU_PINNING": False}, judged=own_mask)
    smooth_quant = found.start == 1
    alternatives = [{"smooth_quant": index == 1, "kept_in_float": [], "calibration_margin": margin}
                    for index, margin in enumerate(found.starts) if index != found.start]
    decided = {"nncf": {**NNCF_SETTINGS, "smooth_quant": smooth_quant}, **rewritten,
               "kept_in_float": found.kept_in_float,
               "search": {"calibration_margin": round(found.margin, 4), "rounds": found.rounds,
                          "alternatives": alternatives}}
    return save(found.model, out_xml, {}, **decided), decided


@contextlib.contextmanager
def quiet() -> Iterator[None]:
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

    model = read_model(src_xml)
    for result in list(model.get_results()):
        if name in result.input_value(0).get_names() or result.get_friendly_name() == name:
            model.remove_result(result)
    dst_xml = Path(dst_xml)
    with disk_errors_as_os_errors(dst_xml):
        ov.save_model(model, str(dst_xml), compress_to_fp16=False)
    dst_xml.with_suffix(".json").write_text(Path(src_xml).with_suffix(".json").read_text(encoding="utf-8"),
                                            encoding="utf-8")
    return dst_xml


__all__ = ["DYNAMIC_GROUP_SIZE", "NNCF_SETTINGS", "build_dynamic_int8", "build_plain",
           "build_static_int8", "drop_output", "quiet", "read_int8_model", "read_model", "save"]
