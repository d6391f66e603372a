"""Where a lone request's time goes in `hub-vit serve`'s torch flavour: one image per request at concurrency 1, taken
apart phase by phase (means, which add up to the served mean), next to the same data path and forward pass in process
at batch 1.

    .venv/bin/python bench/request_path.py --device cpu            # any host: the torch flavour on the CPU
    python bench/request_path.py --device cuda                     # a GPU host (bench/gpu_check.py runs the same)

One `hub-vit serve MODEL --device D` (--flavour torch on cpu) with $HUB_VIT_PHASE_LOG set, so its classifier step logs
each execution's phases. ROUNDS rounds, each sending c1 load over HTTP and gRPC in turn to:
  public   serve's public port: the gate, then Triton's ensemble `vit`
  private  Triton's own port (read from its command line), the ensemble `vit`
  step     Triton's own port, the classifier step `vit_classifier` called directly (no ensemble)
and reading, per request, Triton's statistics of the step (queue, compute_input, compute_infer, compute_output) and
the step's own phases (explained: the requests asking for a rollout map answered apart, and the rest found;
decode: header checks + decode; transform: resize, crop, normalise on the device; forward: forward, top-k and the copy
back; answer: the responses built). The in-process baseline runs `torch_images.ImagePath`
+ `torch_runner.Runner` on the same image at batch 1 in this process. Medians over the rounds of each round's means;
the table:

  gate          public - private                    serve's gate (server/front), one more loopback hop
  ensemble      private - step                      Triton's ensemble scheduling
  front         step                                Triton's HTTP / gRPC front end, the client, the transfers
  (each target's time outside the step's Triton time: its latency less the step's queue and compute in the same
  load segment, so the model's varying speed on a busy host cancels)
  queue         Triton's queue time of the step     the dynamic batcher's wait (max_queue_delay_us)
  stub IPC      compute_input + compute_infer + compute_output - the step's own phases: the Python backend's
                shared-memory hand-off both ways
  explained, decode, transform, forward, answer: the step's own phases

Writes bench/results/request_path_<device kind>.json (or --out).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from run_info import REPO, add_note_option, run_info, write_json
from serve_process import Served

ROUNDS = 3
TARGETS = ("public", "private", "step")
STEP_PHASES = ("explained", "decode", "transform", "forward", "answer")
TRITON_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
PHASE_LOG = "HUB_VIT_PHASE_LOG"  # the classifier_torch step's (templates/classifier_torch/model.py)


def photo_jpeg() -> bytes:
    """scikit-image's chelsea (451x300), JPEG quality 90: the GPU check's load-test image."""
    from PIL import Image
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.chelsea()).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _phase_lines(log: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    text = log.read_text(encoding="utf-8") if log.exists() else ""
    return [json.loads(line) for line in text[offset:].splitlines() if line.strip()], len(text)


def _per_request(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    count = max(after["success"] - before["success"], 1)
    return {phase: (after[f"{phase}_ns"] - before[f"{phase}_ns"]) / count / 1e6 for phase in TRITON_PHASES}


def measure(served: Served, log: Path, payload: bytes, seconds: float, rounds: int = ROUNDS) -> dict[str, Any]:
    """c1 latency through each target, Triton's and the step's phases (ms), per protocol; `served` was started with
    $HUB_VIT_PHASE_LOG = `log`."""
    from hub_vit.server.client.loadtest import load_test

    step = "vit_classifier"
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {p: {t: [] for t in TARGETS} for p in ("http", "grpc")}
    for index in range(rounds):  # every protocol and target in each round, in turn: drift hits them all alike
        for protocol in ("http", "grpc") if index % 2 == 0 else ("grpc", "http"):
            for target in TARGETS if index % 2 == 0 else TARGETS[::-1]:
                url = served.url(protocol, private=target != "public")
                offset = _phase_lines(log, 0)[1]
                before = served.statistics()[step]
                result = load_test(url, [payload], protocol=protocol, model=step if target == "step" else "vit",
                                   concurrency=1, duration_s=seconds / (rounds * len(TARGETS) * 2), warmup=4)
                triton = _per_request(before, served.statistics()[step])
                lines = _phase_lines(log, offset)[0][4:]  # past the warm-up's executions
                inside = {phase: float(np.mean([line[f"{phase}_ms"] for line in lines])) if lines else None
                          for phase in STEP_PHASES}
                samples[protocol][target].append({
                    "p50_ms": result.latency_ms["p50"], "mean_ms": result.latency_ms["mean"],
                    "p99_ms": result.latency_ms["p99"], "requests": result.requests, "errors": result.errors,
                    # outside the step's Triton time: what this target adds to the step
                    "outside_ms": result.latency_ms["mean"] - sum(triton.values()),
                    "triton_ms": triton, "step_ms": inside})
    out: dict[str, Any] = {}
    for protocol, by_target in samples.items():
        out[protocol] = {target: _summary(rows) for target, rows in by_target.items()}
        out[protocol]["breakdown_ms"] = breakdown(out[protocol], [row for rows in by_target.values() for row in rows])
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return float(statistics.median(known)) if known else None

    return {"p50_ms": med([r["p50_ms"] for r in rows]), "mean_ms": med([r["mean_ms"] for r in rows]),
            "p99_ms": med([r["p99_ms"] for r in rows]), "outside_ms": med([r["outside_ms"] for r in rows]),
            "requests": sum(r["requests"] for r in rows), "errors": sum(r["errors"] for r in rows),
            "triton_ms": {k: med([r["triton_ms"][k] for r in rows]) for k in TRITON_PHASES},
            "step_ms": {k: med([r["step_ms"][k] for r in rows]) for k in STEP_PHASES}, "rounds": rows}


def breakdown(by_target: dict[str, Any], segments: list[dict[str, Any]]) -> dict[str, float | None]:
    """The table's rows (module docstring) from one protocol's targets. The model's time varies from one load
    segment to the next on a busy host, so each target's share is its latency less the step's Triton time measured in
    the same segment (`outside_ms`); the step's own phases and Triton's are medians over every segment. Means
    throughout: they add up (the served p50 beside them)."""
    public, private, step = (by_target[t] for t in TARGETS)

    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return float(statistics.median(known)) if known else None

    triton = {phase: med([s["triton_ms"][phase] for s in segments]) for phase in TRITON_PHASES}
    inside = {phase: med([s["step_ms"][phase] for s in segments]) for phase in STEP_PHASES}
    computed = triton["compute_input"] + triton["compute_infer"] + triton["compute_output"]
    return {"served_p50": public["p50_ms"], "served_mean": public["mean_ms"],
            "gate": public["outside_ms"] - private["outside_ms"],
            "ensemble": private["outside_ms"] - step["outside_ms"], "front": step["outside_ms"],
            "queue": triton["queue"],
            "stub_ipc": computed - sum(v for v in inside.values() if v is not None), **inside}


def in_process(folder: Path | None, payload: bytes, device_name: str, seconds: float) -> dict[str, float]:
    """The served data path and forward pass in this process, batch 1, on `payload`: p50 ms of the whole (header,
    decode, transform, forward, top-k, copy back) and of the forward alone (run + fetch of a filled batch)."""
    import importlib.util

    import torch

    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.config import preprocess_params
    from hub_vit.server.repository.metadata import serving_metadata
    from hub_vit.server.repository.options import ServingOptions
    from hub_vit.server.repository.torch_images import ImagePath
    from hub_vit.server.repository.torch_runner import Runner
    from hub_vit.server.repository.writer import template_dir

    folder = folder or default_model_folder()
    spec = importlib.util.spec_from_file_location("imageprep", template_dir("preprocess") / "imageprep.py")
    imageprep = importlib.util.module_from_spec(spec)
    sys.modules["imageprep"] = imageprep
    spec.loader.exec_module(imageprep)
    prep = imageprep.Preprocess.from_params(preprocess_params(serving_metadata(resolve_model(folder)),
                                                              ServingOptions()))
    device = torch.device(device_name)
    if device.type == "cpu":  # as many threads as one served instance has (templates/classifier_torch: _share)
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // ServingOptions().classifier_instances))
    path = ImagePath(imageprep, prep, device)
    runner = Runner(load_model_folder(folder)[0], device, prep.crop_size, (1,))

    def whole() -> None:
        decoded = path.decode([payload])
        with torch.inference_mode():
            path.transform_into(decoded, runner.batch(1))
            runner.fetch(*runner.run(1))

    def forward() -> None:
        runner.fetch(*runner.run(1))

    out = {}
    for name, call in (("data_path_and_forward", whole), ("forward", forward)):
        for _ in range(3):
            call()
        times, deadline = [], time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        out[f"{name}_p50_ms"] = float(np.median(times)) * 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", type=Path, default=None, help="a model folder (default: the shipped digits model)")
    parser.add_argument("--seconds", type=float, default=24.0, help="of served c1 load in all (default 24)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds over the targets (default {ROUNDS})")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/request_path_<device>.json")
    add_note_option(parser)
    args = parser.parse_args()
    out_path = args.out or REPO / "bench" / "results" / f"request_path_{args.device}.json"
    payload = photo_jpeg()
    flags = ["--device", args.device] + (["--flavour", "torch"] if args.device == "cpu" else [])
    result: dict[str, Any] = {"run": run_info(args, ("torchvision", "tritonclient")), "device": args.device,
                              "model": str(args.model or "the shipped digits model"), "image": "chelsea 451x300 JPEG"}
    with tempfile.TemporaryDirectory(prefix="hub-vit-request-path-") as tmp:
        log = Path(tmp) / "phases.jsonl"
        served = Served(args.model, flags, 600, env={PHASE_LOG: str(log)})
        try:
            result["server"] = served.describe()
            result["served"] = measure(served, log, payload, args.seconds, args.rounds)
        finally:
            served.stop()
    result["in_process"] = in_process(args.model, payload, args.device, min(args.seconds / 4, 10))
    write_json(out_path, result)
    print_table(result)
    print(f"wrote {out_path}")
    return 0


def print_table(result: dict[str, Any]) -> None:
    rows = result["served"]["http"]["breakdown_ms"]
    print(f"{'phase':<12} {'HTTP ms':>9} {'gRPC ms':>9}")
    for key in rows:
        values = [result["served"][p]["breakdown_ms"][key] for p in ("http", "grpc")]
        print(f"{key:<12} " + " ".join(f"{v:>9.3f}" if v is not None else f"{'-':>9}" for v in values))
    for key, value in result["in_process"].items():
        print(f"in process {key}: {value:.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
