"""Export one model as several verified ONNX variants: fp32, ORT-optimized, fp16, int8 (dynamic / static), bf16;
and, for the CPU flavour's selection (`server/cpu_variant.py`), OpenVINO variants built from the fp32 graph
(`hub_vit.openvino_runtime`: OpenVINO IR, run and verified by OpenVINO's CPU plugin).

Every variant is built in a temporary folder inside the output folder, run through ONNX Runtime on the verification
set (`hub_vit.export.verify`) and staged only if it passes; a variant that fails or cannot be built is reported with
the reason and leaves no file. A JSON report (`<stem>.export.json`) records everything.

An export owns its files in the output folder: when the run is done, the files an earlier export with the same stem
wrote there (its report and graphs) are replaced as a set, so no graph of another model is left beside the new
report. Other files in the folder are never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hub_vit import openvino_runtime
from hub_vit.atomic import atomic_path
from hub_vit.export import quantize
from hub_vit.export.criterion import FP32_MAX_ABS, MAX_REL_ERROR, MIN_COSINE, MIN_TOP1_AGREEMENT, summary
from hub_vit.export.metadata import REPORT_SUFFIX, engine_info, model_metadata
from hub_vit.export.onnx_export import ATTENTIONS, Exporter, export_onnx, graph_opset, quiet_loggers
from hub_vit.export.probe import PRE_LOGITS, drop_pre_logits, expose_pre_logits
from hub_vit.export.verify import (
    check_informative,
    check_providers,
    judge,
    ort_outputs,
    ort_session,
    photo_batch,
    torch_outputs,
    verification_inputs,
)
from hub_vit.model import VisionTransformer
from hub_vit.openvino_runtime import OPENVINO_VARIANTS, OpenVINOSession

VARIANTS: tuple[str, ...] = ("fp32", "optimized", "fp16", "int8-dynamic", "int8-dynamic-s8", "int8-static", "bf16")
DEFAULT_VARIANTS: tuple[str, ...] = ("fp32", "optimized", "int8-dynamic", "int8-static")
ATTENTIONS_VARIANT = "attentions"  # `<stem>.attentions.onnx`, written with --attentions
PRECISION = {"fp32": "fp32", "optimized": "fp32", "fp16": "fp16", "int8-dynamic": "int8", "int8-dynamic-s8": "int8",
             "int8-static": "int8", "bf16": "bf16", **openvino_runtime.PRECISION}
CALIBRATED = ("int8-static", "openvino-int8")  # the variants that need the calibration set


@dataclass
class VariantOutcome:
    """What happened to one variant: written or not, why, its verification numbers and fused-op counts."""

    variant: str
    precision: str
    written: bool
    file: str | None = None
    size_bytes: int | None = None
    seconds: float = 0.0
    fused_ops: dict[str, int] = field(default_factory=dict)
    verification: dict[str, Any] | None = None
    error: str = ""


@dataclass
class ExportReport:
    """The JSON written next to the exports."""

    source: dict[str, Any]
    out_dir: str
    settings: dict[str, Any]
    environment: dict[str, Any]
    variants: list[VariantOutcome]
    report_file: str = ""
    model: dict[str, Any] = field(default_factory=dict)  # labels + eval transform, for serving (export.metadata)
    removed: list[str] = field(default_factory=list)  # graphs of the earlier export here that this one did not rewrite
    stale_engines: list[str] = field(default_factory=list)  # TensorRT engines here built from the earlier graphs

    def outcome(self, variant: str) -> VariantOutcome:
        for o in self.variants:
            if o.variant == variant:
                return o
        raise KeyError(f"variant {variant!r} was not requested; requested: {[o.variant for o in self.variants]}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_variants(variants: Sequence[str], allowed: Sequence[str] = VARIANTS) -> list[str]:
    """Validate the requested variant names (before anything is written); keeps order, drops duplicates.
    `allowed`: the ONNX variants (`hub-vit export onnx`), or those plus the OpenVINO ones (the CPU flavour)."""
    if isinstance(variants, str):
        variants = [variants]
    unknown = [v for v in variants if v not in allowed]
    if unknown:
        raise ValueError(f"unsupported precision/variant {', '.join(map(repr, unknown))}; "
                         f"valid choices: {', '.join(allowed)}")
    if not variants:
        raise ValueError(f"no variant requested; valid choices: {', '.join(allowed)}")
    return list(dict.fromkeys(variants))


def environment(providers: Sequence[str] | None = None) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort
    import torch

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__,
            "available_providers": ort.get_available_providers(), "requested_providers": list(providers or []),
            "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}


def ort_version() -> str:
    import onnxruntime as ort

    return ort.__version__


def _writable_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out_dir, prefix=".probe-", delete=True)
        probe.close()
    except OSError as exc:
        raise PermissionError(f"cannot write to output folder {str(out_dir)!r}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def _removed_if_left_empty(folder: Path, created: bool) -> Iterator[None]:
    try:
        yield
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise


def calibration_images(model: VisionTransformer, count: int, n_random: int, n_photos: int, seed: int) -> np.ndarray:
    """int8-static calibration set: the verification set's mix of noise and photo crops, drawn with another seed.

    Calibrating on photos alone left the activation ranges too narrow for the noise images the verification also
    uses (digits model, one experiment: 95 % top-1 agreement with photo-only calibration, 100 % with the mix), so the
    ranges cover what the graph will be checked on.
    """
    spec = model.spec
    n_noise = round(count * n_random / max(1, n_random + n_photos))
    rng = np.random.default_rng(seed + 1)
    noise = rng.uniform(-1, 1, (n_noise, spec.in_chans, *spec.img_size)).astype(np.float32)
    photos = photo_batch(spec.img_size, count - n_noise, seed=seed + 1, in_chans=spec.in_chans)
    return np.concatenate([photos, noise])


def _build(variant: str, fp32: Path, work: Path, model: VisionTransformer, calibration: np.ndarray
           ) -> tuple[Path, dict[str, int]]:
    """Create the variant's graph under `work`; returns its path and fused-op counts."""
    spec = model.spec
    dst = work / f"{variant}.onnx"
    if variant in OPENVINO_VARIANTS:
        missing = openvino_runtime.openvino_available()
        if missing:
            raise RuntimeError(f"not built: {missing}")
        return openvino_runtime.build(variant, fp32, work / f"{variant}.xml", calibration), {}
    if variant == "fp32":
        counts = quantize.op_counts(fp32)
        return fp32, {op: counts.get(op, 0) for op in quantize.FUSED_OPS}
    if variant == "optimized":
        return dst, quantize.optimize_transformer(fp32, dst, spec)
    if variant == "fp16":
        return dst, quantize.optimize_transformer(fp32, dst, spec, float16=True)
    if variant in ("int8-dynamic", "int8-dynamic-s8"):  # on the fused graph: ORT quantises Attention too (QAttention)
        optimized = work / "optimized.onnx"
        if not optimized.exists():
            quantize.optimize_transformer(fp32, optimized, spec)
        quantize.quantize_int8_dynamic(optimized, dst, work, signed_weights=variant == "int8-dynamic-s8")
        return dst, {}
    if variant == "int8-static":
        quantize.quantize_int8_static(fp32, dst, calibration, work)
        return dst, {}
    if variant == "bf16":
        quantize.convert_bf16(fp32, dst)
        return dst, {}
    raise ValueError(f"unsupported variant {variant!r}; valid choices: {', '.join(VARIANTS + OPENVINO_VARIANTS)}")


