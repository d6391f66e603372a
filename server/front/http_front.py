"""The HTTP front of one front process: HTTP/1.1 parsed by llhttp (httptools), checked (checks.py), relayed to Triton's
private HTTP port over a pool of keep-alive connections whose answers llhttp parses too.

llhttp (Node.js's parser) is strict by default: a request it finds ambiguous is refused with 400 and the connection
closed, never relayed: Content-Length twice, Content-Length with Transfer-Encoding, obsolete line folding, bare LF line
ends, NUL / CR / other control characters in a header value, a bad chunk size, Upgrade / CONNECT. The front writes
every request it relays itself (its own Content-Length, `Connection: keep-alive`), so Triton never parses the client's
framing. On top of llhttp, what the front refuses (docs/serving.md, "Limits and security"):

* a body over the limit, before reading it when Content-Length says so, and a gzip / deflate body whose inflated size
  passes it (checks.inflate) -> 413 tagged `protocol.too_large`; the inflated body is what is relayed;
* `Transfer-Encoding` (chunked bodies: CVE-2025-23310/23311, a stack overflow in Triton < 2.59.1) -> 411;
* methods other than GET and POST -> 405 (Triton serves none);
* the inference checks of checks.py -> 400;
* a head over `max_head_bytes` -> 431; a head not complete within `head_timeout_s` of its first byte, or of a new
  connection's accept (half-sent connections held Triton's descriptors: 20,400 of them made HTTP, gRPC and metrics
  unreachable) -> 408 and the connection is closed; a kept-alive connection idle for `keep_alive_s` after its last
  answer is closed without a word (an unasked 408 there could meet the client's next request on the wire);
  beyond this process's share of `max_connections`, only health requests are relayed (probes stay reachable; their
  head gets 1 s), others get 503;
* once `drain()` is called (SIGTERM), the listener is closed and a new request on an open connection gets 503
  "shutting down" with `Connection: close`, while requests already taken get their answers; `drained()` then waits for
  them and closes the pooled connections to Triton, so Triton's own drain is not held open by them.

Everything is callbacks on the process's event loop (no task per request): a coroutine runs only for the rare request
that needs one (the model's metadata, a large JSON header, a compressed body). Clients repeat themselves, and so does
Triton: a request head, an inference JSON header or an answer head met before, byte for byte, is not parsed or checked
again; what was derived from it is reused (remembered.py). A repeated head is recognised only when a read holds exactly
one whole message that starts with it, between messages (else llhttp parses the read), so framing is never guessed.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools

from hub_vit.server.front.checks import (
    BUSY,
    SHUTTING_DOWN,
    STARTING,
    Refused,
    check_inference,
    inference_header,
    inflate,
    numeric_outputs,
    too_large,
    unreachable,
    wants_classification,
)
from hub_vit.server.front.http_upstream import NOT_RELAYED_TO_TRITON, Answer, Exchange, Upstream
from hub_vit.server.front.limits import FrontLimits
from hub_vit.server.front.refusals import Refusals
from hub_vit.server.front.remembered import Remembered

INFER_PATH = re.compile(rb"^/v2/models/(?P<model>[^/?]+)(?:/versions/[^/?]+)?/infer(?:\?.*)?$")
HEALTH_PATH = re.compile(rb"^/v2/health/(live|ready)(?:\?.*)?$")
REASONS = {400: "Bad Request", 405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
           413: "Payload Too Large", 415: "Unsupported Media Type", 431: "Request Header Fields Too Large",
           502: "Bad Gateway", 503: "Service Unavailable"}
LARGE_JSON = 1 << 20  # a JSON header this long is parsed off the event loop
# request heads, inference JSON headers and answer heads remembered, per front process: at most this many of each,
# each at most this long
REMEMBERED, REMEMBERED_BYTES = 256, 4096
SWEEP_S = 0.5  # how often connection deadlines are checked


class Request:
    """One request as llhttp parsed it."""

    __slots__ = ("method", "url", "fields", "relayed", "head_size", "body", "keep_alive", "length", "taken",
                 "relay_head")

    def __init__(self) -> None:
        self.method, self.url, self.body = b"", b"", []
        self.fields: dict[bytes, bytes] = {}  # lower-case name -> its first value (each name lowered once)
        self.relayed: list[tuple[bytes, bytes]] = []  # the headers relayed to Triton: not hop-by-hop, not framing
        self.head_size = 0  # the headers' bytes, as the head limit counts them (the URL's come on top)
        self.keep_alive, self.length, self.taken = True, 0, False
        self.relay_head: bytes | None = None  # the head relayed to Triton, for a body of `length` bytes

    def header(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lower case)."""
        return self.fields.get(name)

    def relay_head_for(self, length: int) -> bytes:
        """The head the front writes to Triton for this request with a body of `length` bytes."""
        return relay_head(self.method, self.url, self.relayed, length)


