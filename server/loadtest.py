"""`hub-vit loadtest`: closed-loop load on the served classifier with tritonclient's asyncio API.

N workers each send one request, wait for its answer and send the next, until a duration or a request count is
reached. Reported: throughput, latency percentiles (client side, end to end), errors by message, and the server's
batching efficiency from Triton's statistics, i.e. (inferences / executions) of each step over the run.

With a duration, throughput counts the answers that arrived within it (the steady-state window, as perf_analyzer
does); the requests still in flight at the deadline are awaited and count in the latencies, not in the rate.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException

from hub_vit.server.client import AsyncClassifier, ImageLike, encode


@dataclass
class LoadResult:
    protocol: str
    concurrency: int
    batch: int  # images per request
    requests: int  # answered, including those drained after a deadline
    errors: int
    seconds: float  # the window (duration) or, with a request count, the whole run
    throughput_rps: float  # answered requests per second (within the window when a duration was given)
    images_per_s: float
    latency_ms: dict[str, float]  # p50, p90, p99, mean, max
    batching: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> inferences, executions, ratio
    error_messages: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentiles(latencies_s: Sequence[float]) -> dict[str, float]:
    if not latencies_s:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "mean": float("nan"),
                "max": float("nan")}
    ms = np.asarray(latencies_s) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(ms.mean()), "max": float(ms.max())}


def batching_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, now in after.items():
        then = before.get(name, {})
        inferences = now["inference_count"] - then.get("inference_count", 0)
        executions = now["execution_count"] - then.get("execution_count", 0)
        if inferences:
            out[name] = {"inferences": inferences, "executions": executions,
                         "images_per_execution": inferences / executions if executions else float("nan")}
    return out


async def settled_statistics(client: AsyncClassifier, before: dict[str, dict[str, int]], images: int, *,
                             model: str = "vit", timeout_s: float = 5.0, pause_s: float = 0.02) -> dict:
    """Statistics once every step of the ensemble `model` (the models named `<model>_*`) has counted `images` more
    inferences than in `before`, or the latest read after `timeout_s`.

    Triton counts an execution just after sending its answers, so a read taken the moment the last answer arrives
    may miss the last batch (seen: 116 of 120 in a load test, 24 of 32 in CI)."""
    deadline = time.perf_counter() + timeout_s
    while True:
        latest = await client.statistics()
        counted = [now["inference_count"] - before.get(name, {}).get("inference_count", 0)
                   for name, now in latest.items() if name.startswith(f"{model}_")]
        if all(count >= images for count in counted) or time.perf_counter() >= deadline:
            return latest
        await asyncio.sleep(pause_s)


async def run_load(url: str, images: Sequence[ImageLike], *, protocol: str | None = None, model: str = "vit",
                   concurrency: int = 4, duration_s: float | None = 10.0, requests: int | None = None,
                   batch: int = 1, warmup: int = 2) -> LoadResult:
    """Closed-loop load; stops after `requests` answers if given, else after `duration_s` seconds. `protocol`: as
    `AsyncClassifier` (None: from a grpc:// / http:// URL, else HTTP)."""
    if concurrency < 1 or batch < 1:
        raise ValueError(f"concurrency and batch must be >= 1, got concurrency={concurrency}, batch={batch}")
    if requests is not None and requests < 1:
        raise ValueError(f"the request count (--requests) must be >= 1, got {requests}")
    if requests is None and (duration_s is None or not 0 < duration_s < math.inf):  # NaN fails this too
        raise ValueError(f"the duration (--duration) must be a finite number of seconds > 0, got {duration_s}; "
                         "or give a request count (--requests)")
    payloads = [encode(image) for image in images]
    if not payloads:
        raise ValueError("no images to send")
    cycle = itertools.cycle(payloads)
    latencies: list[float] = []
    answered_at: list[float] = []  # perf_counter time of each answer
    errors: Counter[str] = Counter()
    issued = 0

    async with AsyncClassifier(url, protocol=protocol, model=model) as client:
        limit = await client.max_batch_size()
        if limit and batch > limit:  # the client would split it: one "request" would then be several
            raise ValueError(f"--batch {batch} is more than the {limit} images per request model {model!r} takes "
                             f"(its max_batch_size); valid: 1..{limit}")
        for _ in range(warmup):  # first requests pay connection setup; keep them out of the numbers
            try:
                await client.classify([next(cycle) for _ in range(batch)])
            except InferenceServerException as err:
                # The server answered with an error (a bad image among the inputs, a full queue): the run counts
                # those as errors later; only a server that does not answer at all stops it here.
                if err.status() in (None, "StatusCode.UNAVAILABLE") and "queue" not in str(err).lower():
                    raise
        before = await client.statistics()
        start = time.perf_counter()
        deadline = None if requests is not None else start + float(duration_s or 0)

        async def worker() -> None:
            nonlocal issued
            while True:
                if requests is not None:
                    if issued >= requests:
                        return
                    issued += 1
                elif time.perf_counter() >= deadline:
                    return
                body = [next(cycle) for _ in range(batch)]
                sent = time.perf_counter()
                try:
                    await client.classify(body)
                    now = time.perf_counter()
                    latencies.append(now - sent)
                    answered_at.append(now)
                except Exception as err:  # any server answer that is not a result is an error of the run
                    errors[str(err)[:160]] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - start
        after = await settled_statistics(client, before, len(latencies) * batch, model=model)

    done = rated = len(latencies)
    if deadline is not None:  # rate over the window; the tail drained after the deadline is not load we offered
        seconds, rated = float(duration_s), sum(1 for t in answered_at if t <= deadline)
    return LoadResult(
        protocol=client.protocol, concurrency=concurrency, batch=batch, requests=done, errors=sum(errors.values()),
        seconds=seconds, throughput_rps=rated / seconds, images_per_s=rated * batch / seconds,
        latency_ms=percentiles(latencies), batching=batching_delta(before, after), error_messages=dict(errors),
    )


def load_test(url: str, images: Sequence[ImageLike], **kwargs: Any) -> LoadResult:
    """Blocking wrapper around `run_load`."""
    return asyncio.run(run_load(url, images, **kwargs))
