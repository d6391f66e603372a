"""The HTTP front of the local server: the checks Triton 2.51 lacks, made before a request reaches it.

`hub-vit serve` binds this gate on the public HTTP port and Triton's HTTP endpoint on a private loopback port. Each
request is read whole (bounded), checked, then relayed over a small pool of keep-alive connections to Triton. What
the gate refuses, and why (docs/serving.md, "Limits and security"):

* a body over `max_body_bytes`, before reading it when Content-Length says so, and a gzip / deflate body whose
  inflated size passes the cap (inflated in bounded steps: a 1 MB gzip body inflating to 1 GB peaked at 6.6 GB RSS in
  Triton 2.51, which has no `--http-max-input-size`) -> 413; the inflated body is what is relayed;
* `Transfer-Encoding` (chunked bodies: CVE-2025-23310/23311, a stack overflow in Triton < 2.59.1) -> 411;
* an inference request asking the classification extension of a non-numeric output (Triton 2.51 dies of SIGFPE on
  the STRING `labels`), or with a dimension of 0 or past int32 (a `[0, 1]` request was answered with rank-1 outputs;
  2^32+k was truncated to 32 bits) -> 400;
* a head not complete within `head_timeout_s` (half-sent connections held Triton's descriptors: 20,400 of them made
  HTTP, gRPC and metrics unreachable) -> 408 and the connection is closed; beyond `max_connections` open connections,
  only health requests are relayed (probes stay reachable), others get 503;
* once `drain()` is called (SIGTERM), new connections are refused and a new request on an open connection gets 503
  "shutting down" at once, while requests already relayed get their answers; `drained()` then waits for them.

Answers are JSON `{"error": "..."}`, as Triton's own, so tritonclient shows the message. The gate runs its own event
loop in a thread of the serving process.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import zlib
from dataclasses import dataclass
from typing import Any

from hub_vit.server import protocol
from hub_vit.server.front.loop_thread import LoopThread, until_idle

INFER_PATH = re.compile(rb"^/v2/models/(?P<model>[^/?]+)(?:/versions/[^/?]+)?/infer(?:\?.*)?$")
HEALTH_PATH = re.compile(rb"^/v2/health/(live|ready)(?:\?.*)?$")
LARGEST_DIMENSION = 2**31 - 1  # Triton 2.51 keeps the batch dimension in 32 bits
NUMERIC = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
           "BF16"}
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade"}
# The gate's 503s that mean "no server behind me right now" (a client backs off as from a refused connection), in
# the protocol's words, so clients read the state, not the sentence
STARTING = protocol.server_state(protocol.RESTARTING, "the server is starting or restarting; retry shortly")
SHUTTING_DOWN = protocol.server_state(protocol.SHUTTING_DOWN, "the server is shutting down: no new request is taken")
REASONS = {400: "Bad Request", 408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
           415: "Unsupported Media Type", 431: "Request Header Fields Too Large", 502: "Bad Gateway",
           503: "Service Unavailable"}


@dataclass(frozen=True)
class GateLimits:
    """The gate's bounds; every one has a default fit for the shipped model on a small host."""

    max_body_bytes: int = 64 << 20  # Triton 25.x's own --http-max-input-size default; also the inflated size
    max_buffered_bytes: int = 256 << 20  # bodies held at once across connections (beyond: 503, retry)
    max_head_bytes: int = 64 << 10
    head_timeout_s: float = 10.0  # a request's head, and an idle keep-alive connection's next one
    body_timeout_s: float = 60.0
    max_connections: int = 4096
    upstream_connections: int = 64  # relayed requests in flight to Triton at once (its descriptors stay few)

    def __post_init__(self) -> None:
        for key in ("max_body_bytes", "max_buffered_bytes", "max_head_bytes", "max_connections",
                    "upstream_connections"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        for key in ("head_timeout_s", "body_timeout_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be a positive number of seconds, got {getattr(self, key)!r}")


class Refused(Exception):
    """A request the gate answers itself: HTTP `status` and the message."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.close = status, message, close


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` inflated (gzip or deflate, as Triton 2.51 reads them), refused once it passes `limit` bytes: at most
    `limit` + 64 KiB is ever held."""
    inflater = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15)  # 47: gzip or zlib header
    out, pending = [], body
    size = 0
    try:
        while pending:
            chunk = inflater.decompress(pending, 1 << 16)
            pending = inflater.unconsumed_tail
            size += len(chunk)
            if size > limit:
                why = f"the request body inflates ({encoding}) to more than {limit} bytes, the limit"
                raise Refused(413, protocol.too_large(limit, f"{why} (hub-vit serve --max-request-mb)"), close=True)
            out.append(chunk)
            if inflater.eof:
                break
        out.append(inflater.flush())
    except zlib.error as err:
        raise Refused(400, f"the request body is not valid {encoding} data: {err}") from None
    return b"".join(out)


