"""hub-vit compiles every OpenVINO model through one Core per process (`hub_vit.openvino_runtime.core`).

Why it matters: OpenVINO's CPU plugin (2026.4), loaded once per Core, gives the loading thread an alternate signal
stack and puts back the one it found when the Core is freed. Two Cores freed in the order they were made leave the
thread's alternate stack on freed memory, and the next signal handled in Python there kills the process with SIGSEGV.
The served CPU classifier holds two sessions (plain and explained) and frees them together on unload, so each case
runs in a child process: the failure ends the process it happens in.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ov = pytest.importorskip("openvino")

CHILD = r'''
import gc, json, os, signal, sys
import numpy as np
import openvino as ov
import openvino.opset13 as ops

from hub_vit.openvino_runtime import OpenVINOSession

def model():
    """(1, 4) -> softmax over a matmul (what an attention block's probabilities are) -> (1, 3) logits."""
    rng = np.random.default_rng(0)
    x = ops.parameter([1, 4], np.float32, name="pixel_values")
    probabilities = ops.softmax(ops.matmul(x, ops.constant(rng.random((4, 4), np.float32)), False, False), -1)
    logits = ops.matmul(probabilities, ops.constant(rng.random((4, 3), np.float32)), False, False)
    logits.output(0).get_tensor().set_names({"logits"})
    return ov.Model([logits], [x], "tiny")

xml = sys.argv[2] + "/tiny.xml"
ov.save_model(model(), xml)
with open(sys.argv[2] + "/tiny.json", "w") as f:
    json.dump({"variant": "tiny", "compile": {}}, f)
x = np.ones((1, 4), np.float32)
if sys.argv[1] == "a core each":  # what every compile did before hub-vit shared one Core
    first = ov.Core().compile_model(xml, "CPU")
    second = ov.Core().compile_model(xml, "CPU")
    first(x), second(x)
else:  # the served classifier's pair of sessions
    first = OpenVINOSession(xml, 1)
    second = OpenVINOSession(xml, 1, attentions=True)
    assert first.run(None, {"pixel_values": x})[0].shape == (1, 3)
    assert second.run(None, {"pixel_values": x})[1].shape == (1, 1, 4)  # (B, blocks, ...)
del first
gc.collect()
del second
gc.collect()
signal.signal(signal.SIGUSR1, lambda *_: print("signal handled", flush=True))
os.kill(os.getpid(), signal.SIGUSR1)
print("still running", flush=True)
'''


def _child(how: str, folder: Path) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    return subprocess.run([sys.executable, "-c", CHILD, how, str(folder)], capture_output=True, text=True, timeout=120)


def test_the_served_pair_of_openvino_sessions_freed_in_creation_order_leaves_signals_working(tmp_path: Path) -> None:
    # the hazard first: with a Core per compile, the same sequence must end in SIGSEGV, or this test shows nothing
    hazard = _child("a core each", tmp_path / "cores")
    if hazard.returncode == 0:
        pytest.skip(f"OpenVINO {ov.__version__} frees its Cores without leaving a freed signal stack behind")
    assert hazard.returncode == -signal.SIGSEGV, f"exit {hazard.returncode}\n{hazard.stderr[-3000:]}"

    sessions = _child("sessions", tmp_path / "sessions")
    assert sessions.returncode == 0, f"exit {sessions.returncode}\n{sessions.stderr[-3000:]}"
    assert sessions.stdout.split() == ["signal", "handled", "still", "running"]


def test_the_core_is_made_once_and_no_other_module_makes_one() -> None:
    from hub_vit import openvino_runtime

    assert openvino_runtime.core() is openvino_runtime.core()
    assert isinstance(openvino_runtime.core(), ov.Core)
    root = Path(__file__).resolve().parents[1]
    code = ("hub_vit", "server", "conversion", "model_cards", "bench", "scripts")  # server/ & co install as hub_vit.*
    makers = [str(path.relative_to(root)) for folder in code for path in (root / folder).rglob("*.py")
              if "Core()" in path.read_text(encoding="utf-8")]
    assert makers == ["hub_vit/openvino_runtime.py"]
