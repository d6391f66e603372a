"""What the asyncio client and the load generator put on the wire, seen by a recording HTTP server (the real-server
load tests are in test_server_triton.py): answers asked for uncompressed, prepared requests checked on their answer,
and one pass over the images in requests built once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from hub_vit.server.client.classifier import AsyncClassifier, Classifier
from hub_vit.server.client.loadtest import LoadResult, error_message, percentiles, request_bodies


class Recorder(BaseHTTPRequestHandler):
    """Answers every infer request with `rows` rows of top-1 outputs (JSON) and records its headers."""

    rows: int | None = None  # None: as many rows as the request has images
    seen: list[dict[str, str]]
    parameters: list[dict]  # each request's JSON "parameters"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        header = json.loads(body[:int(self.headers.get("Inference-Header-Content-Length", len(body)))])
        type(self).seen.append(dict(self.headers))
        type(self).parameters.append(header.get("parameters", {}))
        rows = self.rows if self.rows is not None else header["inputs"][0]["shape"][0]
        answer = json.dumps({"model_name": "vit", "outputs": [
            {"name": "labels", "datatype": "BYTES", "shape": [rows, 1], "data": ["7"] * rows},
            {"name": "scores", "datatype": "FP32", "shape": [rows, 1], "data": [0.9] * rows},
            {"name": "class_ids", "datatype": "INT64", "shape": [rows, 1], "data": [7] * rows},
        ]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        """The model's config, which a client reads before sending a queue timeout: a repository whose queue policy
        applies them (protocol.py's ensemble parameters)."""
        answer = json.dumps({"name": "vit", "max_batch_size": 16, "parameters": {
            "hub_vit_queue_timeouts": {"string_value": "true"}}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, type[Recorder]]]:
    handler = type("RecorderForTest", (Recorder,), {"seen": [], "parameters": [], "rows": None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_async_http_client_asks_for_uncompressed_answers(recorder):
    # aiohttp asks for gzip by default, and Triton then compresses every answer (CPU on both ends for ~400 bytes)
    url, handler = recorder

    async def go() -> None:
        async with AsyncClassifier(url) as client:
            predictions = await client.classify([b"png bytes"])
            assert predictions[0].labels == ["7"]
            prepared = client.prepare([b"a", b"b"])
            await client.send(prepared)
            await client.send(prepared)  # built once, sent as often as wanted

    asyncio.run(go())
    assert len(handler.seen) == 3
    assert all(headers.get("Accept-Encoding") == "identity" for headers in handler.seen), handler.seen


def test_a_queue_timeout_travels_in_microseconds_and_a_bad_one_is_refused_unsent(recorder):
    # Triton reads a request's queue timeout from its "timeout" parameter, in microseconds (the real server's
    # rejections are tested in test_server_triton.py)
    url, handler = recorder

    async def go() -> None:
        async with AsyncClassifier(url) as client:
            await client.classify([b"a"], queue_timeout_s=0.002)
            await client.send(client.prepare([b"a"], queue_timeout_s=0.25))
            await client.classify([b"a"])
            await client.classify([b"a"], queue_timeout_s=np.float32(0.5))  # a number, whatever its type
            # beyond one day (the repository's own default, the longest Triton applies) Triton cannot parse it
            for bad in (0, -1.0, float("nan"), float("inf"), True, "1", 86_401, 1e300):
                with pytest.raises(ValueError, match="queue timeout must be a positive number of seconds, at most "
                                                     "86400"):
                    await client.classify([b"a"], queue_timeout_s=bad)

    asyncio.run(go())
    assert [p.get("timeout") for p in handler.parameters] == [2000, 250000, None, 500000]


def test_send_checks_the_answer_has_a_row_per_image(recorder):
    url, handler = recorder
    handler.rows = 1

    async def go() -> None:
        async with AsyncClassifier(url) as client:
            await client.send(client.prepare([b"a"]))  # right
            with pytest.raises(ValueError, match="answered 1 rows of scores for a request of 3 images"):
                await client.send(client.prepare([b"a", b"b", b"c"]))

    asyncio.run(go())


@pytest.mark.parametrize(("count", "batch", "expected"), [
    (5, 1, [[0], [1], [2], [3], [4]]),
    (5, 2, [[0, 1], [2, 3], [4, 0]]),  # the last request filled up from the start
    (2, 4, [[0, 1, 0, 1]]),  # fewer images than one request holds
    (4, 4, [[0, 1, 2, 3]]),
])
def test_request_bodies_send_every_image_once_per_pass(count, batch, expected):
    payloads = [bytes([i]) for i in range(count)]
    bodies = request_bodies(payloads, batch)
    assert [[payload[0] for payload in body] for body in bodies] == expected


@pytest.mark.parametrize("cores", [0.35, 0.97])
def test_loadtest_says_when_the_load_generator_is_the_limit(cores, monkeypatch):
    # a closed loop whose client keeps a core busy measures the client: perf_analyzer-like warning, not silence
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from hub_vit.server.client import loadtest

    result = loadtest.LoadResult(
        protocol="http", concurrency=16, batch=1, requests=100, errors=0, seconds=1.0, throughput_rps=100.0,
        images_per_s=100.0, latency_ms=loadtest.percentiles([0.01] * 100), batching={},
        load_generator_cpu_ms_per_request=cores * 10, load_generator_cores=cores)
    monkeypatch.setattr(loadtest, "load_test", lambda *args, **kwargs: result)
    _load_commands()
    out = CliRunner().invoke(app, ["loadtest", "--url", "127.0.0.1:8000", "--requests", "100"])
    output = " ".join(out.output.split())
    assert out.exit_code == 0, output
    assert f"{cores:.2f} cores busy" in output
    assert ("these numbers may be its limit" in output) == (cores >= loadtest.SATURATED_CORES), output


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_without_an_answer_is_named_by_the_clients_timeout(silent_port, protocol):
    # was: aiohttp's TimeoutError has no words, so `loadtest` counted "964 x " and `classify` said "error: ...: "
    async def go() -> Exception:
        async with AsyncClassifier(f"127.0.0.1:{silent_port}", protocol=protocol, timeout_s=0.5) as client:
            with pytest.raises(Exception) as info:
                await asyncio.wait_for(client.send(client.prepare([b"a"])), timeout=30)  # the client's own, not this
            return info.value

    err = asyncio.run(go())
    if protocol == "http":
        assert isinstance(err, TimeoutError) and str(err) == ""
        assert error_message(err, 0.5) == "no answer within the client's timeout of 0.5 s"
    else:  # the gRPC call now has a deadline (it had none: a stalled server hung the load generator), named by gRPC
        assert error_message(err, 0.5) == "[StatusCode.DEADLINE_EXCEEDED] Deadline Exceeded", err
    assert error_message(ValueError(""), 1) == "ValueError"


def test_an_image_refusal_is_counted_in_words_for_people():
    # was counted as "[400] in ensemble 'vit', [hub-vit image-refused index=0] image 0: ...": the protocol's tag shown
    from tritonclient.utils import InferenceServerException

    from hub_vit.server import protocol

    err = InferenceServerException("in ensemble 'vit', " + protocol.image_refused(0, "not an image"), status="400")
    assert error_message(err, 1) == "[400] in ensemble 'vit', image 0: not an image"
    # with the request's images named, the file: "image 0" said nothing about which of the run's files it was
    second = InferenceServerException("in ensemble 'vit', " + protocol.image_refused(1, "not an image"), status="400")
    assert error_message(second, 1, ["a.png", "scans/b.png"]) == "scans/b.png: not an image"


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (float("inf"), ValueError),
                                        (float("nan"), ValueError), (True, ValueError), ("5", ValueError)])
def test_a_clients_timeout_must_be_a_positive_number_of_seconds(bad, error):
    # tritonclient failed on these with BlockingIOError (0) or "Timeout value out of range" (-1)
    for client in (Classifier, AsyncClassifier):
        with pytest.raises(error, match="timeout_s must be a positive number of seconds"):
            client("127.0.0.1:8000", timeout_s=bad)
    with pytest.raises(TypeError, match="the server URL must be a string"):
        Classifier(8000)


def test_a_load_result_without_answers_is_standard_json():
    # `--json` wrote bare NaN (no answered request: no latency), which JSON parsers refuse
    result = LoadResult(protocol="http", concurrency=1, batch=1, requests=0, errors=3, seconds=1.0,
                        throughput_rps=0.0, images_per_s=0.0, latency_ms=percentiles([]),
                        error_messages={"not an image": 3})

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    report = json.loads(result.to_json(), parse_constant=refuse)
    assert report["latency_ms"]["p50"] is None and report["load_generator_cores"] is None
    assert report["errors"] == 3 and report["error_messages"] == {"not an image": 3}


class LaggingCounts(Recorder):
    """A server that counts each answered image in its statistics only `LAG_S` after answering, as Triton counts an
    execution just after sending its answers; its config, metadata and statistics are Triton's JSON."""

    LAG_S = 0.3
    answered: list[tuple[float, int]]  # (when, images) per answer

    def do_POST(self) -> None:  # noqa: N802
        super().do_POST()
        images = 1 if self.rows is None else self.rows  # the load test below sends one image per request
        type(self).answered.append((time.monotonic(), images))

    def do_GET(self) -> None:  # noqa: N802
        if self.path.endswith("/config"):
            body: dict = {"name": "vit", "max_batch_size": 8}
        elif self.path.endswith("/stats"):
            counted = sum(images for when, images in type(self).answered if when <= time.monotonic() - self.LAG_S)
            body = {"model_stats": [{"name": "vit", "version": "1", "inference_count": counted,
                                     "execution_count": counted}]}
        else:  # GET /v2: the server's metadata
            body = {"name": "lagging", "version": "2.51.0", "extensions": []}
        answer = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def _load_test_on_lagging_counts(concurrency: int, requests: int) -> tuple[LoadResult, type[LaggingCounts]]:
    """A `load_test` of `requests` requests against a LaggingCounts server of its own; (its result, the handler)."""
    from hub_vit.server.client.loadtest import load_test

    handler = type("LaggingForTest", (LaggingCounts,), {"seen": [], "parameters": [], "rows": None, "answered": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        return load_test(f"127.0.0.1:{server.server_address[1]}", [b"\x89PNG stand-in bytes"],
                         concurrency=concurrency, requests=requests, duration_s=None), handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_warm_up_is_not_counted_in_the_runs_batching() -> None:
    """was: the statistics before the run were read the moment the warm-up's last answer arrived, before the server
    had counted it, so the run's batching held it (25 inferences for a run of 24 requests, seen in CI)."""
    result, handler = _load_test_on_lagging_counts(concurrency=2, requests=6)
    assert len(handler.answered) == 6 + 2  # the run's requests and the two of the warm-up
    assert result.requests == 6 and result.batching["vit"]["inferences"] == 6, result.batching


def test_no_more_requests_are_in_flight_than_the_run_sends() -> None:
    # was: --concurrency 1000000 --requests 5 started a million workers (and connections) for five requests
    result, handler = _load_test_on_lagging_counts(concurrency=64, requests=3)
    assert result.concurrency == 3 and result.requests == 3 and len(handler.answered) == 3 + 2, result


def test_the_serving_docs_name_every_field_of_loadtests_json() -> None:
    # the JSON's `requests` counts answered requests while the text's counts every one: the docs say so, field by field
    import dataclasses

    docs = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith("| `--json out.json` |"))
    assert [f.name for f in dataclasses.fields(LoadResult) if f"`{f.name}`" not in row] == [], row
