"""The GPU check's measurements (scripts/gpu_check.sh runs it after the GPU tests): hub-vit's served torch flavour
against the strongest in-process peers and against the CPU flavour, in one run, one JSON.

    python bench/gpu_check.py --device cuda                 # on a GPU host (about 3 minutes)
    python bench/gpu_check.py --device cpu --quick          # every step on a CPU (torch flavour on cpu), small

Steps, each result under its own key of the JSON; a step that fails is recorded under "errors" and the rest go on:
1. in_process (first, while the GPU is free), SimpleViT-S/16 / timm vit_small_patch16_224 at 224, random weights,
   input already on the device: timm eager fp32, bf16 autocast, bf16 weights, and torch.compile with bf16 weights
   (the strongest peer without TensorRT); hub-vit's served forward (server/torch_runner.py: bf16 weights, CUDA graph
   buckets, top-k on the device, (N, K) fetched), and the whole served path in process (torch_images.ImagePath on
   the load test's JPEG + the forward): batch 1 and BIG.
2. decode: the data path alone on BIG copies of that JPEG: imageprep's header checks (CPU, one thread); its scan
   checks (CPU, a thread per core: the whole scan read at 1/8 scale, before any device decode); decode on the device
   + resize, crop, normalise (nvJPEG on cuda; headers read before); the three together (the in-process paths use a
   thread pool of every core). thread_scaling: the scan checks on 1, 2, 4, ... threads, beside lock-free work.
3. servers: the shipped default model (simplevit_digits, trained) and S/16 (random weights; no network on the GPU
   host) served with `--device cuda` (the torch flavour; on cpu `--device cpu --flavour torch`) and, started beside
   it, the CPU flavour (`--device cpu --cpu-variant fp32`); the samples and photos classified over HTTP and gRPC by
   both (top-1 equal wherever the CPU's top-2 margin exceeds 2 x SCORE_ATOL, scores within SCORE_ATOL); bad input
   (not an image, decompression bomb, truncated JPEG: 400 / INVALID_ARGUMENT, still serving); which numpy the
   stubs mapped.
4. load on S/16 (digits with --quick): batch-1 requests at concurrency BIG over HTTP and gRPC, to serve's public ports
   (the gates) and to Triton's own (private) ports, from 8 load-generator processes; GPU utilisation (nvidia-smi),
   images per execution, the step's phases per image and its garbage collections (ms per s, longest); then on
   Triton's own ports of a server with twice the default classifier instances (`load_more_instances`: 8, where
   serve's default on cuda is 4; 3 with --quick); then HTTP on Triton's own port of a server whose batches hold at
   most a quarter of BIG (`load_smaller_batches`: whether the instances still take turns); then Triton's own ports
   of a server with the other queue policy than the device's default (`load_other_queue_policy`: on cuda with one,
   where the default has none; whether the batcher's wait for a new request after an execution, which only a queue
   policy allows, idles the GPU).
5. request_path: bench/request_path.py's c1 breakdown (gate, ensemble, Triton's front end, queue, stub IPC, the step's
   phases) on the same server.
6. agreement: top-1 of the served forward against fp32 eager, in process (digits held-out, S/16 on the photos).
7. targets, each a ratio against its target (issue 39): served forward >= 1.0x timm + torch.compile (bf16 weights)
   at BIG; served c256 on Triton's own ports >= 50 % of the whole path in process at BIG, over HTTP and over gRPC,
   with the GPU busy >= 50 %; c1 p50 <= the whole path in process at batch 1 + 3 ms; GPU decode + preprocess >= 15k
   images/s; served answers agree with the CPU flavour.

Started as `python bench/gpu_check.py` (bench/ on sys.path for run_info, serve_process and request_path).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from request_path import PHASE_LOG, STEP_PHASES, _per_request, _phase_lines, photo_jpeg
from request_path import measure as request_path
from run_info import REPO, add_note_option, run_info, write_json
from serve_process import Served

from hub_vit.server.repository.templates.common.stub_gc import CollectionClock

SCORE_ATOL = 2e-2  # bf16 against float32, softmax scores
S16 = "simplevit_s16"
TIMM_S16 = "vit_small_patch16_224"
# In-process row names: the rows' `path` begins with these, and `targets` finds its rows by them
TIMM_COMPILE_ROW = "timm torch.compile bf16 weights"
SERVED_FORWARD_ROW = "hub-vit served forward"  # also "... + torch.compile", and the cuda rows' "(bf16 weights, ...)"
DATA_PATH_ROW = "hub-vit data path + served forward (JPEG bytes in)"
TARGETS = {"served_forward_vs_timm_compile": 1.0, "served_c256_vs_in_process": 0.5, "gpu_busy_at_c256": 0.5,
           "c1_p50_over_in_process_b1_ms": 3.0, "gpu_decode_preprocess_images_per_s": 15_000}


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


def gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def file_tag(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `h100`, `NVIDIA H200` -> `h200`, else the name's letters and digits."""
    found = re.search(r"\b([A-Z]\d{2,4})\b", name)
    return found[1].lower() if found else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def random_s16(img_size: int = 224) -> Any:
    """SimpleViT-S/16 with random weights (head drawn so the logits have a scale)."""
    import timm
    import torch

    import hub_vit  # noqa: F401

    torch.manual_seed(0)
    model = timm.create_model(S16, pretrained=False, img_size=img_size).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return model


