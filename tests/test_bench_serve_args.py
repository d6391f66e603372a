"""bench/bench_serve.py refuses bad settings by name before it builds or starts anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_serve.py"


def test_gate_cost_needs_at_least_one_slice():
    result = subprocess.run([sys.executable, str(BENCH), "--gate-cost", "--slices", "0"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "--slices must be at least 1, got 0" in result.stderr, result.stderr
