"""The GPU check's measurements (scripts/gpu_check.sh runs it after the GPU tests): served classification with
`hub-vit serve --device cuda` against the CPU flavour, bad input, load, decode and in-process baselines, one JSON.

    python bench/gpu_check.py --device cuda                 # on a GPU host (about 5 minutes)
    python bench/gpu_check.py --device cpu --quick          # the same steps on a CPU (torch flavour on cpu), small

Steps (each result under its own key of the JSON):
1. models: the shipped default model (simplevit_digits, trained) and SimpleViT-S/16 at 224 with RANDOM weights (no
   network on the GPU host: its speed is what counts; its labels are `LABEL_i`).
2. `hub-vit serve MODEL --device cuda` (the torch flavour, GPU-sized batching) and, beside it, `hub-vit serve MODEL
   --device cpu` (the ONNX Runtime CPU flavour); the samples and photos classified over HTTP and gRPC by both:
   top-1 equal wherever the CPU's top-2 margin exceeds 2 x SCORE_ATOL, scores within SCORE_ATOL (bf16).
3. bad input on the GPU server (not an image, decompression bomb, truncated JPEG): HTTP 400, still serving.
4. load on S/16: batch-1 requests at concurrency 1/16/64/256 over HTTP and gRPC, 8-image requests at 64; several
   load-generator processes (hub-vit's load test, asyncio), their CPU reported; images per execution from Triton's
   statistics; GPU utilisation sampled with nvidia-smi.
5. decode: images/s of the server's own decoder (imageprep) on the load test's JPEG, with as many threads as cores.
6. in-process on the GPU, same run: timm vit_small_patch16_224 eager fp32, timm eager bf16 autocast, hub-vit's GPU
   path (server/torch_runner.py: bf16 autocast + CUDA graph buckets, host copies included), batch 1 and 256;
   top-1 agreement of that path with fp32 on the digits model's held-out images and on the photos.
7. targets (issue 29): in-process hub-vit >= 2x timm AMP at 256; served c256 >= 70% of in-process hub-vit at 256;
   served c1 p50 <= in-process batch-1 latency + 3 ms.

Started as `python bench/gpu_check.py` (bench/ on sys.path for run_info).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from run_info import REPO, add_note_option, run_info, write_json

SCORE_ATOL = 2e-2  # bf16 against float32, softmax scores
S16 = "simplevit_s16"
TIMM_S16 = "vit_small_patch16_224"


# -- small helpers ------------------------------------------------------------------------------------------------
def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def encode(array: np.ndarray, fmt: str, **kwargs: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def photos() -> dict[str, bytes]:
    """Real photos: scikit-image's three and the demo's three JPEGs."""
    from skimage import data

    found = {name: encode(getattr(data, name)(), "JPEG", quality=90) for name in ("astronaut", "chelsea", "coffee")}
    for path in sorted((REPO / "hub_vit" / "demo" / "examples").glob("*.jpg")):
        found[f"demo_{path.stem}"] = path.read_bytes()
    return found


def free_port() -> int:
    from hub_vit.server.runtime.launcher import free_port as free

    return free()


def gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def file_tag(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `h100`, `NVIDIA H200` -> `h200`, else the name's letters and digits."""
    found = re.search(r"\b([A-Z]\d{2,4})\b", name)
    return found[1].lower() if found else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def random_s16_folder(root: Path, img_size: int) -> Path:
    """SimpleViT-S/16 with random weights (head drawn so the logits have a scale), saved as a model folder."""
    import timm
    import torch

    import hub_vit  # noqa: F401
    from hub_vit.folder import save_model_folder

    torch.manual_seed(0)
    model = timm.create_model(S16, pretrained=False, img_size=img_size).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return save_model_folder(model, root / f"simplevit_s16_random_{img_size}")