def relay_head(method: bytes, url: bytes, relayed: list[tuple[bytes, bytes]], length: int) -> bytes:
    """The head the front writes to Triton: the request line, the `relayed` headers, its own framing."""
    head = [method, b" ", url, b" HTTP/1.1\r\n"]
    for name, value in relayed:
        head += [name, b": ", value, b"\r\n"]
    head += [b"Content-Length: ", str(length).encode(), b"\r\nConnection: keep-alive\r\n\r\n"]
    return b"".join(head)


class KnownHead:
    """What a request head met before, byte for byte, parsed to and passed: a Request for each body that follows it."""

    __slots__ = ("method", "url", "fields", "relayed", "keep_alive", "length", "relay_head")

    def __init__(self, request: Request) -> None:
        self.method, self.url, self.fields, self.relayed = request.method, request.url, request.fields, request.relayed
        self.keep_alive, self.length = request.keep_alive, request.length
        self.relay_head: bytes | None = None  # written when first met again: most heads are never met again

    def request(self, body: bytes) -> Request:
        if self.relay_head is None:
            self.relay_head = relay_head(self.method, self.url, self.relayed, self.length)
        request = Request()
        request.method, request.url, request.fields, request.relayed = self.method, self.url, self.fields, self.relayed
        request.keep_alive, request.length, request.relay_head, request.body = (self.keep_alive, self.length,
                                                                                  self.relay_head, [body])
        return request


