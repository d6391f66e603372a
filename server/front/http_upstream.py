"""The Triton side of the HTTP front (http_front.py): one request relayed on a pooled keep-alive connection to
Triton's private HTTP port (`Exchange`), the connection itself (`Upstream`, answers parsed by llhttp or known by their
head), and Triton's answer as the front relays it (`Answer`). What they need of the front is `Pool`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import httptools

from hub_vit.server.front.checks import LOST, STOPPED, Refused
from hub_vit.server.front.remembered import Remembered

# Headers the front sets itself on what it relays: hop-by-hop ones (RFC 9110 section 7.6.1) and the framing
NOT_RELAYED = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade", b"transfer-encoding",
               b"content-length", b"expect"}
# ... and on a request, its Content-Type too: Triton reads no body by it, and parses an
# `application/x-www-form-urlencoded` one (curl --data-binary's default) as form fields, which crashed it (SIGSEGV)
# from about 6 MB
NOT_RELAYED_TO_TRITON = NOT_RELAYED | {b"content-type"}


class Pool(Protocol):
    """The front's side of its connections to Triton (http_front.HttpFront)."""

    upstream_address: tuple[str, int] | None  # None: no server ready
    draining: bool
    known_answers: Remembered[Answer]

    def connect(self, exchange: Exchange) -> None: ...

    def release(self, connection: Upstream, reusable: bool) -> None: ...

    def lost(self, connection: Upstream) -> None: ...


class Answer:
    """Triton's answer head as the front relays it: the status line and the headers that are not hop-by-hop or framing
    (`lines`; the front adds its own Content-Length and Connection), and how long a body it announced."""

    __slots__ = ("status", "lines", "keep_alive", "length")

    def __init__(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool,
                 length: int) -> None:
        lines = [b"HTTP/1.1 ", str(status).encode(), b" ", reason, b"\r\n"]
        for name, value in headers:
            if name.lower() not in NOT_RELAYED:
                lines += [name, b": ", value, b"\r\n"]
        self.status, self.lines, self.keep_alive, self.length = status, b"".join(lines), keep_alive, length


class Exchange:
    """One request relayed to Triton: sent on a connection, its answer parsed by llhttp; a pooled connection Triton
    closed meanwhile is retried once on a fresh one. Where no fresh one can be made, Triton is gone: the request may
    have been in flight there (it may be what killed it), so it is answered as lost (`lost_answer`), never as
    "restarting", which tells a client to send it again."""

    __slots__ = ("front", "request", "answered", "failed", "connection", "pooled", "status", "reason", "headers",
                 "body", "done", "unread", "retried")

    def __init__(self, front: Pool, request: bytes, answered: Callable[[Answer, bytes], None],
                 failed: Callable[[Refused], None]) -> None:
        self.front, self.request, self.answered, self.failed = front, request, answered, failed
        self.connection: Upstream | None = None
        self.pooled, self.done, self.retried = False, False, False

    def send_on(self, connection: Upstream | None) -> None:
        if connection is None:
            self.front.connect(self)
        else:
            self.send(connection, pooled=True)

    def send(self, connection: Upstream, pooled: bool) -> None:
        self.connection, self.pooled = connection, pooled
        self.status, self.reason, self.headers, self.body = 0, b"", [], []
        self.unread = True  # nothing of the answer read yet: llhttp is between answers
        connection.exchange = self
        connection.transport.write(self.request)

    def complete(self, answer: Answer, body: bytes) -> None:
        self.done = True
        connection = self.connection
        assert connection is not None
        connection.exchange = None
        self.front.release(connection, answer.keep_alive)
        self.answered(answer, body)

    def broken(self) -> None:
        """The connection ended (or sent garbage) before the whole answer."""
        if self.done:
            return
        if self.pooled and not self.status and self.front.upstream_address is not None:
            self.retried = True
            self.front.connect(self)  # retried once, on a fresh connection (pooled=False there)
            return
        self.done = True
        self.failed(self.lost_answer())

    def lost_answer(self) -> Refused:
        """The answer for a request Triton took and never answered."""
        if self.front.draining:  # serve is stopping (a second signal stops Triton at once): nothing restarts it
            return Refused(503, STOPPED, close=True)
        return Refused(502, LOST, close=True)


class Upstream(asyncio.Protocol):
    """A keep-alive connection to Triton's HTTP port; answers parsed by llhttp, or known by their head."""

    def __init__(self, front: Pool, generation: int) -> None:
        self.front, self.generation = front, generation
        self.exchange: Exchange | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.transport: Any = None
        self.seen: tuple[bytes, int] | None = None  # the head the read being parsed starts with, and the read's size

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        exchange, self.seen = self.exchange, None
        if exchange is not None and exchange.unread:
            exchange.unread = False
            end = data.find(b"\r\n\r\n") + 4
            if end > 3:
                head = data[:end]
                known = self.front.known_answers.get(head)
                if known is not None and len(data) - end == known.length:  # one whole answer, its head met before
                    exchange.complete(known, data[end:])
                    return
                self.seen = head, len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.lost(self)
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.broken()

    # llhttp's callbacks
    def on_status(self, reason: bytes) -> None:
        if self.exchange is not None:
            self.exchange.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.exchange is not None:
            self.exchange.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            self.exchange.body.append(body)

    def on_message_complete(self) -> None:
        exchange = self.exchange
        if exchange is None:  # an answer nobody asked for: the connection is not to be trusted
            self.transport.close()
            return
        body = b"".join(exchange.body)
        answer = Answer(exchange.status, exchange.reason, exchange.headers, self.parser.should_keep_alive(), len(body))
        seen, self.seen = self.seen, None
        # the read was this answer, whole and alone, framed by its length (a body up to the connection's end is not)
        if (seen is not None and seen[1] == len(seen[0]) + len(body) and answer.keep_alive
                and self.front.known_answers.met(seen[0])):
            self.front.known_answers.remember(seen[0], answer)
        exchange.complete(answer, body)
