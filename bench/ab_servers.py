"""What the side-by-side server benchmarks (ab_stub_gc.py, ab_queue_policy.py) share: their options, the servers of
the sides running beside each other, and rounds that load the sides in alternating order (drift hits both alike)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_inference import host
from run_info import REPO, add_note_option, check_writable, write_json
from serve_process import Served

# one round of one side: (its server, its phase log, how far earlier rounds read it) -> (the row, the new offset)
Measure = Callable[[Served, Path, int], tuple[dict[str, Any], int]]


def add_round_options(parser: argparse.ArgumentParser, seconds: float, rounds: int) -> None:
    parser.add_argument("--seconds", type=float, default=seconds, help="per server and round")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s: a check of the path, not a result")
    parser.add_argument("--out", type=Path, default=None)
    add_note_option(parser)


def output_path(args: argparse.Namespace, stem: str) -> Path | None:
    """Where the result goes: --out, else `bench/results/<stem>_<host kind>.json`, and nowhere with --quick (which
    also shortens the rounds); the folder is checked writable before anything runs."""
    if args.quick:
        args.rounds, args.seconds = 2, 3.0
    out = args.out or (None if args.quick else REPO / "bench" / "results" / f"{stem}_{host()['kind']}.json")
    if out is not None:
        check_writable(out.parent)
    return out


def sample_payloads() -> list[bytes]:
    """The default model's sample PNGs, the requests' images."""
    from hub_vit.catalog import default_model_folder

    return [p.read_bytes() for p in sorted(Path(default_model_folder()).glob("samples/*.png"))]


@contextmanager
def side_by_side(sides: dict[str, tuple[Path | None, list[str], dict[str, str]]]) -> Iterator[dict[str, Served]]:
    """`hub-vit serve MODEL EXTRA...` with ENV added, for each side at once (side -> (MODEL, EXTRA, ENV)); all
    stopped at the end, also when one fails to start."""
    servers: dict[str, Served] = {}
    try:
        for side, (model, extra, env) in sides.items():
            servers[side] = Served(model, extra, 600, env=env)
        yield servers
    finally:
        for served in servers.values():
            served.stop()


def alternating_rounds(servers: dict[str, Served], logs: dict[str, Path], rounds: int, measure: Measure,
                       show: Callable[[dict[str, Any]], str]) -> dict[str, list[dict[str, Any]]]:
    """`rounds` rounds, each measuring every side in turn, in alternating order: side -> its rows, in order."""
    rows: dict[str, list[dict[str, Any]]] = {side: [] for side in servers}
    offsets = dict.fromkeys(servers, 0)
    for number in range(rounds):
        for side in list(servers) if number % 2 == 0 else list(servers)[::-1]:
            row, offsets[side] = measure(servers[side], logs[side], offsets[side])
            rows[side].append(row)
            print(f"round {number + 1} {side}: {show(row)}", flush=True)
    return rows


def save(out: Path | None, result: dict[str, Any]) -> int:
    """Write `result` to `out` (None: --quick, nowhere); the exit code."""
    if out is not None:
        write_json(out, result)
        print(f"wrote {out}")
    return 0
