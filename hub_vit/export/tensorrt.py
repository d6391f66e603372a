"""ONNX -> serialized TensorRT engine with the `tensorrt` Python API (TensorRT 10), verified against ONNX Runtime.

fp16 by default with LayerNorm and Softmax pinned to fp32 (ViT LayerNorm overflows in fp16: NVIDIA/TensorRT #2564,
#2709); one optimization profile over the batch range; the metadata JSON beside the engine records the GPU,
the TensorRT version, the profile and the verification numbers. Needs an NVIDIA GPU and TensorRT 10
(`pip install 'tensorrt>=10,<11'`): TensorRT 11 removed weak typing (BuilderFlag.FP16 and the per-layer precision
pins this build relies on), and the Triton image the Dockerfile serves engines with (25.08) runs TensorRT 10.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hub_vit.atomic import atomic_path, file_in_the_way
from hub_vit.export.onnx_export import INPUT_NAME, LOGITS
from hub_vit.export.plan import check_seed
from hub_vit.exported import REPORT_SUFFIX, load_onnx_graph

SUPPORTED_MAJOR = 10  # the API this build uses; see the module docstring
INSTALL = "pip install 'tensorrt>=10,<11'"


class TensorRTUnavailable(RuntimeError):
    """No GPU, no `tensorrt` package or another major version of it: the TensorRT export cannot run here."""


@dataclass(frozen=True)
class BatchProfile:
    """min <= opt <= max batch sizes of the engine's optimization profile."""

    min: int = 1
    opt: int = 8
    max: int = 32

    def __post_init__(self) -> None:
        if not (isinstance(self.min, int) and 1 <= self.min <= self.opt <= self.max):
            raise ValueError(f"batch profile must satisfy 1 <= min <= opt <= max, got min={self.min}, "
                             f"opt={self.opt}, max={self.max}")


def require_tensorrt() -> Any:
    """Import `tensorrt`, check its major version and for a CUDA GPU, failing fast with a message that says what is
    missing."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise TensorRTUnavailable(
            f"TensorRT export needs the `tensorrt` Python package ({INSTALL}) and an NVIDIA GPU; "
            f"`import tensorrt` failed: {exc}") from None
    version = str(getattr(trt, "__version__", "unknown"))
    if version.split(".")[0] != str(SUPPORTED_MAJOR):
        raise TensorRTUnavailable(
            f"TensorRT {version} is installed, but the export is written for TensorRT {SUPPORTED_MAJOR}: TensorRT 11 "
            f"removed the weakly typed FP16 build (BuilderFlag.FP16, per-layer fp32 pins for LayerNorm/Softmax) it "
            f"uses, and Triton's 25.08 image serves TensorRT {SUPPORTED_MAJOR} engines; {INSTALL}")
    import torch

    if not torch.cuda.is_available():
        raise TensorRTUnavailable("TensorRT export needs an NVIDIA GPU, and torch.cuda.is_available() is False here")
    return trt


# ONNX Runtime's quantized operators (QDQ pairs, dynamic quantization, integer MatMul / Conv): an int8 variant's graph
_QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger")


def _check_fp32_logits_graph(graph: Any, onnx_path: Path) -> None:
    """The engine is built from the fp32 logits graph (`model.onnx`): not from the attention graph, whose extra outputs
    the engine would carry for nothing, nor from an int8 variant, whose quantized operators TensorRT's fp16 build
    does not take as the fp32 graph's (and whose verification is against another reference)."""
    outputs = [o.name for o in graph.output]
    if outputs != [LOGITS]:
        raise ValueError(f"{onnx_path} has outputs {outputs}: the TensorRT export takes the fp32 graph whose only "
                         f"output is {LOGITS!r} (model.onnx of `hub-vit export onnx`, not model.attentions.onnx)")
    quantized = sorted({node.op_type for node in graph.node
                        if node.op_type in _QUANTIZED_OPS or node.op_type.startswith("QLinear")})
    if quantized:
        raise ValueError(f"{onnx_path} is a quantized graph ({', '.join(quantized)}): the TensorRT export takes the "
                         "fp32 graph (model.onnx of `hub-vit export onnx`) and makes its own fp16 engine")


