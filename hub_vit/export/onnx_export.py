"""PyTorch -> ONNX for any `VisionTransformer`: named tensors, dynamic batch (and H/W), atomic write.

The graph reads `pixel_values` (float32, NCHW, value range [-1, 1]) and writes `logits`. The attention graph is a
separate file (`with_attentions=True`) that also writes `attentions` (B, depth, heads, N, N) and, for MAP models,
`pool_attention` (B, heads, 1, N), so the plain classifier keeps the fused SDPA path and stays lean. With
`with_token_means=True` either graph also writes `token_means` (B, depth, D), each block's output averaged over its
tokens (`hub_vit.model.token_means`): what the served out-of-domain score reads (`hub_vit.domain_score`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from hub_vit.atomic import atomic_path
from hub_vit.export.fusable import fusable_copy
from hub_vit.model import VisionTransformer, token_means, vision_transformer_of

if TYPE_CHECKING:
    import onnx

INPUT_NAME = "pixel_values"
LOGITS = "logits"
ATTENTIONS = "attentions"
POOL_ATTENTION = "pool_attention"
TOKEN_MEANS = "token_means"
MIN_OPSET = 17
EXPORTERS: tuple[str, ...] = ("dynamo", "torchscript")
Exporter = Literal["dynamo", "torchscript"]
# A single ONNX protobuf cannot exceed 2 GiB; bigger models would need external data files, which we do not write.
MAX_PROTO_BYTES = 2**31 - 2**24


class LogitsGraph(nn.Module):
    """(B, C, H, W) -> (B, num_classes) on the model's own fused forward [, token means (B, depth, D)]."""

    def __init__(self, model: VisionTransformer, with_token_means: bool = False) -> None:
        super().__init__()
        self.model = model
        self.with_token_means = with_token_means

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not self.with_token_means:
            return self.model(pixel_values)
        out = self.model.forward_all(pixel_values, output_hidden_states=True)  # the fused attention path too
        return out.logits, token_means(out.hidden_states)


class AttentionGraph(nn.Module):
    """(B, C, H, W) -> logits, every block's attention probabilities stacked (B, depth, heads, N, N)[, MAP probe's]
    [, token means (B, depth, D)]."""

    def __init__(self, model: VisionTransformer, with_token_means: bool = False) -> None:
        super().__init__()
        self.model = model
        self.with_token_means = with_token_means

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model.forward_all(pixel_values, output_attentions=True,
                                     output_hidden_states=self.with_token_means)
        attentions = torch.stack(out.attentions, dim=1)  # depth x (B, heads, N, N) -> (B, depth, heads, N, N)
        found = (out.logits, attentions) + ((out.pool_attention,) if out.pool_attention is not None else ())
        return found + ((token_means(out.hidden_states),) if self.with_token_means else ())


def output_names(model: VisionTransformer, with_attentions: bool, with_token_means: bool = False) -> list[str]:
    names = [LOGITS]
    if with_attentions:
        names += [ATTENTIONS] + ([POOL_ATTENTION] if model.spec.pool_type == "map" else [])
    return names + ([TOKEN_MEANS] if with_token_means else [])


def float32_cpu(model: VisionTransformer) -> VisionTransformer:
    """`model` itself when its weights are float32 on the CPU, else a float32 CPU copy of it (the model is left as it
    is): the graphs hub-vit writes are fp32, and a bf16 / fp16 or CUDA model failed deep in the exporter ("Input type
    (float) and bias type (c10::BFloat16)")."""
    if all(t.dtype == torch.float32 and t.device.type == "cpu" for t in model.state_dict().values()):
        return model
    copy = VisionTransformer(model.spec)
    copy.load_state_dict({k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()})
    if hasattr(model, "pretrained_cfg"):  # the data config the export records beside the graph
        copy.pretrained_cfg = model.pretrained_cfg
    return copy.train(model.training)


