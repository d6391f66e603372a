"""Every export variant, declared once and registered by name, as timm registers its models.

A declaration says what the variant is (`Variant`: runtime, precision, a one-line summary), what a host needs to
build and run it at its precision (`needs`), what makes it pay off there (`pays_with`: the units without which it is
emulated or no faster than fp32), whether it reads the calibration images, whether `hub-vit export onnx` writes it by
default, whether the CPU flavour may serve it, and how it is built: the decorated function turns the verified fp32
graph into the variant's graph (`BuildJob` -> `Built`). `hub_vit.export.variants.export_variants` loops over the
requested ones; the command line's choices and help (`hub-vit export onnx --variant`, `--cpu-variant` of `serve` and
`repository`) and the CPU flavour's candidates (`server/repository/cpu_variant.py`) are read from here.

Light on purpose: `hub-vit --help` imports this module (no torch, onnx or OpenVINO until a variant is built).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub_vit.host import Host, this_host

if TYPE_CHECKING:
    import numpy as np

    from hub_vit.variants import ViTSpec

RUNTIMES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}


@dataclass(frozen=True)
class Need:
    """Something a host has or lacks: `what` names it in a sentence ("this host has no ...")."""

    what: str
    met: Callable[[Host], bool]
    why: Callable[[Host], str] | None = None  # a better sentence than "no <what>", where the host can say more

    def lack(self, host: Host) -> str:
        return self.why(host) if self.why else f"this host has no {self.what}"


BF16_UNITS = Need("bf16 units (AMX-BF16 or AVX512-BF16)", lambda host: host.bf16_units)
INT8_UNITS = Need("int8 dot-product units (VNNI or AMX-INT8)", lambda host: host.int8_units)
GPU_PROVIDER = Need("GPU execution provider in onnxruntime (CUDA / TensorRT)", lambda host: host.gpu_provider)
OPENVINO = Need("OpenVINO", lambda host: host.openvino_missing is None, lambda host: str(host.openvino_missing))
ORT_BF16_MATMUL = Need("bfloat16 MatMul kernel in onnxruntime", lambda host: host.ort_bf16_matmul,
                       lambda host: "onnxruntime has no bfloat16 MatMul kernel on this host's execution providers "
                                    f"({', '.join(host.providers) or 'none'})")


@dataclass(frozen=True)
class BuildJob:
    """What a variant is built from: the fp32 graph that also writes `pre_logits` (every variant carries it through
    to its verification), the path its graph goes to (`.onnx`, or `.xml` for OpenVINO IR), the model's spec, and the
    calibration images (N, C, H, W) float32, with the mask of those whose top-1 class counts (in-domain images, or
    photos of a trained model; None: none does) and the mask of the model's own images among them (None: it has none;
    then the criterion's bounds judge every image, else those alone: `hub_vit.export.criterion`), for the variants
    that read them."""

    fp32: Path
    out: Path
    spec: ViTSpec
    calibration: np.ndarray
    top1_counts: np.ndarray | None = None
    own_mask: np.ndarray | None = None


@dataclass
class Built:
    """A variant's graph, its fused-op counts, and what its build decided (e.g. the layers kept in float), which
    the export report and the served manifest record."""

    path: Path
    fused_ops: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    name: str
    runtime: str  # a key of RUNTIMES
    precision: str  # fp32 | fp16 | bf16 | int8
    summary: str
    build: Callable[[BuildJob], Built]
    needs: tuple[Need, ...] = ()  # without these it is not built (named or not)
    pays_with: tuple[Need, ...] = ()  # without these `all` and `auto` leave it out (naming it still builds it)
    calibrated: bool = False
    default: bool = False  # written by `hub-vit export onnx` without --variant
    cpu: bool = True  # a candidate of the served CPU flavour

    def missing(self, host: Host | None = None) -> list[str]:
        """Why `host` (default: this one) cannot build this variant; [] when it can."""
        host = host or this_host()
        return [need.lack(host) for need in self.needs if not need.met(host)]

    def unpaid(self, host: Host | None = None) -> list[str]:
        """Why it is not worth building on `host` (besides `missing`): the units it would be emulated without."""
        host = host or this_host()
        return [need.lack(host) for need in self.pays_with if not need.met(host)]

    @property
    def suffix(self) -> str:
        """The graph file's suffix: `xml` for OpenVINO IR (its `.bin` beside it), else `onnx`."""
        return "xml" if self.runtime == "openvino" else "onnx"

    def file_name(self, stem: str) -> str:
        """`<stem>.onnx` for fp32, `<stem>.<name>.xml` for OpenVINO IR, else `<stem>.<name>.onnx`."""
        if self.name == "fp32":
            return f"{stem}.onnx"
        return f"{stem}.{self.name}.{self.suffix}"