def imageprep_module() -> Any:
    """The served preprocessing module, loaded from its template file as a repository's step loads it."""
    import importlib.util

    from hub_vit.server.repository.writer import template_dir

    spec = importlib.util.spec_from_file_location("imageprep", template_dir("preprocess") / "imageprep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["imageprep"] = module
    spec.loader.exec_module(module)
    return module


def served_preprocess(imageprep: Any, model: Any) -> Any:
    """The served transform of a model (its data config, as config.pbtxt carries it)."""
    from hub_vit.resolve import ResolvedModel
    from hub_vit.server.repository.config import preprocess_params
    from hub_vit.server.repository.metadata import serving_metadata
    from hub_vit.server.repository.options import ServingOptions

    resolved = ResolvedModel.from_module(model, name="s16", labels=[f"LABEL_{i}" for i in range(1000)])
    return imageprep.Preprocess.from_params(preprocess_params(serving_metadata(resolved), ServingOptions()))


class Check:
    """The run's result, written after every step; a step's failure is recorded and the next one runs."""

    def __init__(self, out_path: Path, result: dict[str, Any]) -> None:
        self.out_path, self.result = out_path, result
        result.setdefault("errors", {})
        self.collections = CollectionClock().start()  # each step's garbage collections, which stop every thread

    def save(self) -> None:
        write_json(self.out_path, self.result)
        if os.environ.get("OUT"):
            write_json(Path(os.environ["OUT"]) / self.out_path.name, self.result)

    def step(self, name: str, run: Callable[[], Any], record: bool = True) -> Any:
        """`run()`'s value, also stored under `name` when `record`; None when it failed."""
        started, collecting = time.monotonic(), self.collections.ns
        try:
            value = run()
        except Exception as err:  # noqa: BLE001 - one step's failure is recorded; the others still measure
            self.result["errors"][name] = f"{type(err).__name__}: {err}"[:2000]
            log(f"{name} FAILED: {type(err).__name__}: {err}")
            traceback.print_exc()
            value = None
        else:
            if record and value is not None:
                self.result[name] = value
        self.result.setdefault("step_seconds", {})[name] = round(time.monotonic() - started, 1)
        self.result.setdefault("step_gc_seconds", {})[name] = round((self.collections.ns - collecting) / 1e9, 3)
        self.save()
        return value


# -- step 1: in process -------------------------------------------------------------------------------------------
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


def in_process(device_name: str, batches: tuple[int, ...], compile_hub_vit: bool, quick: bool) -> dict[str, Any]:
    import timm
    import torch

    import hub_vit  # noqa: F401
    from hub_vit.server.repository.config import cuda_graph_buckets
    from hub_vit.server.repository.torch_images import ImagePath
    from hub_vit.server.repository.torch_runner import Runner

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    out: dict[str, Any] = {"note": "random weights, 224 px; images/s; latency_ms = seconds per batch; input on the "
                                   "device unless the path says otherwise", "rows": []}

    def count(batch: int) -> dict[str, int]:  # a CPU dry run (quick) only checks that every row runs
        return {"iterations": 1, "warmup": 1} if quick else {"iterations": 50 if batch == 1 else 10, "warmup": 3}

    def row(name: str, batch: int, seconds: float, **extra: Any) -> None:
        out["rows"].append({"path": name, "batch": batch, "latency_ms": seconds * 1e3, "images_per_s": batch / seconds,
                            **extra})
        log(f"in-process {name} b{batch}: {batch / seconds:.0f} img/s, {seconds * 1e3:.2f} ms")

    bf16 = torch.bfloat16 if not cuda or torch.cuda.is_bf16_supported() else torch.float16
    with torch.inference_mode():
        model = timm.create_model(TIMM_S16, pretrained=False).eval().to(device)
        for batch in batches:
            x = torch.randn(batch, 3, 224, 224, device=device)
            row("timm eager fp32", batch, timed(lambda x=x: model(x), sync=sync, **count(batch)))
            if cuda:
                def autocast(x: torch.Tensor = x) -> Any:
                    with torch.autocast("cuda", dtype=bf16):
                        return model(x)
                row("timm eager bf16 autocast", batch, timed(autocast, sync=sync, **count(batch)))
        model = model.to(bf16)  # cast, as the served forward is
        for batch in batches:
            x = torch.randn(batch, 3, 224, 224, device=device, dtype=bf16)
            row("timm eager bf16 weights", batch, timed(lambda x=x: model(x), sync=sync, **count(batch)))
        if cuda:
            started = time.perf_counter()
            compiled = torch.compile(model)
            x = torch.randn(batches[-1], 3, 224, 224, device=device, dtype=bf16)
            compiled(x)
            sync()
            compile_s = time.perf_counter() - started
            row(TIMM_COMPILE_ROW, batches[-1], timed(lambda: compiled(x), sync=sync, **count(batches[-1])),
                compile_s=compile_s)
        model = compiled = None  # free their memory before the next model

    imageprep = imageprep_module()
    variants = [(SERVED_FORWARD_ROW, False)] + ([(f"{SERVED_FORWARD_ROW} + torch.compile", True)]
                                                if compile_hub_vit and cuda else [])
    for name, compiled_model in variants:
        s16 = random_s16()
        started = time.perf_counter()
        # compiled: only the buckets timed (each shape compiles apart, about 10 s on an H200)
        buckets = batches if compiled_model else cuda_graph_buckets(max(batches))
        runner = Runner(s16, device, (224, 224), buckets, compile_model=compiled_model)
        out[f"{name} warm-up s"] = time.perf_counter() - started
        path = None if compiled_model else ImagePath(imageprep, served_preprocess(imageprep, s16), device,
                                                     decode_pool())
        for batch in batches:
            forward, whole = served_calls(runner, path, batch)
            row(f"{name} (bf16 weights, CUDA graphs, top-k on the device)" if cuda else name, batch,
                timed(forward, sync=sync, **count(batch)))
            if whole is not None:
                row(DATA_PATH_ROW, batch, timed(whole, sync=sync, **count(batch)))
    return out


def served_calls(runner: Any, path: Any, batch: int) -> tuple[Callable[[], None], Callable[[], None] | None]:
    """The served forward as the step runs it (one pass over a filled batch, (N, K) and logits back), and with `path`
    the whole served path before it (headers, decode, transform of `batch` copies of the load test's JPEG)."""
    import torch

    with torch.inference_mode():
        runner.batch(batch).normal_()
    data = [photo_jpeg()] * batch

    def forward() -> None:
        runner.fetch(*runner.run(batch))

    def whole() -> None:
        decoded = path.decode(data)
        with torch.inference_mode():
            path.transform_into(decoded, runner.batch(batch))
            runner.fetch(*runner.run(batch))

    return forward, None if path is None else whole


# -- step 2: the data path ------------------------------------------------------------------------------------------
def per_second(fn: Callable[[], Any], per_call: int, seconds: float, sync: Callable[[], None] = lambda: None) -> float:
    """`per_call` x the calls of `fn` a second, over at least `seconds` and 2 calls after one warm-up call; `sync`
    waits for the device's queued work (before the clock starts and before it stops)."""
    fn()
    sync()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or calls < 2:
        fn()
        calls += 1
    sync()
    return per_call * calls / (time.perf_counter() - started)


def jpeg_batch(batch: int) -> tuple[Any, Any, list[bytes], list[Any]]:
    """The served preprocessing module, its Preprocess for S/16, `batch` copies of the load test's JPEG and their
    headers (`Preprocess.inspect`): what steps 2 and thread_scaling run the data path on."""
    imageprep = imageprep_module()
    prep = served_preprocess(imageprep, random_s16())
    data = [photo_jpeg()] * batch
    return imageprep, prep, data, [prep.inspect(item) for item in data]


def decode_rates(device_name: str, batch: int, seconds: float) -> dict[str, Any]:
    """Images/s of the data path on `batch` copies of the load test's JPEG (module docstring, step 2)."""
    import torch

    from hub_vit.server.repository.torch_images import ImagePath, decode_jpegs

    device = torch.device(device_name)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    imageprep, prep, data, headers = jpeg_batch(batch)
    pool = decode_pool()
    path = ImagePath(imageprep, prep, device, pool)
    out = torch.empty(batch, 3, *prep.crop_size, device=device)

    def device_part() -> None:  # decode on the device, then the transform: what nvJPEG and the GPU do
        from hub_vit.server.repository.torch_images import Decoded

        decoded = [Decoded(image, h.orientation) for image, h in zip(decode_jpegs(data, device), headers,
                                                                      strict=True)]
        with torch.inference_mode():
            path.transform_into(decoded, out)

    def whole() -> None:
        decoded = path.decode(data)
        with torch.inference_mode():
            path.transform_into(decoded, out)

    def rate(fn: Callable[[], Any], per_call: int) -> float:
        return per_second(fn, per_call, seconds, sync)

    result = {"jpeg_bytes": len(data[0]), "source_size": list(headers[0].size), "batch": batch,
              "header_checks_cpu_one_thread_images_per_s": rate(lambda: [prep.inspect(item) for item in data], batch),
              f"scan_checks_cpu_{DECODE_THREADS}_threads_images_per_s": rate(lambda: list(pool.map(
                  imageprep.scan_may_end_early, data, headers)), batch),
              "device_decode_and_transform_images_per_s": rate(device_part, batch),
              "whole_data_path_images_per_s": rate(whole, batch)}
    pool.shutdown()
    log(f"data path: headers {result['header_checks_cpu_one_thread_images_per_s']:.0f} img/s (CPU, one thread); "
        f"scan checks {result[f'scan_checks_cpu_{DECODE_THREADS}_threads_images_per_s']:.0f} img/s (CPU, "
        f"{DECODE_THREADS} threads); decode + transform on {device_name} "
        f"{result['device_decode_and_transform_images_per_s']:.0f} img/s; whole "
        f"{result['whole_data_path_images_per_s']:.0f} img/s")
    return result


# the in-process data path's threads (scan checks and CPU decodes): every core, as one served instance with the host
# to itself would have them
DECODE_THREADS = os.cpu_count() or 1
GIL_FREE_BYTES = 1 << 20  # hashlib hashes this without the GIL: work whose rate only the host's cores can limit


def thread_scaling(batch: int, seconds: float) -> dict[str, Any]:
    """Images/s of the scan checks on 1, 2, 4, ... DECODE_THREADS threads (`batch` copies of the load test's JPEG),
    beside the same sweep of work that holds no lock at all (SHA-256 over 1 MiB buffers, MiB/s). Where the plain work
    stops scaling too, the host grants fewer cores than it lists (run.cpu.cgroup_quota says whether a quota is why);
    where only the scan checks stop, the lock they share (the GIL, between Pillow's decodes) is."""
    import hashlib

    imageprep, _, data, headers = jpeg_batch(batch)
    buffers = [bytes(GIL_FREE_BYTES)] * batch

    def rate(pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: list) -> float:
        return per_second(lambda: list(pool.map(fn, *args)), batch, seconds)

    counts = sorted({*(1 << i for i in range(DECODE_THREADS.bit_length())), DECODE_THREADS})
    result: dict[str, Any] = {"threads": counts, "scan_checks_images_per_s": [], "sha256_mib_per_s": []}
    for count in counts:
        with ThreadPoolExecutor(max_workers=count, thread_name_prefix="scaling") as pool:
            result["scan_checks_images_per_s"].append(rate(pool, imageprep.scan_may_end_early, data, headers))
            result["sha256_mib_per_s"].append(rate(pool, lambda b: hashlib.sha256(b).digest(), buffers)
                                              * GIL_FREE_BYTES / (1 << 20))
    for key in ("scan_checks_images_per_s", "sha256_mib_per_s"):
        result[key.replace("_per_s", "_speedup")] = [r / result[key][0] for r in result[key]]
    log("threads " + " ".join(map(str, counts)) + ": scan checks x" + " x".join(
        f"{r:.1f}" for r in result["scan_checks_images_speedup"]) + "; SHA-256 x" + " x".join(
        f"{r:.1f}" for r in result["sha256_mib_speedup"]))
    return result


def decode_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="decode")


