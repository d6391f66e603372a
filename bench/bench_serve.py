"""Served throughput/latency (Triton, HTTP and gRPC, concurrency 1/4/16) next to in-process ONNX Runtime on the
same model, same images, same run.

Targets (issue #6): at concurrency 16 the server reaches >= 85% of in-process throughput; at concurrency 1 its p50
latency is at most in-process p50 + 5 ms. In-process = the identical pipeline without a server: decode + transform
(the served `imageprep` code) + one ORT session with ONNX Runtime's defaults (all cores, spinning threads), batch 16
for throughput, batch 1 for latency. Served requests carry one image each; an extra row per protocol sends 8 images
per request at concurrency 16 (not a target: it shows how much of the gap is fixed per-request cost). Each row
alternates in-process and served measurements SLICES times and reports the median of the paired ratios / gaps, and
the CPU milliseconds per image spent by the in-process baseline, by the server (Triton + its stubs) and by the load
generator, so the run itself shows where a gap comes from. The results file is rewritten after each finished model
("complete": false until the last one), so an interrupted or failed run keeps the models it finished.

Every row is measured with each load generator in turn (`--load-generators`): hub-vit's own (`hub-vit loadtest`'s
code, Python) and Triton's `perf_analyzer` (C++; bench/perf_analyzer.py finds it or assembles it from the package
registries on first use). On a host where the client shares the server's cores, the two show how much of a gap is
the client's own CPU. perf_analyzer rows carry the suffix `_perf_analyzer`.

    .venv/bin/python bench/bench_serve.py                 # default model (+ a ViT-Ti/16 224 px random-weight model)
    .venv/bin/python bench/bench_serve.py --models digits --seconds 5
    .venv/bin/python bench/bench_serve.py --models ti16 --no-spinning   # Ti/16 without spinning ORT threads
    # many-core host: load generator off the server's cores (the in-process baseline gets the server's cores too)
    .venv/bin/python bench/bench_serve.py --server-cpus 0,1 --client-cpus 2-5
    .venv/bin/python bench/bench_serve.py --load-generators hub-vit   # without perf_analyzer
    .venv/bin/python bench/bench_serve.py --quick       # Ti/16 at c16, the CPU variant auto chose: checks the path

`--front-cost` measures something else, the cost of `hub-vit serve`'s front (server/front/), with a trivial model so
that the front is all there is to see (bench/front_cost.py): h11's and httptools' CPU per request, then batch-1
requests at concurrency 64 through the public ports vs Triton's own private ports, HTTP and gRPC, interleaved rounds,
medians, the front processes' CPU per request, for each number of front processes; grpcio's empty server and an HTTP
byte pipe (the cheapest relay Python can be) the same way, as floors, and nginx relaying both protocols where it is
installed (the native floor). Written to bench/results/serve_front_cpu.json unless `--out` says otherwise.

    .venv/bin/python bench/bench_serve.py --front-cost                 # 1, 2 and 4 front processes, 5 rounds of 5 s
    .venv/bin/python bench/bench_serve.py --front-cost --quick         # 1 and 2 processes, 2 rounds of 2 s
    .venv/bin/python bench/bench_serve.py --front-cost --front-processes 1 2 4 8 --rounds 7 --seconds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from perf_analyzer import PerfAnalyzer, PerfAnalyzerUnavailable, locate, measure, write_input_data
from PIL import Image
from run_info import add_note_option, check_writable, run_info, write_json

from hub_vit.resolve import ResolvedModel, resolve_model
from hub_vit.server.client.classifier import Classifier
from hub_vit.server.client.loadtest import batching_delta, load_test, percentiles
from hub_vit.server.repository.metadata import serving_metadata
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import MANIFEST, template_dir, write_repository
from hub_vit.server.runtime.launcher import TritonServer, free_port

RESULTS = Path(__file__).resolve().parent / "results"
CONCURRENCY = (1, 4, 16)
MAX_BATCH = 16
MULTI_IMAGE = 8  # images per request in the extra c16 row
SLICES = 3  # each comparison alternates in-process and served measurements this many times; medians are reported
LOAD_GENERATORS = ("hub-vit", "perf_analyzer")
WARMUP = 4  # requests hub-vit's load generator sends before it measures


def _imageprep():
    spec = importlib.util.spec_from_file_location("imageprep", template_dir("preprocess") / "imageprep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["imageprep"] = module
    spec.loader.exec_module(module)
    return module


def _encode(array: np.ndarray, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def digits_case() -> tuple[ResolvedModel, list[bytes]]:
    """The shipped default model on held-out digits (PNG), or a same-shape random stand-in if not trained yet."""
    from hub_vit.catalog import default_model_folder
    from hub_vit.train.digits import load_digits_split

    images, _ = load_digits_split("val")
    payloads = [_encode(image, "PNG") for image in images[:64]]
    if (Path(default_model_folder()) / "model.safetensors").is_file():
        return resolve_model(None), payloads
    from hub_vit.catalog import DIGITS_SPEC
    from hub_vit.model import VisionTransformer

    model = VisionTransformer(DIGITS_SPEC).eval()
    source = ResolvedModel.from_module(model, name="digits_standin", labels=[str(d) for d in range(10)],
                                     pretrained_cfg={"input_size": (3, 32, 32), "crop_pct": 1.0})
    return source, payloads


def ti16_case() -> tuple[ResolvedModel, list[bytes]]:
    """SimpleViT-Ti/16 at 224 px (random weights: speed only) on real photos (JPEG)."""
    import torch
    from skimage import data

    from hub_vit.catalog import MODELS
    from hub_vit.model import VisionTransformer

    # a non-zero head: big_vision's zero-initialised one gives constant logits, against which the CPU flavour's int8
    # candidates cannot be verified (cpu_variant auto would keep fp32)
    torch.manual_seed(0)
    model = VisionTransformer(dataclasses.replace(MODELS["simplevit_ti16"].spec, head_zeroinit=False)).eval()
    source = ResolvedModel.from_module(model, name="simplevit_ti16", pretrained_cfg={
        "input_size": (3, 224, 224), "crop_pct": 0.875, "interpolation": "bilinear", "num_classes": 1000})
    photos = [data.astronaut(), data.chelsea(), data.coffee()]
    return source, [_encode(p) for p in photos]


CASES = {"digits": digits_case, "ti16": ti16_case}


def parse_cpus(text: str | None) -> set[int] | None:
    """'0,1' or '2-5' or '0,2-3' -> a set of CPU ids (None stays None: no pinning)."""
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    available = os.sched_getaffinity(0)
    if not cpus <= available:
        raise SystemExit(f"CPUs {sorted(cpus - available)} are not available; this process may use {sorted(available)}")
    return cpus


def process_group_cpu_by_pid(pgid: int) -> dict[int, float]:
    """pid -> user + system CPU seconds used so far, for the live processes of one process group (Linux /proc):
    Triton and its Python-backend stubs, which `TritonServer` starts in a session of their own."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after "(comm)": state, ppid, pgrp, ...
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:
            used[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
    return used


def process_group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the live processes of one process group (see `process_group_cpu_by_pid`)."""
    return sum(process_group_cpu_by_pid(pgid).values())


def server_cpu_ms_per_image(before: dict[int, float], after: dict[int, float], leader: int,
                            images: int) -> dict[str, float]:
    """CPU ms per image between two `process_group_cpu_by_pid` snapshots of a server's group: all of it, the
    tritonserver process itself (`leader`: HTTP/gRPC front ends, batcher, ensemble) and its Python-backend stubs
    (decoding, ONNX Runtime, top-k). A stub started between the snapshots counts from zero."""
    def delta(pid: int) -> float:
        return after[pid] - before.get(pid, 0.0)

    stubs = sum(delta(pid) for pid in after if pid != leader)
    tritonserver = delta(leader) if leader in after else 0.0
    return {"server": (tritonserver + stubs) * 1000 / images, "tritonserver": tritonserver * 1000 / images,
            "stubs": stubs * 1000 / images}


def pin(cpus: set[int] | None) -> None:
    """Confine the calling thread (and the threads and processes it starts from now on) to `cpus`."""
    if cpus:
        os.sched_setaffinity(0, cpus)


class InProcess:
    """The served pipeline without a server: served `imageprep` transform + one ORT session (ORT's defaults), or,
    where the repository serves an OpenVINO variant (`model.openvino.xml` beside `model.onnx`), the same
    `OpenVINOSession` the server runs, on every core."""

    def __init__(self, onnx_path: Path, meta, payloads: list[bytes]) -> None:
        import onnxruntime as ort

        self.prep = _imageprep().Preprocess(crop_size=meta.input_size, scale_size=meta.scale_size,
                                            interpolation=meta.interpolation, crop_mode=meta.crop_mode,
                                            mean=meta.mean, std=meta.std)
        # ORT's defaults (all cores, threads spin between ops): what a user would run in-process, and the faster of
        # the two spinning settings for both benchmark models.
        options = ort.SessionOptions()
        cores = len(os.sched_getaffinity(0))
        if cores < (os.cpu_count() or 1):  # pinned: ORT's default would count every core
            options.intra_op_num_threads = cores
        from hub_vit.openvino_runtime import OpenVINOSession, served_model

        if served_model(onnx_path).exists():
            self.session = OpenVINOSession(served_model(onnx_path), cores)
        else:
            self.session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name
        self.payloads = payloads
        self.classify(payloads[:1])

    def classify(self, batch: list[bytes]) -> np.ndarray:
        return self.session.run(None, {self.name: np.stack([self.prep(p) for p in batch])})[0]

    def throughput(self, seconds: float) -> tuple[float, float]:
        """Images per second at batch MAX_BATCH, and CPU milliseconds per image (this process: decode + ORT)."""
        cycle = [self.payloads[i % len(self.payloads)] for i in range(MAX_BATCH)]
        images, start, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            self.classify(cycle)
            images += MAX_BATCH
        return images / (time.perf_counter() - start), (time.process_time() - cpu) * 1000 / images

    def latency(self, seconds: float) -> dict[str, float]:
        """Batch-1 latency percentiles (ms)."""
        latencies, start = [], time.perf_counter()
        while time.perf_counter() - start < seconds:
            t = time.perf_counter()
            self.classify([self.payloads[len(latencies) % len(self.payloads)]])
            latencies.append(time.perf_counter() - t)
        return percentiles(latencies)


def summarize(slices: list[dict]) -> dict:
    """One row from its slices: the median of the per-slice ratios / gaps (each slice compares a served measurement
    with the in-process one taken just before it), plus the slices themselves."""
    def med(values: list[float]) -> float:
        return float(np.median(values))

    served = [s["served"] for s in slices]
    return {
        "throughput_vs_in_process": med([s["throughput_vs_in_process"] for s in slices]),
        "p50_minus_in_process_ms": med([s["p50_minus_in_process_ms"] for s in slices]),
        "served_images_per_s": med([r["images_per_s"] for r in served]),
        "in_process_images_per_s": med([s["in_process"]["images_per_s_batch16"] for s in slices]),
        "served_p50_ms": med([r["latency_ms"]["p50"] for r in served]),
        "in_process_p50_ms": med([s["in_process"]["latency_ms_batch1"]["p50"] for s in slices]),
        "served_p99_ms": med([r["latency_ms"]["p99"] for r in served]),
        "served_max_ms": max((r["latency_ms"]["max"] for r in served if "max" in r["latency_ms"]), default=None),
        "errors": sum(r["errors"] for r in served),
        "classifier_images_per_execution": med([
            r["batching"].get("vit_classifier", {}).get("images_per_execution", float("nan")) for r in served]),
        # Where the cores went, per image: the baseline's process; Triton + its stubs (and each apart); the load
        # generator, which shares the server's cores unless --client-cpus moves it.
        "cpu_ms_per_image": {
            "in_process": med([s["in_process"]["cpu_ms_per_image"] for s in slices]),
            **{part: med([s["cpu_ms_per_image"][part] for s in slices])
               for part in ("server", "tritonserver", "stubs", "load_generator")},
        },
        "slices": slices,
    }


def _spread(slices: list[dict], key: str, fmt: str) -> str:
    values = sorted(s[key] for s in slices)
    return f"[{format(values[0], fmt)}..{format(values[-1], fmt)}]"


def triton_version(server: TritonServer) -> str | None:
    """The running server's own version (GET /v2): the binary may come from the wheel or a system install."""
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2", timeout=5) as reply:
            return json.loads(reply.read()).get("version")
    except (OSError, ValueError, AttributeError):
        return None


def served_by_hub_vit(url: str, protocol: str, payloads: list[bytes], concurrency: int, batch: int,
                      seconds: float, context: dict) -> tuple[dict, int, float]:
    """hub-vit's load generator, in this process: (its result, images answered in the call, its CPU seconds)."""
    cpu = time.process_time()
    result = load_test(url, payloads, protocol=protocol, concurrency=concurrency, duration_s=seconds, batch=batch,
                       warmup=WARMUP).to_dict()
    return result, (result["requests"] + WARMUP) * batch, time.process_time() - cpu


def served_by_perf_analyzer(url: str, protocol: str, payloads: list[bytes], concurrency: int, batch: int,
                            seconds: float, context: dict) -> tuple[dict, int, float]:
    """Triton's perf_analyzer, a child process: (its result in hub-vit's shape, images the server answered while it
    ran, read from Triton's statistics, and its CPU seconds). A failed request fails its run, so errors are 0."""
    with Classifier(url, protocol=protocol) as stats:
        before = stats.statistics()
        result = measure(context["perf_analyzer"], url=url, protocol=protocol, model="vit",
                         data=context["perf_analyzer_data"], concurrency=concurrency, batch=batch, seconds=seconds)
        after = stats.statistics()
    images = after["vit"]["inference_count"] - before.get("vit", {}).get("inference_count", 0)
    served = {"images_per_s": result["images_per_s"], "latency_ms": result["latency_ms"], "errors": 0,
              "batching": batching_delta(before, after), "server_queue_ms": result["server_queue_ms"]}
    return served, images, result["cpu_s"]


SERVED = {"hub-vit": served_by_hub_vit, "perf_analyzer": served_by_perf_analyzer}


def row_key(protocol: str, concurrency: int, batch: int, generator: str) -> str:
    """'http_c16', 'grpc_c16_b8', 'http_c1_perf_analyzer': hub-vit's rows keep the names of earlier results files."""
    return (f"{protocol}_c{concurrency}" + (f"_b{batch}" if batch > 1 else "")
            + ("" if generator == "hub-vit" else f"_{generator}"))


def run_case(case: str, seconds: float, server_cpus: set[int] | None = None,
             client_cpus: set[int] | None = None, spinning: bool | None = None,
             generators: tuple[str, ...] = ("hub-vit",), analyzer: PerfAnalyzer | None = None,
             cpu_variant: str = "auto", concurrency: tuple[int, ...] = CONCURRENCY) -> dict:
    """The machine is shared, so load drifts: every served measurement is paired with an in-process one taken
    right before it, SLICES pairs per row, and each target is judged on the median of its pairs. With
    `server_cpus`, Triton (and its stubs) and the in-process baseline run on those cores, the load generator on
    `client_cpus`. Each row is measured with each of `generators` (perf_analyzer needs `analyzer`)."""
    source, payloads = CASES[case]()
    rows = {}
    pin(server_cpus)  # Triton's processes and the baseline's ORT threads inherit this
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        repo = write_repository(source, Path(tmp) / "repo", ServingOptions(max_batch_size=MAX_BATCH,
                                                                            ort_spinning=spinning,
                                                                            cpu_variant=cpu_variant))
        selected = json.loads((repo / MANIFEST).read_text()).get("cpu_variant")
        print(f"[{case}] CPU variant: {selected and selected['variant']} ({selected and selected['reason']})",
              flush=True)
        local = InProcess(repo / "vit_classifier" / "1" / "model.onnx", serving_metadata(source), payloads)
        context = {"perf_analyzer": analyzer,
                   "perf_analyzer_data": write_input_data(payloads, Path(tmp) / "perf_analyzer_input.json")}
        with TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          exit_timeout_s=10) as server:
            version = triton_version(server)
            for protocol in ("http", "grpc"):
                url = server.http_url if protocol == "http" else server.grpc_url
                for conc, batch in [(c, 1) for c in concurrency] + [(concurrency[-1], MULTI_IMAGE)]:
                    for generator in generators:
                        key = row_key(protocol, conc, batch, generator)
                        slices = []
                        for _ in range(SLICES):  # in-process, served, in-process, served, ...: drift hits both
                            pin(server_cpus)
                            rate, cpu_ms = local.throughput(seconds / (2 * SLICES))
                            base = {"images_per_s_batch16": rate, "cpu_ms_per_image": cpu_ms,
                                    "latency_ms_batch1": local.latency(seconds / (2 * SLICES))}
                            pin(client_cpus)
                            server_cpu = process_group_cpu_by_pid(server.process.pid)
                            result, images, client_cpu_s = SERVED[generator](url, protocol, payloads, conc, batch,
                                                                              seconds / SLICES, context)
                            # CPU over the whole call (warm-up and drained tail too), per image answered in it
                            slices.append({
                                "in_process": base, "served": result,
                                "cpu_ms_per_image": {
                                    **server_cpu_ms_per_image(server_cpu, process_group_cpu_by_pid(server.process.pid),
                                                              server.process.pid, images),
                                    "load_generator": client_cpu_s * 1000 / images,
                                },
                                "throughput_vs_in_process": result["images_per_s"] / base["images_per_s_batch16"],
                                "p50_minus_in_process_ms": (result["latency_ms"]["p50"]
                                                            - base["latency_ms_batch1"]["p50"]),
                            })
                        rows[key] = row = summarize(slices)
                        print(f"[{case}] {key}: {describe(row, slices)}", flush=True)
    targets: dict[str, dict] = {}
    for generator in generators:
        for protocol in ("http", "grpc"):
            c16, c1 = rows.get(row_key(protocol, 16, 1, generator)), rows.get(row_key(protocol, 1, 1, generator))
            judged = targets.setdefault(generator, {}).setdefault(protocol, {})  # only the measured concurrencies
            if c16:
                judged["c16_throughput_vs_in_process"] = c16["throughput_vs_in_process"]
                judged["c16_target_met"] = c16["throughput_vs_in_process"] >= 0.85
            if c1:
                judged["c1_p50_minus_in_process_ms"] = c1["p50_minus_in_process_ms"]
                judged["c1_target_met"] = c1["p50_minus_in_process_ms"] <= 5.0
    return {"model": source.name, "input_size": source.data.img_size, "tritonserver": version,
            "cpu_variant": selected, "rows": rows, "targets": targets}


def describe(row: dict, slices: list[dict]) -> str:
    """One console line for a finished row."""
    cpu = row["cpu_ms_per_image"]
    most = "n/a" if row["served_max_ms"] is None else f"{row['served_max_ms']:.1f} ms"
    return (f"served {row['served_images_per_s']:.1f} img/s (in-process {row['in_process_images_per_s']:.1f}, "
            f"{row['throughput_vs_in_process']:.0%} {_spread(slices, 'throughput_vs_in_process', '.0%')}), "
            f"p50 {row['served_p50_ms']:.2f} ms (in-process {row['in_process_p50_ms']:.2f}; gap "
            f"{row['p50_minus_in_process_ms']:+.2f} ms {_spread(slices, 'p50_minus_in_process_ms', '+.1f')}), "
            f"p99 {row['served_p99_ms']:.1f} ms, max {most}, errors {row['errors']}, "
            f"batching {row['classifier_images_per_execution']:.2f}; CPU ms/img: in-process {cpu['in_process']:.2f}, "
            f"server {cpu['server']:.2f} (tritonserver {cpu['tritonserver']:.2f} + stubs {cpu['stubs']:.2f}), "
            f"load generator {cpu['load_generator']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_cpu.json")
    parser.add_argument("--server-cpus", help="run Triton and the in-process baseline on these CPUs, e.g. 0,1")
    parser.add_argument("--client-cpus", help="run the load generator on these CPUs, e.g. 2-5")
    parser.add_argument("--spinning", action=argparse.BooleanOptionalAction, default=None,
                        help="force the served ORT threads to spin (the classifier instances then take turns) or "
                             "not; default: the repository decides from the model")
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(CONCURRENCY),
                        help="concurrencies to measure (the multi-image row uses the last)")
    parser.add_argument("--cpu-variant", default="auto",
                        help="the CPU flavour's graph (server/repository/cpu_variant.py); the in-process baseline runs "
                             "the same file (default: auto, as hub-vit serve)")
    parser.add_argument("--load-generators", nargs="+", default=list(LOAD_GENERATORS), choices=LOAD_GENERATORS,
                        help="measure every row with each of these, in turn (default: both)")
    parser.add_argument("--front-cost", action="store_true",
                        help="measure hub-vit serve's front instead: a trivial model, c64, public vs private ports")
    parser.add_argument("--front-processes", nargs="+", type=int, default=None,
                        help="--front-cost: the numbers of front processes to measure (default: 1 2 4)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="--front-cost: pairs of measurements per protocol and process count (default: 5)")
    parser.add_argument("--quick", action="store_true",
                        help="checks the path, not a result: ViT-Ti/16 at c16 only, 2 s slices, hub-vit's load "
                             "generator, the result in a temporary file (target c16 >= 85 %%); with --front-cost, 1 "
                             "and 2 processes, 2 rounds of 2 s")
    add_note_option(parser)
    args = parser.parse_args()
    if args.front_cost:
        measure_front(args)
        return
    if args.quick:
        args.models, args.concurrency, args.seconds, args.load_generators = ["ti16"], [16], 2.0, ["hub-vit"]
        args.out = Path(tempfile.mkdtemp(prefix="bench-serve-quick-")) / "serve_cpu_quick.json"
    generators = tuple(dict.fromkeys(args.load_generators))  # in the order given, once each
    server_cpus, client_cpus = parse_cpus(args.server_cpus), parse_cpus(args.client_cpus)
    if server_cpus and client_cpus and server_cpus & client_cpus:
        raise SystemExit(f"--server-cpus and --client-cpus overlap on {sorted(server_cpus & client_cpus)}")
    check_writable(args.out.parent)  # before the run, not after minutes of measuring
    analyzer, analyzer_version = None, None
    if "perf_analyzer" in generators:  # found (or assembled) before the run, not after minutes of measuring
        try:
            analyzer = locate()
            analyzer_version = analyzer.version()
        except PerfAnalyzerUnavailable as err:
            raise SystemExit(f"perf_analyzer is not available: {err}\n"
                             "Put one on PATH, or measure without it: --load-generators hub-vit") from None
        print(f"perf_analyzer: {analyzer.binary} ({analyzer_version})", flush=True)
    report: dict[str, Any] = {
        "run": run_info(args, packages=("nvidia-pytriton", "tritonclient")),
        "complete": False,  # until every requested model has finished
        "host": {"server_cpus": sorted(server_cpus or []), "client_cpus": sorted(client_cpus or [])},
        "slices": SLICES, "concurrency": args.concurrency, "max_batch": MAX_BATCH, "multi_image": MULTI_IMAGE,
        "ort_spinning": args.spinning,
        "load_generators": {"hub-vit": "hub_vit.server.client.loadtest (Python, tritonclient asyncio), in this process",
                            **({"perf_analyzer": f"{analyzer_version}: {analyzer.binary}"} if analyzer else {})},
        "cases": {},
    }
    for case in args.models:
        try:
            report["cases"][case] = run_case(case, args.seconds, server_cpus, client_cpus, args.spinning,
                                             generators, analyzer, args.cpu_variant, tuple(args.concurrency))
        except KeyboardInterrupt:
            finished = ", ".join(report["cases"])
            kept = f"finished models kept in {args.out}: {finished}" if finished else f"{args.out} not written"
            print(f"interrupted during {case}; {kept}", file=sys.stderr)
            raise SystemExit(130) from None
        # rewritten after each model, so a failure or Ctrl-C in a later one keeps this one
        write_json(args.out, report)
    report["complete"] = True
    write_json(args.out, report)
    for case, result in report["cases"].items():
        for generator, protocol, r in [(g, p, r) for g, by in result["targets"].items() for p, r in by.items()]:
            parts = []  # the concurrencies measured (--concurrency)
            if "c16_target_met" in r:
                parts.append(f"c16 = {r['c16_throughput_vs_in_process']:.0%} of in-process (target >= 85%: "
                             f"{'met' if r['c16_target_met'] else 'MISSED'})")
            if "c1_target_met" in r:
                parts.append(f"c1 p50 = in-process {r['c1_p50_minus_in_process_ms']:+.2f} ms (target <= +5 ms: "
                             f"{'met' if r['c1_target_met'] else 'MISSED'})")
            print(f"{case} {protocol} ({generator}): {'; '.join(parts) or 'no target row measured'}")
    print(f"wrote {args.out}")


def measure_front(args: argparse.Namespace) -> None:
    """`--front-cost`: one result file (bench/front_cost.py)."""
    from front_cost import front_cost

    out = args.out if args.out != RESULTS / "serve_cpu.json" else RESULTS / "serve_front_cpu.json"
    counts = args.front_processes or ([1, 2] if args.quick else [1, 2, 4])
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 5)
    seconds = (2.0 if args.quick else 5.0) if args.seconds == 8.0 else args.seconds  # 8.0: not given
    if min(counts) < 1 or rounds < 1 or seconds <= 0:
        raise SystemExit(f"--front-processes, --rounds and --seconds must be positive, got {counts}, {rounds}, "
                         f"{seconds}")
    check_writable(out.parent)
    report = {"run": run_info(args, packages=("nvidia-pytriton", "tritonclient", "grpcio", "httptools", "uvloop",
                                              "hpack", "h11")),
              "quick": args.quick,
              **front_cost(counts, rounds, seconds, parser_requests=5000 if args.quick else 20000)}
    write_json(out, report)
    for key, judged in report["targets"].items():
        print(f"{key}: public {judged['public_vs_private']:.0%} of private (target >= 80%: "
              f"{'met' if judged['ratio_met'] else 'MISSED'}); front CPU {judged['front_cpu_ms_per_request']:.3f} "
              f"ms/request (target <= 0.1: {'met' if judged['cpu_met'] else 'MISSED'})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