# -- servers ------------------------------------------------------------------------------------------------------
class Served:
    """`hub-vit serve` in a subprocess on free ports, until `stop()`."""

    def __init__(self, model: Path | None, extra: list[str], timeout_s: float) -> None:
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        command = [sys.executable, "-c", "from hub_vit.cli import main; main()", "serve",
                   *([str(model)] if model else []), "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                   "--metrics-port", str(self.metrics), "--quiet", *extra]
        self.command = command[3:]
        started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        while time.monotonic() - started < timeout_s and self.process.poll() is None:
            line = self.process.stdout.readline()
            lines.append(line)
            if line.strip().startswith("metrics"):
                break
        self.banner = "".join(lines)
        if "metrics" not in self.banner:
            errors = self.stop()
            raise RuntimeError(f"hub-vit {' '.join(self.command)} did not start within {timeout_s:.0f} s:\n"
                               f"{self.banner}\n{errors[-4000:]}")
        self.ready_s = time.monotonic() - started
        device = re.search(r"device\s+(.+)", self.banner)
        self.device = device[1].strip() if device else "?"

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http if protocol == 'http' else self.grpc}"

    def stop(self) -> str:
        """SIGTERM (a drain), SIGKILL after 60 s; returns what the command wrote to stderr."""
        if self.process.returncode is not None:
            return ""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.communicate(timeout=60)[1] or ""
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.communicate()[1] or ""


def compare(gpu: Served, cpu: Served, images: dict[str, bytes]) -> dict[str, Any]:
    """Both servers classify `images` over HTTP and gRPC; top-1 and scores compared (module docstring, step 2)."""
    from hub_vit.server.client.classifier import Classifier

    out: dict[str, Any] = {}
    names = list(images)
    for protocol in ("http", "grpc"):
        answers = {}
        for key, server in (("gpu", gpu), ("cpu", cpu)):
            with Classifier(server.url(protocol), protocol=protocol) as client:
                answers[key] = client.classify([images[n] for n in names])
        compared, same_top1, worst = 0, 0, 0.0
        disagreements = []
        for name, a, b in zip(names, answers["gpu"], answers["cpu"], strict=True):
            worst = max(worst, float(np.abs(np.asarray(a.scores) - np.asarray(b.scores)).max()))
            if len(b.scores) > 1 and b.scores[0] - b.scores[1] <= 2 * SCORE_ATOL:
                continue  # a near-tie: bf16 may order it either way
            compared += 1
            same_top1 += a.labels[0] == b.labels[0]
            if a.labels[0] != b.labels[0]:
                disagreements.append({"image": name, "gpu": a.labels[0], "cpu": b.labels[0]})
        out[protocol] = {"images": len(names), "compared_top1": compared, "same_top1": same_top1,
                         "max_score_difference": worst, "within_tolerance": worst <= SCORE_ATOL,
                         "disagreements": disagreements,
                         "gpu_top1": {n: p.labels[0] for n, p in zip(names, answers["gpu"], strict=True)}}
    out["passed"] = all(out[p]["same_top1"] == out[p]["compared_top1"] and out[p]["within_tolerance"]
                        for p in ("http", "grpc"))
    return out


