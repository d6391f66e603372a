"""The OpenVINO variant tests (tests/openvino_cases.py), run in a Python process of their own.

In the one long pytest process, after the rest of the suite had run in it, the first of those tests that serves a
repository died with SIGSEGV and no Python traceback (2 of 2 runs of the whole suite; never when the file runs alone
or after the tests from test_hf.py on). A native crash takes the whole suite down with it, so the cases run apart and
their report is shown here when one fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")


@pytest.mark.slow
@pytest.mark.triton
def test_openvino_cases_pass_in_a_process_of_their_own() -> None:
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/openvino_cases.py"],
                            cwd=root, capture_output=True, text=True, timeout=1500)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in summary and "skipped" not in summary and "deselected" not in summary, summary