_REGISTRY: dict[str, Variant] = {}


def register_variant(name: str, *, runtime: str, precision: str, summary: str, needs: Iterable[Need] = (),
                     pays_with: Iterable[Need] = (), calibrated: bool = False, default: bool = False,
                     cpu: bool = True) -> Callable[[Callable[[BuildJob], Built]], Callable[[BuildJob], Built]]:
    """Decorator: register the decorated build function as variant `name`."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; valid: {', '.join(RUNTIMES)}")

    def register(build: Callable[[BuildJob], Built]) -> Callable[[BuildJob], Built]:
        if name in _REGISTRY:
            raise ValueError(f"variant {name!r} is registered twice")
        _REGISTRY[name] = Variant(name, runtime, precision, summary, build, tuple(needs), tuple(pays_with),
                                  calibrated, default, cpu)
        return build

    return register


def names(*, cpu: bool | None = None, default: bool | None = None) -> tuple[str, ...]:
    """The registered names in declaration order; `cpu` / `default`: only those the CPU flavour serves / export writes
    by default."""
    return tuple(v.name for v in _REGISTRY.values()
                 if (cpu is None or v.cpu == cpu) and (default is None or v.default == default))


def get(name: str) -> Variant:
    """The variant called `name`; ValueError listing the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; valid choices: {', '.join(_REGISTRY)}") from None


def check_buildable(wanted: Iterable[str], host: Host | None = None, *, flag: str = "--variant",
                    cpu: bool | None = None) -> None:
    """ValueError naming each of the `wanted` variants that `host` (default: this one) cannot build, why, and what it
    builds (of the `cpu` ones, if given): said before any export, not as a verification failure after it."""
    host = host or this_host()
    lacking = {name: get(name).missing(host) for name in wanted}
    lacking = {name: why for name, why in lacking.items() if why}
    if lacking:
        builds = [name for name in names(cpu=cpu) if not get(name).missing(host)]
        raise ValueError("; ".join(f"{flag} {name} cannot be built on this host: {'; '.join(why)}"
                                   for name, why in lacking.items()) + f" (this host builds {', '.join(builds)})")


def worth_building(host: Host | None = None, *, cpu: bool | None = None) -> tuple[list[str], dict[str, str]]:
    """(the variants `host` can build and that pay off there, {every other variant: why not}), in declaration
    order: what `--variant all` and `--cpu-variant auto` try."""
    host = host or this_host()
    chosen, left_out = [], {}
    for variant in _REGISTRY.values():
        if cpu is not None and variant.cpu != cpu:
            continue
        missing, unpaid = variant.missing(host), variant.unpaid(host)
        if missing:
            left_out[variant.name] = "; ".join(missing)
        elif unpaid:
            left_out[variant.name] = f"{'; '.join(unpaid)}: not worth building here (it is built when named)"
        else:
            chosen.append(variant.name)
    return chosen, left_out


def help_text(*, cpu: bool = False) -> str:
    """The variants as the command line lists them: `name` (runtime, precision), ...; `cpu`: the CPU flavour's."""
    return ", ".join(f"{v.name} ({RUNTIMES[v.runtime]} {v.precision})" for v in _REGISTRY.values()
                     if v.cpu or not cpu)


# -- the variants ----------------------------------------------------------------------------------------------------
# ONNX Runtime graphs (hub_vit.export.quantize) and OpenVINO IR (hub_vit.export.openvino_build), in the order the
# command line lists them. Imports inside the builds: the list above must stay cheap to read.

@register_variant("fp32", runtime="onnxruntime", precision="fp32", default=True,
                  summary="the exported graph, float32")
def _fp32(job: BuildJob) -> Built:
    from hub_vit.export.quantize import FUSED_OPS, op_counts

    counts = op_counts(job.fp32)
    return Built(job.fp32, {op: counts.get(op, 0) for op in FUSED_OPS})


@register_variant("optimized", runtime="onnxruntime", precision="fp32", default=True,
                  summary="ONNX Runtime's transformer fusions (Attention, SkipLayerNorm, Gelu), float32")
def _optimized(job: BuildJob) -> Built:
    from hub_vit.export.quantize import optimize_transformer

    return Built(job.out, optimize_transformer(job.fp32, job.out, job.spec))


@register_variant("fp16", runtime="onnxruntime", precision="fp16", pays_with=(GPU_PROVIDER,), cpu=False,
                  summary="the fused graph in float16, float32 inputs and outputs (for GPUs)")
