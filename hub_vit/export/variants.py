"""Export one model as several verified variants, each declared in `hub_vit.export.registry` (ONNX Runtime graphs:
fp32, fused, fp16, int8, bf16; OpenVINO IR: fp32, bf16, int8), carried out as an `ExportPlan` says and judged on a
`VerificationSet` (`hub_vit.export.plan`).

Every variant is built from the fp32 graph in a temporary folder inside the output folder (`.hub-vit-export.tmp-*`,
swept by the next export there if this one is killed: `export_folder.staging_folder`), run by its runtime on the
verification set (`hub_vit.export.verify`, criterion: `hub_vit.export.criterion`) and staged only if it passes; a
variant that fails or cannot be built is reported with the reason and leaves no file. A JSON report
(`<stem>.export.json`) records everything. The staged files replace the earlier export of the same stem as a set
(`hub_vit.export.export_folder`).
"""

from __future__ import annotations

import platform
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hub_vit.atomic import DISK_REFUSED_ERRNOS
from hub_vit.export import registry
from hub_vit.export.criterion import FP32_MAX_ABS, MAX_REL_ERROR, MIN_COSINE, MIN_TOP1_AGREEMENT, judge, summary
from hub_vit.export.export_folder import (
    files_of,
    folders_in_the_way,
    removed_if_left_empty,
    replace_previous_export,
    staging_folder,
    writable_dir,
)
from hub_vit.export.metadata import REPORT_SUFFIX, model_metadata
from hub_vit.export.onnx_export import ATTENTIONS, export_onnx, float32_cpu, graph_opset, logits_subgraph, quiet_loggers
from hub_vit.export.plan import ExportPlan, VerificationSet
from hub_vit.export.probe import PRE_LOGITS, drop_pre_logits, expose_pre_logits
from hub_vit.export.verify import Evidence, check_providers, gather_evidence, ort_outputs, ort_session, torch_outputs
from hub_vit.model import VisionTransformer, vision_transformer_of
from hub_vit.openvino_runtime import OpenVINOSession, ir_files

ATTENTIONS_VARIANT = "attentions"  # `<stem>.attentions.onnx`, written with --attentions


@dataclass
class VariantOutcome:
    """What happened to one variant: written or not, why, its verification numbers and fused-op counts, what its
    build decided (`settings`, e.g. the layers kept in float), and whether the run required it (named, not an
    `all` / `auto` candidate)."""

    variant: str
    precision: str
    written: bool
    file: str | None = None
    size_bytes: int | None = None
    seconds: float = 0.0
    fused_ops: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    verification: dict[str, Any] | None = None
    error: str = ""
    required: bool = True


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

    def refused(self) -> list[VariantOutcome]:
        """The variants the run required (named, the fp32 graph and the attention graph) that were not written."""
        return [o for o in self.variants if o.required and not o.written]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def environment(providers: tuple[str, ...] | None = None) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort
    import torch

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__,
            "available_providers": ort.get_available_providers(), "requested_providers": list(providers or []),
            "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}


def export_variants(model: VisionTransformer, out_dir: str | Path, plan: ExportPlan = ExportPlan(),
                    check: VerificationSet = VerificationSet(), *, source: dict[str, Any] | None = None,
                    metadata: dict[str, Any] | None = None) -> ExportReport:
    """Export, verify and write the variants `plan` names into `out_dir`; returns the report (also saved).

    Files: `<stem>.onnx` (fp32), `<stem>.<variant>.onnx`, `<stem>.attentions.onnx` (if asked), `<stem>.export.json`;
    an OpenVINO variant: `<stem>.<variant>.xml` + `.bin` + `.json` (its compile settings).
    `check`: the verification set (the model's own images, when it has some, are split between verification and
    calibration, disjoint). `source`: the model's provenance for the report (default: its spec). `metadata`: labels +
    eval transform recorded for serving (`hub_vit.export.metadata.model_metadata`; default: the model's own
    `pretrained_cfg`, no labels).
    """
    if not isinstance(plan, ExportPlan):  # a list of names: "'list' object has no attribute 'providers'"
        raise TypeError(f"plan must be an ExportPlan (ExportPlan.of([...]) from variant names), got "
                        f"{type(plan).__name__}")
    if not isinstance(check, VerificationSet):
        raise TypeError(f"check must be a VerificationSet, got {type(check).__name__}")
    model = float32_cpu(vision_transformer_of(model, "export_variants"))  # a transformers HubViT model: its .vit
    if plan.providers:
        check_providers(plan.providers)  # before the output folder exists: a bad provider would fail every variant
    # likewise the images and their fp32 reference: a constant (zero) head would "pass" every variant vacuously
    evidence = gather_evidence(model.eval(), check, plan.calibrated())
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"output folder {str(out_dir)!r} is a file")
    folders_in_the_way(out_dir, _planned_files(plan))  # before minutes of building, not when the files are moved in
    created = not out_dir.exists()
    writable_dir(out_dir)
    # a failed export (bad opset, Ctrl-C) leaves no empty folder; a killed one's work folder goes with the next export
    with removed_if_left_empty(out_dir, created), staging_folder(out_dir) as tmp:
        run = _Run(model, plan, check, evidence, tmp, out_dir)
        outcomes = [run.variant(name) for name in plan.variants]
        outcomes += [VariantOutcome(name, registry.get(name).precision, written=False, error=f"not built: {why}",
                                    required=False) for name, why in plan.left_out.items()]
        if plan.attentions:
            outcomes.append(run.attention_graph())
        report = ExportReport(source=source or {"spec": model.spec.to_dict()}, out_dir=str(out_dir),
                              settings=run.settings(), environment=environment(plan.providers), variants=outcomes,
                              model=metadata or model_metadata(model))
        report.environment["verification_provider"] = ",".join(plan.providers) if plan.providers else "default"
        report.report_file = str(out_dir / f"{plan.stem}{REPORT_SUFFIX}")
        replace_previous_export(run.staged, out_dir, plan.stem, report)
    return report


