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
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from os import PathLike
from typing import Any, TypeVar

import numpy as np
from tritonclient.utils import InferenceServerException

from hub_vit.server import protocol
from hub_vit.server.client.addresses import resolve_protocol
from hub_vit.server.client.classifier import AsyncClassifier, refusal
from hub_vit.server.client.errors import (
    MAX_REQUEST_FLAG,
    no_server,
    refused_image,
    shed,
    too_large,
    too_large_limit,
)
from hub_vit.server.client.images import ImageLike, encode
from hub_vit.server.client.messages import queue_timeout

T = TypeVar("T")  # what a request holds: encoded images, or their names

# Cores of CPU this load generator may use before its numbers are its own limit: it is one Python process whose
# asyncio loop runs on one thread (gRPC adds a poller thread, which rarely takes much).
SATURATED_CORES = 0.9


# One connection per request in flight: past this, the load generator's own process is the bottleneck (one core drives
# a few thousand), and connections beyond a server's limit are refused (hub-vit serve's front: --max-connections 4096)
MAX_CONCURRENCY = 16_384


@dataclass
class LoadResult:
    protocol: str
    concurrency: int  # requests in flight at once: at most the request count, when one is given
    batch: int  # images per request
    requests: int  # answered, including those drained after a deadline
    errors: int
    seconds: float  # the window (duration) or, with a request count, the whole run
    throughput_rps: float  # answered requests per second (within the window when a duration was given)
    images_per_s: float
    latency_ms: dict[str, float]  # p50, p90, p99, mean, max
    batching: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> inferences, executions, ratio
    error_messages: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False  # Ctrl-C ended the run early: the numbers cover the time until then
    statistics_error: str | None = None  # why `batching` is empty: the server's statistics could not be read
    # This process's own CPU from the first measured request until the last answer (drained ones included): per
    # request sent, and as cores kept busy. A load generator near a full core is measuring itself, not the server.
    load_generator_cpu_ms_per_request: float = float("nan")
    load_generator_cores: float = float("nan")
    queue_timeout_ms: float | None = None  # each request's queue timeout; None: the repository's own
    # of `errors`, those that reached no server (refused connections; serve's front with no server behind it): each
    # worker tries again after 50 ms, so a server that went away adds about 20 per worker per second
    unreached: int = 0

    @property
    def load_generator_saturated(self) -> bool:
        """About a whole core busy over a run that sent requests (one that sent none, e.g. a --duration too short
        for its first request, has no cost per request, and its few microseconds of CPU say nothing)."""
        return math.isfinite(self.load_generator_cpu_ms_per_request) and self.load_generator_cores >= SATURATED_CORES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """The result as standard JSON: a number there is none of (no answered request: no latency) is null, not
        Python's bare NaN, which JSON parsers refuse."""
        def standard(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {key: standard(item) for key, item in value.items()}
            return value

        return json.dumps(standard(self.to_dict()), indent=2, allow_nan=False)


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


WARMUP_SETTLE_S = 2.0  # how long the warm-up's requests may take to be counted before the run starts anyway


async def settled_statistics(client: AsyncClassifier, before: dict[str, dict[str, int]], images: int, *,
                             model: str = "vit", timeout_s: float = 5.0, pause_s: float = 0.02) -> dict:
    """Statistics once `model` and, for an ensemble, each of its steps (the models named `<model>_*`) have counted
    `images` more inferences than in `before`, or the latest read after `timeout_s`.

    Triton counts an execution just after sending its answers, so a read taken the moment the last answer arrives
    may miss the last batch (seen: 116 of 120 in a load test, 24 of 32 in CI)."""
    deadline = time.perf_counter() + timeout_s
    while True:
        latest = await client.statistics()
        counted = [now["inference_count"] - before.get(name, {}).get("inference_count", 0)
                   for name, now in latest.items() if name == model or name.startswith(f"{model}_")]
        if all(count >= images for count in counted) or time.perf_counter() >= deadline:
            return latest
        await asyncio.sleep(pause_s)


async def run_load(url: str, images: Sequence[ImageLike], *, protocol: str | None = None, model: str = "vit",
                   concurrency: int = 4, duration_s: float | None = 10.0, requests: int | None = None,
                   batch: int = 1, warmup: int = 2, queue_timeout_s: float | None = None,
                   timeout_s: float = 60.0) -> LoadResult:
    """Closed-loop load; stops after `requests` answers if given, else after `duration_s` seconds. `protocol`: as
    `AsyncClassifier` (None: from a grpc:// / http:// URL, else HTTP). `queue_timeout_s`: sent with every request
    (`AsyncClassifier.classify`); the requests the server rejects for it are errors of the run, by their message.
    `timeout_s`: the longest wait for any one answer (the model's config before the run included)."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"the requests in flight (--concurrency) must be between 1 and {MAX_CONCURRENCY}, got "
                         f"{concurrency}" + (" (one connection each; a server takes 4096 by default: hub-vit serve "
                                             "--max-connections)" if concurrency > MAX_CONCURRENCY else ""))
    if batch < 1:
        raise ValueError(f"the images per request (--batch) must be >= 1, got {batch}")
    if requests is not None and requests < 1:
        raise ValueError(f"the request count (--requests) must be >= 1, got {requests}")
    if requests is None and (duration_s is None or not 0 < duration_s < math.inf):  # NaN fails this too
        raise ValueError(f"the duration (--duration) must be a finite number of seconds > 0, got {duration_s}; "
                         "or give a request count (--requests)")
    queue_timeout(queue_timeout_s)  # checked before connecting
    if requests is not None:  # more would be workers with nothing to send, each holding a connection open
        concurrency = min(concurrency, requests)
    if resolve_protocol(url, protocol) == "http":
        _allow_open_files(concurrency + 64)  # one socket per worker, plus the interpreter's own files
    payloads = [encode(image) for image in images]
    if not payloads:
        raise ValueError("no images to send")
    latencies: list[float] = []
    answered_at: list[float] = []  # perf_counter time of each answer
    errors: Counter[str] = Counter()
    issued = unreached = 0

    # as many HTTP connections as workers: tritonclient's default of 100 would queue the rest in the client, and a
    # "concurrency 2000" run would offer the server 100 requests at a time without saying so
    async with AsyncClassifier(url, protocol=protocol, model=model, timeout_s=timeout_s,
                               connections=max(100, concurrency)) as client:
        refused = refusal(model, await client.config(), False, queue_timeout_s)
        if refused is not None:  # every request would be refused for it
            raise refused
        limit = await client.max_batch_size()
        if limit and batch > limit:  # the client would split it: one "request" would then be several
            raise ValueError(f"--batch {batch} is more than the {limit} images per request model {model!r} takes "
                             f"(its max_batch_size); valid: 1..{limit}")
        # built once, as perf_analyzer does: the load generator shares the machine, and every microsecond of its own
        # per request is one the server does not get (seen: 0.24-0.25 -> 0.17-0.19 ms of CPU per request, 2 cores)
        prepared = [client.prepare(body, queue_timeout_s=queue_timeout_s) for body in request_bodies(payloads, batch)]
        del payloads  # each prepared request holds its own serialised copy
        named = dict(zip(map(id, prepared), request_bodies(image_names(images), batch), strict=True))  # for refusals
        unwarmed, warmed = await client.statistics(), 0
        for request in itertools.islice(itertools.cycle(prepared), warmup):  # connection setup, kept out of the numbers
            try:
                await client.send(request)
                warmed += request.images
            except InferenceServerException as err:
                # The server answered with an error (a bad image among the inputs, a full queue): the run meets it
                # again and counts it; only a server that does not answer at all stops it here.
                if not _answered(err):
                    raise
        cycle = itertools.cycle(prepared)  # from the first image again: every image the run reaches is counted
        # the warm-up counted in `before`: Triton counts a request just after answering it, so a read at once could miss
        # the last one, and the run's numbers would hold it (seen: 25 inferences for a run of 24 requests)
        before = await settled_statistics(client, unwarmed, warmed, model=model, timeout_s=WARMUP_SETTLE_S)
        server_before = await client.server_id()
        start, cpu_start = time.perf_counter(), time.process_time()
        deadline = None if requests is not None else start + float(duration_s or 0)
        interrupted = _on_first_interrupt()

        async def worker() -> None:
            nonlocal issued, unreached
            while not interrupted.is_set():
                if requests is not None:
                    if issued >= requests:
                        return
                    issued += 1
                elif time.perf_counter() >= deadline:
                    return
                request = next(cycle)
                sent = time.perf_counter()
                try:
                    await client.send(request)
                    now = time.perf_counter()
                    latencies.append(now - sent)
                    answered_at.append(now)
                except Exception as err:  # any server answer that is not a result is an error of the run
                    errors[error_message(err, client.timeout_s, named[id(request)])] += 1
                    if not _answered(err):  # refused connection (a server restarting): no tight retry loop
                        unreached += 1
                        await asyncio.sleep(0.05)

        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            interrupted.restore()
        seconds = elapsed = time.perf_counter() - start  # the whole run, drained answers included
        cpu_s = time.process_time() - cpu_start
        attempts = len(latencies) + sum(errors.values())  # requests sent in the run, answered or failed
        stopped_at = interrupted.at
        if stopped_at is not None and deadline is not None and stopped_at >= deadline:
            stopped_at = None  # Ctrl-C while the last answers drained: the window was complete
        batching, statistics_error = {}, None
        try:
            after = await settled_statistics(client, before, len(latencies) * batch, model=model)
            if await client.server_id() == server_before:
                batching = batching_delta(before, after)
            else:  # `hub-vit serve` replaced a server that died: the new one counts from zero
                statistics_error = "the server restarted during the run, and its counters started again"
        except Exception as err:  # the server died during the run: its answers until then are still the result
            reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            statistics_error = f"reading them after the run failed ({reason}); did the server stop?"

    done = rated = len(latencies)
    if deadline is not None and stopped_at is None:  # rate over the window, not the tail drained after it
        seconds, rated = float(duration_s), sum(1 for t in answered_at if t <= deadline)
    elif stopped_at is not None:  # Ctrl-C: the window ends there; requests then in flight were awaited
        seconds, rated = max(stopped_at - start, 1e-9), sum(1 for t in answered_at if t <= stopped_at)
    return LoadResult(
        protocol=client.protocol, concurrency=concurrency, batch=batch, requests=done, errors=sum(errors.values()),
        seconds=seconds, throughput_rps=rated / seconds, images_per_s=rated * batch / seconds,
        latency_ms=percentiles(latencies), batching=batching, error_messages=dict(errors),
        interrupted=stopped_at is not None, statistics_error=statistics_error,
        load_generator_cpu_ms_per_request=cpu_s * 1000 / attempts if attempts else float("nan"),
        load_generator_cores=cpu_s / elapsed if elapsed > 0 else float("nan"),
        queue_timeout_ms=None if queue_timeout_s is None else queue_timeout_s * 1000, unreached=unreached,
    )


def image_names(images: Sequence[ImageLike]) -> list[str]:
    """How the run's report names each image: its path as given, else its place in the list."""
    return [str(image) if isinstance(image, (str, PathLike)) else f"image {index}"
            for index, image in enumerate(images)]


def error_message(err: Exception, timeout_s: float, names: Sequence[str] = ()) -> str:
    """How a failed request is counted in `error_messages`: the server's words (at most 160 characters), a refused
    image named by `names` (the request's images as the caller knows them: its file, not its index in the request);
    a request that got no answer in time names the client's timeout (aiohttp's `TimeoutError` has no words of its
    own)."""
    if isinstance(err, TimeoutError):  # asyncio's too
        return f"no answer within the client's timeout of {timeout_s:g} s"
    refused = refused_image(err)
    if refused is not None and refused.index < len(names):
        return f"{names[refused.index]}: {refused.reason}"[:160]
    if too_large(err) and too_large_limit(err) is None:  # grpc's own words, which name no way out: the flag does
        return f"{str(err)[:160]} (over the server's request size limit: {MAX_REQUEST_FLAG})"
    return protocol.untagged(str(err))[:160] or type(err).__name__


def request_bodies(payloads: Sequence[T], batch: int) -> list[list[T]]:
    """One pass over `payloads` in requests of `batch` images, the last one filled up from the start: every image is
    sent, and the requests can be built once (their bodies hold the images once more, plus at most `batch - 1`)."""
    count = math.ceil(len(payloads) / batch)
    return [[payloads[(start + k) % len(payloads)] for k in range(batch)] for start in range(0, count * batch, batch)]


def _answered(err: Exception) -> bool:
    """Whether a failed request reached the server (which refused it: a bad image, a full queue, its queue timeout)
    rather than failing to connect. tritonclient gives server answers a status (HTTP code, gRPC status other than
    UNAVAILABLE, which the server also gives when it sheds load)."""
    if not isinstance(err, InferenceServerException) or no_server(err):  # serve's gate, with no server behind it
        return False
    status = err.status()
    return status is not None and status != "StatusCode.UNAVAILABLE" or shed(err)


def _allow_open_files(count: int) -> None:
    """Raise this process's soft limit on open files towards `count` (at most the hard limit): an HTTP run at
    concurrency 2000 needs 2000 sockets, over the usual soft limit of 1024 ("Too many open files" per request)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        target = count if hard == resource.RLIM_INFINITY else min(count, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass  # the requests over the limit then fail, each counted with its reason


class _Interrupt:
    """Set by the first Ctrl-C of a run (`_on_first_interrupt`): workers send no new request, the ones in flight are
    awaited and the run is reported. `at`: perf_counter time of that Ctrl-C."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._restore: Any = None

    def is_set(self) -> bool:
        return self.at is not None

    def restore(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None


def _on_first_interrupt() -> _Interrupt:
    """The first Ctrl-C (SIGINT) ends the run early with its numbers so far; a second one, restored to Python's
    default, aborts at once. Only in the main thread's loop (signal handlers cannot be set elsewhere)."""
    import signal
    import threading

    state = _Interrupt()
    if threading.current_thread() is not threading.main_thread():
        return state
    loop = asyncio.get_running_loop()

    def first() -> None:
        state.at = time.perf_counter()
        state.restore()  # the next Ctrl-C raises KeyboardInterrupt as usual

    try:
        loop.add_signal_handler(signal.SIGINT, first)
    except (NotImplementedError, RuntimeError, ValueError):  # no signal support in this loop
        return state
    state._restore = lambda: loop.remove_signal_handler(signal.SIGINT)
    return state


def load_test(url: str, images: Sequence[ImageLike], **kwargs: Any) -> LoadResult:
    """Blocking wrapper around `run_load`."""
    return asyncio.run(run_load(url, images, **kwargs))