def bad_input(server: Served, good: bytes) -> dict[str, Any]:
    import struct
    import zlib

    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client.classifier import Classifier

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 50_000, 50_000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    cases = {"not_an_image": b"plain text, not a picture", "decompression_bomb": bomb,
             "truncated_jpeg": good[: len(good) // 2]}
    out: dict[str, Any] = {}
    for protocol in ("http", "grpc"):
        with Classifier(server.url(protocol), protocol=protocol) as client:
            for case, data in cases.items():
                try:
                    client.classify([good, data])
                    status, message = "answered", ""
                except InferenceServerException as err:
                    status, message = str(err.status()), err.message() or ""
                still = client.ready() and len(client.classify(good)[0].labels) > 0
                out[f"{protocol}/{case}"] = {"status": status, "message": message[:200], "still_serving": still,
                                             "passed": status in ("400", "StatusCode.INVALID_ARGUMENT") and still}
    out["passed"] = all(v["passed"] for v in out.values() if isinstance(v, dict))
    return out


# -- load ---------------------------------------------------------------------------------------------------------
class GpuSampler:
    """nvidia-smi's utilisation.gpu every 200 ms while running (absent without nvidia-smi)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.process: subprocess.Popen[str] | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        try:
            self.process = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,"
                                             "nounits", "-lms", "200"], stdout=subprocess.PIPE, text=True,
                                            stderr=subprocess.DEVNULL)
        except OSError:
            return self
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self.samples.append(float(line.split(",")[0]))
            except ValueError:
                continue

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def mean(self) -> float | None:
        return float(np.mean(self.samples)) if self.samples else None


def _generator(args: tuple[str, str, list[bytes], int, int, float]) -> dict[str, Any]:
    url, protocol, payloads, concurrency, batch, seconds = args
    from hub_vit.server.client.loadtest import load_test

    return load_test(url, payloads, protocol=protocol, concurrency=concurrency, duration_s=seconds,
                     batch=batch).to_dict()


def load_point(server: Served, pool: Any, protocol: str, payloads: list[bytes], concurrency: int, batch: int,
               seconds: float, processes: int) -> dict[str, Any]:
    """One closed-loop load point spread over `processes` generator processes (each its share of `concurrency`)."""
    from hub_vit.server.client.classifier import Classifier

    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    shares = [s for s in shares if s]
    url = server.url(protocol)
    with Classifier(server.url("http")) as client:
        before = client.statistics()
    with GpuSampler() as gpu:
        results = pool.map(_generator, [(url, protocol, payloads, s, batch, seconds) for s in shares])
    with Classifier(server.url("http")) as client:
        after = client.statistics()
    step = "vit_classifier"
    inferences = after[step]["inference_count"] - before[step]["inference_count"]
    executions = after[step]["execution_count"] - before[step]["execution_count"]
    answered = sum(r["requests"] for r in results)
    weights = [r["requests"] for r in results]
    return {
        "protocol": protocol, "concurrency": concurrency, "batch": batch, "seconds": seconds,
        "generator_processes": len(shares),
        "requests": answered, "errors": sum(r["errors"] for r in results),
        "images_per_s": sum(r["images_per_s"] for r in results),
        "requests_per_s": sum(r["throughput_rps"] for r in results),
        # exact within one process; across processes: p50 weighted by requests, p99 the worst process's
        "latency_ms": {"p50": float(np.average([r["latency_ms"]["p50"] for r in results], weights=weights))
                       if answered else None,
                       "p99": max(r["latency_ms"]["p99"] for r in results) if answered else None},
        "images_per_execution": inferences / executions if executions else None,
        "gpu_utilisation_percent": gpu.mean(),
        "client_cores_busy": sum(r["load_generator_cores"] for r in results),
        "client_cpu_ms_per_request": float(np.average([r["load_generator_cpu_ms_per_request"] for r in results],
                                                      weights=weights)) if answered else None,
        "error_messages": {k: v for r in results for k, v in r["error_messages"].items()},
    }


# -- decode and in-process ----------------------------------------------------------------------------------------
def decode_rate(meta_params: dict[str, str], payload: bytes, seconds: float) -> dict[str, Any]:
    """The served decoder (imageprep, as the step loads it) on `payload`, on as many threads as cores."""
    import importlib.util
    from concurrent.futures import ThreadPoolExecutor

    from hub_vit.server.repository.writer import template_dir

    spec = importlib.util.spec_from_file_location("imageprep", template_dir("preprocess") / "imageprep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["imageprep"] = module
    spec.loader.exec_module(module)
    prep = module.Preprocess.from_params(meta_params)
    threads = len(os.sched_getaffinity(0))
    count = 0
    with ThreadPoolExecutor(threads) as pool:
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < deadline:
            list(pool.map(prep, [payload] * threads * 4))
            count += threads * 4
        elapsed = time.perf_counter() - start
    return {"threads": threads, "images_per_s": count / elapsed, "payload_bytes": len(payload)}


def timed(fn: Callable[[], Any], iterations: int, sync: Callable[[], None], warmup: int = 3) -> float:
    """Seconds per call, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    sync()
    return (time.perf_counter() - start) / iterations


def in_process(device_name: str, batches: tuple[int, ...], img: int, compile_model: bool,
               quick: bool = False) -> dict[str, Any]:
    import timm
    import torch

    import hub_vit  # noqa: F401
    from hub_vit.server.repository.config import cuda_graph_buckets
    from hub_vit.server.repository.torch_runner import Runner

    device = torch.device(device_name)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out: dict[str, Any] = {"note": "random weights; images/s; latency_ms = seconds per batch", "rows": []}

    def count(batch: int) -> dict[str, int]:  # a CPU dry run (quick) only checks that every row runs
        if quick:
            return {"iterations": 1, "warmup": 1}
        return {"iterations": 50 if batch == 1 else 10, "warmup": 3}

    def row(name: str, batch: int, seconds: float) -> None:
        out["rows"].append({"path": name, "batch": batch, "latency_ms": seconds * 1e3, "images_per_s": batch / seconds})
        log(f"in-process {name} b{batch}: {batch / seconds:.0f} img/s, {seconds * 1e3:.2f} ms")

    timm_model = timm.create_model(TIMM_S16, pretrained=False).eval().to(device)
    for batch in batches:
        x = torch.randn(batch, 3, img, img, device=device)
        with torch.inference_mode():
            row("timm eager fp32", batch, timed(lambda x=x: timm_model(x), sync=sync, **count(batch)))
            if device.type == "cuda":
                def amp(x: torch.Tensor = x) -> Any:
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        return timm_model(x)
                row("timm eager bf16 autocast", batch, timed(amp, sync=sync, **count(batch)))
    timm_model = None  # free its memory before the next model
    model = timm.create_model(S16, pretrained=False).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    variants = [("hub-vit runner (bf16 + CUDA graphs)" if device.type == "cuda" else "hub-vit runner (fp32)", False)]
    if compile_model and device.type == "cuda":
        variants.append(("hub-vit runner (bf16 + torch.compile + CUDA graphs)", True))
    for name, compiled in variants:
        started = time.perf_counter()
        runner = Runner(model, device, (img, img), cuda_graph_buckets(max(batches)), compile_model=compiled)
        out[f"{name} warm-up s"] = time.perf_counter() - started
        for batch in batches:
            x = np.random.default_rng(0).uniform(-1, 1, (batch, 3, img, img)).astype(np.float32)
            row(name + ", host copies included", batch,
                timed(lambda x=x, runner=runner: runner(x), sync=sync, **count(batch)))
    return out


def agreement(device_name: str, images: dict[str, bytes]) -> dict[str, Any]:
    """Top-1 of hub-vit's GPU path against fp32 eager: the digits model on its held-out images, S/16 (random) on
    the photos."""
    import timm
    import torch
    from timm.data import create_transform, resolve_data_config

    import hub_vit  # noqa: F401
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder
    from hub_vit.server.repository.torch_runner import Runner
    from hub_vit.train.digits import load_digits_split

    device = torch.device(device_name)
    out = {}
    model, info = load_model_folder(default_model_folder())
    transform = create_transform(**resolve_data_config(pretrained_cfg=dict(info.pretrained_cfg)), is_training=False)
    from PIL import Image

    val, _ = load_digits_split("val")
    x = torch.stack([transform(Image.fromarray(a).convert("RGB")) for a in val])
    with torch.no_grad():
        fp32 = model(x).argmax(1).numpy()
    runner = Runner(model, device, tuple(x.shape[-2:]), (64, 128, 256, 512))
    fast = np.concatenate([runner(x[i:i + 512].numpy()).argmax(1) for i in range(0, len(x), 512)])
    out["digits_val"] = {"images": len(x), "top1_agreement": float((fast == fp32).mean())}
    s16 = timm.create_model(S16, pretrained=False).eval()
    torch.nn.init.normal_(s16.head.weight, std=0.5)
    transform = create_transform(**resolve_data_config(model=s16), is_training=False)
    x = torch.stack([transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in images.values()])
    with torch.no_grad():
        fp32 = s16(x).argmax(1).numpy()
    fast = Runner(s16, device, (224, 224), (8,))(x.numpy()).argmax(1)
    out["photos_s16_random"] = {"images": len(x), "top1_agreement": float((fast == fp32).mean()),
                                "note": "random weights: near-ties are common, a weak check"}
    return out


# -- the run ------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes (a dry run of every step on a CPU)")
    parser.add_argument("--seconds", type=float, default=None, help="per load point (default 6, quick 2)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile in process (minutes)")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/gpu_serving_<gpu>.json")
    add_note_option(parser)
    args = parser.parse_args()
    quick = args.quick
    seconds = args.seconds or (2.0 if quick else 6.0)
    concurrencies = (1, 4) if quick else (1, 16, 64, 256)
    big = 8 if quick else 256
    gpu = gpu_name(args.device)
    start_s = 900 if quick else 240  # a server's start: a shared 2-core host took 90 to over 300 s for the torch step
    out_path = args.out or REPO / "bench" / "results" / f"gpu_serving_{file_tag(gpu)}.json"
    result: dict[str, Any] = {"run": run_info(args, ("timm", "torchvision", "tritonclient")), "gpu": gpu,
                              "device": args.device, "quick": quick, "score_atol": SCORE_ATOL}
    if args.device == "cuda":
        result["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                               "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(out_path, result)
        if os.environ.get("OUT"):
            write_json(Path(os.environ["OUT"]) / out_path.name, result)

    gpu_flags = ["--device", "cuda"] if args.device == "cuda" else ["--device", "cpu", "--flavour", "torch"]
    if quick:
        gpu_flags += ["--max-batch-size", "8"]
    images = photos()
    from hub_vit.catalog import default_model_folder
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.config import preprocess_params
    from hub_vit.server.repository.metadata import serving_metadata
    from hub_vit.server.repository.options import ServingOptions

    samples = {p.name: p.read_bytes() for p in sorted(Path(default_model_folder()).glob("samples/*.png"))}
    with tempfile.TemporaryDirectory(prefix="hub-vit-gpu-check-") as tmp:
        s16_folder = random_s16_folder(Path(tmp), 224)
        for key, folder, shown in (("digits", None, {**samples, **images}), ("s16_224_random", s16_folder, images)):
            log(f"serving {key} on {args.device} and on the CPU flavour")
            served = Served(folder, gpu_flags, start_s)
            reference = None
            try:
                reference = Served(folder, ["--device", "cpu"], start_s)
                result[key] = {"gpu_server": {"command": served.command, "device": served.device,
                                              "ready_s": served.ready_s},
                               "cpu_server": {"command": reference.command, "ready_s": reference.ready_s},
                               "compare": compare(served, reference, shown)}
                reference.stop()  # the GPU server gets the host to itself for the rest
                result[key]["bad_input"] = bad_input(served, images["coffee"])
                log(f"{key}: compare passed {result[key]['compare']['passed']}, bad input passed "
                    f"{result[key]['bad_input']['passed']}")
                save()
                if key == "s16_224_random":
                    result["load"] = run_load(served, images["chelsea"], concurrencies, seconds, quick)
                    save()
            finally:
                served.stop()
                if reference is not None:
                    reference.stop()
        # the served transform's parameters, as config.pbtxt carries them
        params = preprocess_params(serving_metadata(resolve_model(s16_folder)), ServingOptions())
    result["decode"] = decode_rate(params, images["chelsea"], seconds)
    log(f"decode: {result['decode']['images_per_s']:.0f} img/s on {result['decode']['threads']} threads")
    save()
    result["in_process"] = in_process(args.device, (1, big), 224, args.compile, quick)
    result["agreement"] = agreement(args.device, images)
    result["targets"] = targets(result, big)
    save()
    log(f"wrote {out_path}")
    print(json.dumps(result["targets"], indent=2))
    return 0


def run_load(served: Served, payload: bytes, concurrencies: tuple[int, ...], seconds: float,
             quick: bool) -> list[dict[str, Any]]:
    points = []
    processes = 2 if quick else 8
    context = multiprocessing.get_context("spawn")  # no forked CUDA or tritonclient state
    with context.Pool(processes) as pool:
        for protocol in ("http", "grpc"):
            for concurrency in concurrencies:
                point = load_point(served, pool, protocol, [payload], concurrency, 1, seconds,
                                   min(processes, concurrency))
                points.append(point)
                log(f"load {protocol} c{concurrency} b1: {point['images_per_s']:.0f} img/s, p50 "
                    f"{point['latency_ms']['p50']:.2f} ms, {point['images_per_execution'] or 0:.1f} img/exec, "
                    f"GPU {point['gpu_utilisation_percent']}%, client {point['client_cores_busy']:.1f} cores")
        for protocol in ("http", "grpc"):
            concurrency = 4 if quick else 64
            points.append(load_point(served, pool, protocol, [payload], concurrency, 8, seconds,
                                     min(processes, concurrency)))
    return points


def targets(result: dict[str, Any], big: int) -> dict[str, Any]:
    rows = result["in_process"]["rows"]

    def best(prefix: str, batch: int) -> dict[str, Any] | None:
        found = [r for r in rows if r["path"].startswith(prefix) and r["batch"] == batch]
        return max(found, key=lambda r: r["images_per_s"]) if found else None

    hub_big, amp_big, hub_one = best("hub-vit", big), best("timm eager bf16", big), best("hub-vit", 1)
    load = result.get("load", [])
    c_big = max((p for p in load if p["batch"] == 1), key=lambda p: p["concurrency"], default=None)
    c_one = [p for p in load if p["batch"] == 1 and p["concurrency"] == 1]
    out: dict[str, Any] = {}
    if hub_big and amp_big:
        ratio = hub_big["images_per_s"] / amp_big["images_per_s"]
        out["in_process_vs_timm_amp_at_batch"] = {"batch": big, "ratio": ratio, "target": 2.0, "met": ratio >= 2.0}
    if hub_big and c_big:
        ratio = max(p["images_per_s"] for p in load if p["batch"] == 1 and p["concurrency"] == c_big["concurrency"]) \
            / hub_big["images_per_s"]
        out["served_max_concurrency_vs_in_process"] = {"concurrency": c_big["concurrency"], "ratio": ratio,
                                                       "target": 0.7, "met": ratio >= 0.7}
    if hub_one and c_one:
        p50 = min(p["latency_ms"]["p50"] for p in c_one)
        out["served_c1_p50_over_in_process_b1_ms"] = {"p50_ms": p50, "in_process_ms": hub_one["latency_ms"],
                                                      "over_ms": p50 - hub_one["latency_ms"], "target": 3.0,
                                                      "met": p50 - hub_one["latency_ms"] <= 3.0}
    if "decode" in result and c_big:
        decode = result["decode"]["images_per_s"]
        served = c_big["images_per_s"]
        out["decode_limits_served"] = {"decode_images_per_s": decode, "served_images_per_s": served,
                                       "decode_is_the_limit": served >= 0.8 * decode,
                                       "gpu_utilisation_percent": c_big["gpu_utilisation_percent"]}
    out["all_met"] = all(v.get("met", True) for v in out.values() if isinstance(v, dict))
    return out


if __name__ == "__main__":
    sys.exit(main())
