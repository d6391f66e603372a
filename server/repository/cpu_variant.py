"""Which graph the CPU flavour serves: the fastest variant on this host that passes the verification criterion.

At repository build time (`hub-vit repository / serve --cpu-variant auto`) the candidates (the variants of
`hub_vit.export.registry` that the CPU flavour serves and that this host can build and gains from: bf16 only where
the CPU has bf16 units, the OpenVINO ones where OpenVINO is installed) are built and verified against the fp32
PyTorch model by `hub_vit.export.variants` (criterion: `hub_vit.export.criterion`), the ones that pass are timed side
by side in interleaved rounds at the serving batch, with the threads an instance uses, and the fastest is copied into
the repository: an ONNX graph over the classifier's `model.onnx`, or an OpenVINO variant as `model.openvino.xml` /
`.bin` / `.json` beside the fp32 `model.onnx` (the served classifier runs the OpenVINO files when they are there).
The choice, every candidate's numbers and verdict, the ones left out on this host and why, the verification set and
the host's ISA flags go into the repository manifest. A named variant (`--cpu-variant int8-dynamic`) skips the
timing but is still verified: a variant that fails the criterion is never served.

Int8 runs on the VNNI / AMX-INT8 units through ONNX Runtime's MLAS u8 x s8 kernels (int8-static, int8-dynamic-s8:
7-bit signed weights); int8-dynamic's u8 x u8 weights do not use them. All compute the same integers on every x86 CPU
(quantize.py). ONNX Runtime's CPU provider has no bfloat16 MatMul kernel, so `bf16` is a candidate only where the
CPU has bf16 units, and is reported as not built when the provider cannot run it; OpenVINO's CPU plugin runs bf16 on
those units (`openvino-bf16`) and int8 on VNNI / AMX-INT8 (`openvino-int8`, `openvino-int8-dynamic`;
`hub_vit.openvino_runtime`).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hub_vit.cgroup_limits import usable_cores
from hub_vit.export import registry
from hub_vit.host import Host, this_host
from hub_vit.openvino_runtime import OpenVINOSession, ir_files, served_model
from hub_vit.server.repository import variant_cache

if TYPE_CHECKING:
    from hub_vit.export.plan import VerificationSet
    from hub_vit.resolve import ResolvedModel

AUTO = "auto"
CPU_VARIANTS: tuple[str, ...] = registry.names(cpu=True)  # the variants the CPU flavour can serve
CHOICES: tuple[str, ...] = (AUTO, *CPU_VARIANTS)


@dataclasses.dataclass
class CpuSelection:
    """What the CPU flavour serves and why; stored in the repository manifest under `cpu_variant`."""

    variant: str
    requested: str
    reason: str
    isa_flags: list[str]
    batch: int = 0
    threads: int = 0
    candidates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)  # variants not tried on this host, and why
    cache: dict[str, Any] = dataclasses.field(default_factory=dict)  # the variant cache's entry; hit: reused
    # what the candidates were judged on: noise, photos, the model's own images, and where top-1 was judged
    verification_set: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_cpu_variant(name: str) -> str:
    """`name` if it is a valid `--cpu-variant`, else ValueError listing the valid ones."""
    if name not in CHOICES:
        raise ValueError(f"unknown cpu_variant {name!r}; valid choices: {', '.join(CHOICES)}")
    return name


def candidates(host: Host | None = None) -> tuple[list[str], dict[str, str]]:
    """(the variants worth timing on `host`, {the others: why not}): the registry's CPU variants that this host can
    build and that pay off on it (bf16 only with bf16 units: emulated bf16 is slower; the OpenVINO ones where
    OpenVINO is installed)."""
    return registry.worth_building(host or this_host(), cpu=True)


def _time_graphs(graphs: dict[str, Path], x: np.ndarray, threads: int, rounds: int, iters: int) -> dict[str, float]:
    """Median seconds per batch of each graph, timed in interleaved rounds so a load change hits every one alike."""
    import onnxruntime as ort

    sessions: dict[str, Any] = {}
    for name, path in graphs.items():
        if path.suffix == ".xml":  # an OpenVINO variant
            sessions[name] = OpenVINOSession(path, threads)
            sessions[name].run(None, {"pixel_values": x})  # warm-up
            continue
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no spinning into the next one
        sessions[name] = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        sessions[name].run(None, {"pixel_values": x})  # warm-up
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, session in sessions.items():
            for _ in range(iters):
                start = time.perf_counter()
                session.run(None, {"pixel_values": x})
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def select(module: Any, requested: str, check: VerificationSet, *, batch: int, threads: int | None = None,
           work_dir: str | Path | None = None, rounds: int = 3, iters: int = 2, host: Host | None = None,
           with_token_means: bool = False) -> tuple[Path, CpuSelection, tempfile.TemporaryDirectory]:
    """Build, verify on `check` and (for `auto`) time the candidates of `module` on `host` (default: this one);
    returns the chosen graph, the record, and the temporary folder holding it (the caller copies the graph, then
    cleans the folder up).

    ValueError when a named variant fails the criterion or cannot be built (the report's reason, with the margin),
    or when no candidate passes. `with_token_means`: the graphs also write the out-of-domain score's features.
    """
    from hub_vit.export.plan import ExportPlan
    from hub_vit.export.variants import export_variants

    check_cpu_variant(requested)
    host = host or this_host()
    if requested != AUTO:  # named: a host that cannot build it is told so before the export (it took 27 s)
        registry.check_buildable([requested], host, flag="--cpu-variant", cpu=True)
    names, left_out = candidates(host) if requested == AUTO else ([requested], {})
    threads = threads or usable_cores()
    tmp = tempfile.TemporaryDirectory(prefix=".cpu-variant-", dir=work_dir)
    try:
        plan = ExportPlan(tuple(names), optional=frozenset(names) if requested == AUTO else frozenset(),
                          providers=("CPUExecutionProvider",), host=host, token_means=with_token_means)
        report = export_variants(module, Path(tmp.name), plan, check, source={"cpu_variant": requested})
        rows = [{"variant": o.variant, "verified": o.written, "error": o.error, "settings": o.settings,
                 "verification": _numbers(o.verification)} for o in report.variants]
        passed = {o.variant: Path(o.file) for o in report.variants if o.written}
        selection = CpuSelection(variant="", requested=requested, reason="", isa_flags=host.flags, batch=batch,
                                 threads=threads, candidates=rows, left_out=left_out,
                                 verification_set=check.describe() | {"seed": report.settings["seed"]})
        if requested != AUTO:
            if requested not in passed:
                raise ValueError(f"cpu_variant {requested!r} is not served: {report.outcome(requested).error}")
            selection.variant = requested
            selection.reason = f"forced (--cpu-variant {requested}); passes the verification criterion"
            return passed[requested], selection, tmp
        if not passed:
            raise ValueError("no CPU variant passes the verification criterion: " +
                             "; ".join(f"{o.variant}: {o.error}" for o in report.variants))
        x = np.random.default_rng(0).uniform(-1, 1, (batch, module.spec.in_chans, *module.spec.img_size))
        seconds = _time_graphs(passed, x.astype(np.float32), threads, rounds, iters)
        for row in rows:
            if row["variant"] in seconds:
                row["ms_per_batch"] = seconds[row["variant"]] * 1e3
                row["images_per_s"] = batch / seconds[row["variant"]]
        best = min(seconds, key=seconds.get)
        base = seconds.get("fp32")
        speed = f", {base / seconds[best]:.2f}x fp32" if base and best != "fp32" else ""
        rejected = [r["variant"] for r in rows if not r["verified"]]
        selection.variant = best
        selection.reason = (f"fastest verified of {', '.join(seconds)} at batch {batch}, {threads} threads "
                            f"({batch / seconds[best]:.1f} img/s{speed})"
                            + (f"; not eligible: {', '.join(rejected)}" if rejected else ""))
        return passed[best], selection, tmp
    except BaseException:
        tmp.cleanup()
        raise


def place(source: ResolvedModel, target: Path, requested: str, *, batch: int, threads: int | None = None,
          compute_bound: bool = True, with_token_means: bool = False) -> CpuSelection:
    """Put the selected graph at `target` (the CPU classifier's `model.onnx`, already holding the fp32 export) and
    return the record for the manifest. `source`: the resolved model the repository is written for.

    fp32 keeps the graph already written (exact: max |diff| 1e-4 or less, today's path, no build-time cost); an
    exported ONNX file is served as given (there is no model to verify variants against); a model whose head is
    constant cannot be verified, so `auto` keeps fp32 for it. A model below the compute-bound threshold
    (`compute_bound` False: < 0.1 GMACs per image, e.g. the 15-MMAC digits model) keeps fp32 under `auto` without
    measuring: its time goes to per-op overhead and decoding, not matmuls (digits, batch 8: ORT-fused fp32 397 img/s,
    int8-dynamic 220), and the build stays as fast as before. `with_token_means`: the graph at `target` writes the
    out-of-domain score's features, and so must the variant that replaces it.
    """
    check_cpu_variant(requested)
    flags = this_host().flags
    module = source.module
    if module is None:
        if requested not in (AUTO, "fp32"):
            raise ValueError(f"cpu_variant {requested!r} is built and verified from the model, but "
                             f"{source.origin!r} is an exported file: export that variant (hub-vit export onnx -v "
                             f"{requested}) and serve its file, or use cpu_variant auto / fp32")
        return CpuSelection("as given", requested, "an exported ONNX file is served as given", flags)
    if requested == "fp32":
        return CpuSelection("fp32", requested, "forced (--cpu-variant fp32); the fp32 graph, no candidates timed",
                            flags)
    if requested == AUTO and not compute_bound:
        return CpuSelection("fp32", requested, "a tiny model (< 0.1 GMACs per image): per-op overhead, not matmuls, "
                            "sets its speed, so the exact fp32 graph is served without measuring", flags)
    if requested == AUTO and module.head_is_constant():
        return CpuSelection("fp32", requested, "the model's head is all zero (untrained), so no reduced-precision "
                            "variant can be verified against it: fp32", flags)
    # an in-memory module (tests, benchmarks) or random init: top-1 on photos means nothing, the criterion's
    # cosine / relative-error bounds judge alone (verification_set)
    from hub_vit.export.own_images import verification_set

    # the model's own held-out images when its folder names some (top-1 judged on them), else photos
    check = verification_set(source, n_random=8, n_photos=24, n_calibration=32, seed=0)
    host = this_host()
    threads = threads or usable_cores()
    key = variant_cache.cache_key(module, requested, check, batch=batch, threads=threads, flags=host.flags,
                                  token_means=with_token_means, weights=source.weights_digest)
    cached = _from_cache(key, target)
    if cached is not None:
        return cached
    graph, selection, tmp = select(module, requested, check, batch=batch, threads=threads, work_dir=target.parent,
                                   host=host, with_token_means=with_token_means)
    try:
        files = ir_files(graph) if graph.suffix == ".xml" else [graph]
        _keep(key, selection, files)
        _place(files, target)
    finally:
        tmp.cleanup()
    return selection


def _keep(key: variant_cache.CacheKey, selection: CpuSelection, files: list[Path]) -> None:
    """`selection` and its graph into the variant cache; one that cannot be written is said in the reason the start
    prints (under an arbitrary user id, as OpenShift runs containers, `~/.cache` is `/.cache`: every start took minutes
    again without a word)."""
    try:
        selection.cache = {"hit": False, "entry": str(variant_cache.store(key, selection.to_dict(), files))}
    except OSError as err:
        selection.cache = {"hit": False, "entry": None, "unwritable": f"{err.filename}: {err.strerror}"}
        selection.reason += (f"; not kept for later starts: the variant cache {err.filename!r} cannot be written "
                             f"({err.strerror}), so each start builds and times the variants again; set "
                             f"{variant_cache.ENV} to a writable folder")


def _from_cache(key: variant_cache.CacheKey, target: Path) -> CpuSelection | None:
    """The selection `key`'s cache entry holds, its graph placed at `target`; None on a miss (or a damaged entry,
    which `variant_cache.load` removed)."""
    hit = variant_cache.load(key)
    if hit is None:
        return None
    recorded, files = hit
    try:
        selection = CpuSelection(**recorded)
    except TypeError:  # recorded by another layout of the record: build afresh
        return None
    selection.cache = {"hit": True, "entry": str(files[0].parent)}
    selection.reason += "; reused from the variant cache (built and verified earlier on this host)"
    _place(files, target)
    return selection


def _place(files: list[Path], target: Path) -> None:
    """The chosen graph at the classifier's `target`: an ONNX graph over it, or an OpenVINO variant's three files
    beside the fp32 graph, which stays."""
    import shutil

    if files[0].suffix == ".xml":
        for src, dst in zip(files, ir_files(served_model(target)), strict=True):
            shutil.copyfile(src, dst)
    else:
        shutil.copyfile(files[0], target)


def _numbers(verification: dict[str, Any] | None) -> dict[str, Any] | None:
    if verification is None:
        return None
    keep = ("passed", "reason", "worst", "margins", "top1_agreement", "top1_scope", "top1_judged", "max_abs_diff",
            "bounds_scope")
    reported = (verification.get("extra") or {}).get("reported_only")
    return {key: verification.get(key) for key in keep} | ({"reported_only": reported} if reported else {})


__all__ = ["AUTO", "CHOICES", "CPU_VARIANTS", "CpuSelection", "candidates", "check_cpu_variant", "place", "select"]