def _refuse_export_report(onnx_path: Path) -> None:
    """`<stem>.export.json` sits beside the graphs it describes and is easily taken for one: name it as the report,
    and the fp32 graph to give instead (else the .onnx files beside it)."""
    if not onnx_path.name.endswith(REPORT_SUFFIX):
        return
    fp32 = onnx_path.with_name(onnx_path.name[:-len(REPORT_SUFFIX)] + ".onnx")  # <stem>.onnx, as the report's stem
    others = sorted(onnx_path.parent.glob("*.onnx"))
    if fp32.is_file():
        hint = f"give the fp32 graph beside it: {str(fp32)!r}"
    elif others:
        hint = f"give the fp32 graph; the .onnx files beside it: {', '.join(repr(str(p)) for p in others)}"
    else:
        hint = "no .onnx file is beside it; write the fp32 graph with `hub-vit export onnx`"
    raise ValueError(f"{str(onnx_path)!r} is not a valid ONNX model: it is the report of `hub-vit export onnx`; {hint}")


def _load_graph(onnx_path: Path) -> Any:
    """The graph of `onnx_path`; ValueError naming the file when it is not ONNX (a PNG, a truncated download, the
    export report)."""
    _refuse_export_report(onnx_path)
    return load_onnx_graph(onnx_path)


def _onnx_image_shape(onnx_path: Path) -> tuple[int, int, int]:
    """(C, H, W) of the graph input; TensorRT profiles here fix H and W, so they must be static."""
    graph = _load_graph(onnx_path)
    inp = next((i for i in graph.input if i.name == INPUT_NAME), None)
    if inp is None:
        raise ValueError(f"{onnx_path} has no input named {INPUT_NAME!r}; export it with `hub-vit export onnx`")
    _check_fp32_logits_graph(graph, onnx_path)
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim][1:]
    if len(dims) != 3 or None in dims:
        raise ValueError(f"{onnx_path}: input {INPUT_NAME!r} has channel/height/width dims {dims}; the TensorRT "
                         "export needs a fixed image size (export the ONNX without --dynamic-size)")
    return dims[0], dims[1], dims[2]


def check_request(onnx_path: str | Path, engine_path: str | Path, workspace_gib: float,
                  seed: int | None = None) -> tuple[int, int, int]:
    """What the caller asked for, checked before TensorRT is looked for, so a mistake is named on any machine (and
    before a build of minutes): the ONNX file exists and has a fixed image size, the engine path is not a folder, the
    workspace is a positive number of GiB, the verification seed fits. Returns the graph's (C, H, W)."""
    check_seed(seed)
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        what = "is a folder" if onnx_path.is_dir() else "does not exist"
        raise FileNotFoundError(f"ONNX file {str(onnx_path)!r} {what}; create it with `hub-vit export onnx`")
    if Path(engine_path).is_dir():
        raise IsADirectoryError(f"engine path {str(engine_path)!r} is a directory; give a file name such as "
                                "model.plan")
    blocker = file_in_the_way(Path(engine_path).parent)
    if blocker is not None:  # found after a build of minutes otherwise, when the engine is written
        raise NotADirectoryError(f"engine path {str(engine_path)!r} cannot be written: {str(blocker)!r} is a file")
    if not (isinstance(workspace_gib, (int, float)) and math.isfinite(workspace_gib) and workspace_gib > 0):
        raise ValueError(f"workspace_gib must be a positive number of GiB, got {workspace_gib}")
    return _onnx_image_shape(onnx_path)


