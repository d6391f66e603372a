"""scripts/gpu_check.sh refuses what it cannot run, before anything is unpacked; bench/gpu_check.py names its
result file after the GPU. (The whole check runs on a GPU host; `scripts/gpu_check.sh --dry-run` runs its CPU steps.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, cwd=REPO)


def test_a_missing_pack_names_the_script_that_makes_it(tmp_path):
    done = _script(f"--pack={tmp_path / 'nothing'}", GPU_CHECK_WORK=str(tmp_path / "work"), OUT=str(tmp_path))
    assert done.returncode == 2
    said = done.stdout + done.stderr  # the script's output goes to its log too (tee), stdout and stderr together
    assert "triton-cp312.tar.xz is missing: run scripts/pack_gpu_check.sh" in said, said
    assert not (tmp_path / "work" / "server").exists()


def test_an_unknown_argument_prints_the_usage(tmp_path):
    done = _script("--gpu", GPU_CHECK_WORK=str(tmp_path / "work"))
    assert done.returncode == 2 and "usage: scripts/gpu_check.sh [--dry-run] [--pack=FOLDER]" in done.stderr


@pytest.mark.parametrize("name, tag", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("cpu", "cpu")])
def test_result_files_are_named_after_the_gpu(name, tag, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # gpu_check imports run_info as the bench scripts do
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)
    spec.loader.exec_module(module)
    assert module.file_tag(name) == tag
