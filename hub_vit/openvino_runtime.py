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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


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


__all__ = ["OpenVINOSession", "ir_files", "served_model"]
