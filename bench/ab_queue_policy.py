"""What a queue policy costs Triton's dynamic batcher, side by side: the same repository written twice by
`hub-vit repository`, as by default and with `--no-queue-policy` (no `default_queue_policy` in any config), served
and loaded in turn.

    .venv/bin/python bench/ab_queue_policy.py                      # every case below, one after the other
    .venv/bin/python bench/ab_queue_policy.py --cases one-instance   # one of them
    .venv/bin/python bench/ab_queue_policy.py --quick              # 2 rounds of 3 s per case: a check of the path

Cases (CASES), each its own pair of servers: `one-instance` (the CPU flavour with `--instances 1`, c16),
`cpu-default` (the CPU flavour as `hub-vit serve` builds it, c16) and `torch-big-batches` (the torch flavour on the
CPU with batches of up to 256, c256: the GPU's batching at CPU rates).

Why: any queue policy (a queue bound, a queue timeout, per-request timeouts) turns off the batcher's prefetching in
Triton's core (`PriorityQueue`: `support_prefetching_` only without one). The batcher then hands a batch only to an
instance waiting for one (`RateLimiter::PayloadSlotAvailable`: `WaitingConsumerCount > 0`). When an execution ends,
its payload's callback wakes the batcher (`Payload::Execute` -> `Callback`) before that instance's thread is back
waiting (`RateLimiter::DequeuePayload` -> `IncrementConsumerCount`); the batcher finds no instance waiting and sleeps
in `WaitForPayloadSlotAvailable` until a new request wakes it or 500 ms pass. Under closed-loop load every pending
request may already be queued, so the next wake is the next request that arrives: with one instance up to 500 ms,
with two the other instance's answers (its clients send again), so that two instances can fall into taking turns.

Both servers run the whole time (the idle one costs nothing); each round sends batch-1 HTTP requests at
`--concurrency` to one and then the other, on Triton's own port (the step, not the front), in alternating order, for
`--seconds`. Per server and round: requests/s, p50, p99 and the longest answer, images per execution (Triton's
statistics), and with the torch flavour's phase log ($HUB_VIT_PHASE_LOG) the share of time with 0, 1, 2, ...
executions running at once. Reported: medians over the rounds, per case. Writes
`bench/results/queue_policy_<host kind>.json` (not with --quick, unless --out).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ab_servers import add_round_options, alternating_rounds, output_path, sample_payloads, save, side_by_side
from gpu_check import executing_at_once
from request_path import PHASE_LOG, _phase_lines
from run_info import run_info
from serve_process import Served

from hub_vit.server.client.loadtest import load_test

SIDES = ("with the queue policy (the default)", "without (--no-queue-policy)")
STEP = "vit_classifier"


def one_round(served: Served, log: Path, offset: int, payloads: list[bytes], concurrency: int,
              seconds: float) -> tuple[dict[str, Any], int]:
    offset = _phase_lines(log, offset)[1]  # past the executions of earlier rounds
    before = served.statistics()[STEP]
    result = load_test(served.url("http", private=True), payloads, protocol="http", concurrency=concurrency,
                       duration_s=seconds)
    after = served.statistics()[STEP]
    lines, offset = _phase_lines(log, offset)
    executions = after["execution_count"] - before["execution_count"]
    shares = executing_at_once(lines)
    return {"requests_per_s": result.throughput_rps, "p50_ms": result.latency_ms["p50"],
            "p99_ms": result.latency_ms["p99"], "max_ms": result.latency_ms["max"], "errors": result.errors,
            "images_per_execution": (after["inference_count"] - before["inference_count"]) / executions
            if executions else None,
            "share_one_or_none_executing": shares[0] + shares[1] if len(shares) > 1 else None,
            "executing_at_once": shares}, offset


# name -> (hub-vit repository's options, concurrency)
CASES = {"one-instance": ("--instances 1", 16), "cpu-default": ("", 16),
         "torch-big-batches": ("--flavour torch --device cpu --max-batch-size 256", 256)}
KEYS = ("requests_per_s", "p50_ms", "p99_ms", "max_ms", "images_per_execution", "share_one_or_none_executing")


def _shown(row: dict[str, Any]) -> str:
    at_once = " / ".join(f"{share:.0%}" for share in row["executing_at_once"])
    return (f"{row['requests_per_s']:.0f} req/s, p99 {row['p99_ms']:.1f} ms, max {row['max_ms']:.0f} ms, "
            f"{row['images_per_execution'] or 0:.1f} img/exec"
            + (f", 0 / 1 / 2.. executing {at_once}" if at_once else ""))


def run_case(repository_args: str, concurrency: int, rounds: int, seconds: float,
             payloads: list[bytes]) -> dict[str, Any]:
    """One case: both servers of one repository, `rounds` interleaved rounds; medians and the rounds."""
    with tempfile.TemporaryDirectory(prefix="hub-vit-ab-queue-policy-") as tmp:
        repositories = {side: Path(tmp) / f"repository_{i}" for i, side in enumerate(SIDES)}
        for side, flags in zip(SIDES, ([], ["--no-queue-policy"]), strict=True):
            subprocess.run([sys.executable, "-c", "from hub_vit.cli import main; main()", "repository",
                            str(repositories[side]), *repository_args.split(), *flags], check=True,
                           stdout=subprocess.DEVNULL)
        logs = {side: Path(tmp) / f"phases_{i}.jsonl" for i, side in enumerate(SIDES)}
        with side_by_side({side: (None, ["--repository", str(repositories[side])], {PHASE_LOG: str(logs[side])})
                           for side in SIDES}) as servers:
            rows = alternating_rounds(
                servers, logs, rounds,
                lambda served, log, offset: one_round(served, log, offset, payloads, concurrency, seconds), _shown)
    medians = {side: {key: statistics.median(values) if (values := [r[key] for r in rows[side]
                                                                    if r[key] is not None]) else None
                      for key in KEYS} for side in SIDES}
    policy, none = (medians[side] for side in SIDES)
    return {"repository_args": repository_args, "concurrency": concurrency, "medians": medians, "rounds": rows,
            "without_over_with": {key: none[key] / policy[key] if none[key] and policy[key] else None for key in KEYS}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    add_round_options(parser, seconds=8.0, rounds=6)
    args = parser.parse_args()
    out = output_path(args, "queue_policy")
    payloads = sample_payloads()
    cases = {}
    for name in args.cases:
        print(f"-- {name}", flush=True)
        cases[name] = run_case(*CASES[name], args.rounds, args.seconds, payloads)
    result = {"run": run_info(args), "rounds": args.rounds, "seconds": args.seconds, "cases": cases}
    for name, case in cases.items():
        for side in SIDES:
            m = case["medians"][side]
            print(f"{name:<18} {side:<36} {m['requests_per_s']:7.0f} req/s  p50 {m['p50_ms']:6.1f} ms  p99 "
                  f"{m['p99_ms']:6.1f} ms  max {m['max_ms']:6.1f} ms  {m['images_per_execution'] or 0:5.1f} img/exec")
    return save(out, result)


if __name__ == "__main__":
    raise SystemExit(main())