# -- step 3: served against the CPU flavour -----------------------------------------------------------------------
def compare(gpu: Served, cpu: Served, images: dict[str, bytes]) -> dict[str, Any]:
    """Both servers classify `images` over HTTP and gRPC; top-1 and scores compared (module docstring, step 3)."""
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
             "truncated_jpeg": good[: len(good) // 2], "truncated_jpeg_closed": good[:-600] + b"\xff\xd9"}
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
                out[f"{protocol}/{case}"] = {"status": status, "message": message[:300], "still_serving": still,
                                             "passed": status in ("400", "StatusCode.INVALID_ARGUMENT") and still
                                             and "image 1" in message}
    out["passed"] = all(v["passed"] for v in out.values() if isinstance(v, dict))
    return out


def stub_numpy(served: Served) -> list[str]:
    """The numpy core libraries the server's Python-backend stubs mapped (their folders say which numpy)."""
    from hub_vit.server.runtime.processes import is_stub, live_processes

    found = set()
    for pid, command in live_processes().items():
        if not is_stub(command):
            continue
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        if str(served.process.pid) in command or _in_session(pid, served.process.pid):
            found |= {line.split()[-1] for line in maps.splitlines() if "_multiarray_umath" in line}
    return sorted(str(Path(path).parent.parent) for path in found)


def _in_session(pid: int, serve_pid: int) -> bool:
    """Whether `pid` descends from `serve_pid` (a stub of that server: serve -> tritonserver -> stub)."""
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == serve_pid:
            return True
    return False


def start_pair(folder: Path | None, gpu_flags: list[str], start_s: float,
               env: dict[str, str]) -> tuple[Served, Served]:
    """The served flavour and the CPU flavour of one model, started side by side."""
    with ThreadPoolExecutor(2) as pool:
        gpu = pool.submit(Served, folder, gpu_flags, start_s, env)
        cpu = pool.submit(Served, folder, ["--device", "cpu", "--cpu-variant", "fp32"], start_s)
        try:
            return gpu.result(), cpu.result()
        except BaseException:
            for future in (gpu, cpu):
                if future.done() and future.exception() is None:
                    future.result().stop()
            raise


# -- step 4: load -------------------------------------------------------------------------------------------------
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


def executing_at_once(lines: list[dict[str, Any]]) -> list[float]:
    """From the step's phase log: the share of the time between the first execution's start and the last one's end
    during which 0, 1, 2, ... executions ran at once (an execution: its start_ns plus its phases). Instances that
    take turns instead of running together show as a share at 1 that more instances do not move."""
    edges = sorted(edge for line in lines for edge in (
        (line["start_ns"], 1),
        (line["start_ns"] + 1e6 * sum(line.get(f"{phase}_ms", 0.0) for phase in STEP_PHASES), -1)))
    shares: list[float] = []
    running, since = 0, edges[0][0] if edges else 0
    for at, change in edges:
        shares += [0.0] * (running + 1 - len(shares))
        shares[running] += at - since
        running, since = running + change, at
    total = sum(shares)
    return [share / total for share in shares] if total else []


def load_point(server: Served, pool: Any, protocol: str, private: bool, payloads: list[bytes], concurrency: int,
               seconds: float, processes: int, phase_log: Path | None = None) -> dict[str, Any]:
    """One closed-loop load point of batch-1 requests spread over `processes` generator processes, to serve's
    public port or Triton's own (`private`); with the server's `phase_log`, where each execution's time went."""
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    shares = [s for s in shares if s]
    url = server.url(protocol, private=private)
    step = "vit_classifier"
    before = server.statistics()[step]
    offset = _phase_lines(phase_log, 0)[1] if phase_log else 0
    with GpuSampler() as gpu:
        results = pool.map(_generator, [(url, protocol, payloads, s, 1, seconds) for s in shares])
    after = server.statistics()[step]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    answered = sum(r["requests"] for r in results)
    weights = [r["requests"] for r in results]
    point = {
        "protocol": protocol, "ports": "private" if private else "public", "concurrency": concurrency, "batch": 1,
        "seconds": seconds, "generator_processes": len(shares), "requests": answered,
        "errors": sum(r["errors"] for r in results), "images_per_s": sum(r["images_per_s"] for r in results),
        # exact within one process; across processes: p50 weighted by requests, p99 the worst process's
        "latency_ms": {"p50": float(np.average([r["latency_ms"]["p50"] for r in results], weights=weights))
                       if answered else None,
                       "p99": max(r["latency_ms"]["p99"] for r in results) if answered else None},
        "images_per_execution": inferences / executions if executions else None,
        "gpu_utilisation_percent": gpu.mean(),
        "client_cores_busy": sum(r["load_generator_cores"] for r in results),
        "error_messages": {k: v for r in results for k, v in r["error_messages"].items()},
        "triton_ms_per_request": _per_request(before, after),
    }
    lines = _phase_lines(phase_log, offset)[0] if phase_log else []
    if lines:  # the step's executions during this point: mean ms per phase, and per image
        images = float(np.mean([line["images"] for line in lines]))
        point["step_phases"] = {"executions": len(lines), "images_per_execution": images,
                                "ms": {p: float(np.mean([line.get(f"{p}_ms", 0.0) for line in lines]))
                                       for p in STEP_PHASES}}
        point["step_phases"]["us_per_image"] = {p: 1e3 * ms / images for p, ms in point["step_phases"]["ms"].items()}
        # the step's processes' garbage collections during the point (each stops all of a process's threads)
        point["step_phases"]["gc_ms_per_s"] = sum(line.get("gc_ms", 0.0) for line in lines) / seconds
        point["step_phases"]["longest_gc_ms"] = max(line.get("gc_ms", 0.0) for line in lines)
        point["step_phases"]["executing_at_once"] = executing_at_once(lines)
        log(f"load {protocol} {point['ports']}: the step per image (us): " + ", ".join(f"{p} {us:.0f}" for p, us in
                                                      point["step_phases"]["us_per_image"].items()))
    log(f"load {protocol} {point['ports']} c{concurrency} b1: {point['images_per_s']:.0f} img/s, p50 "
        f"{point['latency_ms']['p50'] or 0:.2f} ms, {point['images_per_execution'] or 0:.1f} img/exec, "
        f"GPU {point['gpu_utilisation_percent']}%, client {point['client_cores_busy']:.1f} cores")
    return point


def run_load(served: Served, payload: bytes, concurrency: int, seconds: float, processes: int,
             phase_log: Path | None = None, ports: tuple[bool, ...] = (True, False),
             protocols: tuple[str, ...] = ("http", "grpc")) -> list[dict[str, Any]]:
    """Load points over `protocols`, to each of `ports` (True: Triton's own, False: serve's public ones)."""
    context = multiprocessing.get_context("spawn")  # no forked CUDA or tritonclient state
    with context.Pool(processes) as pool:
        return [load_point(served, pool, protocol, private, [payload], concurrency, seconds,
                           min(processes, concurrency), phase_log)
                for protocol in protocols for private in ports]


def load_with_flags(folder: Path | None, flags: list[str], extra: list[str], payload: bytes, concurrency: int,
                    seconds: float, processes: int, start_s: float, phase_log: Path,
                    protocols: tuple[str, ...] = ("http", "grpc")) -> dict[str, Any]:
    """The load over `protocols` on Triton's own ports of a server started with `flags` + `extra`:
    {"server": its description, "load": the points}."""
    served = Served(folder, [*flags, *extra], start_s, {PHASE_LOG: str(phase_log)})
    try:
        return {"server": served.describe(),
                "load": run_load(served, payload, concurrency, seconds, processes, phase_log, ports=(True,),
                                 protocols=protocols)}
    finally:
        served.stop()


def load_with_instances(folder: Path | None, flags: list[str], instances: int, payload: bytes, concurrency: int,
                        seconds: float, processes: int, start_s: float, phase_log: Path) -> dict[str, Any]:
    """The load on Triton's own ports of a server with `instances` classifier instances: each instance runs the CPU's
    share of its batch (headers, scan checks, Python per request) while another's runs on the device, so more of them
    keep the device busier where that share is what bounds the rate."""
    return {"instances": instances, **load_with_flags(folder, flags, ["--instances", str(instances)], payload,
                                                      concurrency, seconds, processes, start_s, phase_log)}


def load_with_smaller_batches(folder: Path | None, flags: list[str], max_batch: int, payload: bytes,
                              concurrency: int, seconds: float, processes: int, start_s: float,
                              phase_log: Path) -> dict[str, Any]:
    """The HTTP load on Triton's own port of a server whose batches hold at most `max_batch` images (a quarter of the
    concurrency): where batches may hold about half the requests in flight, two instances of the torch step were
    seen to take turns, one running while the other waited, on 2 CPU cores (docs/serving.md, "Instances"); with
    smaller batches there the instances ran together. `step_phases.executing_at_once` tells which happened here."""
    return {"max_batch_size": max_batch, **load_with_flags(folder, flags, ["--max-batch-size", str(max_batch)],
                                                           payload, concurrency, seconds, processes, start_s,
                                                           phase_log, protocols=("http",))}


def load_other_queue_policy(folder: Path | None, flags: list[str], device: str, payload: bytes, concurrency: int,
                            seconds: float, processes: int, start_s: float, phase_log: Path) -> dict[str, Any]:
    """The load on Triton's own ports of a server whose queue policy is the other one than `device`'s default (on
    cuda none, so `--queue-policy`; on the CPU `--no-queue-policy`). Without a policy Triton's batcher prefetches;
    with one, an instance that finishes can wait for its next batch until a new request arrives or 500 ms pass, and
    instances can fall into taking turns (docs/serving.md, "The queue policy"; bench/ab_queue_policy.py). Against
    `load`'s private points: what the policy costs on this device."""
    from hub_vit.server.repository.options import ServingOptions

    policy = ServingOptions.for_device(device).queue_policy  # the device's default (off on cuda: CUDA_DEFAULTS)
    flag = "--no-queue-policy" if policy else "--queue-policy"
    return {"queue_policy": not policy, **load_with_flags(folder, flags, [flag], payload, concurrency, seconds,
                                                          processes, start_s, phase_log)}


# -- step 6: agreement in process ---------------------------------------------------------------------------------
def agreement(device_name: str, images: dict[str, bytes], quick: bool = False) -> dict[str, Any]:
    """Top-1 of hub-vit's served forward against fp32 eager: the digits model on its held-out images, S/16 (random) on
    the photos."""
    import torch
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder
    from hub_vit.server.repository.torch_runner import Runner
    from hub_vit.train.digits import load_digits_split

    device = torch.device(device_name)
    out = {}
    model, info = load_model_folder(default_model_folder())
    transform = create_transform(**resolve_data_config(pretrained_cfg=dict(info.pretrained_cfg)), is_training=False)
    val, _ = load_digits_split("val")
    x = torch.stack([transform(Image.fromarray(a).convert("RGB")) for a in (val[:64] if quick else val)])
    with torch.no_grad():
        fp32 = model(x).argmax(1).numpy()
    runner = Runner(model, device, tuple(x.shape[-2:]), (64, 128, 256, 512))
    fast = np.concatenate([runner(x[i:i + 512].numpy()).argmax(1) for i in range(0, len(x), 512)])
    out["digits_val"] = {"images": len(x), "top1_agreement": float((fast == fp32).mean())}
    s16 = random_s16()
    transform = create_transform(**resolve_data_config(model=s16), is_training=False)
    x = torch.stack([transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in images.values()])
    with torch.no_grad():
        fp32 = s16(x).argmax(1).numpy()
    fast = Runner(s16, device, (224, 224), (8,))(x.numpy()).argmax(1)
    out["photos_s16_random"] = {"images": len(x), "top1_agreement": float((fast == fp32).mean()),
                                "note": "random weights: near-ties are common, a weak check"}
    return out


# -- step 7: targets ----------------------------------------------------------------------------------------------
def _ratio(value: float | None, target: float, lower_is_better: bool = False, **extra: Any) -> dict[str, Any]:
    """{value, target, ratio (value / target, or target / value where lower is better: >= 1 meets it), met}."""
    if value is None:
        return {"value": None, "target": target, "ratio": None, "met": False, **extra}
    ratio = (target / value if value > 0 else float("inf")) if lower_is_better else value / target
    return {"value": value, "target": target, "ratio": ratio, "met": ratio >= 1.0, **extra}


def targets(result: dict[str, Any], big: int) -> dict[str, Any]:
    rows = result.get("in_process", {}).get("rows", [])

    def rate(prefix: str, batch: int) -> dict[str, Any] | None:
        found = [r for r in rows if r["path"].startswith(prefix) and r["batch"] == batch]
        return max(found, key=lambda r: r["images_per_s"]) if found else None

    out: dict[str, Any] = {}
    served, peer = rate(SERVED_FORWARD_ROW, big), rate(TIMM_COMPILE_ROW, big)
    if served and peer:
        out["served_forward_vs_timm_compile"] = _ratio(served["images_per_s"] / peer["images_per_s"],
                                                       TARGETS["served_forward_vs_timm_compile"], batch=big,
                                                       path=served["path"])  # the faster, with or without compile
    whole_big, whole_one = rate(DATA_PATH_ROW, big), rate(DATA_PATH_ROW, 1)
    load = result.get("load", [])
    for protocol in ("http", "grpc"):
        for ports in ("private", "public"):
            point = next((p for p in load if p["protocol"] == protocol and p["ports"] == ports), None)
            if point is None or whole_big is None:
                continue
            out[f"served_c{point['concurrency']}_{ports}_{protocol}_vs_in_process"] = _ratio(
                point["images_per_s"] / whole_big["images_per_s"], TARGETS["served_c256_vs_in_process"],
                in_process=f"hub-vit data path + served forward at batch {big}", informative=ports == "public")
            busy = point["gpu_utilisation_percent"]
            if ports == "private" and busy is not None:
                out[f"gpu_busy_at_c{point['concurrency']}_{protocol}"] = _ratio(busy / 100,
                                                                                TARGETS["gpu_busy_at_c256"])
    path = result.get("request_path", {})
    for protocol in ("http", "grpc"):
        p50 = path.get(protocol, {}).get("breakdown_ms", {}).get("served_p50")
        if p50 is not None and whole_one is not None:
            out[f"c1_p50_over_in_process_b1_ms_{protocol}"] = _ratio(
                p50 - whole_one["latency_ms"], TARGETS["c1_p50_over_in_process_b1_ms"], lower_is_better=True,
                p50_ms=p50, in_process_ms=whole_one["latency_ms"])
    decode = result.get("decode", {}).get("device_decode_and_transform_images_per_s")
    if decode is not None:
        out["gpu_decode_preprocess_images_per_s"] = _ratio(decode, TARGETS["gpu_decode_preprocess_images_per_s"],
                                                           whole_data_path=result["decode"][
                                                               "whole_data_path_images_per_s"])
    agreed = [result[m][k]["passed"] for m in ("digits", "s16_224_random") if m in result
              for k in ("compare", "bad_input") if k in result[m]]
    if agreed:
        out["agrees_with_the_cpu_flavour"] = {"met": all(agreed)}
    out["all_met"] = all(v.get("met", True) for k, v in out.items() if isinstance(v, dict) and not v.get("informative"))
    return out


# -- the run ------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes, digits only (a dry run on a CPU)")
    parser.add_argument("--seconds", type=float, default=None, help="per load point (default 5, quick 1)")
    parser.add_argument("--compile", action="store_true",
                        help="also time hub-vit's served forward with torch.compile (buckets 1 and 256 compiled: "
                             "about 25 s more on an H200)")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/gpu_serving_<gpu>.json")
    add_note_option(parser)
    args = parser.parse_args()
    quick = args.quick
    seconds = args.seconds or (1.0 if quick else 5.0)
    big = 2 if quick else 256
    gpu = gpu_name(args.device)
    start_s = 900 if quick else 240  # a server's start: a shared 2-core host took 90 to over 300 s
    out_path = args.out or REPO / "bench" / "results" / f"gpu_serving_{file_tag(gpu)}.json"
    check = Check(out_path, {"run": run_info(args, ("timm", "torchvision", "tritonclient")), "gpu": gpu,
                             "device": args.device, "quick": quick, "score_atol": SCORE_ATOL, "batch": big,
                             "targets_wanted": TARGETS})
    if args.device == "cuda":
        check.result["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True).stdout.strip()
    images = photos()
    if quick and args.device == "cpu":  # a dry run checks that every step runs; one thread cannot oversubscribe
        import torch

        torch.set_num_threads(1)
    check.step("in_process", lambda: in_process(args.device, (1, big), args.compile, quick))
    # What the in-process step left (torch.compile's graphs: several hundred thousand objects) out of the collector's
    # full walks, as a served step freezes what it loaded (stub_gc.py): they would stop the data path's threads
    gc.collect()
    gc.freeze()
    check.step("decode", lambda: decode_rates(args.device, big, min(seconds, 2.0)))
    check.step("thread_scaling", lambda: thread_scaling(big, 0.5))
    device_flags = ["--device", "cuda"] if args.device == "cuda" else ["--device", "cpu", "--flavour", "torch"]
    gpu_flags = [*device_flags, "--max-batch-size", str(big)] if quick else device_flags
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import save_model_folder
    from hub_vit.server.repository.options import CUDA_DEFAULTS

    samples = {p.name: p.read_bytes() for p in sorted(Path(default_model_folder()).glob("samples/*.png"))}
    with tempfile.TemporaryDirectory(prefix="hub-vit-gpu-check-") as tmp:
        models = [("digits", None, {**samples, **images})]
        if not quick:
            models.append(("s16_224_random", save_model_folder(random_s16(), Path(tmp) / "s16_random"), images))
        for key, folder, shown in models:
            phase_log = Path(tmp) / f"{key}_phases.jsonl"
            log(f"serving {key} on {args.device} and, beside it, the CPU flavour")
            pair = check.step(f"{key}_start", lambda folder=folder, phase_log=phase_log: start_pair(
                folder, gpu_flags, start_s, {PHASE_LOG: str(phase_log)}), record=False)
            if pair is None:
                continue
            served, reference = pair
            try:
                check.result[key] = {"gpu_server": served.describe(), "cpu_server": reference.describe(),
                                     "stubs_numpy": stub_numpy(served)}
                check.step(f"{key}_compare", lambda s=served, r=reference, shown=shown, key=key: check.result[
                    key].update(compare=compare(s, r, shown)))
                reference.stop()  # the served flavour gets the host to itself for the rest
                check.step(f"{key}_bad_input", lambda s=served, key=key: check.result[key].update(
                    bad_input=bad_input(s, images["coffee"])))
                if key == models[-1][0]:  # load and the c1 path on the largest model served
                    check.step("load", lambda s=served, log_=phase_log: run_load(s, images["chelsea"], big, seconds,
                                                                                 2 if quick else 8, log_))
                    check.step("request_path", lambda s=served, log_=phase_log: request_path(
                        s, log_, photo_jpeg(), 6 * seconds if quick else 12.0))
            finally:
                served.stop()
                reference.stop()
        folder, log_ = models[-1][1], Path(tmp) / "instances_phases.jsonl"
        more = 3 if quick else 2 * int(CUDA_DEFAULTS["classifier_instances"])  # quick: 2 cores, a step up is enough
        check.step("load_more_instances", lambda: load_with_instances(
            folder, gpu_flags, more, images["chelsea"], big, seconds, 2 if quick else 8, start_s, log_))
        smaller_log = Path(tmp) / "smaller_batches_phases.jsonl"
        check.step("load_smaller_batches", lambda: load_with_smaller_batches(
            folder, device_flags, max(1, big // 4), images["chelsea"], big, seconds, 2 if quick else 8, start_s,
            smaller_log))
        check.step("load_other_queue_policy", lambda: load_other_queue_policy(
            folder, gpu_flags, args.device, images["chelsea"], big, seconds, 2 if quick else 8, start_s,
            Path(tmp) / "other_queue_policy_phases.jsonl"))
    check.step("agreement", lambda: agreement(args.device, images, quick))
    check.result["targets"] = targets(check.result, big)
    check.save()
    log(f"wrote {out_path}")
    print(json.dumps(check.result["targets"], indent=2))
    return 1 if check.result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
