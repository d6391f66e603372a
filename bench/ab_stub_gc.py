"""What freezing the loaded objects out of the garbage collector (server/repository/templates/common/stub_gc.py) does
for a served step under load, side by side: two `hub-vit serve` of the same model and flavour, one as shipped and one
with `HUB_VIT_GC_FREEZE=0` in its environment (the collector as Python has it), loaded in turn.

    .venv/bin/python bench/ab_stub_gc.py                    # torch flavour on the CPU, the default model (digits)
    .venv/bin/python bench/ab_stub_gc.py --quick            # 2 rounds of 3 s: a check of the path, not a result
    python bench/ab_stub_gc.py --serve-args "--device cuda"  # on a GPU host

The collector walks everything alive in a full collection, and starts one once enough objects outlived younger
ones: a step whose executions hold many objects at once (large batches: a future per image on the decode pool, the
requests and their answers) starts them every few seconds; one with a few images per execution hardly ever. So the
default load is the GPU's pattern at CPU rates: batches of up to 256 images (`--max-batch-size 256`, 256 requests in
flight), on one instance (`--instances 1`): on 2 cores two instances of this step at c256 fall, some rounds and not
others, into taking turns (docs/serving.md), which moves requests/s more than the collector does.

Both servers run the whole time (the idle one costs nothing); each round sends batch-1 HTTP requests at
`--concurrency` to one and then the other, on Triton's own port (the step, not the front), in alternating order, for
`--seconds`. Per server and round: requests/s, p50 and p99 latency, and from the step's phase log
($HUB_VIT_PHASE_LOG: every execution's phases and the time its process spent collecting garbage, `gc_ms`) the
collections' milliseconds per second of load and the longest. Reported: medians over the rounds, and the ratios
frozen / as Python has it. Writes `bench/results/stub_gc_<host kind>.json` (not with --quick, unless --out).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from ab_servers import add_round_options, alternating_rounds, output_path, sample_payloads, save, side_by_side
from request_path import _phase_lines
from run_info import run_info
from serve_process import Served

from hub_vit.server.client.loadtest import load_test

SIDES = {"frozen": {}, "collector as Python has it": {"HUB_VIT_GC_FREEZE": "0"}}
PHASE_LOG = "HUB_VIT_PHASE_LOG"


def one_round(served: Served, log: Path, offset: int, payloads: list[bytes], concurrency: int,
              seconds: float) -> tuple[dict[str, Any], int]:
    offset = _phase_lines(log, offset)[1]  # past the executions of earlier rounds
    result = load_test(served.url("http", private=True), payloads, protocol="http", concurrency=concurrency,
                       duration_s=seconds)
    lines, offset = _phase_lines(log, offset)
    pauses = [line.get("gc_ms", 0.0) for line in lines]
    return {"requests_per_s": result.throughput_rps, "p50_ms": result.latency_ms["p50"],
            "p99_ms": result.latency_ms["p99"], "max_ms": result.latency_ms["max"], "errors": result.errors,
            "executions": len(pauses), "gc_ms_per_s": sum(pauses) / seconds,
            "longest_gc_ms": max(pauses, default=0.0)}, offset


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="what `hub-vit serve` serves (default: its default model)")
    parser.add_argument("--serve-args", default="--device cpu --flavour torch --max-batch-size 256 --instances 1",
                        help="hub-vit serve's options for both servers")
    parser.add_argument("--concurrency", type=int, default=256)
    add_round_options(parser, seconds=15.0, rounds=4)
    args = parser.parse_args()
    out = output_path(args, "stub_gc")
    payloads = sample_payloads()
    with tempfile.TemporaryDirectory(prefix="hub-vit-ab-stub-gc-") as tmp:
        logs = {side: Path(tmp) / f"phases_{i}.jsonl" for i, side in enumerate(SIDES)}
        model = Path(args.model) if args.model else None
        with side_by_side({side: (model, args.serve_args.split(), {**env, PHASE_LOG: str(logs[side])})
                           for side, env in SIDES.items()}) as servers:
            rows = alternating_rounds(
                servers, logs, args.rounds,
                lambda served, log, offset: one_round(served, log, offset, payloads, args.concurrency, args.seconds),
                lambda row: f"{row['requests_per_s']:.0f} req/s, p99 {row['p99_ms']:.1f} ms, gc "
                            f"{row['gc_ms_per_s']:.1f} ms/s (longest {row['longest_gc_ms']:.1f} ms)")
    keys = ("requests_per_s", "p50_ms", "p99_ms", "max_ms", "gc_ms_per_s", "longest_gc_ms")
    medians = {side: {key: statistics.median(row[key] for row in rows[side]) for key in keys} for side in SIDES}
    frozen, unfrozen = (medians[side] for side in SIDES)
    result = {"run": run_info(args), "serve_args": args.serve_args, "concurrency": args.concurrency,
              "medians": medians, "rounds": rows,
              "frozen_over_unfrozen": {key: frozen[key] / unfrozen[key] if unfrozen[key] else None for key in keys}}
    for side in SIDES:
        m = medians[side]
        print(f"{side:<28} {m['requests_per_s']:8.0f} req/s  p50 {m['p50_ms']:6.1f} ms  p99 {m['p99_ms']:6.1f} ms  "
              f"max {m['max_ms']:6.1f} ms  gc {m['gc_ms_per_s']:6.1f} ms/s, longest {m['longest_gc_ms']:6.1f} ms")
    return save(out, result)


if __name__ == "__main__":
    raise SystemExit(main())
