"""The OpenVINO variant tests (tests/openvino_cases.py), run in a Python process of their own.

In the one long pytest process, after the rest of the suite had run in it, the first of those tests that serves a
repository died with SIGSEGV and no Python traceback. The cause is OpenVINO's CPU plugin (2026.4): a compiled model
gives the thread that compiled it an alternate signal stack of its own (11,824 bytes here) and, when it is freed,
puts back the one it found. Two compiled models freed in the order they were made leave the thread's alternate stack
pointing at the first one's freed memory; the next signal handled in Python on that thread (CPython installs its
handlers with SA_ONSTACK) then ends the process with a kernel SIGSEGV (si_code SI_KERNEL): what the suite's process
met (its altstack found unmapped under gdb). Five lines show it: compile A, compile B, free A, free B, then
`os.kill(os.getpid(), SIGUSR1)` with a handler set. A native crash takes the whole suite down with it, so the cases
run apart and their report is shown here when one fails.
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