def _fp16(job: BuildJob) -> Built:
    from hub_vit.export.quantize import optimize_transformer

    return Built(job.out, optimize_transformer(job.fp32, job.out, job.spec, float16=True))


def _int8_dynamic(job: BuildJob, signed_weights: bool) -> Built:
    """On the fused graph: ONNX Runtime quantises its Attention ops too (QAttention)."""
    from hub_vit.export.quantize import optimize_transformer, quantize_int8_dynamic

    optimized = job.out.with_name(f"{job.out.stem}.fused.onnx")
    optimize_transformer(job.fp32, optimized, job.spec)
    quantize_int8_dynamic(optimized, job.out, job.out.parent, signed_weights=signed_weights)
    optimized.unlink()
    return Built(job.out)


@register_variant("int8-dynamic", runtime="onnxruntime", precision="int8", default=True,
                  summary="8-bit unsigned weights, activations quantised at run time (the same integers on any x86)")
def _int8_dynamic_u8(job: BuildJob) -> Built:
    return _int8_dynamic(job, signed_weights=False)


@register_variant("int8-dynamic-s8", runtime="onnxruntime", precision="int8", pays_with=(INT8_UNITS,),
                  summary="7-bit signed weights, activations at run time: ONNX Runtime's VNNI / AMX-INT8 kernels")
def _int8_dynamic_s8(job: BuildJob) -> Built:
    return _int8_dynamic(job, signed_weights=True)


@register_variant("int8-static", runtime="onnxruntime", precision="int8", calibrated=True, default=True,
                  summary="QDQ int8 (7-bit weights), activation ranges calibrated; softmax and LayerNorm in float")
def _int8_static(job: BuildJob) -> Built:
    from hub_vit.export.quantize import quantize_int8_static

    quantize_int8_static(job.fp32, job.out, job.calibration, job.out.parent)
    return Built(job.out)


@register_variant("bf16", runtime="onnxruntime", precision="bf16", needs=(ORT_BF16_MATMUL,), pays_with=(BF16_UNITS,),
                  summary="bf16 MatMul / Gemm, the rest float32")
def _bf16(job: BuildJob) -> Built:
    from hub_vit.export.quantize import convert_bf16

    convert_bf16(job.fp32, job.out)
    return Built(job.out)


@register_variant("openvino-fp32", runtime="openvino", precision="fp32", needs=(OPENVINO,),
                  summary="the fp32 graph as OpenVINO IR, run in f32")
def _openvino_fp32(job: BuildJob) -> Built:
    from hub_vit.export.openvino_build import build_plain

    return Built(build_plain(job.fp32, job.out, "f32"))


@register_variant("openvino-bf16", runtime="openvino", precision="bf16", needs=(OPENVINO,), pays_with=(BF16_UNITS,),
                  summary="the fp32 graph run in bf16 by OpenVINO (AMX-BF16 / AVX512-BF16; emulated elsewhere)")
def _openvino_bf16(job: BuildJob) -> Built:
    from hub_vit.export.openvino_build import build_plain

    return Built(build_plain(job.fp32, job.out, "bf16"))


# openvino-int8's MatMuls are quantised for the CPU plugin's signed VNNI / AMX kernels (openvino_build.NNCF_SETTINGS).
# Without those units the plugin's AVX2 path is both slow and, on a Zen 3, outside the bounds: the shipped model's
# search kept 18 layers in float (1 to 5 on an AMX host, docs/export.md), and a held-out digit still fell to cosine
# 0.988.
@register_variant("openvino-int8", runtime="openvino", precision="int8", needs=(OPENVINO,), pays_with=(INT8_UNITS,),
                  calibrated=True, summary="NNCF static int8, the layers the criterion finds sensitive kept in float")
def _openvino_int8(job: BuildJob) -> Built:
    from hub_vit.export.openvino_build import build_static_int8

    path, decided = build_static_int8(job.fp32, job.out, job.calibration, job.top1_counts,
                                      job.own_mask)
    return Built(path, settings=decided)


@register_variant("openvino-int8-dynamic", runtime="openvino", precision="int8", needs=(OPENVINO,),
                  summary="int8 weights (NNCF), activations quantised per token at run time by OpenVINO")
def _openvino_int8_dynamic(job: BuildJob) -> Built:
    from hub_vit.export.openvino_build import build_dynamic_int8

    path, decided = build_dynamic_int8(job.fp32, job.out)
    return Built(path, settings=decided)


__all__ = ["BF16_UNITS", "GPU_PROVIDER", "INT8_UNITS", "OPENVINO", "ORT_BF16_MATMUL", "RUNTIMES", "BuildJob", "Built",
           "Need", "Variant", "check_buildable", "get", "help_text", "names", "register_variant",
           "worth_building"]
