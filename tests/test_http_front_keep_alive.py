"""How long the HTTP front keeps a connection (server/front/http_front.py): an idle keep-alive connection waits
`keep_alive_s` after its last answer and is then closed without a word, while a request that has begun has the head
timeout from its first byte. A real HttpFront on its own event loop, before a stand-in for Triton."""

from __future__ import annotations

import socket
import time

import pytest

from hub_vit.server.front.limits import FrontLimits
from tests.test_http_front_remembered import _served

pytest.importorskip("httptools")

REQUEST = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"


def _answer(sock: socket.socket) -> bytes:
    """One answer of the stand-in (a 200 with an empty body: the whole of it fits one read)."""
    data = sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 200 "), data
    return data


def _silence_then_close(sock: socket.socket, within_s: float) -> tuple[bytes, float]:
    """What the front sent before closing, and after how many seconds it closed."""
    start, received = time.monotonic(), b""
    sock.settimeout(within_s)
    while chunk := sock.recv(65536):
        received += chunk
    return received, time.monotonic() - start


def test_an_idle_keep_alive_connection_outlives_the_head_timeout_then_closes_without_a_word() -> None:
    # was: the head timeout (10 s) also bounded the wait for a next request, which then got an unasked 408: behind a
    # load balancer whose idle timeout is longer (AWS ALB: 60 s), a request sent as that 408 came was lost (a 502)
    with _served(FrontLimits(head_timeout_s=1.0, keep_alive_s=3.0)) as served:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(REQUEST)
            _answer(sock)
            time.sleep(2.0)  # past the head timeout and its sweep
            sock.sendall(REQUEST)  # the same connection still serves
            _answer(sock)
            received, after_s = _silence_then_close(sock, within_s=10)
        assert received == b"", received  # no 408 for a request nobody sent
        assert after_s > 2.0, after_s  # the keep-alive wait, not the head timeout


def test_a_next_request_that_has_begun_has_the_head_timeout() -> None:
    with _served(FrontLimits(head_timeout_s=1.0, keep_alive_s=30.0)) as served:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(REQUEST)
            _answer(sock)
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\n")  # a head never finished
            received, after_s = _silence_then_close(sock, within_s=10)
        assert received.startswith(b"HTTP/1.1 408 ") and b"no complete request head within 1 s" in received, received
        assert after_s < 5.0, after_s  # the head timeout, not the 30 s keep-alive


def test_keep_alive_must_be_positive() -> None:
    with pytest.raises(ValueError, match="keep_alive_s must be a positive number of seconds"):
        FrontLimits(keep_alive_s=0)