def export_variants(
    model: VisionTransformer,
    out_dir: str | Path,
    *,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    stem: str = "model",
    opset: int = 17,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
    with_attentions: bool = False,
    exporter: Exporter = "dynamo",
    n_random: int = 16,
    n_photos: int = 32,
    n_calibration: int = 32,
    seed: int | None = None,
    providers: Sequence[str] | None = None,
    source: dict[str, Any] | None = None,
    images: np.ndarray | None = None,
    metadata: dict[str, Any] | None = None,
    trained: bool = False,
    with_token_means: bool = False,
) -> ExportReport:
    """Export, verify and write the requested variants of `model` into `out_dir`; returns the report (also saved).

    Files: `<stem>.onnx` (fp32), `<stem>.<variant>.onnx`, `<stem>.attentions.onnx` (if asked), `<stem>.export.json`;
    an OpenVINO variant: `<stem>.<variant>.xml` + `.bin` + `.json` (its compile settings).
    `images`: optional in-domain images (N, C, H, W) in [-1, 1]; the first half joins the verification set, the
    second half the int8-static calibration set (disjoint), so a domain model is checked on its own kind of data.
    `metadata`: labels + eval transform recorded for serving (`hub_vit.export.metadata.model_metadata`; default:
    the model's own `pretrained_cfg`, no labels).
    `trained`: the weights are trained (not random), so top-1 agreement on the photos is judged too when no own
    `images` are given (`hub_vit.export.criterion`).
    `with_token_means`: every graph also writes `token_means` (export_onnx), for a served out-of-domain score.
    """
    variants = check_variants(variants, VARIANTS + OPENVINO_VARIANTS)
    check_stem(stem)
    if providers:
        check_providers(providers)  # before the output folder exists: a bad provider would fail every variant
    check_informative(model)  # likewise: a constant (zero) head would "pass" every variant vacuously
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"output folder {str(out_dir)!r} is a file")
    created = not out_dir.exists()
    _writable_dir(out_dir)
    with _removed_if_left_empty(out_dir, created):  # a failed export (bad opset, Ctrl-C) leaves no empty folder
        model.eval()
        own_verify = own_calib = None
        if images is not None and len(images):
            half = (len(images) + 1) // 2
            own_verify, own_calib = images[:half], images[half:]
        x, seed = verification_inputs(model, n_random=n_random, n_photos=n_photos, seed=seed, images=own_verify)
        reference = torch_outputs(model, x)
        n_own = 0 if own_verify is None else len(own_verify)
        # top-1 agreement is judged where the classes mean something: own images, else photos of a trained model
        top1_from, top1_scope = ((len(x) - n_own, "own images") if n_own else
                                 (n_random, "photos") if trained else (None, "reported only"))
        provider_name = ",".join(providers) if providers else "default"
        outcomes: list[VariantOutcome] = []
        settings = dict(variants=variants, stem=stem, opset=opset, dynamic_batch=dynamic_batch,
                        dynamic_size=dynamic_size, with_attentions=with_attentions, exporter=exporter,
                        n_random=n_random, n_photos=n_photos, n_calibration=n_calibration,
                        n_own_images=0 if images is None else len(images), seed=seed,
                        trained=trained, with_token_means=with_token_means,
                        thresholds={"fp32_max_abs_diff": FP32_MAX_ABS, "min_cosine": MIN_COSINE,
                                    "max_rel_error": MAX_REL_ERROR, "min_top1_agreement": MIN_TOP1_AGREEMENT,
                                    "top1_judged_on": top1_scope})
        with tempfile.TemporaryDirectory(prefix=".export-", dir=out_dir) as tmp:
            work = Path(tmp)
            staged = work / "staged"  # what passed, moved into `out_dir` together once the run is done
            staged.mkdir()
            t0 = time.perf_counter()
            fp32 = export_onnx(model, work / "fp32.onnx", opset=opset, dynamic_batch=dynamic_batch,
                               dynamic_size=dynamic_size, exporter=exporter, with_token_means=with_token_means)
            # every variant is built from the graph that also writes the pre-logits features, verified on both, and
            # written without that output (probe.py)
            fp32 = expose_pre_logits(fp32, work / "fp32.probe.onnx")
            export_seconds = time.perf_counter() - t0
            settings["graph_opset"] = graph_opset(fp32)
            calibrated = any(v in CALIBRATED for v in variants)
            calibration = calibration_images(model, n_calibration, n_random, n_photos, seed) if calibrated else x[:0]
            if own_calib is not None and calibrated:
                calibration = np.concatenate([calibration, own_calib.astype(np.float32)])
            fp32_ok = True
            for variant in variants:
                outcome = VariantOutcome(variant=variant, precision=PRECISION[variant], written=False)
                outcomes.append(outcome)
                t = time.perf_counter()
                if not fp32_ok and variant != "fp32":
                    outcome.error = "not built: the fp32 graph it derives from failed verification"
                    continue
                try:
                    with quiet_loggers():  # ORT's quantiser logs advice through the root logger
                        path, outcome.fused_ops = _build(variant, fp32, work, model, calibration)
                    session = OpenVINOSession(path) if variant in OPENVINO_VARIANTS else ort_session(path, providers)
                    got = ort_outputs(session, x, batch_size=8 if dynamic_batch else 1)
                    result = judge(variant, PRECISION[variant], reference["logits"], got["logits"],
                                   provider=session.get_providers()[0], n_random=n_random, seed=seed,
                                   reference_features=reference[PRE_LOGITS], candidate_features=got[PRE_LOGITS],
                                   top1_from=top1_from, top1_scope=top1_scope)
                    if own_verify is not None:  # judge counts everything after the noise as photos
                        result.n_photos -= len(own_verify)
                        result.extra["n_own_images"] = len(own_verify)
                    result.extra["summary"] = summary(result)
                    outcome.verification = result.to_dict()
                except Exception as exc:  # noqa: BLE001 - a variant that cannot be built/run is reported, not fatal
                    outcome.error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:400]}"
                    if "NOT_IMPLEMENTED" in outcome.error:
                        outcome.error = (f"onnxruntime {ort_version()} has no {PRECISION[variant]} kernel for an op of "
                                         f"this graph on the execution provider(s) {providers or 'default'}: "
                                         + outcome.error)
                    outcome.seconds = time.perf_counter() - t + (export_seconds if variant == "fp32" else 0)
                    fp32_ok = fp32_ok and variant != "fp32"
                    continue
                outcome.seconds = time.perf_counter() - t + (export_seconds if variant == "fp32" else 0)
                if not result.passed:
                    outcome.error = f"verification failed: {result.reason}"
                    fp32_ok = fp32_ok and variant != "fp32"
                    continue
                name = variant_file_name(stem, variant)
                if variant in OPENVINO_VARIANTS:
                    openvino_runtime.drop_output(path, staged / name, PRE_LOGITS)
                else:
                    drop_pre_logits(path, staged / name)  # the verification output off; fp32 stays in `work`
                outcome.written, outcome.file = True, str(out_dir / name)
                outcome.size_bytes = sum(p.stat().st_size for p in _files_of(staged / name))
            if with_attentions:
                # a few of each kind: the attention graph is larger (B, depth, heads, N, N) and slower to compare
                n_noise = min(2, n_random)
                subset = np.concatenate([x[:n_noise], x[n_random:n_random + 6]])
                outcomes.append(_attention_graph(model, out_dir, staged, stem, subset, n_noise, opset=opset,
                                                 dynamic_batch=dynamic_batch, dynamic_size=dynamic_size,
                                                 exporter=exporter, providers=providers, seed=seed))
            report = ExportReport(source=source or {"spec": model.spec.to_dict()}, out_dir=str(out_dir),
                                  settings=settings, environment=environment(providers), variants=outcomes,
                                  model=metadata or model_metadata(model))
            report.environment["verification_provider"] = provider_name
            report.report_file = str(out_dir / f"{stem}{REPORT_SUFFIX}")
            _replace_previous_export(staged, out_dir, stem, report)
        return report


