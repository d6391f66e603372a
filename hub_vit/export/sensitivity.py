"""Which layers static int8 keeps in float: a per-layer sensitivity search judged by the verification criterion.

NNCF quantises every MatMul / Convolution of the graph (`openvino_build.NNCF_SETTINGS`: per-channel weights,
symmetric activations; with or without SmoothQuant, as `openvino_build.build_static_int8` decides). Where the result
misses the criterion's bounds on the calibration images (`margin`: the worst image's distance to a bound, as a fraction
of the bound's slack), the search measures what each quantised layer adds to the error (`profile`: the relative error
of its output against fp32, less that of its inputs, on the same images), keeps the worst few in float, quantises
again and measures again, until the margin reaches `target` or `max_rounds` are spent. It returns the model and the
layers it kept in float, which the variant's settings, the export report and the served manifest record.

Why not NNCF's `quantize_with_accuracy_control`: it ranks every quantised operation by compiling and running the
model once per operation (87 operations for SimpleViT-Ti/16: more than 15 minutes on 2 busy cores, still ranking),
where one profile costs two runs; the result is the same kind (the few sensitive layers in float).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hub_vit.export.criterion import MAX_REL_ERROR, MIN_COSINE, MIN_TOP1_AGREEMENT, per_image
from hub_vit.openvino_runtime import core, output_name

QUANTIZED = ("MatMul", "Convolution")
_PASS_THROUGH = ("FakeQuantize", "Convert", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Multiply")
TARGET = 0.3  # the calibration images' worst margin must keep 30 % of the slack: the verification images are others
MAX_ROUNDS = 6
PROFILE_IMAGES = 8  # the images nearest a bound, profiled in one batch
CANDIDATES = 6  # layers tried per round, in the profile's order
_PROBE = "sensitivity:"  # the name given to a profiled node's output


def per_image_margins(reference: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> np.ndarray:
    """(N,) each image's distance to the nearest of the criterion's bounds (logits' and pre-logits' cosine and
    relative error), as a fraction of that bound's slack: 1 = equal to fp32, 0 = on the bound, < 0 = outside."""
    worst = np.full(len(reference["logits"]), np.inf)
    for name in ("logits", "pre_logits"):
        cos, rel = per_image(reference[name], got[name])
        worst = np.minimum(worst, (cos - MIN_COSINE) / (1 - MIN_COSINE))
        worst = np.minimum(worst, (MAX_REL_ERROR - rel) / MAX_REL_ERROR)
    return worst


def margin(reference: dict[str, np.ndarray], got: dict[str, np.ndarray], top1_counts: np.ndarray | None,
           judged: np.ndarray | None = None) -> float:
    """The worst `per_image_margins` over the images the bounds judge (`judged`, a mask; None: every image), and
    the top-1 agreement's over the images whose top-1 counts, as a fraction of its slack."""
    worst = float(_judged_margins(reference, got, judged).min())
    if top1_counts is not None and top1_counts.any():
        agree = float((reference["logits"][top1_counts].argmax(-1) == got["logits"][top1_counts].argmax(-1)).mean())
        worst = min(worst, (agree - MIN_TOP1_AGREEMENT) / (1 - MIN_TOP1_AGREEMENT))
    return worst


def _judged_margins(reference: dict[str, np.ndarray], got: dict[str, np.ndarray], judged: np.ndarray | None
                    ) -> np.ndarray:
    """(N,) `per_image_margins`, +inf for the images the bounds do not judge (reported only, as in the verification).
    """
    margins = per_image_margins(reference, got)
    return margins if judged is None else np.where(judged, margins, np.inf)


def quantized_layers(model: Any) -> list[str]:
    """The MatMul / Convolution nodes of a quantised model that read a FakeQuantize (what NNCF quantised)."""
    return [op.get_friendly_name() for op in model.get_ordered_ops()
            if op.get_type_name() in QUANTIZED and any(_producer(op, i).get_type_name() == "FakeQuantize"
                                                       for i in range(op.get_input_size()))]


def _producer(op: Any, port: int) -> Any:
    return op.input_value(port).get_node()


def _source(op: Any, port: int) -> Any:
    """The node whose output reaches `op`'s input `port` through quantisers and layout ops (what it reads in fp32)."""
    node = _producer(op, port)
    while node.get_type_name() in _PASS_THROUGH and node.get_input_size():
        node = node.input_value(0).get_node()
    return node


def _compiled(model: Any, nodes: list[str], config: dict[str, Any]) -> tuple[Any, list[Any]]:
    """`model` compiled with the outputs of `nodes` added; returns it and the ports of those outputs, in the order of
    `nodes` (found by a name given to each: the order of a compiled model's outputs is not promised)."""
    model = model.clone()
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    for name in nodes:
        ops[name].output(0).get_tensor().add_names({f"{_PROBE}{name}"})
    if nodes:
        model.add_outputs([f"{_PROBE}{name}" for name in nodes])
    compiled = core().compile_model(model, "CPU", config)
    return compiled, [compiled.output(f"{_PROBE}{name}") for name in nodes]


def run(model: Any, images: np.ndarray, config: dict[str, Any], batch: int = 8) -> dict[str, np.ndarray]:
    """{output name: (N, ...)} of `model` on `images`, in batches."""
    compiled, _ = _compiled(model, [], config)
    request = compiled.create_infer_request()
    ports = {output_name(port): port for port in compiled.outputs}  # `get_any_name` may give another name
    found: dict[str, list[np.ndarray]] = {name: [] for name in ports}
    for start in range(0, len(images), batch):
        results = request.infer([images[start:start + batch]])
        for name, port in ports.items():
            found[name].append(np.array(results[port]))
    return {name: np.concatenate(parts) for name, parts in found.items()}


def profile(fp32: Any, quantized: Any, images: np.ndarray, config: dict[str, Any]) -> dict[str, float]:
    """What each quantised layer adds to the error on `images` (one batch): the worst relative error of its output
    against the fp32 model's, less the worst of the layers it reads (the error it was handed)."""
    layers = quantized_layers(quantized)
    ops = {op.get_friendly_name(): op for op in quantized.get_ordered_ops()}
    fp32_names = {op.get_friendly_name() for op in fp32.get_ordered_ops()}
    reads = {name: [_source(ops[name], i).get_friendly_name() for i in range(ops[name].get_input_size())]
             for name in layers}
    inputs = {src for srcs in reads.values() for src in srcs
              if src in ops and ops[src].get_type_name() not in ("Constant", "Parameter")}
    watched = [name for name in dict.fromkeys([*layers, *sorted(inputs)]) if name in fp32_names]
    results = []
    for model, settings in ((fp32, {**config, "INFERENCE_PRECISION_HINT": "f32"}), (quantized, config)):
        compiled, ports = _compiled(model, watched, settings)
        found = compiled.create_infer_request().infer([images])
        results.append([np.array(found[port]).reshape(len(images), -1) for port in ports])
    error = {name: float(per_image(ref, got)[1].max()) for name, ref, got in zip(watched, *results, strict=True)}
    return {name: error.get(name, 0.0) - max((error.get(src, 0.0) for src in reads[name]), default=0.0)
            for name in layers if name in error}


def without_activation_quantizers(model: Any, layers: list[str]) -> Any:
    """A copy of the quantised `model` whose `layers` read their activations unquantised (each input that a
    FakeQuantize feeds is fed by that quantiser's own input instead; the other readers of a shared quantiser keep it).
    Their int8 weights stay: per-channel weights cost little, per-tensor activations most, so this tells, without
    quantising again, what keeping a layer in float would give."""
    model = model.clone()
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    for name in layers:
        op = ops[name]
        for port in range(op.get_input_size()):
            node = _producer(op, port)
            if node.get_type_name() == "FakeQuantize":
                op.input(port).replace_source_output(node.input_value(0))
    model.validate_nodes_and_infer_types()
    return model


@dataclass
class SearchResult:
    model: Any
    kept_in_float: list[str]
    margin: float
    rounds: list[dict[str, Any]] = field(default_factory=list)  # per round: layers kept in float, margin
    start: int = 0  # which of the quantisers the search went on with
    starts: list[float] = field(default_factory=list)  # the margin of the model each one quantised whole, as tried


def search(fp32: Any, quantizers: Sequence[Callable[[list[str]], Any]], calibration: np.ndarray,
           top1_counts: np.ndarray | None, config: dict[str, Any], *, target: float = TARGET,
           max_rounds: int = MAX_ROUNDS, judged: np.ndarray | None = None) -> SearchResult:
    """Quantise `fp32` (an OpenVINO model; each of `quantizers`, `quantize(kept)`, quantises it with `kept` left in
    float, in its own way), judge the result on `calibration` against the fp32 model (`margin`), and keep the most
    sensitive layers in float until the margin reaches `target`. The first round quantises the whole model with each
    quantiser in turn until one reaches the target; the search goes on with the one whose model had the highest
    margin (a tie: the earlier). Each further round profiles the images nearest a bound, tries the `CANDIDATES`
    layers that add the most error (and the last layers, which no normalisation follows) with their activations
    unquantised (`without_activation_quantizers`: no new quantisation), keeps the ones that help most, greedily,
    until the margin would reach the target, and quantises once with them in float. `config`: the compile settings
    the variant runs with. `judged`: the mask of the calibration images the bounds judge (the model's own, where it
    has some: the verification judges a static int8 variant there alone); None: every image. Returns the best model
    found."""
    reference = run(fp32, calibration, {**config, "INFERENCE_PRECISION_HINT": "f32"})

    def judged_margin(model: Any) -> tuple[float, dict[str, np.ndarray]]:
        got = run(model, calibration, config)
        return margin(reference, got, top1_counts, judged), got

    starts: list[float] = []
    first: tuple[int, float, Any, dict[str, np.ndarray]] | None = None
    for index, quantize in enumerate(quantizers):
        model = quantize([])
        found, got = judged_margin(model)
        starts.append(round(found, 4))
        if first is None or found > first[1]:
            first = (index, found, model, got)
        if found >= target:
            break
    assert first is not None, "search needs a quantiser"
    start, found, model, got = first
    kept: list[str] = []
    rounds = [{"kept_in_float": [], "margin": round(found, 4)}]
    best = SearchResult(model, [], found, rounds, start, starts)
    while found < target and len(rounds) < max_rounds:
        chosen = _more_in_float(fp32, model, calibration, reference, got, kept, found, target, config, judged_margin,
                                judged)
        if not chosen:
            break
        kept += chosen
        model = quantizers[start](kept)
        found, got = judged_margin(model)
        rounds.append({"kept_in_float": list(kept), "margin": round(found, 4)})
        if found > best.margin:
            best = SearchResult(model, list(kept), found, rounds, start, starts)
    return best


def _more_in_float(fp32: Any, model: Any, calibration: np.ndarray, reference: dict[str, np.ndarray],
                   got: dict[str, np.ndarray], kept: list[str], found: float, target: float, config: dict[str, Any],
                   judged_margin: Callable[[Any], tuple[float, dict[str, np.ndarray]]], judged: np.ndarray | None
                   ) -> list[str]:
    """The layers to keep in float next: greedily, the candidate whose unquantised activations raise the margin most,
    until it would reach `target` or none helps (then the profile's first, so a round always adds one)."""
    worst = np.sort(np.argsort(_judged_margins(reference, got, judged))[:PROFILE_IMAGES])
    added = profile(fp32, model, calibration[worst], config)
    layers = quantized_layers(model)
    ranked = [name for name, _ in sorted(added.items(), key=lambda item: -item[1]) if name not in kept]
    candidates = list(dict.fromkeys([*ranked[:CANDIDATES], *[name for name in layers[-2:] if name not in kept]]))
    chosen: list[str] = []
    while candidates:
        tried = {name: judged_margin(without_activation_quantizers(model, [*chosen, name]))[0]
                 for name in candidates}
        name = max(tried, key=tried.get)
        if tried[name] <= found:
            break
        chosen.append(name)
        candidates.remove(name)
        found = tried[name]
        if found >= target:
            break
    return chosen or ranked[:1]


__all__ = ["CANDIDATES", "MAX_ROUNDS", "TARGET", "SearchResult", "margin", "per_image_margins", "profile",
           "quantized_layers", "run", "search", "without_activation_quantizers"]