def build_engine(onnx_path: str | Path, engine_path: str | Path, *, fp16: bool = True,
                 profile: BatchProfile = BatchProfile(), workspace_gib: float = 4.0) -> dict[str, Any]:
    """Parse the ONNX graph, build and serialize the engine (atomically); returns the build metadata."""
    c, h, w = check_request(onnx_path, engine_path, workspace_gib)
    trt = require_tensorrt()
    import torch

    onnx_path = Path(onnx_path)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * 2**30))
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
        pinned = (trt.LayerType.NORMALIZATION, trt.LayerType.SOFTMAX)
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if layer.type in pinned:  # keep the LayerNorm / softmax statistics in fp32
                layer.precision = trt.float32
                for j in range(layer.num_outputs):
                    layer.set_output_type(j, trt.float32)
    else:  # TF32 is on by default on Ampere+ and would miss the fp32 threshold (1e-4)
        config.clear_flag(trt.BuilderFlag.TF32)
    opt_profile = builder.create_optimization_profile()
    opt_profile.set_shape(INPUT_NAME, (profile.min, c, h, w), (profile.opt, c, h, w), (profile.max, c, h, w))
    config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build an engine from {onnx_path} (see the TensorRT log above)")
    with atomic_path(engine_path, suffix=".plan") as tmp, open(tmp, "wb") as f:
        f.write(serialized)  # IHostMemory supports the buffer protocol
    return {"tensorrt": trt.__version__, "gpu": torch.cuda.get_device_name(0),
            "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "precision": "fp16" if fp16 else "fp32", "fp32_layers": "LayerNorm, Softmax" if fp16 else "all",
            "profile": {"input": INPUT_NAME, "min": [profile.min, c, h, w], "opt": [profile.opt, c, h, w],
                        "max": [profile.max, c, h, w]}, "workspace_gib": workspace_gib, "onnx": str(onnx_path)}


def run_engine(engine_path: str | Path, x: np.ndarray, batch_size: int) -> np.ndarray:
    """Logits for `x` (N, C, H, W) float32, in batches of at most `batch_size` (torch CUDA tensors as buffers)."""
    trt = require_tensorrt()
    import torch

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
    context = engine.create_execution_context()
    stream = torch.cuda.current_stream()  # same stream as the host->device copies below, so no extra sync is needed
    outs = []
    for i in range(0, len(x), batch_size):
        inp = torch.from_numpy(np.ascontiguousarray(x[i:i + batch_size])).cuda()
        context.set_input_shape(INPUT_NAME, tuple(inp.shape))
        out = torch.empty(tuple(context.get_tensor_shape(LOGITS)), dtype=torch.float32, device="cuda")
        context.set_tensor_address(INPUT_NAME, inp.data_ptr())
        context.set_tensor_address(LOGITS, out.data_ptr())
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        stream.synchronize()
        outs.append(out.cpu().numpy())
    return np.concatenate(outs)


def export_tensorrt(onnx_path: str | Path, engine_path: str | Path, *, fp16: bool = True,
                    profile: BatchProfile = BatchProfile(), workspace_gib: float = 4.0, n_random: int = 16,
                    n_photos: int = 32, seed: int | None = None) -> dict[str, Any]:
    """Build the engine, verify it against ONNX Runtime (same thresholds as the ONNX variants) and write
    `<engine>.json`; a failing engine is deleted. Returns the metadata."""
    import secrets

    from hub_vit.export.metadata import MODEL_KEY, report_metadata
    from hub_vit.export.verify import judge, ort_outputs, ort_session, photo_batch

    c, h, w = check_request(onnx_path, engine_path, workspace_gib, seed)
    require_tensorrt()
    engine_path = Path(engine_path)
    info = build_engine(onnx_path, engine_path, fp16=fp16, profile=profile, workspace_gib=workspace_gib)
    try:
        seed = secrets.randbits(31) if seed is None else seed
        rng = np.random.default_rng(seed)
        x = np.concatenate([rng.uniform(-1, 1, (n_random, c, h, w)).astype(np.float32),
                            photo_batch((h, w), n_photos, seed=seed, in_chans=c)])
        reference = ort_outputs(ort_session(onnx_path, ["CPUExecutionProvider"]), x, batch_size=profile.opt)["logits"]
        got = run_engine(engine_path, x, profile.opt)
        result = judge("tensorrt", info["precision"], reference, got, provider="TensorRT", n_random=n_random,
                       seed=seed)
        info["verification"] = {**result.to_dict(), "reference": "onnxruntime CPUExecutionProvider"}
        serving = report_metadata(Path(onnx_path))  # labels + transform from the ONNX export's report, if any
        if serving:
            info[MODEL_KEY] = serving
        if not result.passed:
            raise RuntimeError(f"TensorRT engine failed verification against ONNX Runtime: {result.reason}")
        with atomic_path(engine_path.with_suffix(engine_path.suffix + ".json"), suffix=".json") as tmp:
            tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    except BaseException:
        engine_path.unlink(missing_ok=True)
        raise
    return info


__all__ = ["BatchProfile", "TensorRTUnavailable", "build_engine", "check_request", "export_tensorrt",
           "require_tensorrt", "run_engine"]
