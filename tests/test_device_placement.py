"""A forward pass makes every tensor on the input's device: none is built on the host and copied over.

A tensor made on the CPU inside `forward` and copied to a CUDA input is a host-to-device copy on every call, and inside
CUDA graph capture it is an error ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU
tensor is pinned"): every SimpleViT served on cuda failed so, and no CPU test saw it. Here the model runs on the
`meta` device (shapes only, no data, any size) under a dispatch mode that records every op whose result is not on
`meta`: a host tensor built during the forward, or a copy to or from the host.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hub_vit.layers import posemb_sincos_2d
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

META = torch.device("meta")
TINY = dict(width=64, depth=2, mlp_dim=128, num_heads=4, patch_size=16, img_size=64, num_classes=10)
FAMILIES = {  # every position embedding and readout the model has
    "vit_jax_token": dict(posemb="learn", pool_type="tok", posemb_on_cls=True),
    "big_vision_token": dict(posemb="learn", pool_type="tok"),
    "simplevit_gap_rep": dict(posemb="sincos2d", pool_type="gap", rep_size=True),
    "map": dict(posemb="learn", pool_type="map"),
}


class HostTensors(TorchDispatchMode):
    """Records each op whose tensor results are not all on `device` (op name, result devices)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device, self.found = device, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        where = {t.device for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
        if where - {self.device}:
            sources = sorted({str(t.device) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)})
            self.found.append((str(func), sorted(map(str, where)), sources))
        return out


def _meta_model(family: str, **spec) -> VisionTransformer:
    with META:
        return VisionTransformer(ViTSpec(**{**TINY, **FAMILIES[family], **spec})).eval()


def test_the_recorder_sees_a_host_table_copied_to_the_input_device():
    """The check itself: the sincos table as it was built before (on the CPU, then moved) is reported."""
    x = torch.empty(2, 16, 64, device=META)
    with HostTensors(META) as recorder:
        x + posemb_sincos_2d(4, 4, 64).to(META)
    assert recorder.found, "a CPU-made table copied to the meta input went unnoticed"
    assert any("_to_copy" in op for op, _, _ in recorder.found)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("img_size", [64, (48, 80)], ids=["trained_size", "other_size"])
def test_forward_builds_nothing_on_the_host(family, img_size):
    """Plain logits and `forward_all` with attentions, at the trained size and at another one (a learned table is
    resampled, a sincos one rebuilt for the new grid)."""
    model = _meta_model(family)
    x = torch.empty(2, 3, *((img_size, img_size) if isinstance(img_size, int) else img_size), device=META)
    with torch.inference_mode(), HostTensors(META) as recorder:
        logits = model(x)
        out = model.forward_all(x, output_attentions=True, output_hidden_states=True)
    assert logits.shape == (2, 10) and out.logits.device == META
    assert recorder.found == [], f"ops that made tensors off the input's device: {recorder.found}"


@pytest.mark.parametrize("name", ["simplevit_s16", "vit_b16"])
def test_registered_models_at_full_size_build_nothing_on_the_host(name):
    """The served models themselves, at their real size: meta costs no memory or time."""
    import timm

    import hub_vit  # noqa: F401  (registers the models with timm)

    with META:
        model = timm.create_model(name).eval()
    x = torch.empty(4, 3, 224, 224, device=META)
    with torch.inference_mode(), HostTensors(META) as recorder:
        model(x)
    assert recorder.found == [], f"ops that made tensors off the input's device: {recorder.found}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rollout_and_gradient_rollout_build_nothing_on_the_host(family):
    """The maps the demo and the served explanation compute on the model's device: every readout row, the head
    fusion, the discarding and the chains stay on the input's device (on a GPU a host-made tensor is a copy and a
    wait, or an error)."""
    from hub_vit.explain.grad_rollout import gradient_rollout
    from hub_vit.explain.rollout import attention_rollout

    model = _meta_model(family)
    x = torch.empty(2, 3, 64, 64, device=META)
    with HostTensors(META) as recorder:
        rolled = attention_rollout(model, x, head_fusion="max", discard_ratio=0.5)
        chefer = gradient_rollout(model, x)
    assert rolled.layer_maps.shape == (2, TINY["depth"], 4, 4) and rolled.maps.device == META
    assert chefer.maps.shape == (2, 4, 4) and chefer.maps.device == META
    assert recorder.found == [], f"ops that made tensors off the input's device: {recorder.found}"
