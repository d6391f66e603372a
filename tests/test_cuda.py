"""hub-vit on a CUDA device: Google's outputs reproduced there, the explicit-attention path against the fused SDPA
kernels CUDA picks (flash / memory-efficient), and rollout maps equal to the CPU's.

Skipped without a CUDA device (the CI machine has none). Run on an H100 on 2026-11-23 (torch 2.11 + CUDA 13):
bench/results/gpu_smoke_h100.json has the measured differences these tolerances bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import hub_vit  # noqa: F401  (registers the timm entry points)
from hub_vit.conversion import infer_spec, read_npz
from hub_vit.conversion.verify import find_reference
from hub_vit.explain.rollout import attention_rollout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
CHECKPOINTS = sorted(p for p in JAX.glob("*/*.npz") if not p.name.endswith(".io.npz"))
GOOGLE_ATOL = 1e-4  # CPU float32 meets 1e-5 (test_conversion_parity); GPU reductions run in another order


@pytest.fixture(autouse=True)
def _exact_float32():
    """TF32 matmuls (10-bit mantissa) would move logits by ~1e-3: compare true float32 only."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def random_model(name: str) -> torch.nn.Module:
    model = timm.create_model(name, pretrained=False).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)  # heads are zero-initialised: give the logits a scale
    return model


@pytest.mark.parametrize("ckpt", CHECKPOINTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_google_outputs_on_cuda(ckpt: Path) -> None:
    reference = find_reference(ckpt)
    assert reference is not None, f"no Google reference (*.io.npz) beside {ckpt.name}"
    with np.load(reference, allow_pickle=False) as io:
        inputs, logits = io["inputs"], io["logits"]  # Google's NHWC inputs and its model's logits
    spec = infer_spec(read_npz(ckpt), img_size=tuple(inputs.shape[1:3]))
    model = timm.create_model("hub_vit", pretrained=True, pretrained_cfg_overlay=dict(file=str(ckpt), custom_load=True),
                              **spec.to_dict()).eval().cuda()
    x = torch.from_numpy(inputs).permute(0, 3, 1, 2).contiguous().cuda()  # (B, 3, H, W)
    with torch.no_grad():
        fused = model(x).cpu().double().numpy()
        explicit = model.forward_all(x, output_attentions=True).logits.cpu().double().numpy()
    assert np.abs(fused - logits).max() <= GOOGLE_ATOL
    assert np.abs(explicit - logits).max() <= GOOGLE_ATOL


@pytest.mark.parametrize("name", ["simplevit_s16", "vit_b16"])
def test_explicit_attention_matches_the_fused_kernel_on_cuda(name: str) -> None:
    model = random_model(name).cuda()
    x = torch.rand(2, 3, 224, 224, device="cuda") * 2 - 1
    with torch.no_grad():
        fused = model(x)
        out = model.forward_all(x, output_attentions=True)
    assert fused.abs().max() > 1  # logits with a scale, so the comparison below can fail
    torch.testing.assert_close(out.logits, fused, atol=1e-3, rtol=0)  # measured 1e-5..7e-5 on an H100
    for attn in out.attentions:  # (B, heads, N, N) probabilities
        torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn[..., 0]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["simplevit_s16", "vit_b16"])
def test_rollout_on_cuda_matches_cpu(name: str) -> None:
    model = random_model(name)
    x = torch.rand(1, 3, 224, 224) * 2 - 1
    with torch.no_grad():
        cpu = attention_rollout(model, x)
        gpu = attention_rollout(model.cuda(), x.cuda())
    torch.testing.assert_close(gpu.logits.cpu(), cpu.logits, atol=1e-3, rtol=0)
    torch.testing.assert_close(gpu.maps.cpu(), cpu.maps, atol=1e-6, rtol=1e-4)