class HttpFront:
    """The HTTP front of one process. Coroutines and callbacks of the process's event loop only."""

    def __init__(self, limits: FrontLimits) -> None:
        self.limits = limits
        self.max_connections = limits.share(limits.max_connections)
        self.max_buffered = limits.share(limits.max_buffered_bytes)
        self.upstream_address: tuple[str, int] | None = None  # None: no server ready (starting, restarting) -> 503
        self.generation = 0  # bumped at each `upstream`: pooled connections of an older server are dropped
        self.outputs: dict[bytes, set[str] | None] = {}  # model -> its numeric outputs, per upstream
        # inference JSON headers that passed the checks needing no model; request heads that passed; answer heads
        self.passed_headers: Remembered[bool] = Remembered(REMEMBERED, REMEMBERED_BYTES)
        self.known_requests: Remembered[KnownHead] = Remembered(REMEMBERED, REMEMBERED_BYTES)
        self.known_answers: Remembered[Answer] = Remembered(REMEMBERED, REMEMBERED_BYTES)
        self.idle: list[Upstream] = []
        self.upstreams = 0  # open connections to Triton
        self.waiting: deque[tuple[bytes, Callable[[Upstream | None], None]]] = deque()  # for a free upstream
        self.connections: set[Client] = set()
        self.in_flight = 0
        self.buffered = 0
        self.draining = False
        self.refusals = Refusals()  # answers the front gave itself, by status, for serve's log
        self.server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None

    async def listen(self, host: str, port: int) -> None:
        """Bind the public port, shared with the other front processes (SO_REUSEPORT: the kernel spreads new
        connections across them)."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Client(self), host, port, backlog=1024, reuse_address=True,
                                               reuse_port=True)
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def upstream(self, host: str | None, port: int | None) -> None:
        self.generation += 1
        self.outputs.clear()
        self.known_answers.forget()
        self._close_idle()
        self.upstream_address = None if host is None else (host, int(port or 0))

    def drain(self) -> None:
        self.draining = True
        if self.server is not None:
            self.server.close()  # new connections are refused by the OS: fast and clean

    async def drained(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._close_idle()
        return not self.in_flight

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._close_idle()

    def _close_idle(self) -> None:
        idle, self.idle = self.idle, []
        for connection in idle:
            connection.transport.close()

    async def _sweep(self) -> None:
        """Close connections past their deadline (a head or body that did not come in time)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for client in [c for c in self.connections if c.deadline and c.deadline < now]:
                client.timed_out()

    # -- relaying ----------------------------------------------------------------------------------------------------
    def relay(self, request: bytes, answered: Callable[[Answer, bytes], None],
              failed: Callable[[Refused], None]) -> None:
        """Send `request` (whole, framed by the front) to Triton on a pooled connection; `answered(answer, body)` or
        `failed(refusal)` is called with the outcome."""
        if self.upstream_address is None:
            failed(Refused(503, STARTING))
            return
        exchange = Exchange(self, request, answered, failed)
        if self.idle:
            exchange.send(self.idle.pop(), pooled=True)
        elif self.upstreams < self.limits.upstream_connections:
            self.connect(exchange)
        else:
            self.waiting.append((request, exchange.send_on))

    def connect(self, exchange: Exchange) -> None:
        """A new connection to Triton for `exchange` (counted among `upstream_connections`)."""
        self.upstreams += 1
        generation = self.generation

        def connected(task: asyncio.Future) -> None:
            if task.cancelled() or task.exception() is not None or generation != self.generation:
                self.upstreams -= 1
                if not task.cancelled() and task.exception() is None:
                    task.result()[0].close()
                if exchange.retried:  # sent on a pooled connection to the server that is gone: lost, not unsent
                    exchange.failed(exchange.lost_answer())
                elif self.draining:  # serve is stopping: nothing will answer on this port again
                    exchange.failed(Refused(503, SHUTTING_DOWN, close=True))
                else:  # no server where one should be: dead, being replaced, or (no restarts) gone for good
                    exchange.failed(Refused(503, unreachable(self.limits.restarts), close=not self.limits.restarts))
                self._next_waiting()
                return
            exchange.send(task.result()[1], pooled=False)

        assert self.upstream_address is not None
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(loop.create_connection(lambda: Upstream(self, generation),
                                                            *self.upstream_address))
        task.add_done_callback(connected)

    def release(self, connection: Upstream, reusable: bool) -> None:
        """A connection whose exchange ended: to the next waiting request, or the pool, or closed."""
        if not reusable or connection.generation != self.generation:
            connection.transport.close()  # `lost` counts it, and starts a waiting request
            return
        if self.waiting:
            self.waiting.popleft()[1](connection)
        else:
            self.idle.append(connection)

    def lost(self, connection: Upstream) -> None:
        self.upstreams -= 1
        if connection in self.idle:
            self.idle.remove(connection)
        self._next_waiting()

    def _next_waiting(self) -> None:
        if self.waiting and self.upstreams < self.limits.upstream_connections:
            request, send_on = self.waiting.popleft()
            send_on(None)

    async def model_outputs(self, model: bytes) -> set[str] | None:
        """The numeric outputs of `model` (its metadata, once per server), or None when unknown."""
        if model not in self.outputs:
            future: asyncio.Future = asyncio.get_running_loop().create_future()

            def answered(answer: Answer, body: bytes) -> None:
                future.set_result((answer.status, body))

            def failed(refusal: Refused) -> None:
                future.set_result((refusal.status, b""))
            self.relay(b"GET /v2/models/" + model + b" HTTP/1.1\r\nHost: triton\r\nContent-Length: 0\r\n"
                       b"Connection: keep-alive\r\n\r\n", answered, failed)
            status, body = await future
            try:
                self.outputs[model] = numeric_outputs(json.loads(body)) if status == 200 else None
            except (ValueError, KeyError, TypeError):
                self.outputs[model] = None
        return self.outputs[model]


