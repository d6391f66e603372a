"""What this machine offers the exported variants (`hub_vit.export.registry`): the CPU's vector and matrix-unit flags,
whether OpenVINO and NNCF are installed, and ONNX Runtime's execution providers and bf16 kernels; and how to install
one of hub-vit's extras where something is missing (`install_extra`).

Each fact is read the first time it is asked for (ONNX Runtime is imported only for the provider facts), so the
command line can list the variants without paying for any of it. `Host(flags=...)` describes another machine, as the
tests do for an AMX host.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path

BF16_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")  # bf16 matrix / dot-product units
INT8_FLAGS: tuple[str, ...] = ("avx512_vnni", "avx_vnni", "amx_int8")  # int8 dot-product units
_REPORTED_FLAGS = ("avx2", "fma", "avx512", "avx_vnni", "amx")  # prefixes of the flags recorded


# The top-level modules (as `import` names them) that only one of hub-vit's extras brings (pyproject.toml,
# [project.optional-dependencies]); a test checks each against the extra's requirements. protobuf ("google") comes
# with tritonclient and onnx; the commands that fail without it are serve's (the repository's configs).
EXTRA_MODULES = {
    "tritonclient": "serve", "geventhttpclient": "serve", "grpc": "serve", "google": "serve", "httptools": "serve",
    "uvloop": "serve", "pytriton": "serve", "openvino": "serve", "nncf": "serve",
    "onnx": "onnx", "onnxruntime": "onnx", "onnxscript": "onnx", "skimage": "onnx",
    "gradio": "demo",
}


def module_not_found(err: BaseException | None) -> ModuleNotFoundError | None:
    """The ModuleNotFoundError behind `err`: itself, or its cause (tritonclient raises its own RuntimeError for a
    protocol installed without its extra, caused by the missing geventhttpclient)."""
    while err is not None and not isinstance(err, ModuleNotFoundError):
        err = err.__cause__
    return err


def missing_extra(err: BaseException) -> str | None:
    """The extra whose module `err` did not find; None for a module no extra brings (a bug, or a broken install: the
    traceback stands)."""
    found = module_not_found(err)
    return EXTRA_MODULES.get((found.name or "").split(".")[0]) if found is not None else None


def install_extra(extra: str) -> str:
    """How to install hub-vit's optional `extra` (serve, demo, onnx, bench), for every message that asks for one.
    hub-vit is not on PyPI, so `pip install 'hub-vit[serve]'` finds nothing: extras come from the clone (or the
    wheel built there)."""
    return f"pip install '.[{extra}]' in hub-vit's clone, or the wheel built there with [{extra}]"


def isa_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
    """The CPU's vector / matrix-unit flags (avx2, avx512*, avx_vnni, amx*), sorted; [] where unreadable."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return sorted({f for f in line.split() if f.startswith(_REPORTED_FLAGS)})


def openvino_missing() -> str | None:
    """None when OpenVINO and NNCF are installed, else which is not, with the install command. Found, not imported:
    NNCF's import alone probes every backend it knows (torch included)."""
    for name in ("openvino", "nncf"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed ({install_extra('serve')})"
    return None


class Host:
    """One machine's facts, each read once. `flags`: its ISA flags (default: this CPU's, `isa_flags`)."""

    def __init__(self, flags: Sequence[str] | None = None) -> None:
        self._flags = None if flags is None else sorted(flags)

    @functools.cached_property
    def flags(self) -> list[str]:
        return isa_flags() if self._flags is None else self._flags

    @property
    def bf16_units(self) -> bool:
        return any(f in self.flags for f in BF16_FLAGS)

    @property
    def int8_units(self) -> bool:
        return any(f in self.flags for f in INT8_FLAGS)

    @functools.cached_property
    def openvino_missing(self) -> str | None:
        return openvino_missing()

    @functools.cached_property
    def providers(self) -> list[str]:
        """ONNX Runtime's execution providers ([] without onnxruntime)."""
        try:
            import onnxruntime as ort
        except ImportError:
            return []
        return list(ort.get_available_providers())

    @property
    def gpu_provider(self) -> bool:
        return any(p in self.providers for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider"))

    @functools.cached_property
    def ort_bf16_matmul(self) -> bool:
        """Whether ONNX Runtime runs a bfloat16 MatMul on one of its providers: its x86 CPU provider has no such
        kernel (1.32), so a bf16 graph cannot run there whatever the CPU's units."""
        try:
            import onnxruntime as ort
            from onnx import TensorProto, helper
        except ImportError:
            return False
        x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 2])
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "bf16_matmul", [x],
                                  [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 2])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        try:
            ort.InferenceSession(model.SerializeToString(), providers=self.providers)
        except Exception:  # noqa: BLE001 - NOT_IMPLEMENTED (no kernel) is the answer, not a failure
            return False
        return True


@functools.cache
def this_host() -> Host:
    """This machine (its facts read once per process)."""
    return Host()


__all__ = ["BF16_FLAGS", "INT8_FLAGS", "Host", "isa_flags", "openvino_missing", "this_host"]