def _check_args(model: VisionTransformer, opset: int, dynamic_size: bool, exporter: str) -> None:
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < MIN_OPSET:
        raise ValueError(f"opset must be an integer >= {MIN_OPSET} (one LayerNormalization op), got {opset!r}")
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; valid choices: {', '.join(map(repr, EXPORTERS))}")
    if dynamic_size and model.spec.posemb == "learn" and exporter == "torchscript":
        raise ValueError("dynamic_size with a learned position embedding needs exporter='dynamo' (the default): the "
                         "torchscript exporter traces the table's resampling for the traced size only")
    n_bytes = sum(p.numel() * 4 for p in model.parameters())
    if n_bytes > MAX_PROTO_BYTES:
        raise ValueError(f"model has {n_bytes / 2**30:.1f} GiB of float32 weights; one ONNX file holds 2 GiB")


@contextlib.contextmanager
def quiet_loggers(names: tuple[str, ...] = ("torch.onnx", "onnxscript", "onnx_ir", "root")) -> Iterator[None]:
    loggers = [logging.getLogger(n if n != "root" else None) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def graph_opset(path: str | Path) -> int:
    """The default-domain opset a saved graph declares."""
    import onnx

    return _default_opset(onnx.load(str(path), load_external_data=False))


def _default_opset(proto: onnx.ModelProto) -> int:
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def _export_to(graph: nn.Module, dummy: torch.Tensor, path: Path, names: list[str], opset: int, dynamic_batch: bool,
               dynamic_size: bool, patch: int, exporter: str) -> None:
    # the dynamo exporter prints progress lines to stdout and logs its opset 18 -> 17 down-conversion attempts (a
    # failed attempt keeps opset 18; `_down_convert` tries again on the optimised graph); keep CLI output and JSON
    # pipes clean
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), quiet_loggers():
        # the legacy exporter warns that it is legacy, and shape comparisons it records as constants are intended
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            in_axes: dict[int, str] = {0: "batch"} if dynamic_batch else {}
            if dynamic_size:
                in_axes.update({2: "height", 3: "width"})
            out_axes = {0: "batch"} if dynamic_batch else {}
            dynamic_axes = {INPUT_NAME: in_axes, **{n: out_axes for n in names}} if in_axes else None
            torch.onnx.export(graph, (dummy,), str(path), input_names=[INPUT_NAME], output_names=names,
                              opset_version=opset, dynamo=False, dynamic_axes=dynamic_axes, do_constant_folding=True)
            return
        dims: dict[int, object] = {}
        if dynamic_batch:
            dims[0] = torch.export.Dim("batch", min=1, max=4096)
        if dynamic_size:
            # derived dims: heights/widths are whole multiples of the patch, so the model's size checks hold statically
            dims[2] = patch * torch.export.Dim("grid_h", min=1, max=256)
            dims[3] = patch * torch.export.Dim("grid_w", min=1, max=256)
        shapes = {"pixel_values": dims} if dims else None
        program = torch.onnx.export(graph, (dummy,), None, input_names=[INPUT_NAME], output_names=names,
                                    opset_version=opset, dynamo=True, dynamic_shapes=shapes, optimize=True)
        program.save(str(path), external_data=False)
    _down_convert(path, opset)