class Client(asyncio.Protocol):
    """One client connection: requests parsed by llhttp, answered one after another (pipelined ones wait)."""

    def __init__(self, front: HttpFront) -> None:
        self.front = front
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.parsing: Request | None = None
        self.queue: deque[Request] = deque()
        self.current: Request | None = None
        self.head_bytes = 0  # of the head being read
        self.heads = 0  # heads completed on this connection
        self.in_head = True
        self.idle = False  # answered, and no byte of a next request yet: the keep-alive wait
        self.over = False  # beyond the connection cap when it came
        self.deadline = 0.0  # 0: none (a request is being relayed)
        self.closing = False
        self.seen: tuple[bytes, int] | None = None  # the head the read being parsed starts with, and the read's size

    # -- the connection --------------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        front = self.front
        front.connections.add(self)
        self.over = len(front.connections) > front.max_connections
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.connections.discard(self)
        self.closing = True
        for request in (*self.queue, self.parsing):  # the current one is released when its answer comes
            self._release(request)
        self.queue.clear()

    def _await_head(self) -> None:
        self.deadline = time.monotonic() + (1.0 if self.over else self.front.limits.head_timeout_s)

    def _await_next(self) -> None:
        """After an answer: the keep-alive wait (a connection over the cap keeps its 1 s)."""
        if self.over:
            self._await_head()
            return
        self.idle = True
        self.deadline = time.monotonic() + self.front.limits.keep_alive_s

    def timed_out(self) -> None:
        if self.idle:  # nothing was asked: closed without an answer, as a client closing its idle connection would
            self.closing = True
            self.transport.close()
        elif self.in_head:
            self.refuse(Refused(408, f"no complete request head within {self.front.limits.head_timeout_s:g} s",
                                close=True))
        else:
            self.refuse(Refused(408, f"the request body did not arrive within {self.front.limits.body_timeout_s:g} s",
                                close=True))

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.idle:  # a next request begins: its head has the head timeout
            self.idle = False
            self._await_head()
        self.seen = None
        if self.parsing is None and self.current is None and not self.queue:  # between requests, none being answered
            end = data.find(b"\r\n\r\n") + 4
            if end > 3:
                head = data[:end]
                known = self.front.known_requests.get(head)
                if known is not None and len(data) - end == known.length:  # one whole request, its head met before
                    self._known(known.request(data[end:]))
                    return
                self.seen = head, len(data)
        heads = self.heads
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as err:
            refusal = err.__context__
            self.refuse(refusal if isinstance(refusal, Refused) else Refused(400, f"bad request: {refusal}", True))
            return
        except httptools.HttpParserUpgrade:
            self.refuse(Refused(400, "protocol upgrades and CONNECT are not served", close=True))
            return
        except httptools.HttpParserError as err:
            self.refuse(Refused(400, f"malformed HTTP/1.1 request: {err}", close=True))
            return
        if self.heads != heads:
            self.head_bytes = 0
        elif self.in_head and self.parsing is not None:  # all of it was head: no head completed in it
            self.head_bytes += len(data)
            if self.head_bytes > self.front.limits.max_head_bytes:
                self.refuse(Refused(431, f"the request head is over {self.front.limits.max_head_bytes} bytes",
                                    close=True))

    # -- llhttp's callbacks ----------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.parsing = Request()
        self.in_head = True

    def on_url(self, url: bytes) -> None:
        assert self.parsing is not None
        self.parsing.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.parsing
        assert request is not None
        lower = name.lower()
        request.fields.setdefault(lower, value)
        request.head_size += len(name) + len(value) + 4
        if lower not in NOT_RELAYED_TO_TRITON:
            request.relayed.append((name, value))

    def on_headers_complete(self) -> None:
        request, limits = self.parsing, self.front.limits
        assert request is not None
        self.in_head = False
        self.heads += 1
        size = len(request.url) + request.head_size
        if size > limits.max_head_bytes:
            raise Refused(431, f"the request head is over {limits.max_head_bytes} bytes", close=True)
        self.head_bytes = 0
        request.method = self.parser.get_method()
        request.keep_alive = self.parser.should_keep_alive()
        if request.method not in (b"GET", b"POST"):
            raise Refused(405, f"method {request.method.decode('latin-1')} is not served; GET and POST are",
                          close=True)
        if request.header(b"transfer-encoding") is not None:
            raise Refused(411, "Transfer-Encoding is not accepted (chunked bodies crash Triton 2.51: CVE-2025-23310); "
                               "send a Content-Length", close=True)
        length = int(request.header(b"content-length") or b"0")  # llhttp checked it is a number
        if length > limits.max_body_bytes:
            raise too_large(limits.max_body_bytes, f"the request body is {length} bytes, over the limit of "
                                                   f"{limits.max_body_bytes}")
        request.length = length
        self._admit(request)
        if length:
            if (request.header(b"expect") or b"").lower() == b"100-continue":  # curl waits for it before sending
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.deadline = time.monotonic() + limits.body_timeout_s
        else:
            self.deadline = 0.0

    def _admit(self, request: Request) -> None:
        """After the head's own checks, refuse what the moment refuses (a connection over the cap, a front draining,
        the bytes buffered at their bound), else reserve the request's body among the bytes buffered: from here it is
        answered, whatever happens."""
        front = self.front
        if self.over and not HEALTH_PATH.match(request.url):
            raise Refused(503, f"too many open connections ({_cap_words(front.limits)}); only health requests are "
                               "answered until some close", close=True)
        if front.draining:
            raise Refused(503, SHUTTING_DOWN, close=True)
        if front.buffered + request.length > front.max_buffered:
            raise Refused(503, BUSY, close=True)
        request.taken = True
        front.buffered += request.length
        front.in_flight += 1

    def _known(self, request: Request) -> None:
        """A whole request whose head was met before, byte for byte (its checks passed then): only what depends on
        the moment is checked, then it is answered as llhttp's would be."""
        try:
            self._admit(request)
        except Refused as refusal:
            self.refuse(refusal)
            return
        self.heads += 1
        self.queue.append(request)
        self._next()

    def on_body(self, body: bytes) -> None:
        assert self.parsing is not None
        self.parsing.body.append(body)

    def on_message_complete(self) -> None:
        request, self.parsing = self.parsing, None
        assert request is not None
        self.in_head = True
        seen, self.seen = self.seen, None
        if self.parser.should_upgrade():  # llhttp raises HttpParserUpgrade next, and the connection is refused
            self._release(request)
            return
        if (seen is not None and seen[1] == len(seen[0]) + request.length  # the read was this request, whole and alone
                and b"content-encoding" not in request.fields and b"expect" not in request.fields
                and self.front.known_requests.met(seen[0])):
            self.front.known_requests.remember(seen[0], KnownHead(request))
        self.queue.append(request)
        if self.current is None:
            self._next()
        else:
            self.transport.pause_reading()  # pipelined: one at a time

    # -- answering ---------------------------------------------------------------------------------------------------
    def _next(self) -> None:
        self.current = request = self.queue.popleft()
        self.deadline = 0.0
        try:
            body = self._checked(request)
        except Refused as refusal:
            self._finish(refusal=refusal)
            return
        if body is None:  # needs a coroutine (a compressed body, a large JSON header, the model's outputs)
            asyncio.ensure_future(self._check_then_relay(request))
            return
        self._relay(request, body)

    def _checked(self, request: Request) -> bytes | None:
        """The body to relay after the checks that need no waiting; None when the rest needs a coroutine."""
        body = b"".join(request.body) if len(request.body) != 1 else request.body[0]
        request.body = [body]
        encoding = request.header(b"content-encoding")
        if encoding is not None:
            encoding = encoding.strip().lower()
            if encoding == b"identity":
                pass
            elif encoding in (b"gzip", b"deflate"):
                return None
            else:
                raise Refused(415, f"Content-Encoding {encoding.decode('latin-1')!r} is not accepted; valid: gzip, "
                                   "deflate, identity")
        infer = INFER_PATH.match(request.url) if request.method == b"POST" else None
        if infer is None:
            return body
        length = request.header(b"inference-header-content-length")
        size = int(length) if length is not None and length.isdigit() else len(body)
        if size >= LARGE_JSON:
            return None
        # clients repeat the same JSON header (the tensors follow it): one that passed is not parsed again
        passed = self.front.passed_headers
        json_part = body[:size] if length is not None and size <= len(body) else None
        if json_part is not None and passed.get(json_part):
            return body
        header = inference_header(infer["model"].decode("latin-1"), body, length)
        if wants_classification(header):
            return None
        check_inference(header, set(), self.front.limits.queue_timeouts)
        if json_part is not None:
            passed.remember(json_part, True)
        return body

    async def _check_then_relay(self, request: Request) -> None:
        try:
            body = request.body[0]
            encoding = (request.header(b"content-encoding") or b"identity").strip().lower()
            if encoding in (b"gzip", b"deflate"):
                body = inflate(body, encoding.decode(), self.front.limits.max_body_bytes)
                request.relayed = [(k, v) for k, v in request.relayed if k.lower() != b"content-encoding"]
            infer = INFER_PATH.match(request.url) if request.method == b"POST" else None
            if infer is not None:
                model, length = infer["model"], request.header(b"inference-header-content-length")
                if len(body) >= LARGE_JSON:
                    header = await asyncio.to_thread(inference_header, model.decode("latin-1"), body, length)
                else:
                    header = inference_header(model.decode("latin-1"), body, length)
                check_inference(header, await self.front.model_outputs(model) if wants_classification(header)
                                else set(), self.front.limits.queue_timeouts)
        except Refused as refusal:
            self._finish(refusal=refusal)
            return
        self._relay(request, body)

    def _relay(self, request: Request, body: bytes) -> None:
        head = request.relay_head if request.relay_head is not None and len(body) == request.length else \
            request.relay_head_for(len(body))  # an inflated body is relayed with its own length
        self.front.relay(head + body, self._answered, self._refused)

    def _refused(self, refusal: Refused) -> None:
        self._finish(refusal=refusal)

    def _answered(self, answer: Answer, body: bytes) -> None:
        close = self._closes(self.current)
        self._finish(answer=b"".join((answer.lines, b"Content-Length: ", str(len(body)).encode(),
                                      b"\r\nConnection: close\r\n\r\n" if close else
                                      b"\r\nConnection: keep-alive\r\n\r\n", body)), close=close)

    def _closes(self, request: Request | None) -> bool:
        return self.front.draining or request is None or not request.keep_alive

    def _finish(self, answer: bytes = b"", close: bool = False, refusal: Refused | None = None) -> None:
        """The current request's answer (or refusal) written; then the next one, or the connection waits for one."""
        request, self.current = self.current, None
        self._release(request)
        if refusal is not None:
            answer, close = self._refusal(refusal), refusal.close or self._closes(request)
        if self.closing:
            return
        self.transport.write(answer)
        if close:
            self.closing = True
            self.transport.close()
        elif self.queue:
            self._next()
        else:
            self.transport.resume_reading()
            self._await_next()

    def refuse(self, refusal: Refused) -> None:
        """Answer a refusal outside of a request's answer (a parse error, a timeout): the connection closes after it
        (answers already due are dropped: the client broke the framing)."""
        if self.closing:
            return
        for request in (*self.queue, self.current, self.parsing):
            self._release(request)
        self.queue.clear()
        self.current = self.parsing = None
        self.transport.write(self._refusal(refusal))
        self.closing = True
        self.transport.close()

    def _release(self, request: Request | None) -> None:
        if request is not None and request.taken:
            request.taken = False
            self.front.in_flight -= 1
            self.front.buffered -= request.length

    def _refusal(self, refusal: Refused) -> bytes:
        self.front.refusals.count(refusal.status)
        body = json.dumps({"error": refusal.message}).encode()
        close = refusal.close or self.front.draining
        head = (f"HTTP/1.1 {refusal.status} {REASONS.get(refusal.status, 'Error')}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n")
        return head.encode() + body


def _cap_words(limits: FrontLimits) -> str:
    """The connection cap as this process applies it: with several front processes, each takes its share of
    --max-connections, and the kernel does not spread connections evenly, so the cap may be met below the total."""
    if limits.processes == 1:
        return f"over {limits.max_connections}"
    return (f"over {limits.share(limits.max_connections)} on this front process: its share of --max-connections "
            f"{limits.max_connections} across {limits.processes} processes")
