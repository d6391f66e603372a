"""Training's cuda-only lines on the CPU, with torch.cuda and the process group standing in: `distributed.setup` on a
GPU host (each process on `cuda:LOCAL_RANK`, nccl across processes, a refusal naming `--device cpu` without a GPU),
the hardware record a GPU run writes into training.json and its card, and `--precision auto` (bf16 on CUDA only)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hub_vit.train import distributed
from hub_vit.train.loop import hardware


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """torch.cuda as on a host with GPUs, and a process group that is only recorded."""
    calls: dict[str, list] = {"set_device": [], "init_process_group": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls["set_device"].append(device))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"NVIDIA H200 ({device})")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kwargs: calls["init_process_group"].append(backend))
    return calls


@pytest.mark.parametrize("asked", ["cuda", None])
def test_each_torchrun_process_drives_its_local_gpu_and_the_group_uses_nccl(gpu_host, monkeypatch, asked) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    d = distributed.setup(asked)  # None: cuda, since torch sees one
    assert d.device == torch.device("cuda", 1) and (d.rank, d.world_size, d.local_rank) == (1, 2, 1)
    assert gpu_host == {"set_device": [1], "init_process_group": ["nccl"]}


def test_on_a_gpu_host_device_cpu_stays_on_the_cpu_with_gloo(gpu_host, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.setup("cpu").device == torch.device("cpu")
    assert gpu_host == {"set_device": [], "init_process_group": ["gloo"]}


def test_device_cuda_without_a_gpu_is_refused_naming_the_way_out(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"device 'cuda' was asked for but torch sees no CUDA device; use "
                                         r"--device cpu"):
        distributed.setup("cuda")
    assert distributed.setup(None).device == torch.device("cpu")


def test_a_gpu_runs_hardware_record_names_the_gpu_it_ran_on(gpu_host) -> None:
    record = hardware(distributed.Dist(world_size=2, local_rank=1, device=torch.device("cuda", 1)))
    assert record["device"] == "cuda" and record["processes"] == 2
    assert record["gpu"] == "NVIDIA H200 (cuda:1)"  # the process's own GPU, not GPU 0
    assert "gpu" not in hardware(distributed.Dist())


@pytest.mark.parametrize(("precision", "on_cuda", "on_cpu"), [("auto", True, False), ("bf16", True, True),
                                                             ("fp32", False, False)])
def test_precision_auto_is_bf16_autocast_on_cuda_only(precision: str, on_cuda: bool, on_cpu: bool) -> None:
    from hub_vit.train.recipe import Recipe

    recipe = Recipe(precision=precision)
    assert (recipe.bf16_autocast("cuda"), recipe.bf16_autocast("cpu")) == (on_cuda, on_cpu)
