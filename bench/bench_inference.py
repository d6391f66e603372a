"""Side-by-side CPU inference: hub-vit's verified paths against what a CPU user would pick instead, ViT-Ti/16 and
ViT-S/16 at 224 px, batch 8, 2 threads, one process, one run.

    nice -n 5 .venv/bin/python bench/bench_inference.py     # writes bench/results/inference_cpu_<host kind>.json
    .venv/bin/python bench/bench_inference.py --quick       # ViT-Ti/16, 2 rounds, no result file

Every row of a model runs the same weights (timm's `vit_small_patch16_224` / `vit_tiny_patch16_224`, random: no
network here, loaded into hub-vit's `vit_s16` / `vit_ti16` too) on the same 8 photo crops:

* peers: timm eager fp32; timm eager + `torch.autocast(bfloat16)`; OpenVINO `convert_model(timm model)` compiled
  with its default settings (bf16 on AMX / avx512_bf16 hosts, f32 elsewhere); plain ONNX Runtime of timm's
  `torch.onnx` export;
* hub-vit: eager fp32; the ONNX variants `hub-vit export` writes (ORT-fused fp32, int8 dynamic with u8 or 7-bit
  s8 weights, int8 static QDQ, each verified by the export with `hub_vit.export.criterion`); the OpenVINO variants
  the CPU flavour can serve (`hub_vit.openvino_runtime`: OpenVINO default precision, NNCF static int8,
  int8 weights with dynamic activations), run by the same `OpenVINOSession` the server runs; `torch.compile` bf16
  with freezing where the CPU has bf16 units.

Rows are timed in interleaved rounds (15; each runs every row once or a few times, in an order drawn for that round),
so a load change on the shared machine hits every row alike; each row reports its median, and a ratio between two
rows (the targets) is the median over rounds of their ratio within each round. Every row's logits are judged against
timm eager fp32 with the criterion's bounds (per image: cosine >= 0.99, relative error <= 0.15); a row that fails, or
a hub-vit graph the export refused, is listed as rejected and never counts for a target, however fast. The run
records the host's ISA flags, its load average, and the matmul peak of the best engine for each precision (fp32:
torch.mm / ORT MatMul; int8: ORT MatMulInteger u8 x s8 and u8 x u8; bf16: torch.mm in bf16), measured at the start
and at the end. Targets, at batch 8, judged on ViT-S/16: on an AMX host, the fastest verified hub-vit path >= 1.25x
OpenVINO default and >= 4x timm eager fp32; on a host without AMX, >= 1.0x the best verified peer. ViT-Ti/16 runs too
(its own rows and targets): every size must pass the criterion, the int8 variants included. `--quick` runs ViT-Ti/16
alone, briefly, and writes no result: a check that the path works, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from run_info import add_note_option, check_writable, cpu_identity, cpu_model, run_info, write_json

from hub_vit.openvino_runtime import core

REPO = Path(__file__).resolve().parents[1]
# hub-vit name -> (timm's name for the same architecture, GMACs per 224 px image (timm / the ViT paper's FLOP counts,
# as MACs), what the report calls it); every row of one model runs the same random weights
MODELS = {"vit_ti16": ("vit_tiny_patch16_224", 1.26, "ViT-Ti/16"),
          "vit_s16": ("vit_small_patch16_224", 4.6, "ViT-S/16")}
TARGET_MODEL = "vit_s16"  # the targets are judged on it
AMX_TARGETS = (1.25, 4.0)  # x OpenVINO default, x timm eager fp32


def host() -> dict[str, Any]:
    from hub_vit.host import isa_flags

    flags = isa_flags()
    return {"cpu": cpu_model(), **cpu_identity(), "logical_cpus": os.cpu_count(), "isa_flags": flags,
            "kind": host_kind(flags)}


def host_kind(flags: list[str]) -> str:
    """The result file's name part: the best matrix unit the CPU has."""
    for flag, kind in (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512_vnni", "avx512vnni"),
                       ("avx_vnni", "avxvnni"), ("avx2", "avx2")):
        if flag in flags:
            return kind
    return "generic"


def has_bf16(flags: list[str]) -> bool:
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))


# -- matmul peaks ----------------------------------------------------------------------------------------------------
def _best_rate(fn: Callable[[], Any], macs: float, seconds: float) -> float:
    fn()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return macs / best


def _ort_matmul(op: str, a_type: int, b_type: int, n: int, threads: int) -> Callable[[], Any]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    as_np = {TensorProto.FLOAT: np.float32, TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
    w = rng.integers(0, 100, (n, n)).astype(as_np[b_type]) if b_type != TensorProto.FLOAT else \
        rng.standard_normal((n, n)).astype(np.float32)
    out_type = TensorProto.FLOAT if op == "MatMul" else TensorProto.INT32
    graph = helper.make_graph([helper.make_node(op, ["a", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", a_type, [n, n])],
                              [helper.make_tensor_value_info("y", out_type, [n, n])], [numpy_helper.from_array(w, "w")])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    a = rng.integers(0, 100, (n, n)).astype(as_np[a_type]) if a_type != TensorProto.FLOAT else \
        rng.standard_normal((n, n)).astype(np.float32)
    return lambda: session.run(None, {"a": a})


def _openvino_matmul(precision: str, n: int, threads: int) -> Callable[[], Any]:
    """(n, n) x (n, n) weights on OpenVINO's CPU plugin: f32, bf16 (the precision hint), or int8 (NNCF-quantised,
    as `openvino-int8` builds it)."""
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    x = ops.parameter([n, n], np.float32, name="a")
    model = ov.Model([ops.matmul(x, ops.constant(rng.standard_normal((n, n)).astype(np.float32)), False, False)],
                     [x], "mm")
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads}
    if precision == "int8":
        import nncf

        with contextlib.redirect_stdout(io.StringIO()):
            model = nncf.quantize(model, nncf.Dataset([a]), subset_size=1)
    else:
        config["INFERENCE_PRECISION_HINT"] = precision
    request = core().compile_model(model, "CPU", config).create_infer_request()
    return lambda: request.infer([a])


def matmul_peaks(threads: int, seconds: float, bf16_units: bool, n: int = 2048) -> dict[str, dict[str, float]]:
    """GMAC/s of an n^3 matmul per precision and engine (best of repeated runs); OpenVINO's bf16 only with bf16 units
    (its emulation elsewhere takes seconds per matmul)."""
    from onnx import TensorProto

    a, b = torch.randn(n, n), torch.randn(n, n)
    ab, bb = a.bfloat16(), b.bfloat16()
    macs = float(n) ** 3
    peaks = {
        "fp32": {"torch.mm": _best_rate(lambda: torch.mm(a, b), macs, seconds) / 1e9,
                 "ort MatMul": _best_rate(_ort_matmul("MatMul", TensorProto.FLOAT, TensorProto.FLOAT, n, threads),
                                          macs, seconds) / 1e9},
        "int8": {"ort MatMulInteger u8s8": _best_rate(_ort_matmul("MatMulInteger", TensorProto.UINT8, TensorProto.INT8,
                                                                  n, threads), macs, seconds) / 1e9,
                 "ort MatMulInteger u8u8": _best_rate(_ort_matmul("MatMulInteger", TensorProto.UINT8,
                                                                  TensorProto.UINT8, n, threads), macs, seconds) / 1e9},
        "bf16": {"torch.mm bf16": _best_rate(lambda: torch.mm(ab, bb), macs, min(seconds, 1.0)) / 1e9},
    }
    for precision in ("f32", "int8") + ("bf16",) * bf16_units:
        key = {"f32": "fp32"}.get(precision, precision)
        peaks[key][f"openvino MatMul {precision}"] = _best_rate(_openvino_matmul(precision, n, threads), macs,
                                                                seconds) / 1e9
    return peaks


# -- runners ---------------------------------------------------------------------------------------------------------
def torch_runner(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode(), (torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()):
            return model(torch.from_numpy(x)).float().numpy()
    return run


def ort_runner(path: Path, threads: int) -> Callable[[np.ndarray], np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no spinning into the next row's time
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return lambda x: session.run(["logits"], {"pixel_values": x})[0]


def openvino_runner(model: Any, threads: int) -> Callable[[np.ndarray], np.ndarray]:
    """OpenVINO on the CPU with its defaults, only the thread count set (the run's rule for every row)."""
    compiled = core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    return lambda x: np.asarray(request.infer([x])[compiled.output(0)])


def openvino_session_runner(xml: Path, threads: int) -> Callable[[np.ndarray], np.ndarray]:
    """A hub-vit OpenVINO variant through the session the CPU classifier serves it with."""
    from hub_vit.openvino_runtime import OpenVINOSession

    session = OpenVINOSession(xml, threads)
    return lambda x: session.run(None, {"pixel_values": x})[0]


# -- the run ---------------------------------------------------------------------------------------------------------
class Rows:
    """Named runners, their verdicts against the reference, then interleaved timing."""

    def __init__(self, x: np.ndarray, reference: np.ndarray) -> None:
        self.x, self.reference = x, reference
        self.rows: list[dict[str, Any]] = []
        self.runners: dict[str, tuple[Callable[[np.ndarray], np.ndarray], int]] = {}

    def add(self, path: str, kind: str, precision: str, make: Callable[[], Callable[[np.ndarray], np.ndarray]], *,
            iters: int = 2, note: str = "", refused: str = "") -> None:
        from hub_vit.export.criterion import MAX_REL_ERROR, MIN_COSINE, per_image

        row: dict[str, Any] = {"path": path, "kind": kind, "precision": precision, "note": note}
        self.rows.append(row)
        try:
            run = make()
            out = np.asarray(run(self.x), dtype=np.float32)
        except Exception as exc:  # noqa: BLE001 - a path that does not run here is a result, recorded as such
            row["error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            print(f"  {path:48s} FAILED {row['error'][:100]}", flush=True)
            return
        cos, rel = per_image(self.reference, out)
        row.update(min_cosine=float(cos.min()), max_rel_error=float(rel.max()),
                   top1_agreement=float((out.argmax(1) == self.reference.argmax(1)).mean()))
        failed = [f"cosine {cos.min():.4f} < {MIN_COSINE}"] * bool(cos.min() < MIN_COSINE) + \
            [f"relative error {rel.max():.3f} > {MAX_REL_ERROR}"] * bool(rel.max() > MAX_REL_ERROR)
        if refused:
            failed.append(refused)
        row["verified"] = not failed
        if failed:
            row["rejected"] = "; ".join(failed)
        self.runners[path] = (run, iters)

    def measure(self, rounds: int) -> None:
        """`rounds` rounds, each running every row (`iters` times in a row) in an order drawn for that round: a row
        that always ran after another (or first) would always meet what that one leaves behind (warm caches, threads
        still busy, a load pattern of the shared host). Each row records its median over all runs and its median in
        each round (`round_ms`, in round order), which `targets` pairs row against row."""
        samples: dict[str, list[float]] = {path: [] for path in self.runners}
        per_round: dict[str, list[float]] = {path: [] for path in self.runners}
        for run, _ in self.runners.values():  # warm-up (allocations, oneDNN / OpenVINO kernel caches)
            run(self.x)
        paths = list(self.runners)
        for r in range(rounds):
            for i in np.random.default_rng(r).permutation(len(paths)):
                path = paths[i]
                run, iters = self.runners[path]
                times = []
                for _ in range(iters):
                    start = time.perf_counter()
                    run(self.x)
                    times.append(time.perf_counter() - start)
                samples[path] += times
                per_round[path].append(statistics.median(times) * 1e3)
            print(f"  round {r + 1}/{rounds} done (load average {os.getloadavg()[0]:.2f})", flush=True)
        batch = len(self.x)
        for row in self.rows:
            times = samples.get(row["path"])
            if times:
                median = statistics.median(times)
                row.update(images_per_s=batch / median, ms_per_batch=median * 1e3, samples=len(times),
                           round_ms=[round(ms, 2) for ms in per_round[row["path"]]])


def build(rows: Rows, args: argparse.Namespace, work: Path, flags: list[str], hub_name: str) -> dict[str, Any]:
    import timm

    from hub_vit.export import load_source, registry
    from hub_vit.export.plan import ExportPlan, VerificationSet
    from hub_vit.export.variants import export_variants

    info: dict[str, Any] = {}
    torch.manual_seed(0)
    timm_model = timm.create_model(MODELS[hub_name][0], pretrained=False).eval()
    hub = load_source(hub_name, pretrained=False).module.eval()
    hub.load_state_dict(timm_model.state_dict())  # the same weights in both: one fp32 reference for every row
    threads, bf16_units = args.threads, has_bf16(flags)
    bf16_note = "native bf16 units" if bf16_units else "emulated: this CPU has no avx512_bf16 / AMX"

    # peers
    rows.add("timm eager fp32", "peer", "fp32", lambda: torch_runner(timm_model))
    rows.add("timm eager + autocast bf16", "peer", "bf16", lambda: torch_runner(timm_model, torch.bfloat16),
             iters=2 if bf16_units else 1, note=bf16_note)

    def openvino_default() -> Callable[[np.ndarray], np.ndarray]:
        import openvino as ov

        model = ov.convert_model(timm_model, example_input=torch.zeros(len(rows.x), 3, 224, 224))
        return openvino_runner(model, threads)

    rows.add("OpenVINO convert_model(timm), default", "peer", "default",
             openvino_default, note="bf16 on AMX / avx512_bf16 hosts, f32 here" if not bf16_units else "bf16")
    timm_onnx = work / "timm.onnx"

    def timm_ort() -> Callable[[np.ndarray], np.ndarray]:
        with contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(timm_model, (torch.zeros(2, 3, 224, 224),), str(timm_onnx), input_names=["pixel_values"],
                              output_names=["logits"], opset_version=18, dynamo=True,
                              dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
        return ort_runner(timm_onnx, threads)

    rows.add("ONNX Runtime, plain export of timm", "peer", "fp32", timm_ort)

    # hub-vit
    rows.add("hub-vit eager fp32", "hub-vit", "fp32", lambda: torch_runner(hub))
    # OpenVINO's bf16 where the CPU has bf16 units: elsewhere the plugin emulates it (ViT-S/16: 0.4 img/s)
    all_openvino = [name for name in registry.names() if registry.get(name).runtime == "openvino"]
    openvino_variants = [v for v in all_openvino if bf16_units or v != "openvino-bf16"]
    start = time.perf_counter()
    plan = ExportPlan(("fp32", "optimized", "int8-dynamic", "int8-dynamic-s8", "int8-static", *openvino_variants))
    report = export_variants(hub, work / "hub", plan,
                             VerificationSet(n_random=8, n_photos=24, n_calibration=args.calibration, seed=0))
    info["export_seconds"] = time.perf_counter() - start
    # settings: what each build decided (openvino-int8: the layers kept in float and the search's rounds)
    info["export"] = [{"variant": o.variant, "written": o.written, "error": o.error,
                       "worst": (o.verification or {}).get("worst"), "margins": (o.verification or {}).get("margins"),
                       "settings": o.settings} for o in report.variants]
    for variant, precision in (("optimized", "fp32"), ("int8-dynamic", "int8"), ("int8-dynamic-s8", "int8"),
                               ("int8-static", "int8")):
        outcome = report.outcome(variant)
        if outcome.written:
            rows.add(f"hub-vit ONNX Runtime {variant}", "hub-vit", precision,
                     lambda f=outcome.file: ort_runner(Path(f), threads))
        else:
            rows.rows.append({"path": f"hub-vit ONNX Runtime {variant}", "kind": "hub-vit", "precision": precision,
                              "verified": False, "rejected": f"export refused it: {outcome.error}"})
    for variant in all_openvino:
        path = f"hub-vit OpenVINO runtime {variant}"
        if variant not in openvino_variants:
            rows.rows.append({"path": path, "kind": "hub-vit", "precision": registry.get(variant).precision,
                              "error": f"not run: {bf16_note}"})
            continue
        outcome = report.outcome(variant)
        if outcome.written:
            rows.add(path, "hub-vit", registry.get(variant).precision,
                     lambda f=outcome.file: openvino_session_runner(Path(f), threads))
        else:
            rows.rows.append({"path": path, "kind": "hub-vit", "precision": registry.get(variant).precision,
                              "verified": False, "rejected": f"export refused it: {outcome.error}"})
    if bf16_units:
        def compiled_bf16() -> Callable[[np.ndarray], np.ndarray]:
            import torch._inductor.config as inductor

            inductor.freezing = True
            model = torch.compile(hub, dynamic=False)
            return torch_runner(model, torch.bfloat16)

        rows.add("hub-vit torch.compile bf16 (freezing)", "hub-vit", "bf16", compiled_bf16)
    else:
        rows.rows.append({"path": "hub-vit torch.compile bf16 (freezing)", "kind": "hub-vit", "precision": "bf16",
                          "error": "not run: this CPU has no bf16 units (avx512_bf16 / AMX); emulated bf16 is slower "
                                   "than fp32"})
    return info


def paired_ratio(row: dict[str, Any], other: dict[str, Any]) -> tuple[float, list[float]]:
    """How many times faster `row` ran than `other`: the median over rounds of the ratio within each round (both ran
    in the same round, seconds apart, so a load change of the shared host between rounds cancels), and the rounds'
    ratios. Rows without per-round times (an older result's) give the ratio of their medians."""
    if not row.get("round_ms") or not other.get("round_ms"):
        return row["images_per_s"] / other["images_per_s"], []
    ratios = [theirs / ours for ours, theirs in zip(row["round_ms"], other["round_ms"], strict=True)]
    return statistics.median(ratios), [round(r, 3) for r in ratios]


def targets(rows: list[dict[str, Any]], flags: list[str]) -> dict[str, Any]:
    timed = [r for r in rows if "images_per_s" in r]
    eligible = [r for r in timed if r.get("verified")]
    hub = max((r for r in eligible if r["kind"] == "hub-vit"), key=lambda r: r["images_per_s"], default=None)
    peer = max((r for r in eligible if r["kind"] == "peer"), key=lambda r: r["images_per_s"], default=None)
    by_path = {r["path"]: r for r in timed}
    out: dict[str, Any] = {"best_hub_vit": hub and hub["path"], "best_peer": peer and peer["path"],
                           "rejected": [r["path"] for r in timed if not r.get("verified")]}
    if hub is None:
        return out
    timm_eager = by_path.get("timm eager fp32")
    ov = by_path.get("OpenVINO convert_model(timm), default")
    for key, other in (("best_vs_timm_eager", timm_eager), ("best_vs_openvino_default", ov),
                       ("best_vs_best_peer", peer)):
        if other:
            out[key], out[f"{key}_per_round"] = paired_ratio(hub, other)
    if "amx_bf16" in flags or "amx_int8" in flags:
        out["applies"] = (f"AMX host: >= {AMX_TARGETS[0]}x OpenVINO default and >= {AMX_TARGETS[1]}x timm eager "
                          "fp32")
        out["met"] = (out.get("best_vs_openvino_default", 0) >= AMX_TARGETS[0]
                      and out.get("best_vs_timm_eager", 0) >= AMX_TARGETS[1])
    else:
        out["applies"] = "host without AMX: >= 1.0x the best verified peer"
        out["met"] = out.get("best_vs_best_peer", 0) >= 1.0
    return out


def print_table(result: dict[str, Any]) -> None:
    base = next((r for r in result["rows"] if r["path"] == "timm eager fp32" and "images_per_s" in r), None)
    print(f"\n{'path':48s} {'img/s':>7s} {'ms/batch':>9s} {'x timm':>7s} {'min cos':>8s} {'max rel':>8s}  verdict")
    for r in result["rows"]:
        if "images_per_s" not in r:
            print(f"{r['path']:48s} {'-':>7s} {'-':>9s} {'-':>7s} {'-':>8s} {'-':>8s}  "
                  f"{r.get('error') or r.get('rejected', '')}"[:200])
            continue
        ratio = r["images_per_s"] / base["images_per_s"] if base else float("nan")
        verdict = "verified" if r.get("verified") else f"REJECTED: {r.get('rejected', '')}"
        print(f"{r['path']:48s} {r['images_per_s']:7.2f} {r['ms_per_batch']:9.1f} {ratio:7.2f} "
              f"{r['min_cosine']:8.4f} {r['max_rel_error']:8.3f}  {verdict}"[:220])
    print(f"\ntargets ({result['model']}):", json.dumps(result["targets_batch8"], indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (every row runs in each, in an "
                                                                "order drawn per round)")
    parser.add_argument("--peak-seconds", type=float, default=1.5, help="per matmul peak measurement")
    parser.add_argument("--calibration", type=int, default=32, help="int8 calibration images")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                        help=f"models, each with its own rows (the targets are judged on {TARGET_MODEL})")
    parser.add_argument("--quick", action="store_true", help="ViT-Ti/16, 2 rounds, short peaks: checks the path in a "
                                                             "few minutes; writes no result unless --out")
    parser.add_argument("--out", type=Path, help="default: bench/results/inference_cpu_<host kind>.json")
    add_note_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.models, args.rounds, args.peak_seconds, args.calibration = ["vit_ti16"], 2, 0.2, 16
    machine = host()
    out = args.out or (None if args.quick else REPO / "bench" / "results" / f"inference_cpu_{machine['kind']}.json")
    if out is not None:
        check_writable(out.parent)  # before the run (minutes), not after it
    info = run_info(args, packages=("timm", "onnxruntime", "openvino", "nncf"))
    torch.set_num_threads(args.threads)
    started, load_start = time.perf_counter(), os.getloadavg()
    peaks_start = matmul_peaks(args.threads, args.peak_seconds, has_bf16(machine["isa_flags"]))
    print("matmul peaks (GMAC/s):", json.dumps(peaks_start), flush=True)
    from hub_vit.export.verify import photo_batch

    x = photo_batch((224, 224), args.batch, seed=123)
    per_model = {}
    for name in args.models:
        print(f"== {MODELS[name][2]}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-inference-") as tmp:
            import timm

            torch.manual_seed(0)  # the reference: timm eager fp32 with the weights every row gets (build() re-seeds)
            reference = torch_runner(timm.create_model(MODELS[name][0], pretrained=False).eval())(x)
            rows = Rows(x, reference)
            exports = build(rows, args, Path(tmp), machine["isa_flags"], name)
            rows.measure(args.rounds)
        per_model[name] = (rows, exports)
    peaks_end = matmul_peaks(args.threads, args.peak_seconds, has_bf16(machine["isa_flags"]))
    peaks = {precision: {engine: max(value, peaks_end[precision][engine]) for engine, value in engines.items()}
             for precision, engines in peaks_start.items()}
    best_peak = {precision: max(engines.values()) for precision, engines in peaks.items()}
    models = {}
    for name, (rows, exports) in per_model.items():
        for r in rows.rows:
            if "images_per_s" in r:
                reference_peak = best_peak["int8" if r["precision"] == "int8" else "fp32"]
                r["fraction_of_peak"] = r["images_per_s"] * MODELS[name][1] / reference_peak
        models[name] = {"model": f"{MODELS[name][2]} at 224 px ({MODELS[name][1]} GMACs/image), random weights shared "
                                 "by every row",
                        "rows": rows.rows, "exports": exports,
                        "targets_batch8": targets(rows.rows, machine["isa_flags"])}
    judged = models.get(TARGET_MODEL) or next(iter(models.values()))
    result = {"run": info, "machine": machine | {"threads": args.threads, "torch": torch.__version__},
              "model": judged["model"], "batch": args.batch, "rounds": args.rounds,
              "load_average": {"start": load_start, "end": os.getloadavg()},
              "matmul_peak_gmacs_per_s": {"start": peaks_start, "end": peaks_end, "best_per_precision": best_peak},
              "criterion": "per image vs timm eager fp32: cosine >= 0.99 and relative error <= 0.15 "
                           "(hub_vit.export.criterion); hub-vit graphs also passed the export's own check",
              "rows": judged["rows"], "exports": judged["exports"], "models": models,
              "total_seconds": time.perf_counter() - started, "targets_batch8": judged["targets_batch8"]}
    for entry in models.values():
        print_table(entry)
    if out is not None:
        write_json(out, result)
        print(f"wrote {out} in {result['total_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
