"""How long `hub-vit serve` takes to start, the first time and again: the second start reuses the CPU variant the first
one chose (the variant cache, server/repository/variant_cache.py) instead of building, verifying and timing every
candidate again.

    .venv/bin/python bench/bench_serve_start.py                 # ViT-S/16 at 224, random weights, --cpu-variant auto
    .venv/bin/python bench/bench_serve_start.py --quick         # ViT-Ti/16 at 112: a check of the path, not a result

Each start is `hub-vit serve <model> --cpu-variant auto` as a user runs it, in a process of its own, timed from launch
to the moment its public HTTP port answers ready; then it is stopped (SIGTERM). The variant cache is an empty folder
of this run's (`HUB_VIT_VARIANT_CACHE`), so the first start builds and the second one finds the entry. The model is a
random-weights hub-vit folder written for the run (a registered name without weights would be random, but `serve`
treats it as untrained and keeps fp32). Target: the second start at least 5x faster than the first
(`second_start_speedup`). Writes `bench/results/serve_start_<host kind>.json` (not with --quick, unless --out).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_inference import host
from run_info import REPO, add_note_option, check_writable, cpu_model, run_info, write_json
from serve_process import ready

TARGET = 5.0


def model_folder(name: str, img_size: int, folder: Path) -> Path:
    """A hub-vit model folder of `name` at `img_size` with random weights, seed 0 (its head non-zero, as a trained
    one). `serve` judges a folder as trained (top-1 on the photos), so which int8 candidates pass depends on the draw:
    the seed makes the run's choice reproducible."""
    import torch

    from hub_vit.catalog import get_entry
    from hub_vit.folder import save_model_folder
    from hub_vit.model import VisionTransformer

    torch.manual_seed(0)
    spec = get_entry(name).spec.replace(img_size=img_size, head_zeroinit=False)
    return save_model_folder(VisionTransformer(spec).eval(), folder)


def free_port() -> int:
    from hub_vit.server.runtime.launcher import free_port as free

    return free()


def start_once(folder: Path, env: dict[str, str], timeout_s: float) -> dict:
    """Seconds from launching `hub-vit serve` to its HTTP port answering ready, and the CPU variant line it printed."""
    ports = [free_port() for _ in range(3)]
    command = [str(Path(sys.executable).with_name("hub-vit")), "serve", str(folder), "--cpu-variant", "auto",
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    log = tempfile.TemporaryFile()
    start = time.perf_counter()
    serve = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not ready(ports[0]):
            if serve.poll() is not None or time.perf_counter() - start > timeout_s:
                log.seek(0)
                raise SystemExit(f"hub-vit serve did not become ready:\n{log.read().decode()[-3000:]}")
            time.sleep(0.25)
        seconds = time.perf_counter() - start
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        try:
            serve.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
    log.seek(0)
    line = next((ln for ln in log.read().decode(errors="replace").splitlines() if "CPU variant:" in ln), "")
    return {"seconds": seconds, "cpu_variant": line.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_s16", help="registered architecture (random weights)")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--quick", action="store_true", help="ViT-Ti/16 at 112 px: checks the path in a minute")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one start may take")
    parser.add_argument("--out", type=Path, help="default: bench/results/serve_start_<host kind>.json (none with "
                                                 "--quick)")
    add_note_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.model, args.img_size = "vit_ti16", 112
    kind = host()["kind"]
    out = args.out or (None if args.quick else REPO / "bench" / "results" / f"serve_start_{kind}.json")
    if out is not None:
        check_writable(out.parent)
    with tempfile.TemporaryDirectory(prefix="bench-serve-start-") as tmp:
        folder = model_folder(args.model, args.img_size, Path(tmp) / "model")
        env = {**os.environ, "HUB_VIT_VARIANT_CACHE": str(Path(tmp) / "variant-cache")}
        first = start_once(folder, env, args.timeout)
        print(f"first start  {first['seconds']:7.1f} s  {first['cpu_variant']}", flush=True)
        second = start_once(folder, env, args.timeout)
        print(f"second start {second['seconds']:7.1f} s  {second['cpu_variant']}", flush=True)
    speedup = first["seconds"] / second["seconds"]
    print(f"second start {speedup:.1f}x faster than the first (target >= {TARGET:g}x: "
          f"{'met' if speedup >= TARGET else 'MISSED'})")
    if out is not None:
        write_json(out, {"run": run_info(args, packages=("openvino", "nncf")), "cpu": cpu_model(),
                         "host_kind": kind, "model": args.model, "img_size": args.img_size,
                         "load_average_end": os.getloadavg(), "first": first, "second": second,
                         "second_start_speedup": speedup, "target": TARGET, "met": speedup >= TARGET})
        print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