def check_inference(header: object, numeric_outputs: set[str] | None) -> None:
    """Refuse (400) what crashes or misleads Triton 2.51 in an inference request's JSON header: the classification
    extension on a non-numeric output, a dimension of 0 or beyond int32. `numeric_outputs`: the model's numeric
    outputs (None: unknown, so any classification request is refused). Anything else is left to Triton."""
    if not isinstance(header, dict):
        return
    for output in header.get("outputs") or ():
        if not isinstance(output, dict):
            continue
        parameters = output.get("parameters")
        if isinstance(parameters, dict) and "classification" in parameters:
            name = output.get("name")
            if numeric_outputs is None or name not in numeric_outputs:
                raise Refused(400, f"the classification extension is not served for output {name!r}: it needs a "
                                   "numeric output, and Triton 2.51 crashes on a STRING one; request 'labels' and "
                                   "'scores' (already the top-k, best first) without 'classification'")
    for tensor in header.get("inputs") or ():
        if not isinstance(tensor, dict) or not isinstance(tensor.get("shape"), list):
            continue
        for dim in tensor["shape"]:
            if isinstance(dim, int) and not 1 <= dim <= LARGEST_DIMENSION:
                raise Refused(400, f"input {tensor.get('name')!r} has shape {tensor['shape']}: every dimension must "
                                   f"be between 1 and {LARGEST_DIMENSION}")


