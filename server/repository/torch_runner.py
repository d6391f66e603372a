"""The torch flavour's forward pass, shared by its Triton step (templates/classifier_torch) and bench/gpu_check.py,
so the benchmark's in-process "hub-vit GPU path" is the served one.

The model's weights are cast to the run's dtype (bf16 on cuda, fp16 where the GPU has no bf16; float32 on cpu): no
autocast, no per-call weight casts. Each batch bucket (config.cuda_graph_buckets) has one float32 input buffer on the
device, which the data path (torch_images) fills; a batch runs in the smallest bucket that holds it (rows past the
batch hold an earlier batch: ViT rows are independent). One pass is `_body`: the input cast to the dtype, the forward,
float32 logits, softmax and the top k, all on the device, so only (N, K) scores and ids (and the (N, C) logits the
step serves) come back to the host, in one copy after one wait (`fetch`).
On cuda every bucket runs once (compiled by torch.compile first when asked) and is then captured as one CUDA graph
of `_body`, in the constructor: the server reports ready only once every shape has run.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

# class ids packed below the score's bits in one int64 key: ids up to 2^21 (hub_vit.variants.BOUNDS: 2^20 classes)
_ID_BITS = 21


class Ranked(NamedTuple):
    """One pass's results on the device: (N, C) float32 logits, (N, K) softmax scores and int64 class ids, and
    (N, F) float32 features the model returns after its C logits (F = 0 for a plain classifier; the token means of
    torch_domain.LogitsAndTokenMeans where the step serves an out-of-domain score)."""

    logits: torch.Tensor
    scores: torch.Tensor
    ids: torch.Tensor
    features: torch.Tensor


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C) float32 logits -> (N, K) softmax scores and class ids, best first; equal scores in class order, as the
    CPU flavour's numpy top_k (a stable sort) gives them (bf16 logits tie often). One `topk` on a key that packs
    the score's bits (non-negative float32 bits order as the values do) above the class id's complement: no sort, no
    host sync, capturable in a CUDA graph."""
    probs = torch.softmax(logits, dim=-1)
    classes = torch.arange(probs.shape[-1], device=probs.device)
    key = (probs.view(torch.int32).to(torch.int64) << _ID_BITS) + ((1 << _ID_BITS) - 1 - classes)
    ids = key.topk(min(k, probs.shape[-1]), dim=-1).indices
    return probs.gather(-1, ids), ids


def default_dtype(device: torch.device) -> torch.dtype:
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


class Runner:
    """The model on one device with its batch buffers: fill `batch(n)`, `run(n)`, then `fetch` what goes back."""

    def __init__(self, model: torch.nn.Module, device: torch.device, crop: tuple[int, int],
                 buckets: tuple[int, ...], *, top_k: int = 5, graphs: bool = True, compile_model: bool = False,
                 dtype: torch.dtype | None = None, classes: int | None = None) -> None:
        """`classes`: how many of the model's output columns are logits (None: all); the rest are features."""
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets must be increasing positive batch sizes, got {buckets}")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        self.device, self.crop, self.buckets, self.k, self.classes = device, crop, buckets, top_k, classes
        self.cuda = device.type == "cuda"
        self.dtype = dtype or default_dtype(device)
        self.model = model.eval().to(device=device, dtype=self.dtype)  # cast, not autocast
        if compile_model and self.cuda:
            self.model = torch.compile(self.model, dynamic=False)
        # the data path writes into these; on cuda each is also its bucket's graph input
        self.inputs = {size: torch.zeros((size, 3, *crop), device=device) for size in buckets}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Ranked]] = {}
        if self.cuda:
            self._warm_up(graphs)

    def _body(self, pixels: torch.Tensor) -> Ranked:
        """(B, 3, H, W) float32 on the device -> Ranked; the region a CUDA graph captures (no host tensor, no sync,
        shapes fixed by B)."""
        out = self.model(pixels.to(self.dtype)).float()
        logits, features = out[:, :self.classes], out[:, out.shape[1] if self.classes is None else self.classes:]
        return Ranked(logits, *top_k(logits, self.k), features)

    @torch.inference_mode()
    def _warm_up(self, graphs: bool) -> None:
        """Run every bucket twice on a side stream (torch.compile compiles it then), then capture one CUDA graph per
        bucket, largest first so the smaller ones reuse its memory pool."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for size in self.buckets:
                for _ in range(2):
                    self._body(self.inputs[size])
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        if not graphs:
            return
        pool = torch.cuda.graph_pool_handle()
        for size in sorted(self.buckets, reverse=True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                ranked = self._body(self.inputs[size])
            graph.replay()  # the bucket runs once as a graph before the server reports ready
            self.graphs[size] = (graph, ranked)
        torch.cuda.synchronize(self.device)

    def bucket(self, count: int) -> int:
        """The smallest bucket that holds `count` rows; ValueError past the largest."""
        for size in self.buckets:
            if size >= count:
                return size
        raise ValueError(f"a batch of {count} images is more than the largest bucket, {self.buckets[-1]} "
                         "(max_batch_size)")

    def batch(self, count: int) -> torch.Tensor:
        """The (count, 3, H, W) float32 rows on the device that the next `run(count)` reads: fill them first."""
        return self.inputs[self.bucket(count)][:count]

    @torch.inference_mode()
    def run(self, count: int) -> Ranked:
        """One pass over the first `count` rows of their bucket -> Ranked (views of `count` rows, on the device; a
        graph's outputs are overwritten by its next replay: fetch them first)."""
        size = self.bucket(count)
        if size in self.graphs:
            graph, ranked = self.graphs[size]
            graph.replay()
            return Ranked(*(tensor[:count] for tensor in ranked))
        return self._body(self.inputs[size][:count])  # eager: the padding rows need not run

    def fetch(self, *tensors: torch.Tensor) -> list[np.ndarray]:
        """Device tensors -> numpy, after one wait: on cuda each is copied into pinned host memory without blocking
        (torch pins a non-blocking device-to-host copy's destination), then the stream is waited for once."""
        host = [tensor.to("cpu", non_blocking=self.cuda) for tensor in tensors]
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        return [tensor.numpy() for tensor in host]

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        """(N, 3, H, W) float32 normalised pixels on the host -> (N, C) float32 logits on the host."""
        with torch.inference_mode():
            self.batch(len(batch)).copy_(torch.from_numpy(batch))
        return self.fetch(self.run(len(batch)).logits)[0]

    @torch.inference_mode()
    def with_attentions(self, batch: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor | None]:
        """An eager pass that also returns the attention probabilities, for explained requests (no CUDA graph: the
        graphs hold the fused path): (N, C [+ F]) float32 outputs (the logits, then any features: see `Ranked`),
        (N, depth, heads, T, T) and the MAP probe's (N, heads, 1, T) or None, all float32 on the CPU."""
        x = torch.from_numpy(batch).to(self.device, self.dtype)
        model = getattr(self.model, "_orig_mod", self.model)  # torch.compile's wrapper: the eager module
        out = model.forward_all(x, output_attentions=True)
        probe = None if out.pool_attention is None else out.pool_attention.float().cpu()
        return out.logits.float().cpu().numpy(), torch.stack(out.attentions, 1).float().cpu(), probe
