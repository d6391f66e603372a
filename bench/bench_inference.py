"""Side-by-side CPU inference benchmark: hub-vit (eager, torch.compile, ONNX Runtime variants) vs timm, transformers
and a plain ONNX Runtime export of timm's model, ViT-S/16 and ViT-B/16 at 224 px, one process, one run.

    nice -n 5 .venv/bin/python bench/bench_inference.py            # writes bench/results/inference_cpu.json

Each row: images/s and median latency per batch; `peak` = the row's MAC rate as a fraction of this machine's fp32
matmul rate, measured in the same run with a large `torch.mm` and the same matmul in ONNX Runtime, at the start and
at the end (the largest of the four is the peak; the "% of start peak" printed while rows run is provisional);
ViT-S/16 = 4.6 GMACs/image, ViT-B/16 = 17.6. Timing per row: one warm-up, then at least --min-iters timed
iterations, then more until --seconds have passed or --max-iters are done, whichever comes first.
Weights are random (no network here); the architectures are the published ones. Every row uses the same thread
count. Reduced-precision rows report top-1 agreement and max |logit diff| against hub-vit fp32 eager on the same
real photos. Targets (issue #4), defined at batch 8, are printed at the end and stored in the JSON, met or not.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from run_info import add_note_option, check_writable, cpu_model, run_info, write_json

REPO = Path(__file__).resolve().parents[1]
GMACS = {"S/16": 4.6, "B/16": 17.6}  # per 224 px image (timm / the ViT paper's FLOP counts, MACs)
TIMM_NAMES = {"S/16": "vit_small_patch16_224", "B/16": "vit_base_patch16_224"}
HUB_NAMES = {"S/16": "vit_s16", "B/16": "vit_b16"}
HF_SIZES = {"S/16": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
            "B/16": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}


def bf16_note() -> str:
    """How this CPU runs bf16 autocast: native (avx512_bf16 / AMX) or emulated in fp32 (slower than fp32)."""
    native = [f for f in machine()["isa_flags"] if f in ("avx512_bf16", "amx_bf16")]
    return f"oneDNN bf16 ({', '.join(native)})" if native else "oneDNN bf16, emulated: this CPU has no avx512_bf16/AMX"


def machine() -> dict[str, Any]:
    flags: list[str] = []
    try:
        line = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
        flags = sorted(f for f in line.split() if f.startswith(("avx512", "amx", "avx_vnni", "avx2", "fma")))
    except OSError:
        pass
    import onnxruntime as ort
    import timm
    import transformers

    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "isa_flags": flags, "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "onnxruntime": ort.__version__, "timm": timm.__version__,
            "transformers": transformers.__version__}


def matmul_peak(n: int = 2048, seconds: float = 3.0) -> float:
    """fp32 MAC/s of a large square torch.mm (n^3 MACs each), best of repeated runs."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return n**3 / best


def ort_matmul_peak(threads: int, n: int = 2048, seconds: float = 3.0) -> float:
    """fp32 MAC/s of the same square matmul as one ONNX Runtime MatMul (MLAS), best of repeated runs.

    Measured because PyTorch's CPU BLAS here is MKL, which on AMD CPUs may not pick its fastest kernels; the
    "peak" used for the fractions is the larger of the two, so no row is flattered by a slow reference.
    """
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
    session.run(None, {"a": a})
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        session.run(None, {"a": a})
        best = min(best, time.perf_counter() - t)
    del onnx
    return n**3 / best