class Gate:
    """One HTTP front, started with `start()`, pointed at Triton with `upstream(host, port)` (again after each
    restart), drained with `drain()` / `drained(timeout_s)`, ended with `close()`."""

    protocol = "http"  # the server endpoint it relays to (runtime.supervisor.Front)

    def __init__(self, host: str, port: int, limits: GateLimits = GateLimits()) -> None:
        self.host, self.port, self.limits = host, port, limits
        self._upstream: tuple[str, int] | None = None  # None: no server ready (starting, restarting) -> 503
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._generation = 0  # bumped at each `upstream` call: pooled connections of an older server are dropped
        self._outputs: dict[bytes, set[str] | None] = {}  # model -> its numeric outputs, per upstream
        self._connections = 0
        self._in_flight = 0
        self._buffered = 0
        self._draining = False
        self._server: asyncio.base_events.Server | None = None
        self._runner = LoopThread("hub-vit-gate")
        self.refused: dict[int, int] = {}  # status -> count, for the log and tests

    # -- control, from any thread ----------------------------------------------------------------------------------
    def start(self) -> Gate:
        _raise_descriptor_limit()
        self._runner.start()
        try:
            self._call(self._listen())
        except BaseException:  # e.g. the port is taken: no loop thread is left running
            self.close()
            raise
        return self

    def upstream(self, host: str | None, port: int | None = None) -> None:
        """Relay to Triton's HTTP endpoint at (host, port); None: refuse with 503 "starting" until set again."""
        async def switch() -> None:
            self._generation += 1
            self._outputs.clear()
            idle, self._idle = self._idle, []
            for _, writer in idle:
                writer.close()
            self._upstream = None if host is None else (host, int(port or 0))
        self._call(switch())

    def drain(self) -> None:
        """Stop taking connections (a new one is refused by the OS: fast and clean) and answer each new request on an
        open connection 503 "shutting down", `Connection: close`; requests already relayed still get their answers.
        The listener closes now, not at the end: connections still in its accept queue when it closes are reset, and
        at the end clients turned away by the 503 reconnect at once (3 of 4,190 requests were reset so)."""
        async def start_draining() -> None:
            self._draining = True
            if self._server is not None:
                self._server.close()
        self._call(start_draining())

    def drained(self, timeout_s: float) -> bool:
        """Wait until no request is being relayed (at most `timeout_s`), then close the pooled connections to Triton
        so its own drain is not held open by them; whether everything in flight was answered."""
        async def wait() -> bool:
            answered = await until_idle(lambda: self._in_flight, timeout_s)
            idle, self._idle = self._idle, []
            for _, writer in idle:
                writer.close()
            return answered
        return self._call(wait(), timeout_s + 5)

    def close(self) -> None:
        if not self._runner.alive:
            return
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for _, writer in self._idle:
                writer.close()
        try:
            self._call(stop())
        finally:
            self._runner.stop()

    def _call(self, coroutine: Any, timeout_s: float = 10.0) -> Any:
        return self._runner.call(coroutine, timeout_s)

    # -- the event loop's side -------------------------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=self.limits.max_head_bytes,
                                                  backlog=1024, reuse_address=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        over = self._connections > self.limits.max_connections
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                                  1.0 if over else self.limits.head_timeout_s)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed (the normal end of a keep-alive connection)
                except TimeoutError:
                    await self._answer(writer, Refused(408, "no complete request head within "
                                                            f"{self.limits.head_timeout_s:g} s", close=True))
                    return
                except asyncio.LimitOverrunError:
                    await self._answer(writer, Refused(431, f"the request head is over {self.limits.max_head_bytes} "
                                                            "bytes", close=True))
                    return
                keep = await self._request(head, reader, writer, over)
                if not keep:
                    return
        except Refused as refusal:
            await self._answer(writer, refusal)
        except (ConnectionError, OSError):
            pass
        finally:
            self._connections -= 1
            writer.close()

    async def _request(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       over: bool) -> bool:
        """One request: read, check, relay; whether the connection stays open."""
        try:
            method, target, version, headers = _parse_head(head)
        except ValueError as err:
            raise Refused(400, str(err), close=True) from None
        if over and not HEALTH_PATH.match(target):
            raise Refused(503, f"too many open connections (over {self.limits.max_connections}); only health "
                               "requests are answered until some close", close=True)
        if self._draining:
            raise Refused(503, SHUTTING_DOWN, close=True)
        if b"transfer-encoding" in headers:
            raise Refused(411, "Transfer-Encoding is not accepted (chunked bodies crash Triton 2.51: "
                               "CVE-2025-23310); send a Content-Length", close=True)
        length = _content_length(headers)
        if length > self.limits.max_body_bytes:
            raise Refused(413, protocol.too_large(self.limits.max_body_bytes, f"the request body is {length} bytes, "
                                                  f"over the limit of {self.limits.max_body_bytes} (hub-vit serve "
                                                  "--max-request-mb)"), close=True)
        if headers.pop(b"expect", b"").lower() == b"100-continue" and length:  # curl waits for it before sending
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self._buffered + length > self.limits.max_buffered_bytes:
            raise Refused(503, "the server holds too many large requests at once; retry shortly", close=True)
        self._buffered += length
        self._in_flight += 1  # from here the request is taken: answered, whatever happens
        try:
            try:
                body = await asyncio.wait_for(reader.readexactly(length), self.limits.body_timeout_s)
            except TimeoutError:
                raise Refused(408, f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
                              close=True) from None
            encoding = headers.get(b"content-encoding", b"identity").strip().lower().decode("latin-1")
            if encoding in ("gzip", "deflate"):
                body = inflate(body, encoding, self.limits.max_body_bytes)
                del headers[b"content-encoding"]
            elif encoding != "identity":
                raise Refused(415, f"Content-Encoding {encoding!r} is not accepted; valid: gzip, deflate, identity")
            infer = INFER_PATH.match(target)
            if infer is not None and method == b"POST":
                await self._check_inference(infer["model"], headers, body)
            status, answer = await self._relay(method, target, headers, body)
        except Refused as refusal:
            await self._answer(writer, refusal)
            return not refusal.close
        finally:
            self._buffered -= length
            self._in_flight -= 1
        close = self._draining or headers.get(b"connection", b"").lower() == b"close" or version == b"HTTP/1.0"
        writer.write(_with_connection(answer, close))
        await writer.drain()
        return not close

    async def _check_inference(self, model: bytes, headers: dict[bytes, bytes], body: bytes) -> None:
        size = headers.get(b"inference-header-content-length")
        try:
            json_part = body[:int(size)] if size is not None else body
        except ValueError:
            return  # Triton answers a bad header length itself
        try:
            header = json.loads(json_part) if len(json_part) < 1 << 20 else await asyncio.to_thread(json.loads,
                                                                                                    json_part)
        except ValueError:
            return  # not JSON: Triton says so
        if model not in self._outputs:
            self._outputs[model] = await self._numeric_outputs(model)
        check_inference(header, self._outputs[model])

    async def _numeric_outputs(self, model: bytes) -> set[str] | None:
        try:
            status, answer = await self._relay(b"GET", b"/v2/models/" + model, {}, b"")
            metadata = json.loads(answer.split(b"\r\n\r\n", 1)[1]) if status == 200 else {}
            return {o["name"] for o in metadata.get("outputs", ()) if o.get("datatype") in NUMERIC}
        except (Refused, ValueError, KeyError, TypeError, AttributeError):
            return None

    async def _relay(self, method: bytes, target: bytes, headers: dict[bytes, bytes],
                     body: bytes) -> tuple[int, bytes]:
        """Send the request to Triton on a pooled connection; (status, the whole raw answer)."""
        if self._upstream is None:
            raise Refused(503, STARTING)
        generation = self._generation
        lines = [method + b" " + target + b" HTTP/1.1"]
        lines += [name + b": " + value for name, value in headers.items()
                  if name not in HOP_BY_HOP and name != b"content-length"]
        lines += [b"Content-Length: " + str(len(body)).encode(), b"Connection: keep-alive", b"", b""]
        request = b"\r\n".join(lines) + body
        for attempt in range(2):  # a pooled connection Triton closed meanwhile is retried once on a fresh one
            pooled = bool(self._idle)
            try:
                reader, writer = self._idle.pop() if pooled else await asyncio.open_connection(*self._upstream)
            except OSError:
                raise Refused(503, STARTING) from None
            try:
                writer.write(request)
                await writer.drain()
                status, answer, reusable = await _read_answer(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                writer.close()
                if pooled and attempt == 0:
                    continue
                raise Refused(502, "tritonserver closed the connection without an answer (it died? hub-vit serve "
                                   "restarts it)", close=True) from None
            if reusable and generation == self._generation and len(self._idle) < self.limits.upstream_connections:
                self._idle.append((reader, writer))
            else:
                writer.close()
            return status, answer
        raise AssertionError("unreachable")

    async def _answer(self, writer: asyncio.StreamWriter, refusal: Refused) -> None:
        self.refused[refusal.status] = self.refused.get(refusal.status, 0) + 1
        body = json.dumps({"error": refusal.message}).encode()
        head = (f"HTTP/1.1 {refusal.status} {REASONS.get(refusal.status, 'Error')}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: {'close' if refusal.close or self._draining else 'keep-alive'}\r\n\r\n").encode()
        try:
            writer.write(head + body)
            await writer.drain()
        except (ConnectionError, OSError):
            pass


def _parse_head(head: bytes) -> tuple[bytes, bytes, bytes, dict[bytes, bytes]]:
    """(method, target, version, {lower-case name: value}) of an HTTP/1.x request head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise ValueError(f"malformed header line: {line[:80]!r}")
        name = name.lower()
        if name in headers and name in (b"content-length", b"content-encoding", b"transfer-encoding"):
            raise ValueError(f"header {name.decode('latin-1')} given twice")
        headers[name] = value.strip()
    return parts[0], parts[1], parts[2], headers


def _content_length(headers: dict[bytes, bytes]) -> int:
    value = headers.get(b"content-length", b"0")
    if not value.isdigit():
        raise Refused(400, f"Content-Length {value[:40].decode('latin-1')!r} is not a number of bytes", close=True)
    return int(value)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Triton's answer, whole: (status, raw bytes, whether the connection may be reused)."""
    head = await reader.readuntil(b"\r\n\r\n")
    _, status, _ = (head.split(b"\r\n", 1)[0] + b"  ").split(b" ", 2)
    _, _, _, headers = _parse_head(b"GET / HTTP/1.1\r\n" + head.split(b"\r\n", 1)[1])
    reusable = headers.get(b"connection", b"").lower() != b"close"
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            chunks.append(chunk[:-2])
            if size == 0:
                break
        body = b"".join(chunks)
        head = re.sub(rb"(?im)^transfer-encoding:[^\r]*\r\n", b"", head)
        head = head[:-2] + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    else:
        body = await reader.read()
        reusable = False
    return int(status), head + body, reusable


def _with_connection(answer: bytes, close: bool) -> bytes:
    """Triton's answer with the client connection's own Connection header."""
    head, body = answer.split(b"\r\n\r\n", 1)
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith((b"connection:", b"keep-alive:"))]
    lines.append(b"Connection: close" if close else b"Connection: keep-alive")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _raise_descriptor_limit() -> None:
    """The soft limit on open files up to the hard one: each client connection holds one descriptor here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass
