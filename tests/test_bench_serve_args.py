"""bench/bench_serve.py refuses bad settings by name before it builds or starts anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_serve.py"


@pytest.mark.parametrize("args", [("--rounds", "0"), ("--front-processes", "0", "2"), ("--seconds", "0")])
def test_front_cost_refuses_settings_that_measure_nothing(args):
    result = subprocess.run([sys.executable, str(BENCH), "--front-cost", *args], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "--front-processes, --rounds and --seconds must be positive" in result.stderr, \
        result.stderr
