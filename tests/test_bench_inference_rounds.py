"""bench/bench_inference.py's timing: every round runs every row, in an order drawn for that round, and a target
ratio pairs two rows round by round, so a load change of the shared host between rounds cancels out of it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bench_modules import load_bench_script


def test_each_round_runs_every_row_in_its_own_order(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_bench_script("bench_inference", monkeypatch)
    x = np.zeros((2, 3), np.float32)
    rows = bench.Rows(x, np.eye(2, 3, dtype=np.float32))
    calls: list[str] = []
    names = [f"row {i}" for i in range(6)]
    for name in names:
        rows.add(name, "peer", "fp32", lambda name=name: lambda x: calls.append(name) or np.eye(2, 3, dtype=np.float32),
                 iters=2)
    rows.measure(4)
    timed = calls[len(names) * 2:]  # after the checks' and the warm-up's run of each row
    per_round = [timed[i:i + 2 * len(names)] for i in range(0, len(timed), 2 * len(names))]
    assert len(per_round) == 4 and all(sorted(set(r)) == names and len(r) == 12 for r in per_round)
    orders = [tuple(dict.fromkeys(r)) for r in per_round]
    assert len(set(orders)) > 1, "every round ran the rows in the same order"
    assert all(len(row["round_ms"]) == 4 and row["samples"] == 8 for row in rows.rows)


def test_a_target_ratio_pairs_the_rows_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_bench_script("bench_inference", monkeypatch)
    # the host slows down 3x in the last rounds: the rows' medians fall in different regimes, their ratio per round
    # stays 1.5
    hub = {"images_per_s": 8 / 0.1, "round_ms": [100, 100, 300, 300, 300]}
    peer = {"images_per_s": 8 / 0.3, "round_ms": [150, 150, 450, 450, 450]}
    ratio, rounds = bench.paired_ratio(hub, peer)
    assert ratio == pytest.approx(1.5) and rounds == [1.5] * 5
    assert bench.paired_ratio({"images_per_s": 90.0}, {"images_per_s": 60.0}) == (1.5, [])
