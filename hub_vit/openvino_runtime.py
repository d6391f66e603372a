"""The session that runs an OpenVINO variant (`hub_vit.export.openvino_build` builds them; `hub_vit.export.registry`
declares them): the same `OpenVINOSession` verifies a variant at export, times it in the CPU flavour's selection and
serves it.

A variant is three files written together: the IR pair (`<name>.xml` + `<name>.bin`) and `<name>.json`, the compile
settings it was verified with (and what its build decided, e.g. the layers kept in float). The served CPU classifier
imports this file (copied beside its model.py by `hub-vit repository`), so the module imports nothing but numpy at
the top (OpenVINO inside the session).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_CORE: list[Any] = []  # the one Core, once made
_CORE_LOCK = threading.Lock()


def core() -> Any:
    """The process's one `openvino.Core`, made on first use and kept for the life of the process: every OpenVINO model
    hub-vit compiles goes through it.

    One, because each Core loads a CPU plugin of its own, and OpenVINO's CPU plugin (2026.4) gives the thread that
    loads it an alternate signal stack, putting back the one it found when the Core (with every model compiled by it)
    is freed. Two Cores freed in the order they were made leave that thread's alternate stack on the first one's
    freed memory, and the next signal handled in Python on it (CPython's handlers run with SA_ONSTACK) ends the
    process with SIGSEGV: the served classifier holds two sessions, the export verifies one per variant, the
    sensitivity search compiles dozens."""
    with _CORE_LOCK:
        if not _CORE:
            import openvino as ov

            _CORE.append(ov.Core())
        return _CORE[0]


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
    `get_providers()`. `threads`: OpenVINO's inference threads (None: its default, every core).

    `attentions`: also output every attention block's probabilities, as the attention graph does (`attentions`
    (B, depth, heads, N, N), and a MAP model's `pool_attention` (B, heads, 1, N)): the softmax outputs of this same
    IR, so the served CPU classifier explains a request at the precision its plain answers have (one run)."""

    def __init__(self, xml: str | Path, threads: int | None = None, *, attentions: bool = False) -> None:
        import openvino as ov

        settings = json.loads(Path(xml).with_suffix(".json").read_text(encoding="utf-8"))
        # unpinned: several instances of the served model, each with its share of the cores, would otherwise pin
        # their threads to the same first cores
        config: dict[str, Any] = {"ENABLE_CPU_PINNING": False, **settings.get("compile", {})}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        shared = core()
        model = shared.read_model(str(xml))
        self.probabilities = _softmax_outputs(model) if attentions else 0
        self.compiled = shared.compile_model(model, "CPU", config)
        self.input_names = [port.get_any_name() for port in self.compiled.inputs]
        plain = len(self.compiled.outputs) - self.probabilities  # the attention outputs come last
        self.names = [output_name(output) for output in self.compiled.outputs[:plain]]
        self.pooled = self._pooled()
        if attentions:
            self.names += ["attentions"] + ["pool_attention"] * self.pooled
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # an ov.Type: f32, bf16, f16
        self.precision = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        wanted = str(config.get("INFERENCE_PRECISION_HINT", self.precision))
        if self.precision != wanted:  # a CPU the plugin cannot run that precision on: it falls back silently
            raise RuntimeError(f"OpenVINO {ov.__version__} runs this model at {self.precision} on this CPU, not at "
                               f"{wanted}")
        self.request = self.compiled.create_infer_request()

    def _pooled(self) -> bool:
        """Whether the last softmax is a MAP probe's: one query, (B, heads, 1, N)."""
        shape = self.compiled.outputs[-1].get_partial_shape()
        return self.probabilities > 0 and shape.rank.get_length() == 4 and shape[2].is_static and \
            shape[2].get_length() == 1

    def run(self, _outputs: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.request.infer(list(feeds.values()))
        found = [np.array(results[output]) for output in self.compiled.outputs]  # copies: the request reuses them
        if not self.probabilities:
            return found
        plain, probabilities = found[:-self.probabilities], found[-self.probabilities:]
        pool = [probabilities.pop()] if self.pooled else []
        return [*plain, np.stack(probabilities, axis=1), *pool]  # blocks: (B, depth, heads, N, N)

    def get_inputs(self) -> list[Any]:
        return [_Named(name) for name in self.input_names]

    def get_outputs(self) -> list[Any]:
        return [_Named(name) for name in self.names]

    def get_providers(self) -> list[str]:
        return [f"OpenVINO CPU ({self.precision})"]


def output_name(port: Any) -> str:
    """An output's name: the graph's contract name where the tensor has several (OpenVINO folds an Identity into its
    input, so `pre_logits` and the head's input are one tensor with both names, e.g. `{'mean', 'pre_logits'}`), else
    any of them."""
    names = port.get_names()
    return next((name for name in ("logits", "pre_logits") if name in names), port.get_any_name())


def _softmax_outputs(model: Any) -> int:
    """Add every Softmax of `model` (the attention blocks' in order, then a MAP probe's) to its outputs; returns how
    many. Each stays a node of its own in this compiled model (an output is not fused away)."""
    softmaxes = [op for op in model.get_ordered_ops() if op.get_type_name() == "Softmax"]
    if not softmaxes:
        raise ValueError("this OpenVINO model has no Softmax: its attention probabilities cannot be read")
    model.add_outputs([op.output(0) for op in softmaxes])
    return len(softmaxes)


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


__all__ = ["OpenVINOSession", "core", "ir_files", "output_name", "served_model"]
