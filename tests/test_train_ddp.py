"""DDP: `torchrun --nproc_per_node 2` (gloo on CPU) trains 2 steps; both ranks end with identical weights, and the
global batch is preserved (the same run in one process with gradient accumulation reaches the same weights)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hub_vit.train.loop import TrainingWarning, train
from hub_vit.weights_digest import file_digest
from tests.test_train_loop import TINY, make_folder

pytestmark = pytest.mark.slow


def test_torchrun_two_ranks_gloo(tmp_path: Path) -> None:
    data = make_folder(tmp_path / "data", per_class=4, val_per_class=1)
    run = tmp_path / "ddp"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    args = ["-m", "hub_vit.train", str(data), "--out", str(run), "--model", "simplevit_digits", "--img-size", "32",
            "--steps", "2", "--batch-size", "8", "--lr", "3e-3", "--warmup-steps", "1", "--workers", "0",
            "--device", "cpu", "--threads", "1", "--no-progress"]
    workspace = tmp_path / "tmp"  # torchrun's own torchelastic_* folder is left in $TMPDIR after each run
    workspace.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(workspace)}
    proc = subprocess.Popen(torchrun + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)  # own process group: a hang must not leave ranks behind
    try:
        output, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in 400 s:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    training = json.loads((run / "model" / "training.json").read_text())
    assert training["hardware"]["processes"] == 2 and training["steps"] == 2
    digests = training["rank_weight_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]  # sha256 of every weight, computed on each rank
    assert training["weights_digest"] == digests[0] == file_digest(run / "model" / "model.safetensors")

    # Same recipe in one process: micro-batch 4 x 2 accumulation steps covers the same 8 images per step that the
    # two ranks (4 each) covered, with the same augmentation and mixup ratios, so the weights must agree.
    with pytest.warns(TrainingWarning, match="not calibrated"):  # 3 held-out images: too few to set the threshold
        single = train(TINY.replace(total_steps=2, batch_size=8, micro_batch=4, lr=3e-3, warmup_steps=1), data,
                       tmp_path / "single", progress=False)
    w_ddp = load_file(str(run / "model" / "model.safetensors"))
    w_one = load_file(str(single.model_dir / "model.safetensors"))
    for key in w_one:
        torch.testing.assert_close(w_ddp[key], w_one[key], rtol=1e-4, atol=1e-6, msg=key)
