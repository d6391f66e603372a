"""What asking for rollout maps costs the server: served throughput with and without `explain`, at concurrency 16.

    .venv/bin/python bench/bench_serve_explain.py [--model vit_ti16] [--img-size 224] [--seconds 20] [--rounds 3]
        [--cpu-variant openvino-int8-dynamic]     # explained at the variant's own precision

One tritonserver (CPU flavour, the default serving options) serves the model with random weights (the cost does not
depend on the values); hub-vit's async load generator sends one real photograph per request from 16 concurrent
requests, alternating plain and explained slices of `--seconds` each, so drifting background load hits both alike.
Target: explained throughput >= 85 % of plain (maps cost <= 15 %) for ViT-Ti/16 at 224 on CPU. Meaningful only on a
quiet host: the load generator shares the cores with the server (bench_serve.py says how much).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

from run_info import add_note_option, check_writable, run_info, write_json

from hub_vit.resolve import ResolvedModel
from hub_vit.server.client.classifier import AsyncClassifier
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository
from hub_vit.server.runtime.launcher import TritonServer, free_port

TARGET = 0.85


def photo() -> bytes:
    from PIL import Image
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.chelsea()).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


async def slice_rate(url: str, image: bytes, explain: bool, seconds: float, concurrency: int) -> float:
    """Images per second answered in `seconds` of `concurrency` closed-loop requests."""
    done = 0
    async with AsyncClassifier(url) as client:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await client.classify([image], explain=explain)
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_ti16", help="registered hub-vit name (random weights)")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each measured slice")
    parser.add_argument("--rounds", type=int, default=3, help="plain + explained slice pairs")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cpu-variant", default="fp32",
                        help="the CPU flavour's graph (server/repository/cpu_variant.py): an OpenVINO variant explains "
                             "from its own attention probabilities, the others from the fp32 attention graph")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                        help="folder for the results JSON")
    add_note_option(parser)
    args = parser.parse_args()
    check_writable(args.out)
    from hub_vit.catalog import get_entry
    from hub_vit.model import VisionTransformer

    # a non-zero head: a reduced-precision --cpu-variant is verified against it (the cost does not depend on values)
    spec = get_entry(args.model).spec.replace(img_size=args.img_size, head_zeroinit=False)
    source = ResolvedModel.from_module(VisionTransformer(spec).eval(), name=args.model)
    image = photo()
    with tempfile.TemporaryDirectory(prefix="bench-explain-") as tmp:
        repo = write_repository(source, Path(tmp) / "repository", ServingOptions(cpu_variant=args.cpu_variant))
        server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
        server.start(timeout_s=300)
        try:
            asyncio.run(slice_rate(server.http_url, image, True, 3.0, args.concurrency))  # warm both paths
            asyncio.run(slice_rate(server.http_url, image, False, 3.0, args.concurrency))
            rates: dict[str, list[float]] = {"plain": [], "explain": []}
            for _ in range(args.rounds):
                for mode in ("plain", "explain"):
                    rates[mode].append(asyncio.run(slice_rate(server.http_url, image, mode == "explain",
                                                              args.seconds, args.concurrency)))
        finally:
            server.stop()
    ratio = statistics.median(e / p for p, e in zip(rates["plain"], rates["explain"], strict=True))
    result = {
        "run": run_info(args),
        "benchmark": "served throughput with and without rollout maps (HTTP, one photo per request)",
        "model": args.model, "img_size": args.img_size, "concurrency": args.concurrency,
        "cpu_variant": args.cpu_variant,
        "images_per_s": rates, "explain_over_plain": round(ratio, 4), "target": TARGET,
        "meets_target": ratio >= TARGET, "load_average": os.getloadavg(),
    }
    variant = "" if args.cpu_variant == "fp32" else f"_{args.cpu_variant}"
    path = args.out / f"serve_explain_{args.model}_{args.img_size}{variant}.json"
    write_json(path, result)
    print(f"plain   {statistics.median(rates['plain']):8.1f} images/s")
    print(f"explain {statistics.median(rates['explain']):8.1f} images/s  ({ratio:.0%} of plain; target "
          f">= {TARGET:.0%})")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
