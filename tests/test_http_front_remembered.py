"""The HTTP front remembers what it derived from bytes it met before (server/front/http_front.py, remembered.py): the
inference JSON headers that passed its checks, the request heads llhttp parsed and the front passed, Triton's answer
heads. A client repeating itself is not parsed or checked again, and nothing else may pass for what was remembered:
not a request differing in one byte, not a body or answer of other bytes, not what the moment refuses (a drain), not
an upgrade. A real HttpFront on its own event loop relays to a stand-in for Triton that keeps every request it
receives and answers each 200 with the last 4 bytes of its body."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from hub_vit.server.front.checks import SHUTTING_DOWN
from hub_vit.server.front.limits import FrontLimits
from tests.own_loop import Teardown, on_own_loop

httptools = pytest.importorskip("httptools")


class _Triton(asyncio.Protocol):
    """Keeps each request it receives (head and body as they came) in `received`; answers 200, the body's last 4
    bytes as its own (the same answer head for every body of 4 bytes or more)."""

    def __init__(self, received: list[bytes]) -> None:
        self.received, self.data = received, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.parser, self.body = transport, httptools.HttpRequestParser(self), b""

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.received.append(self.data)
        tail, self.data, self.body = self.body[-4:], b"", b""
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"  # type: ignore[attr-defined]
                             b"Content-Length: %d\r\n\r\n" % len(tail) + tail)


@dataclass
class Served:
    port: int
    received: list[bytes] = field(default_factory=list)  # the requests the stand-in for Triton received
    front: Any = None
    loop: asyncio.AbstractEventLoop | None = None


@contextmanager
def _served(limits: FrontLimits = FrontLimits()) -> Iterator[Served]:
    from hub_vit.server.front.http_front import HttpFront
    from hub_vit.server.runtime.launcher import free_port

    served, upstream_port = Served(free_port()), free_port()

    async def setup() -> Teardown:
        served.loop = asyncio.get_running_loop()
        upstream = await served.loop.create_server(lambda: _Triton(served.received), "127.0.0.1", upstream_port)
        served.front = HttpFront(limits)
        await served.front.listen("127.0.0.1", served.port)
        await served.front.upstream("127.0.0.1", upstream_port)

        async def teardown() -> None:
            await served.front.close()
            upstream.close()
        return teardown

    with on_own_loop(setup):
        yield served


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with _served() as served:
        yield served


@pytest.fixture(scope="module")
def port(served: Served) -> int:
    return served.port


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


# -- request heads and answer heads ---------------------------------------------------------------------------------
def _infer(tensors: bytes) -> bytes:
    """A keep-alive inference request of the JSON header `_header([1, 1])` and binary `tensors`."""
    header = _header([1, 1])
    return (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(header), len(header) + len(tensors))) + header + tensors


class _Answers:
    """The whole answers read from a connection, as llhttp parses them: [(status, body)]."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.parser, self.answers, self.body = sock, httptools.HttpResponseParser(self), [], b""

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.answers.append((self.parser.get_status_code(), self.body))
        self.body = b""

    def read(self, count: int) -> list[tuple[int, bytes]]:
        while len(self.answers) < count:
            chunk = self.sock.recv(65536)
            assert chunk, f"the front closed the connection after {len(self.answers)} answers of {count}"
            self.parser.feed_data(chunk)
        answers, self.answers = self.answers, []
        return answers


def _one_connection(port: int, requests: list[bytes | list[bytes]]) -> list[tuple[int, bytes]]:
    """Send each request on one keep-alive connection, each after the answer to the one before (a request given as
    parts is sent part by part, 50 ms apart); the answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        answers = _Answers(sock)
        found = []
        for request in requests:
            for part in [request] if isinstance(request, bytes) else request:
                sock.sendall(part)
                time.sleep(0.05)
            found += answers.read(1)
        return found


def test_a_repeated_request_is_relayed_as_its_first_was_and_each_body_and_answer_is_its_own(served: Served) -> None:
    request = _infer(b"\0\0\x80?")
    before = len(served.received)
    assert _one_connection(served.port, [request] * 3) == [(200, b"\0\0\x80?")] * 3
    assert served.received[before:] == [request.replace(b"\r\n\r\n", b"\r\nConnection: keep-alive\r\n\r\n", 1)] * 3
    # the same head with other tensors: Triton receives those, and the client gets the answer to them (its head too
    # met before), never a remembered one
    other = _infer(b"\1\2\3\4")
    before = len(served.received)
    assert _one_connection(served.port, [request, other, request]) == [(200, b"\0\0\x80?"), (200, b"\1\2\3\4"),
                                                                        (200, b"\0\0\x80?")]
    assert [relayed.endswith(b"\1\2\3\4") for relayed in served.received[before:]] == [False, True, False]


def test_a_known_head_followed_by_more_or_less_than_its_body_is_parsed_afresh(served: Served) -> None:
    request = _infer(b"\0\0\x80?")
    _one_connection(served.port, [request, request])
    split = len(request) - 3
    assert _one_connection(served.port, [[request[:split], request[split:]], request]) == [(200, b"\0\0\x80?")] * 2
    # a request pipelined after it, in the same write: its own answer, after the first
    health = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(request + health)
        assert _Answers(sock).read(2) == [(200, b"\0\0\x80?"), (200, b"")]
    # one byte more than its Content-Length: the start of a next request, which llhttp refuses, and the read with it
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(request + b"\0")
        assert _Answers(sock).read(1)[0][0] == 400


def test_an_upgrade_is_refused_and_never_relayed_however_often_it_comes(served: Served) -> None:
    upgrade = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    before = len(served.received)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(upgrade)
            assert _Answers(sock).read(1)[0][0] == 400
    _one_connection(served.port, [_infer(b"\0\0\x80?")])  # Triton has had time to receive what the front sent
    time.sleep(0.2)
    assert [r for r in served.received[before:] if b"/v2/health/ready" in r] == []


def test_a_known_request_is_refused_once_a_drain_began() -> None:
    request = _infer(b"\0\0\x80?")
    with _served() as served, socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        answers = _Answers(sock)
        for _ in range(2):
            sock.sendall(request)
            assert answers.read(1) == [(200, b"\0\0\x80?")]
        assert served.loop is not None
        served.loop.call_soon_threadsafe(served.front.drain)
        time.sleep(0.2)
        sock.sendall(request)
        (status, body), = answers.read(1)
        assert (status, json.loads(body)["error"]) == (503, SHUTTING_DOWN)


def test_what_is_remembered_is_bounded() -> None:
    from hub_vit.server.front.remembered import Remembered

    remembered: Remembered[int] = Remembered(entries=2, key_bytes=4)
    remembered.remember(b"long!", 1)  # over key_bytes: not kept
    assert remembered.get(b"long!") is None
    remembered.remember(b"a", 1)
    remembered.remember(b"b", 2)
    remembered.remember(b"b", 3)  # a key already kept is replaced, nothing forgotten
    assert (remembered.get(b"a"), remembered.get(b"b"), len(remembered)) == (1, 3, 2)
    remembered.remember(b"c", 4)  # full: everything else forgotten
    assert (remembered.get(b"a"), remembered.get(b"c"), len(remembered)) == (None, 4, 1)
    # a key is worth remembering from its second meeting; what is met is bounded alike
    assert [remembered.met(key) for key in (b"x", b"x", b"y", b"z", b"x")] == [False, True, False, False, False]
    assert [remembered.met(b"long!") for _ in range(2)] == [False, False]  # over key_bytes: never noted
    with pytest.raises(ValueError, match="entries and key_bytes must be positive"):
        Remembered(entries=0, key_bytes=4)