def _down_convert(path: Path, opset: int) -> None:
    """Bring a graph the exporter left at a newer opset down to `opset`, when ONNX's version converter can.

    The dynamo exporter builds at opset 18 and converts down before it optimises; on a GAP model that conversion
    fails (the pooling ReduceMean's `axes` is not yet a constant), so the graph stays at 18. Once optimised, the axes
    are a constant initializer and the converter succeeds. When it still fails, or its result is not a valid graph,
    the exporter's opset (>= `opset`) is kept, as before: the caller reads the opset written from the file.
    """
    import onnx
    from onnx import version_converter

    proto = onnx.load(str(path), load_external_data=False)
    if _default_opset(proto) <= opset:
        return
    try:
        converted = version_converter.convert_version(proto, opset)
    except (version_converter.ConvertError, RuntimeError, ValueError, IndexError):  # C++ assertions: RuntimeError
        return
    if opset < 18 and not _drop_noop_with_empty_axes(converted.graph):
        return
    try:  # only a valid graph replaces the exporter's own (which the caller checks in full afterwards)
        onnx.checker.check_model(converted, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return
    onnx.save(converted, str(path))


def _drop_noop_with_empty_axes(graph: onnx.GraphProto) -> bool:
    """Opset 18 gave the Reduce ops but ReduceSum (which has had it since 13) `noop_with_empty_axes`; the converter
    moves `axes` back to an attribute but keeps this one, which opset 17 does not know. Dropping it is exact when it
    is 0 (the opset 17 behaviour) or when the axes are given (it only matters for empty axes). Returns False when a
    node relies on it (then nothing is dropped).
    """
    found = []
    for node in graph.node:
        if not node.op_type.startswith("Reduce") or node.op_type == "ReduceSum":
            continue
        attrs = {a.name: a for a in node.attribute}
        noop = attrs.get("noop_with_empty_axes")
        if noop is None:
            continue
        if noop.i != 0 and not ("axes" in attrs and len(attrs["axes"].ints) > 0):
            return False
        found.append((node, noop))
    for node, noop in found:
        node.attribute.remove(noop)
    return True


def export_onnx(model: torch.nn.Module, path: str | Path, *, opset: int = 17, dynamic_batch: bool = True,
                dynamic_size: bool = False, with_attentions: bool = False, exporter: Exporter = "dynamo",
                fusable_attention: bool = True, with_token_means: bool = False) -> Path:
    """Write `model` as an fp32 ONNX graph `pixel_values` -> `logits` (+ `attentions`, + `token_means`) and return the
    path.

    The file appears only once the graph passes `onnx.checker` (full check, shape inference included); any failure
    leaves nothing at `path`. `dynamic_size` makes height and width symbolic (a learned position embedding is
    resampled in the graph, as the model does; the torchscript exporter cannot, and is refused for it).
    `fusable_attention` exports the split-q/k/v layout (`hub_vit.export.fusable`) that ONNX Runtime's transformer
    optimizer fuses; with the default dynamo exporter every block fuses (S/16: 12 of 12; torchscript: 11 of 12).
    """
    import onnx

    model = float32_cpu(vision_transformer_of(model, "export_onnx"))
    _check_args(model, opset, dynamic_size, exporter)
    path = Path(path)
    was_training = model.training
    model.eval()
    spec = model.spec
    source = fusable_copy(model) if fusable_attention else model
    graph = (AttentionGraph if with_attentions else LogitsGraph)(source, with_token_means)
    names = output_names(model, with_attentions, with_token_means)
    # batch 2 so the exporter cannot specialise a dynamic batch axis to 1; a static graph takes batch 1
    dummy = torch.zeros(2 if dynamic_batch else 1, spec.in_chans, *spec.img_size, dtype=torch.float32)
    try:
        with atomic_path(path, suffix=".onnx") as tmp, torch.no_grad():
            _export_to(graph, dummy, tmp, names, opset, dynamic_batch, dynamic_size, spec.patch_size, exporter)
            try:
                onnx.checker.check_model(str(tmp), full_check=True)
            except onnx.checker.ValidationError as exc:  # e.g. an opset newer than the exporter's op library
                first = str(exc).strip().splitlines()[0]
                raise ValueError(f"the graph exported at opset {opset} is not valid ONNX ({first}); opset "
                                 f"{MIN_OPSET} (the default) and the next few are tested, use one of them") from None
    finally:
        model.train(was_training)
    return path


def logits_subgraph(attention_graph: str | Path, path: str | Path) -> Path:
    """Write the `pixel_values` -> `logits` (+ `token_means`, where the attention graph has them) part of an attention
    graph (`with_attentions=True`) to `path`: the same nodes, less those that only stack the attention outputs, so it
    computes the logits of the plain export with one export instead of two (the server serves both). Atomic, checked
    like `export_onnx`."""
    import onnx
    from onnx.utils import Extractor

    proto = onnx.load(str(attention_graph))
    names = [t.name for t in proto.graph.output]
    if LOGITS not in names:
        raise ValueError(f"{attention_graph}: the graph writes {names}, not {LOGITS!r}")
    part = Extractor(proto).extract_model([INPUT_NAME], [LOGITS] + [TOKEN_MEANS] * (TOKEN_MEANS in names))
    with atomic_path(Path(path), suffix=".onnx") as tmp:
        onnx.save(part, str(tmp))
        onnx.checker.check_model(str(tmp), full_check=True)
    return Path(path)


__all__ = ["ATTENTIONS", "EXPORTERS", "INPUT_NAME", "LOGITS", "POOL_ATTENTION", "TOKEN_MEANS", "export_onnx",
           "graph_opset", "logits_subgraph", "output_names", "quiet_loggers"]
