"""The HTTP front remembers the inference JSON headers that passed its checks (server/front/http_front.py): a client
repeating one is not parsed again, and nothing else may pass for it. A real HttpFront on its own event loop relays to
a stand-in for Triton that answers every request 200."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import pytest

from hub_vit.server.front.limits import FrontLimits
from tests.own_loop import Teardown, on_own_loop

httptools = pytest.importorskip("httptools")
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


class _Triton(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.parser = transport, httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(ANSWER)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    from hub_vit.server.front.http_front import HttpFront
    from hub_vit.server.runtime.launcher import free_port

    ports = {"public": free_port(), "upstream": free_port()}

    async def setup() -> Teardown:
        upstream = await asyncio.get_running_loop().create_server(_Triton, "127.0.0.1", ports["upstream"])
        front = HttpFront(FrontLimits())
        await front.listen("127.0.0.1", ports["public"])
        await front.upstream("127.0.0.1", ports["upstream"])

        async def teardown() -> None:
            await front.close()
            upstream.close()
        return teardown

    with on_own_loop(setup):
        yield ports["public"]


def _status(port: int, header: bytes, declared: int | None = None, tensors: bytes = b"\0\0\x80?") -> int:
    """POST an inference request of JSON `header` + binary `tensors` (Inference-Header-Content-Length `declared`,
    default the header's length); the answer's status."""
    body = header + tensors
    request = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (len(header) if declared is None else declared,
                                                                     len(body))) + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(request)
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _header(shape: list[int], **parameters: object) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape,
                                   "parameters": {"binary_data_size": 4}}], **parameters}).encode()


def test_a_header_that_passed_passes_again_and_nothing_else_passes_for_it(port: int) -> None:
    good = _header([1, 1])
    assert [_status(port, good) for _ in range(3)] == [200] * 3
    assert _status(port, _header([0, 1])) == 400  # another header is checked, however alike
    assert _status(port, good, declared=len(good) + 10) == 400  # a declared length past the body: not the header
    assert _status(port, good[:-1], tensors=b"}" + b"\0\0\x80?", declared=len(good) - 1) == 400  # a cut header
    assert _status(port, good, tensors=b"\1\2\3\4") == 200  # the tensors are Triton's to read


def test_a_header_refused_once_is_refused_every_time(port: int) -> None:
    bad = _header([1, 2**32])
    assert [_status(port, bad) for _ in range(3)] == [400] * 3
