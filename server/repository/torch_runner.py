"""The torch flavour's forward pass, shared by its Triton step (templates/classifier_torch) and bench/gpu_check.py,
so the benchmark's in-process "hub-vit GPU path" is the served one.

cuda: bf16 autocast (fp16 where the GPU has no bf16), batches copied from pinned host memory, and one CUDA graph per
batch bucket (config.cuda_graph_buckets), every bucket run and captured in the constructor; a batch runs in the
smallest bucket that holds it. cpu: float32, eager.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch


class Runner:
    """The model on one device: (N, 3, H, W) float32 numpy -> (N, C) float32 numpy logits."""

    def __init__(self, model: torch.nn.Module, device: torch.device, crop: tuple[int, int],
                 buckets: tuple[int, ...], *, graphs: bool = True, compile_model: bool = False) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets must be increasing positive batch sizes, got {buckets}")
        self.device, self.crop, self.buckets = device, crop, buckets
        self.model = model.eval().to(device)
        self.cuda = device.type == "cuda"
        self.dtype = None
        if self.cuda:
            self.dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            if compile_model:
                self.model = torch.compile(self.model, dynamic=False)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        # one pinned host buffer per bucket: a pageable tensor would be staged through a pinned one by the driver
        self.host = {size: torch.zeros((size, 3, *crop), pin_memory=True) for size in buckets} if self.cuda else {}
        if self.cuda:
            self._warm_up(graphs)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.cuda:
            return self.model(x)
        # cache_enabled=False: autocast's cast cache does not survive CUDA graph capture (torch.cuda.graph docs)
        with torch.autocast("cuda", dtype=self.dtype, cache_enabled=False):
            return self.model(x).float()

    @torch.inference_mode()
    def _warm_up(self, graphs: bool) -> None:
        """Run every bucket (compiling it with torch.compile), then capture one CUDA graph per bucket, largest first
        so the smaller ones reuse its memory pool."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for size in self.buckets:
                for _ in range(2):
                    self._forward(torch.zeros((size, 3, *self.crop), device=self.device))
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        if not graphs:
            return
        pool = torch.cuda.graph_pool_handle()
        for size in sorted(self.buckets, reverse=True):
            static_in = torch.zeros((size, 3, *self.crop), device=self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                static_out = self._forward(static_in)
            graph.replay()  # the bucket runs once as a graph before the server reports ready
            self.graphs[size] = (graph, static_in, static_out)
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def with_attentions(self, batch: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor | None]:
        """An eager pass that also returns the attention probabilities, for explained requests (no CUDA graph: the
        graphs hold the fused path): (N, C) float32 logits, (N, depth, heads, T, T) and the MAP probe's
        (N, heads, 1, T) or None, both float32 on the CPU."""
        x = torch.from_numpy(batch).to(self.device)
        model = getattr(self.model, "_orig_mod", self.model)  # torch.compile's wrapper: the eager module
        with torch.autocast("cuda", dtype=self.dtype) if self.cuda else contextlib.nullcontext():
            out = model.forward_all(x, output_attentions=True)
        probe = None if out.pool_attention is None else out.pool_attention.float().cpu()
        return out.logits.float().cpu().numpy(), torch.stack(out.attentions, 1).float().cpu(), probe

    def bucket(self, count: int) -> int:
        return next(size for size in self.buckets if size >= count)

    @torch.inference_mode()
    def __call__(self, batch: np.ndarray) -> np.ndarray:
        count = len(batch)
        if not self.cuda:
            return self._forward(torch.from_numpy(batch)).float().numpy()
        size = self.bucket(count)
        host = self.host[size]
        host[:count].copy_(torch.from_numpy(batch))  # rows past `count` hold an earlier batch: ignored, rows are
        if size in self.graphs:  # independent (no batch statistics in a ViT)
            graph, static_in, static_out = self.graphs[size]
            static_in.copy_(host, non_blocking=True)
            graph.replay()
            out = static_out
        else:
            out = self._forward(host.to(self.device, non_blocking=True))
        return out[:count].cpu().numpy()  # .cpu() waits for the GPU