def variant_file_name(stem: str, variant: str) -> str:
    """`<stem>.onnx` for fp32, `<stem>.<variant>.xml` for an OpenVINO variant, else `<stem>.<variant>.onnx` (also
    `<stem>.attentions.onnx`)."""
    if variant in OPENVINO_VARIANTS:
        return f"{stem}.{variant}.xml"
    return f"{stem}.onnx" if variant == "fp32" else f"{stem}.{variant}.onnx"


def _files_of(graph: Path) -> list[Path]:
    """A written graph's files: the ONNX file, or an OpenVINO variant's IR pair and settings."""
    return openvino_runtime.ir_files(graph) if graph.suffix == ".xml" else [graph]


def check_stem(stem: str) -> None:
    """A stem names files inside the output folder: a path in it (`../up`, `sub/m`) would put graphs where the staging
    and the report do not follow them."""
    if not stem or stem in (".", "..") or "/" in stem or "\\" in stem or stem != stem.strip():
        raise ValueError(f"--stem {stem!r} must be a plain file name (no folder, no '/'); choose the folder with -o")


def previous_export_files(out_dir: str | Path, stem: str) -> list[Path]:
    """The files an earlier export with this stem left in `out_dir`: its report and the graphs it lists.

    Only what the report lists: a file merely named like a variant (`model.fp16.onnx` written by `--stem model.fp16`,
    or by hand) is not this stem's export. A listed file counts only if it is `<stem>.*.onnx` directly in `out_dir`,
    so an edited report cannot make an export delete an unrelated file.
    """
    out_dir = Path(out_dir)
    names = {f"{stem}{REPORT_SUFFIX}"}
    try:
        old = json.loads((out_dir / f"{stem}{REPORT_SUFFIX}").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    listed = old.get("variants") if isinstance(old, dict) else None
    for entry in listed if isinstance(listed, list) else []:
        name = Path(str(entry.get("file") or "") if isinstance(entry, dict) else "").name
        if name.startswith(f"{stem}.") and name.endswith(".onnx"):
            names.add(name)
        elif name.startswith(f"{stem}.") and name.endswith(".xml"):  # an OpenVINO variant: its three files
            names.update(p.name for p in openvino_runtime.ir_files(Path(name)))
    return sorted(p for p in (out_dir / n for n in names) if p.is_file())


def _engines_built_from(out_dir: Path, graphs: Sequence[str]) -> list[str]:
    """TensorRT engines in `out_dir` whose `<engine>.json` (`hub-vit export tensorrt`) names one of `graphs`."""
    stale = []
    for info_file in sorted(out_dir.glob("*.json")):
        engine = info_file.with_suffix("")
        info = engine_info(engine) if engine.is_file() else None
        if info and Path(str(info.get("onnx") or "")).name in graphs:
            stale.append(engine.name)
    return stale


def _replace_previous_export(staged: Path, out_dir: Path, stem: str, report: ExportReport) -> None:
    """Move the staged graphs into `out_dir` in place of the earlier export's files, then write the report.

    A graph of the earlier export that this run does not rewrite (not requested, or refused this time) would sit
    beside the new report, unlisted, and `hub-vit repository`/`serve` would take it for this model (a wrong graph,
    or Triton crashing on its input shape). The earlier report goes first and the new one comes last, so a report
    never lists the other export's files. Engines are only flagged: another command built them, at GPU cost.
    """
    report_path = Path(report.report_file)
    previous = previous_export_files(out_dir, stem)
    new = {p.name for p in staged.iterdir()}
    graphs = [p.name for p in previous if p != report_path]
    report.removed = [name for name in graphs if name not in new]
    report.stale_engines = _engines_built_from(out_dir, graphs)
    report_path.unlink(missing_ok=True)
    for name in report.removed:
        (out_dir / name).unlink(missing_ok=True)
    for path in sorted(staged.iterdir()):
        os.chmod(path, 0o644)  # served by other users; the staging folder's files may be 0600
        os.replace(path, out_dir / path.name)
    with atomic_path(report_path, suffix=".json") as tmp_json:
        tmp_json.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")


def _attention_graph(model: VisionTransformer, out_dir: Path, staged: Path, stem: str, x: np.ndarray, n_random: int,
                     *, opset: int, dynamic_batch: bool, dynamic_size: bool, exporter: Exporter,
                     providers: Sequence[str] | None, seed: int) -> VariantOutcome:
    """The separate logits + attention-maps graph; both outputs must match PyTorch within the fp32 threshold.
    Written to `staged` (moved into `out_dir` with the other graphs)."""
    outcome = VariantOutcome(variant=ATTENTIONS_VARIANT, precision="fp32", written=False)
    t = time.perf_counter()
    name = variant_file_name(stem, ATTENTIONS_VARIANT)
    try:
        with atomic_path(staged / name, suffix=".onnx") as tmp:
            export_onnx(model, tmp, opset=opset, dynamic_batch=dynamic_batch, dynamic_size=dynamic_size,
                        with_attentions=True, exporter=exporter)
            session = ort_session(tmp, providers)
            got = ort_outputs(session, x, batch_size=8 if dynamic_batch else 1)
            ref = torch_outputs(model, x, with_attentions=True)
            result = judge("attentions", "fp32", ref["logits"], got["logits"], provider=session.get_providers()[0],
                           n_random=n_random, seed=seed)
            attn_diff = float(np.abs(ref[ATTENTIONS] - got[ATTENTIONS]).max())
            result.extra = {"attentions_max_abs_diff": attn_diff, "attentions_shape": list(got[ATTENTIONS].shape)}
            if attn_diff > FP32_MAX_ABS:
                result.passed, result.reason = False, f"max |attention diff| {attn_diff:.3g} > {FP32_MAX_ABS:g}"
            outcome.verification = result.to_dict()
            if not result.passed:
                raise RuntimeError(f"verification failed: {result.reason}")
    except Exception as exc:  # noqa: BLE001
        outcome.error = str(exc) if str(exc).startswith("verification failed") else f"{type(exc).__name__}: {exc}"
    else:
        outcome.written, outcome.file = True, str(out_dir / name)
        outcome.size_bytes = (staged / name).stat().st_size
    outcome.seconds = time.perf_counter() - t
    return outcome


__all__ = ["DEFAULT_VARIANTS", "PRECISION", "VARIANTS", "ExportReport", "VariantOutcome", "check_variants",
           "export_variants", "previous_export_files", "variant_file_name"]