def _planned_files(plan: ExportPlan) -> list[str]:
    """The names of the files `plan` may write: each variant's graph (an OpenVINO variant's three files), the attention
    graph when asked, the report."""
    names = [p.name for name in plan.variants for p in files_of(Path(registry.get(name).file_name(plan.stem)))]
    if plan.attentions:
        names.append(f"{plan.stem}.{ATTENTIONS_VARIANT}.onnx")
    return [*names, f"{plan.stem}{REPORT_SUFFIX}"]


class _Run:
    """One export's shared work: the fp32 graph every variant is built from (with the `pre_logits` output the
    verification reads), the attention graph when asked (the fp32 graph is cut from it: one export), the evidence
    every variant is judged on, and the staging folder of what passed."""

    def __init__(self, model: VisionTransformer, plan: ExportPlan, check: VerificationSet, evidence: Evidence,
                 work: Path, out_dir: Path) -> None:
        self.model, self.plan, self.check, self.evidence = model, plan, check, evidence
        self.work, self.out_dir = work, out_dir
        self.staged = work / "staged"  # what passed, moved into the output folder together once the run is done
        self.staged.mkdir()
        start = time.perf_counter()
        how = dict(opset=plan.opset, dynamic_batch=plan.dynamic_batch, dynamic_size=plan.dynamic_size,
                   exporter=plan.exporter, with_token_means=plan.token_means)
        self.attentions = export_onnx(model, work / "attentions.onnx", with_attentions=True, **how) \
            if plan.attentions else None
        fp32 = logits_subgraph(self.attentions, work / "fp32.onnx") if self.attentions else \
            export_onnx(model, work / "fp32.onnx", **how)
        self.graph_opset = graph_opset(fp32)
        # every variant is built from the graph that also writes the pre-logits features, verified on both, and
        # written without that output (probe.py)
        self.fp32 = expose_pre_logits(fp32, work / "fp32.probe.onnx", headless=not model.spec.num_classes)
        self.export_seconds = time.perf_counter() - start
        self.fp32_ok = True

    def settings(self) -> dict[str, Any]:
        plan, scope = self.plan, self.check.top1_scope
        return dict(variants=list(plan.variants), stem=plan.stem, opset=plan.opset, dynamic_batch=plan.dynamic_batch,
                    dynamic_size=plan.dynamic_size, with_attentions=plan.attentions, exporter=plan.exporter,
                    with_token_means=plan.token_means,
                    **self.check.describe(), seed=self.evidence.seed, graph_opset=self.graph_opset,
                    thresholds={"fp32_max_abs_diff": FP32_MAX_ABS, "min_cosine": MIN_COSINE,
                                "max_rel_error": MAX_REL_ERROR, "min_top1_agreement": MIN_TOP1_AGREEMENT,
                                "top1_judged_on": scope})

    def variant(self, name: str) -> VariantOutcome:
        """Build, verify and (when it passes) stage one registered variant."""
        spec = registry.get(name)
        outcome = VariantOutcome(name, spec.precision, written=False, required=self.plan.required(name))
        start = time.perf_counter()
        try:
            self._variant(spec, outcome)
        finally:
            outcome.seconds = time.perf_counter() - start + (self.export_seconds if name == "fp32" else 0)
            if name == "fp32" and not outcome.written:
                self.fp32_ok = False
        return outcome

    def _variant(self, spec: registry.Variant, outcome: VariantOutcome) -> None:
        if not self.fp32_ok:
            outcome.error = "not built: the fp32 graph it derives from failed verification"
            return
        missing = spec.missing(self.plan.host)
        if missing:
            outcome.error = f"not built: {'; '.join(missing)}"
            return
        evidence = self.evidence
        job = registry.BuildJob(self.fp32, self.work / f"{spec.name}.{spec.suffix}", self.model.spec,
                                evidence.calibration, evidence.top1_counts, evidence.own_mask)
        try:
            with quiet_loggers():  # ORT's quantiser logs advice through the root logger
                built = spec.build(job)
            outcome.fused_ops, outcome.settings = built.fused_ops, built.settings
            session = OpenVINOSession(built.path) if spec.runtime == "openvino" else \
                ort_session(built.path, self.plan.providers)
            batch_size = 8 if self.plan.dynamic_batch else 1
            got = ort_outputs(session, evidence.x, batch_size=batch_size)
            served = None  # an OpenVINO variant's written graph, judged before it is placed
            if spec.runtime == "openvino":
                # the CPU plugin picks precisions for the graph it is given: with `pre_logits` as an output it kept
                # ViT-S/16's residual stream in f32 on an AMX host, without it in bf16 (logits up to 4 % apart). So
                # the logits judged are those of the graph that is written; the features, of the graph exposing them.
                from hub_vit.export.openvino_build import drop_output

                served = drop_output(built.path, self.work / f"{spec.name}.served.xml", PRE_LOGITS)
                got["logits"] = ort_outputs(OpenVINOSession(served), evidence.x, batch_size=batch_size)["logits"]
        except Exception as exc:  # noqa: BLE001 - a variant that cannot be built/run is reported, not fatal
            if isinstance(exc, OSError) and exc.errno in DISK_REFUSED_ERRNOS:
                raise  # the disk, not the variant: the export stops, the earlier one left whole
            outcome.error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:400]}"
            if "NOT_IMPLEMENTED" in outcome.error:
                import onnxruntime as ort

                outcome.error = (f"onnxruntime {ort.__version__} has no {spec.precision} kernel for an op of this "
                                 f"graph on the execution provider(s) {self.plan.providers or 'default'}: "
                                 + outcome.error)
            return
        result = judge(spec.name, spec.precision, evidence.reference["logits"], got["logits"],
                       provider=session.get_providers()[0], n_random=self.check.n_random, seed=evidence.seed,
                       reference_features=evidence.reference[PRE_LOGITS], candidate_features=got[PRE_LOGITS],
                       top1_from=evidence.top1_from, top1_scope=self.check.top1_scope,
                       # static int8 is promised inside its calibration's domain: the own images, where there are some
                       **self.check.bounds_for(spec.calibrated, evidence.own_from))
        if evidence.n_own:  # judge counts everything after the noise as photos
            result.n_photos -= evidence.n_own
            result.extra["n_own_images"] = evidence.n_own
        result.extra["summary"] = summary(result)
        outcome.verification = result.to_dict()
        if not result.passed:
            outcome.error = f"verification failed: {result.reason}"
            return
        name = spec.file_name(self.plan.stem)
        if served is not None:
            for src, dst in zip(ir_files(served), ir_files(self.staged / name), strict=True):
                src.replace(dst)  # the very files whose logits were judged
        else:
            drop_pre_logits(built.path, self.staged / name)  # the verification output off; fp32 stays in `work`
        outcome.written, outcome.file = True, str(self.out_dir / name)
        outcome.size_bytes = sum(p.stat().st_size for p in files_of(self.staged / name))

    def attention_graph(self) -> VariantOutcome:
        """The separate logits + attention-maps graph; both outputs must match PyTorch within the fp32 threshold,
        on a few images of each kind (the attention graph is larger, (B, depth, heads, N, N), and slower to
        compare)."""
        n_noise, n_random = min(2, self.check.n_random), self.check.n_random
        x = np.concatenate([self.evidence.x[:n_noise], self.evidence.x[n_random:n_random + 6]])
        outcome = VariantOutcome(variant=ATTENTIONS_VARIANT, precision="fp32", written=False)
        start = time.perf_counter()
        name = f"{self.plan.stem}.{ATTENTIONS_VARIANT}.onnx"
        try:
            session = ort_session(self.attentions, self.plan.providers)
            got = ort_outputs(session, x, batch_size=8 if self.plan.dynamic_batch else 1)
            ref = torch_outputs(self.model, x, with_attentions=True)
            result = judge("attentions", "fp32", ref["logits"], got["logits"], provider=session.get_providers()[0],
                           n_random=n_noise, seed=self.evidence.seed)
            attn_diff = float(np.abs(ref[ATTENTIONS] - got[ATTENTIONS]).max())
            result.extra = {"attentions_max_abs_diff": attn_diff, "attentions_shape": list(got[ATTENTIONS].shape)}
            if attn_diff > FP32_MAX_ABS:
                result.passed, result.reason = False, f"max |attention diff| {attn_diff:.3g} > {FP32_MAX_ABS:g}"
            outcome.verification = result.to_dict()
        except Exception as exc:  # noqa: BLE001
            outcome.error = f"{type(exc).__name__}: {exc}"
        else:
            if result.passed:
                shutil.copyfile(self.attentions, self.staged / name)
                outcome.written, outcome.file = True, str(self.out_dir / name)
                outcome.size_bytes = (self.staged / name).stat().st_size
            else:
                outcome.error = f"verification failed: {result.reason}"
        outcome.seconds = time.perf_counter() - start
        return outcome


__all__ = ["ATTENTIONS_VARIANT", "ExportReport", "VariantOutcome", "environment", "export_variants"]