def timed(fn: Callable[[], Any], min_seconds: float, max_iters: int, min_iters: int) -> list[float]:
    """One warm-up, then `min_iters` timed calls at least; beyond those, more until `min_seconds` (counted from the
    first timed call) have passed or `max_iters` calls are done, whichever comes first: a fast row stops at
    `max_iters`, before `min_seconds`."""
    fn()  # warm-up (allocations, ORT arena, oneDNN primitive cache)
    times: list[float] = []
    t_end = time.perf_counter() + min_seconds
    while len(times) < min_iters or (time.perf_counter() < t_end and len(times) < max_iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def photos(batch: int) -> np.ndarray:
    from hub_vit.export.verify import photo_batch

    return photo_batch((224, 224), batch, seed=123)


class Bench:
    def __init__(self, args: argparse.Namespace, peak: float) -> None:
        self.args, self.peak, self.rows = args, peak, []
        self.reference: dict[tuple[str, int], np.ndarray] = {}

    def row(self, variant: str, name: str, batch: int, run: Callable[[np.ndarray], np.ndarray], *,
            compare_to_hub: bool = False, note: str = "") -> dict[str, Any] | None:
        x = photos(batch)
        try:
            with torch.inference_mode():
                out = np.asarray(run(x), dtype=np.float32)
                times = timed(lambda: run(x), self.args.seconds, self.args.max_iters, self.args.min_iters)
        except Exception as exc:  # noqa: BLE001 - a path that does not work here is a result, recorded as such
            row = {"variant": variant, "path": name, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"  {variant:5s} {name:34s} b={batch:<3d} FAILED {row['error'][:120]}", flush=True)
            self.rows.append(row)
            return None
        med = statistics.median(times)
        ips = batch / med
        row = {"variant": variant, "path": name, "batch": batch, "images_per_s": ips, "latency_ms": med * 1e3,
               "iters": len(times), "fraction_of_peak": ips * GMACS[variant] * 1e9 / self.peak, "note": note}
        ref = self.reference.get((variant, batch))
        if compare_to_hub and ref is not None:
            row["max_abs_diff_vs_hub_fp32"] = float(np.abs(out - ref).max())
            row["top1_agreement_vs_hub_fp32"] = float((out.argmax(1) == ref.argmax(1)).mean())
        extra = (f" top1={row['top1_agreement_vs_hub_fp32']:.0%} maxdiff={row['max_abs_diff_vs_hub_fp32']:.2g}"
                 if "top1_agreement_vs_hub_fp32" in row else "")
        # the start peak: the end peaks are not measured yet, so the final table's fractions can be lower
        print(f"  {variant:5s} {name:34s} b={batch:<3d} {ips:7.2f} img/s {med * 1e3:8.1f} ms "
              f"{row['fraction_of_peak']:6.1%} of start peak{extra}", flush=True)
        self.rows.append(row)
        return row


def torch_runner(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        xt = torch.from_numpy(x)
        if dtype is not None:
            with torch.autocast("cpu", dtype=dtype):
                return model(xt).float().numpy()
        return model(xt).float().numpy()
    return run


def ort_runner(path: Path, threads: int) -> Callable[[np.ndarray], np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    # no busy-waiting between runs: spinning ORT threads would steal the cores from the next (PyTorch) row
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return lambda x: session.run(["logits"], {"pixel_values": x})[0]


def bench_variant(bench: Bench, variant: str, batches: list[int], work: Path, threads: int) -> dict[str, Any]:
    import timm
    from transformers import ViTConfig, ViTForImageClassification

    from hub_vit.export import load_source
    from hub_vit.export.variants import export_variants

    info: dict[str, Any] = {}
    torch.manual_seed(0)
    hub = load_source(HUB_NAMES[variant]).module.eval()
    timm_model = timm.create_model(TIMM_NAMES[variant], pretrained=False).eval()
    hf = ViTForImageClassification(ViTConfig(**HF_SIZES[variant], num_labels=1000, image_size=224)).eval()
    hf_run = lambda x: hf(pixel_values=torch.from_numpy(x)).logits.numpy()  # noqa: E731

    # ONNX: hub-vit's verified variants (export + verification timed separately), and a plain export of timm's model
    t = time.perf_counter()
    report = export_variants(hub, work / variant.replace("/", ""), variants=["fp32", "optimized", "int8-dynamic",
                             "int8-static", "bf16"], n_random=4, n_photos=8, n_calibration=bench.args.calibration,
                             seed=0, source={"name": HUB_NAMES[variant]})
    info["hub_export_seconds"] = time.perf_counter() - t
    info["hub_export"] = [{k: getattr(o, k) for k in ("variant", "written", "fused_ops", "error")} |
                          {"verification": o.verification} for o in report.variants]
    timm_onnx = work / f"timm_{variant.replace('/', '')}.onnx"
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the dynamo exporter's progress lines
            torch.onnx.export(timm_model, (torch.zeros(2, 3, 224, 224),), str(timm_onnx), input_names=["pixel_values"],
                          output_names=["logits"], opset_version=18, dynamo=True,
                          dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    info["timm_onnx_export_seconds"] = time.perf_counter() - t

    unverified = build_unverified(report, hub, work / f"unverified_{variant.replace('/', '')}", bench.args)
    for batch in batches:
        with torch.inference_mode():
            bench.reference[(variant, batch)] = hub(torch.from_numpy(photos(batch))).numpy()
        bench.row(variant, "timm eager", batch, torch_runner(timm_model))
        bench.row(variant, "transformers ViT eager (sdpa)", batch, hf_run)
        bench.row(variant, "hub-vit eager", batch, torch_runner(hub))
        bench.row(variant, "hub-vit eager bf16 autocast", batch, torch_runner(hub, torch.bfloat16),
                  compare_to_hub=True, note=bf16_note())
        bench.row(variant, "ORT plain export of timm", batch, ort_runner(timm_onnx, threads),
                  note="torch.onnx dynamo export, ORT default graph optimisations")
        for o in report.variants:
            if o.written:
                bench.row(variant, f"hub-vit ORT {o.variant}", batch, ort_runner(Path(o.file), threads),
                          compare_to_hub=True)
            elif o.variant in unverified:  # failed verification: time it anyway, labelled, so speed is known
                bench.row(variant, f"hub-vit ORT {o.variant} (UNVERIFIED)", batch,
                          ort_runner(unverified[o.variant], threads), compare_to_hub=True,
                          note=f"not written by the export: {o.error[:80]}")
            elif batch == batches[0]:
                bench.rows.append({"variant": variant, "path": f"hub-vit ORT {o.variant}", "batch": batch,
                                   "error": o.error})
                print(f"  {variant:5s} hub-vit ORT {o.variant:22s} not available: {o.error[:110]}", flush=True)
        if variant in bench.args.compile and batch == bench.args.compile_batch:
            try:
                t = time.perf_counter()
                compiled = torch.compile(hub, dynamic=False)
                with torch.inference_mode():
                    compiled(torch.from_numpy(photos(batch)))
                info["compile_seconds"] = time.perf_counter() - t
                bench.row(variant, "hub-vit torch.compile", batch, torch_runner(compiled), compare_to_hub=True,
                          note=f"inductor, compiled for batch {batch} in {info['compile_seconds']:.0f}s")
            except Exception as exc:  # noqa: BLE001
                bench.rows.append({"variant": variant, "path": "hub-vit torch.compile", "batch": batch,
                                   "error": f"{type(exc).__name__}: {exc}"[:300]})
                print(f"  torch.compile failed: {exc}", flush=True)
    return info


def build_unverified(report: Any, hub: torch.nn.Module, work: Path, args: argparse.Namespace) -> dict[str, Path]:
    """int8 graphs that failed verification (random weights: tiny top-1 margins) rebuilt for timing only."""
    from hub_vit.export import export_onnx, quantize
    from hub_vit.export.verify import photo_batch

    failed = [o.variant for o in report.variants if not o.written and o.verification is not None
              and o.variant.startswith("int8")]
    if not failed:
        return {}
    work.mkdir(parents=True, exist_ok=True)
    fp32, out = export_onnx(hub, work / "fp32.onnx"), {}
    if "int8-dynamic" in failed:
        quantize.optimize_transformer(fp32, work / "opt.onnx", hub.spec)
        quantize.quantize_int8_dynamic(work / "opt.onnx", work / "int8-dynamic.onnx", work)
        out["int8-dynamic"] = work / "int8-dynamic.onnx"
    if "int8-static" in failed:
        calib = photo_batch((224, 224), args.calibration, seed=1)
        quantize.quantize_int8_static(fp32, work / "int8-static.onnx", calib, work)
        out["int8-static"] = work / "int8-static.onnx"
    return out


def targets(rows: list[dict[str, Any]], batch: int) -> dict[str, Any] | None:
    """The issue's targets at `batch`, per model variant: measured ratios and whether they are met; None when no row
    was measured at `batch` (an empty dict would read as "no target applies")."""
    out: dict[str, Any] = {}
    ok = [r for r in rows if "images_per_s" in r and r["batch"] == batch]
    if not ok:
        return None
    for variant in sorted({r["variant"] for r in ok}):
        rs = {r["path"]: r for r in ok if r["variant"] == variant}
        # eligible: hub-vit paths that passed the export's verification (UNVERIFIED rows failed it) and agree here
        hub_rows = [r for p, r in rs.items() if p.startswith("hub-vit") and "UNVERIFIED" not in p
                    and r.get("top1_agreement_vs_hub_fp32", 1.0) >= 0.99]
        best = max(hub_rows, key=lambda r: r["images_per_s"], default=None)
        fp32_paths = [p for p in rs if p.startswith("hub-vit") and "bf16" not in p and "int8" not in p]
        best_fp32 = max((rs[p] for p in fp32_paths), key=lambda r: r["images_per_s"], default=None)
        timm_eager, timm_ort = rs.get("timm eager"), rs.get("ORT plain export of timm")
        entry: dict[str, Any] = {"best_hub_path": best and best["path"],
                                 "best_hub_fp32_path": best_fp32 and best_fp32["path"]}
        if best and timm_eager:
            entry["best_vs_timm_eager"] = best["images_per_s"] / timm_eager["images_per_s"]
            entry["target_1.3x_timm_eager_met"] = entry["best_vs_timm_eager"] >= 1.3
        if best and timm_ort:
            entry["best_vs_timm_plain_ort"] = best["images_per_s"] / timm_ort["images_per_s"]
            entry["target_1.0x_timm_ort_met"] = entry["best_vs_timm_plain_ort"] >= 1.0
        if best_fp32:
            entry["best_fp32_fraction_of_peak"] = best_fp32["fraction_of_peak"]
            entry["target_60pct_peak_met"] = best_fp32["fraction_of_peak"] >= 0.6
            reduced = [r for p, r in rs.items() if ("int8" in p or "bf16" in p) and p.startswith("hub-vit")]
            faster = [r["path"] for r in reduced if r["images_per_s"] > best_fp32["images_per_s"]
                      and r.get("top1_agreement_vs_hub_fp32", 0) >= 0.99]
            entry["reduced_precision_faster_than_best_fp32_with_top1_99"] = [p for p in faster if "UNVERIFIED" not in p]
            entry["faster_but_failed_export_verification"] = [p for p in faster if "UNVERIFIED" in p]
        out[variant] = entry
    return out


def finalize(result: dict[str, Any]) -> dict[str, Any]:
    """Fractions of peak against the largest of the four peak measurements (start/end, torch/ORT) and the targets.

    On a shared machine the matmul rate can swing several-fold during a run; dividing by the largest rate measured
    gives the conservative (lowest) fractions. Pure post-processing of measured numbers: `--recompute FILE` re-applies
    it to a saved result without measuring anything.
    """
    peak = max(result["peak_measurements_gmacs_per_s"].values()) * 1e9
    result["matmul_peak_gmacs_per_s"] = peak / 1e9
    result["peak_rule"] = "max of torch.mm and ORT MatMul (2048^3 fp32), measured at the start and at the end"
    for r in result["rows"]:
        if "images_per_s" in r:
            r["fraction_of_peak"] = r["images_per_s"] * GMACS[r["variant"]] * 1e9 / peak
    result["targets_batch8"] = targets(result["rows"], 8)
    if result["targets_batch8"] is None:
        batches = sorted({r["batch"] for r in result["rows"]})
        result["targets_note"] = f"targets are defined at batch 8 only; this run measured batches {batches}"
    return result


def print_targets(result: dict[str, Any]) -> None:
    if result["targets_batch8"] is None:
        print(result["targets_note"])
    else:
        print("targets at batch 8:", json.dumps(result["targets_batch8"], indent=2))


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="CPU inference, 224 px (images/s, median latency per batch, fraction of fp32 matmul peak: "
                        "the largest of the start and end measurements)")
    for col in ("model", "path", "batch", "img/s", "ms/batch", "% peak", "top-1 vs fp32", "note"):
        table.add_column(col, justify="right" if col in ("batch", "img/s", "ms/batch", "% peak") else "left")
    for r in rows:
        if "images_per_s" not in r:
            table.add_row(r["variant"], r["path"], str(r["batch"]), "-", "-", "-", "-", r.get("error", "")[:60])
            continue
        agree = r.get("top1_agreement_vs_hub_fp32")
        table.add_row(r["variant"], r["path"], str(r["batch"]), f"{r['images_per_s']:.2f}", f"{r['latency_ms']:.1f}",
                      f"{r['fraction_of_peak']:.1%}", "-" if agree is None else f"{agree:.0%}", r.get("note", ""))
    Console(width=160).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["S/16", "B/16"], choices=sorted(GMACS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="timed seconds per row, unless --max-iters come first (--min-iters always run)")
    parser.add_argument("--max-iters", type=int, default=20,
                        help="timed iterations at most per row (stops a fast row before --seconds)")
    parser.add_argument("--calibration", type=int, default=8, help="int8-static calibration images")
    parser.add_argument("--min-iters", type=int, default=1, help="timed iterations at least (after 1 warm-up)")
    parser.add_argument("--compile", nargs="*", default=["S/16"], help="variants to time with torch.compile")
    parser.add_argument("--compile-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "inference_cpu.json")
    parser.add_argument("--recompute", type=Path, help="re-derive fractions/targets of a saved result; no measuring")
    add_note_option(parser)
    args = parser.parse_args()
    if args.recompute:
        result = finalize(json.loads(args.recompute.read_text()))
        write_json(args.recompute, result)
        print_table(result["rows"])
        print_targets(result)
        return 0
    if 8 not in args.batches:
        print(f"note: targets are defined at batch 8 only; --batches {args.batches} measures none of them", flush=True)
    check_writable(args.out.parent)  # before the run (minutes), not after it
    info = run_info(args, packages=("timm", "transformers"))
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    torch_peak, ort_peak = matmul_peak(), ort_matmul_peak(args.threads)
    peak = max(torch_peak, ort_peak)
    print(f"fp32 matmul peak, 2048^3, {args.threads} threads: torch.mm {torch_peak / 1e9:.1f} GMAC/s, "
          f"ORT MatMul {ort_peak / 1e9:.1f} GMAC/s -> start peak {peak / 1e9:.1f} GMAC/s (re-measured at the end)",
          flush=True)
    bench = Bench(args, peak)
    infos: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-inference-") as tmp:
        for variant in args.variants:
            print(f"== ViT-{variant} @ 224 ==", flush=True)
            try:
                infos[variant] = bench_variant(bench, variant, args.batches, Path(tmp), args.threads)
            except Exception:  # noqa: BLE001 - keep the rows measured so far
                infos[variant] = {"error": traceback.format_exc()[-1500:]}
                print(infos[variant]["error"], file=sys.stderr)
    end_torch, end_ort = matmul_peak(), ort_matmul_peak(args.threads)  # contention check: start vs end
    result = {"run": info, "machine": machine(), "matmul_peak_gmacs_per_s": peak / 1e9,
              "peak_measurements_gmacs_per_s": {"torch_mm_start": torch_peak / 1e9, "ort_matmul_start": ort_peak / 1e9,
                                                "torch_mm_end": end_torch / 1e9, "ort_matmul_end": end_ort / 1e9},
              "gmacs_per_image": GMACS,
              "threads": args.threads, "rows": bench.rows, "exports": infos,
              "total_seconds": time.perf_counter() - started}
    finalize(result)
    write_json(args.out, result)
    print_table(bench.rows)
    print_targets(result)
    print(f"wrote {args.out} in {result['total_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
