"""Process-group setup for `torchrun` (DistributedDataParallel): gloo on CPU, nccl on CUDA.

A plain `hub-vit train` is a world of one; under `torchrun --nproc_per_node N` the usual environment variables
(`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...) are present and one process group spans all processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hub_vit.train.recipe import SettingError


class NoCudaDevice(ValueError):
    """`--device cuda` where torch sees no CUDA device: nothing asked is wrong, this host cannot run it (the CLI exits
    3, as `hub-vit serve --device cuda` does)."""


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup(device: str | None = None) -> Dist:
    """Read torchrun's environment and join the process group (no-op for a single process).

    `device`: "cpu", "cuda" or None (= CUDA when available). Each process drives `cuda:LOCAL_RANK`.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cpu", "cuda"):
        raise SettingError(f"unknown device {device!r}; valid choices: 'cpu', 'cuda'")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise NoCudaDevice("device 'cuda' was asked for but torch sees no CUDA device; use --device cpu")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
    return Dist(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def all_sum(d: Dist, values: list[float]) -> list[float]:
    """Sum a few numbers over all processes (eval counts, losses)."""
    if not d.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.tolist()


def all_gather(d: Dist, obj: object) -> list[object]:
    if not d.enabled:
        return [obj]
    out: list[object] = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast(d: Dist, obj: object) -> object:
    """Rank 0's value on every rank (e.g. whether a check passed, so all ranks stop together)."""
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
