"""One client connection of the gRPC front (`grpc_front.py` says what it refuses and why): the client's HTTP/2 read
frame by frame on its way to Triton (header blocks with hpack, each call's messages reassembled and checked, the frame
completing a message held until it passes), Triton's frames passed back with only their headers read (but the end of
a stream the front refused, read whole), and the front's own frames (refusals, GOAWAY, window updates) written at frame
boundaries."""

from __future__ import annotations

import asyncio
import json
import re
import struct
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from hpack import Decoder
from hpack.exceptions import HPACKError

from hub_vit.server import protocol
from hub_vit.server.front import h2
from hub_vit.server.front.checks import (
    BUSY,
    LOST,
    SHUTTING_DOWN,
    STARTING,
    STOPPED,
    Refused,
    inference_refusal,
    inflate,
    parse_inference,
    too_large,
    unreachable,
)
from hub_vit.server.front.limits import FrontLimits
from hub_vit.server.front.refusals import GOAWAY, OVER_CAP, Refusals

SERVICE = "/inference.GRPCInferenceService/"
INFER = (SERVICE + "ModelInfer").encode()
STREAM_INFER = (SERVICE + "ModelStreamInfer").encode()
RESET_REMEMBERED = 1024  # per connection: streams the front reset whose frames in flight are still dropped
REMEMBERED_BLOCKS = 64  # per connection: header blocks of indexed fields decoded once
# The largest frame a client may send: Triton's SETTINGS are passed on with their frame size lowered to HTTP/2's
# default (grpc advertises 4 MiB), as the front holds each client frame whole before passing it on
MAX_CLIENT_FRAME = h2.DEFAULT_MAX_FRAME_SIZE
# gRPC status codes (grpc.StatusCode's numbers)
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED, UNAVAILABLE = 3, 8, 12, 14
ENCODINGS = (b"gzip", b"deflate")  # the message encodings Triton 2.51 reads
_PREFIX = struct.Struct(">BL")  # a gRPC message's prefix: compressed flag, length
# an HTTP/1.x request line's start (`curl` at the gRPC port): answered in HTTP/1.1, which that client reads
_HTTP1_REQUEST = re.compile(rb"[A-Z]{3,7} [^ ]+ HTTP/1\.[01]\r?\n")
# what may still become one, its line end not yet read (a line split across reads): waited for, up to MAX_REQUEST_LINE
# bytes and the head timeout, then closed as any other bytes that are not a preface
_HTTP1_PARTIAL = re.compile(rb"[A-Z]{1,7}(?: [^\r\n]*)?\r?\Z")
MAX_REQUEST_LINE = 8 << 10


class Front(Protocol):
    """What a connection shares with the other connections of its front process (`grpc_front.GrpcFront`)."""

    limits: FrontLimits
    max_connections: int  # this process's share
    max_buffered: int  # this process's share of the bytes held for checking
    target: tuple[str, int] | None  # Triton's private gRPC port; None: no server
    connections: set[Connection]
    in_flight: int
    buffered: int
    draining: bool
    http_port: int | None  # the public HTTP port, named to a client that sends HTTP/1.1 here
    refusals: Refusals  # answers the front gave itself, by code, for serve's log

    def numeric(self, model: str, version: str) -> set[str] | None: ...


class _Refusal(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


class _Broken(Exception):
    """The client broke HTTP/2: the connection ends with a GOAWAY carrying `code` and the reason."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


def _integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """An HPACK integer (RFC 7541, 5.1) at `at` with an N-bit prefix: (its value, where it ends). IndexError when the
    block ends inside it."""
    mask = (1 << prefix_bits) - 1
    value, at = block[at] & mask, at + 1
    if value < mask:
        return value, at
    shift = 0
    while True:
        byte, at = block[at], at + 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _all_indexed(block: bytes) -> bool:
    """Whether every field of an HPACK block (one hpack decoded whole) is an indexed field (RFC 7541, 6.1), which
    changes no table."""
    at, size = 0, len(block)
    while at < size:
        if not block[at] & 0x80:
            return False
        _, at = _integer(block, at, 7)
    return True


def _after_string(block: bytes, at: int) -> int:
    """Where the HPACK string literal at `at` ends (RFC 7541, 5.2). IndexError when the block ends inside it."""
    length, at = _integer(block, at, 7)
    if at + length > len(block):
        raise IndexError("a string past the block's end")
    return at + length


def _changes_no_table(payload: bytes, flags: int) -> bool:
    """Whether a HEADERS frame's header block (`payload` less its padding and priority) leaves both HPACK tables as
    they were: indexed fields and literals without indexing or never indexed only (RFC 7541, 6.1 to 6.2.3; grpc
    writes `grpc-status: 0` indexed and an empty `grpc-message` without indexing)."""
    try:
        block = bytes(h2.unpadded(payload, flags, h2.HEADERS))
        at, size = 0, len(block)
        while at < size:
            first = block[at]
            if first & 0x80:  # an indexed field
                _, at = _integer(block, at, 7)
            elif not first & 0xE0:  # 0000xxxx / 0001xxxx: a literal without indexing, or never indexed
                name, at = _integer(block, at, 4)
                if name == 0:  # the name is a literal too
                    at = _after_string(block, at)
                at = _after_string(block, at)
            else:  # a literal added to the table, or a table size update
                return False
        return True
    except (IndexError, ValueError):  # not a whole block (padding past the frame, a field cut off): as it came
        return False


class _Stream:
    """One call as the front follows it: its method, its message being reassembled, and where it stands."""

    __slots__ = ("id", "path", "encoding", "prefix", "remaining", "compressed", "parts", "reserved", "relayed",
                 "server_done", "client_done", "headers_sent", "pending", "messages")

    def __init__(self, stream: int, path: bytes, encoding: bytes) -> None:
        self.id, self.path, self.encoding = stream, path, encoding
        self.prefix = b""  # the next message's 5-byte prefix as far as it has come
        self.remaining = 0  # bytes of the current message still to come (0: between messages)
        self.compressed = 0  # the current message's compressed flag
        self.parts: list[bytes] = []  # the current message so far
        self.reserved = 0  # of the front's buffer share, for this message
        self.relayed = False  # passed on to Triton and not answered yet: counted in flight
        self.server_done = False  # Triton ended it
        self.client_done = False  # the client has sent END_STREAM
        self.headers_sent = False  # response headers went to the client: a refusal is then trailers
        self.pending: tuple[int, str] | None = None  # a stream's refusal, sent when Triton ends the stream
        self.messages = 0  # messages passed on


class Connection(asyncio.Protocol):
    """One client connection and, once connected, its connection to Triton (`_Upstream`)."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.alone: str | None = None  # no server: every call is answered UNAVAILABLE with this, then GOAWAY
        self.connecting = False
        self.buffer = bytearray()
        self.preface = False
        self.decoder = Decoder()
        self.reset: set[int] = set()  # streams the front reset towards the client (the last RESET_REMEMBERED)
        self.reset_order: deque[int] = deque()
        self.indexed: dict[bytes, tuple[bytes, bytes]] = {}  # header blocks of indexed fields -> :path, grpc-encoding
        self.block: bytearray | None = None  # a header block awaiting CONTINUATION frames
        self.block_stream = 0
        self.block_end_stream = False
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.credit = 0  # DATA bytes the front dropped: given back to the client's connection window
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None

    # -- the connection ----------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        front = self.front
        if len(front.connections) >= front.max_connections:
            front.refusals.count(OVER_CAP)  # in the log and metrics as the HTTP front's 503s are
            transport.abort()
            self.closed = True
            return
        front.connections.add(self)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(front.limits.head_timeout_s, self._handshake_timeout)
        if front.draining:
            self.alone = SHUTTING_DOWN
        elif front.target is None:
            self.alone = STARTING
        else:
            self.connecting = True
            asyncio.ensure_future(self._connect(front.target))

    async def _connect(self, target: tuple[str, int]) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(lambda: _Upstream(self), *target)
        except OSError:  # its private port does not answer: it died before serve noticed, or is being replaced
            self.alone = SHUTTING_DOWN if self.front.draining else unreachable(self.front.limits.restarts)
        else:
            if self.closed:
                upstream.transport.close()
                return
            self.upstream = upstream
        self.connecting = False
        self._process()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.connecting and not self.closed:
            self._process()

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        front = self.front
        front.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        for stream in self.streams.values():
            self._forget(stream)
        self.streams.clear()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def _forget(self, stream: _Stream) -> None:
        """Release what `stream` holds of the front's counts."""
        if stream.relayed:
            self.front.in_flight -= 1
            stream.relayed = False
        self.front.buffered -= stream.reserved
        stream.reserved, stream.parts = 0, []

    def _handshake_timeout(self) -> None:
        self.timer = None
        self.close()  # no preface and first frame within the head timeout

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def _status(self, stream: int, code: int, text: str, headers_sent: bool) -> bytes:
        """A call's end with a status of the front's own (a refusal, or no server to answer it), counted."""
        self.front.refusals.count_grpc(code)
        return h2.grpc_status(stream, code, text, headers_sent)

    def go_away(self, code: int = h2.NO_ERROR, debug: str = "") -> None:
        """Tell the client no new call is taken on this connection (calls up to the last one it opened still are).
        Not before the client's preface: until then no SETTINGS went to it (the front's own where it answers alone,
        Triton's held in `_Upstream.early`), and a server's first frame must be SETTINGS."""
        if self.preface:
            self.to_client(h2.goaway(self.last_stream, code, debug.encode()))

    def to_client(self, data: bytes) -> None:
        """Frames of the front's own, written between Triton's frames."""
        if self.upstream is not None:
            self.upstream.inject(data)
        elif self.transport is not None:
            self.transport.write(data)

    # -- client -> Triton ---------------------------------------------------------------------------------------------
    def _process(self) -> None:
        buffer, out = self.buffer, []
        at = start = 0  # frames from `start` to `at` are passed on together
        try:
            if not self.preface:
                if buffer[:len(h2.PREFACE)] != h2.PREFACE[:len(buffer)]:
                    if _HTTP1_REQUEST.match(buffer):
                        self._answer_http1()
                        return
                    if len(buffer) < MAX_REQUEST_LINE and _HTTP1_PARTIAL.match(buffer):
                        return  # the rest of the line is still to come
                    raise _Broken(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface (this is the gRPC port)")
                if len(buffer) < len(h2.PREFACE):
                    return
                self.preface, at = True, len(h2.PREFACE)
                if self.upstream is not None and self.upstream.early:  # Triton's SETTINGS, held until now
                    early, self.upstream.early = self.upstream.early, b""
                    self.upstream.data_received(early)
                if self.alone is not None:  # the front is the server: its SETTINGS (all defaults) first
                    start = at
                    self.transport.write(h2.frame(h2.SETTINGS, 0, 0))
            size = len(buffer)
            while size - at >= h2.FRAME_HEADER:
                length, kind, flags, stream = h2.read_header(buffer, at)
                if length > MAX_CLIENT_FRAME:
                    raise _Broken(h2.FRAME_SIZE_ERROR,
                                  f"a frame of {length} bytes, over the {MAX_CLIENT_FRAME} allowed")
                end = at + h2.FRAME_HEADER + length
                if end > size:
                    break
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                passed, after = self._frame(kind, flags, stream, memoryview(buffer)[at + h2.FRAME_HEADER:end])
                if self.closed:
                    return
                if not passed:  # the frame stays here: what came before it goes on
                    out.append(buffer[start:at])
                    start = end
                if after:  # frames of the front's own for Triton, right after this one
                    out.append(buffer[start:end])
                    out.extend(after)
                    start = end
                at = end
        except _Broken as broken:
            self._break(broken)
            return
        out.append(buffer[start:at])
        del buffer[:at]
        if self.upstream is not None:
            data = b"".join(out)
            if data:
                self.upstream.transport.write(data)
        if self.credit:
            self.to_client(h2.window_update(0, self.credit))
            self.credit = 0

    def _break(self, broken: _Broken) -> None:
        """End the connection for a client that broke HTTP/2 (or is not speaking it): GOAWAY with the reason."""
        self.front.refusals.count(GOAWAY)
        if self.preface:
            self.go_away(broken.code, broken.text)
        self.buffer = bytearray()  # not cleared in place: the frame being read may still be viewed
        self.closed = True
        self.close()

    def _answer_http1(self) -> None:
        """A client speaking HTTP/1.1 here (curl at the wrong port): an HTTP/1.1 400 that names the HTTP port, and the
        connection ends. Nothing of Triton's has reached it (`_Upstream.early`)."""
        port = self.front.http_port
        where = f"port {port}" if port is not None else "its HTTP port (hub-vit serve --http-port)"
        sentence = "this is hub-vit serve's gRPC port: it speaks gRPC (HTTP/2) only; send HTTP/REST requests to " \
            + where
        error = protocol.port_speaks("grpc", sentence, **({"http_port": port} if port is not None else {}))
        body = json.dumps({"error": error}).encode()
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        self._break(_Broken(h2.PROTOCOL_ERROR, "HTTP/1.x on the gRPC port"))  # counted; no GOAWAY before a preface

    def _frame(self, kind: int, flags: int, stream: int, payload: memoryview) -> tuple[bool, list[bytes]]:
        """Follow one client frame: (whether it is passed on to Triton, frames of the front's own to send after it)."""
        if self.block is not None and kind != h2.CONTINUATION:
            raise _Broken(h2.PROTOCOL_ERROR, "a frame inside a header block (CONTINUATION expected)")
        if flags & h2.PADDED and kind in (h2.DATA, h2.HEADERS):
            # grpc reads a HEADERS frame's padding as header block (and has read DATA padding as message bytes): what
            # the front checked would not be what Triton runs. gRPC clients do not pad
            raise _Broken(h2.PROTOCOL_ERROR, "a padded frame: refused, as Triton's gRPC server would read its padding "
                                             "as content")
        if kind == h2.DATA:
            return self._data(flags, stream, payload)
        if kind == h2.HEADERS:
            try:
                block = h2.unpadded(payload, flags, kind)
            except ValueError as err:
                raise _Broken(h2.PROTOCOL_ERROR, str(err)) from None
            self.block, self.block_stream, self.block_end_stream = bytearray(block), stream, bool(flags & h2.END_STREAM)
            return self._header_block(flags)
        if kind == h2.CONTINUATION:
            if self.block is None or stream != self.block_stream:
                raise _Broken(h2.PROTOCOL_ERROR, "a CONTINUATION frame that continues no header block")
            self.block += payload
            return self._header_block(flags)
        if kind == h2.RST_STREAM:
            known = self.streams.pop(stream, None)
            if known is not None:
                self._forget(known)
            return stream not in self.reset, []  # a call the front ended was reset at Triton already
        if self.alone is not None:
            return self._alone_frame(kind, flags, payload)
        return True, []  # SETTINGS, PING, WINDOW_UPDATE, PRIORITY, GOAWAY, ...: Triton's business

    def _alone_frame(self, kind: int, flags: int, payload: memoryview) -> tuple[bool, list[bytes]]:
        """With no server behind the connection the front answers what HTTP/2 asks an answer of."""
        if kind == h2.SETTINGS and not flags & h2.ACK:
            self.transport.write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        elif kind == h2.PING and not flags & h2.ACK:
            self.transport.write(h2.frame(h2.PING, h2.ACK, 0, bytes(payload)))
        return False, []

    def _header_block(self, flags: int) -> tuple[bool, list[bytes]]:
        assert self.block is not None
        if len(self.block) > self.front.limits.max_head_bytes:
            raise _Broken(h2.ENHANCE_YOUR_CALM, f"a header block over {self.front.limits.max_head_bytes} bytes")
        if not flags & h2.END_HEADERS:
            return self.alone is None, []
        block, stream, end_stream = bytes(self.block), self.block_stream, self.block_end_stream
        self.block = None
        path, encoding = self._read_block(block)
        known = self.streams.get(stream)
        if known is not None or stream % 2 == 0 or stream <= self.last_stream:  # trailers, or Triton's to judge
            if known is not None and end_stream:
                known.client_done = True
            return self.alone is None, []
        self.last_stream = stream
        call = _Stream(stream, path, encoding)
        call.client_done = end_stream
        if self.alone is not None:  # answered here, then no further call on this connection
            self.transport.write(self._status(stream, UNAVAILABLE, self.alone, headers_sent=False))
            self.go_away()
            self.transport.close()
            self.closed = True
            return False, []
        if self.front.draining:  # Triton has seen the header block (its HPACK state), not the call
            self.to_client(self._status(stream, UNAVAILABLE, SHUTTING_DOWN, headers_sent=False))
            self.to_client(self._reset(call))
            return True, [h2.rst_stream(stream)]
        self.streams[stream] = call
        call.relayed = True
        self.front.in_flight += 1
        return True, []

    def _read_block(self, block: bytes) -> tuple[bytes, bytes]:
        """A header block's :path and grpc-encoding, the client's HPACK table updated as Triton's will be.

        A client's calls mostly repeat the same header block, every field an index into the tables (grpc indexes even
        its coarse timeouts): such a block changes no table, so while the table stays as it is the same bytes mean the
        same fields, and are decoded once. Any other block is decoded by hpack, and the remembered ones forgotten."""
        known = self.indexed.get(block)
        if known is not None:
            return known
        try:
            fields = self.decoder.decode(block, raw=True)
        except (HPACKError, ValueError) as err:
            raise _Broken(h2.COMPRESSION_ERROR, f"a header block that is not HPACK ({type(err).__name__})") from None
        path = encoding = b""
        for name, value in fields:
            if name == b":path":
                path = value
            elif name == b"grpc-encoding":
                encoding = value
        if not _all_indexed(block):
            self.indexed.clear()  # the table may have changed under what they meant
        elif len(self.indexed) < REMEMBERED_BLOCKS:
            self.indexed[block] = path, encoding
        return path, encoding

    def _data(self, flags: int, stream: int, payload: memoryview) -> tuple[bool, list[bytes]]:
        call = self.streams.get(stream)
        if call is None:
            if stream in self.reset:  # sent before the client saw the front end the call: dropped, window given back
                self.credit += len(payload)
                return False, []
            return self.alone is None, []  # a stream Triton knows the state of
        if flags & h2.END_STREAM:
            call.client_done = True
        if call.pending is not None:  # what the client still sends is dropped, its window given back
            self.credit += len(payload)
            return False, []
        if call.server_done:  # Triton answered before the client finished: its business
            self._done_with(call)
            return True, []
        try:
            body = h2.unpadded(payload, flags, h2.DATA)
        except ValueError as err:
            raise _Broken(h2.PROTOCOL_ERROR, str(err)) from None
        passed = 0  # the end of the last message in `body` that passed its checks
        try:
            for compressed, message, end in self._messages(call, body):
                self._check(call, compressed, message)
                call.messages += 1
                passed = end
        except _Refusal as refusal:
            # the messages before the refused one go on (a DATA frame of their bytes), the rest is dropped and given
            # back to the client's window
            after = [h2.frame(h2.DATA, 0, stream, bytes(body[:passed]))] if passed else []
            self.credit += len(payload) - passed
            after += self._refuse(call, refusal)
            return False, after
        return True, []

    def _done_with(self, call: _Stream) -> None:
        """Forget a call both sides have ended (one the front ended is forgotten by `_reset`)."""
        if call.client_done and call.server_done and call.pending is None:
            self.streams.pop(call.id, None)
            self._forget(call)

    def _reset(self, call: _Stream) -> bytes:
        """Forget a call the front has ended towards the client; the RST_STREAM (NO_ERROR) that tells a client still
        sending it to stop (RFC 9113, 8.1), or nothing. Its frames still on their way are dropped: the last
        RESET_REMEMBERED such streams are remembered."""
        self.streams.pop(call.id, None)
        self._forget(call)
        if call.client_done:
            return b""
        self.reset.add(call.id)
        self.reset_order.append(call.id)
        if len(self.reset_order) > RESET_REMEMBERED:
            self.reset.discard(self.reset_order.popleft())
        return h2.rst_stream(call.id, h2.NO_ERROR)

    def _messages(self, call: _Stream, body: memoryview) -> Iterator[tuple[int, bytes, int]]:
        """The gRPC messages `body` completes (compressed flag, message, where it ends in `body`), the rest kept in
        `call` until its next frame. A message over the limit is refused from its prefix, before it is read."""
        at, size = 0, len(body)
        limit = self.front.limits.max_body_bytes
        while at < size:
            if call.remaining == 0:  # a message begins (its prefix may be split across frames)
                need = 5 - len(call.prefix)
                call.prefix += bytes(body[at:at + need])
                at += min(need, size - at)
                if len(call.prefix) < 5:
                    break
                compressed, length = _PREFIX.unpack(call.prefix)
                call.prefix = b""
                if length > limit:
                    raise _Refusal(RESOURCE_EXHAUSTED, too_large(limit, f"the gRPC message is {length} bytes, over "
                                                                        f"the limit of {limit}").message)
                if length == 0:
                    yield compressed, b"", at
                    continue
                if at + length <= size:  # whole in this frame: no copy kept
                    at += length
                    yield compressed, bytes(body[at - length:at]), at
                    continue
                front = self.front
                if front.buffered + length > front.max_buffered:
                    raise _Refusal(UNAVAILABLE, BUSY)
                front.buffered += length
                call.reserved, call.remaining, call.compressed = length, length, compressed
            step = min(call.remaining, size - at)
            call.parts.append(bytes(body[at:at + step]))
            call.remaining -= step
            at += step
            if call.remaining == 0:
                message = b"".join(call.parts)
                self.front.buffered -= call.reserved
                call.parts, call.reserved = [], 0
                yield call.compressed, message, at

    def _check(self, call: _Stream, compressed: int, message: bytes) -> None:
        """Refuse (`_Refusal`) a message that must not reach Triton 2.51."""
        limits = self.front.limits
        if compressed:
            if call.encoding not in ENCODINGS:
                raise _Refusal(UNIMPLEMENTED, f"message compression {call.encoding[:40].decode('latin-1')!r} is not "
                                              "read by this server (gzip and deflate are)")
            try:
                message = inflate(message, call.encoding.decode(), limits.max_body_bytes, "the gRPC message")
            except Refused as refused:
                raise _Refusal(RESOURCE_EXHAUSTED if refused.status == 413 else INVALID_ARGUMENT,
                               refused.message) from None
        if call.path not in (INFER, STREAM_INFER):
            return
        request = parse_inference(message)
        if request is None:
            raise _Refusal(INVALID_ARGUMENT, "the message is not an inference.ModelInferRequest (protobuf)")
        numeric: set[str] | None = set()  # only looked up when a request asks for classification
        if any("classification" in output.parameters for output in request.outputs):
            numeric = self.front.numeric(request.model_name, request.model_version)
        why = inference_refusal(request, numeric, limits.queue_timeouts)
        if why is not None:
            raise _Refusal(INVALID_ARGUMENT, why)

    def _refuse(self, call: _Stream, refusal: _Refusal) -> list[bytes]:
        """End a call the front refuses; returns the frames for Triton. A stream that has messages at Triton is closed
        towards it and refused when Triton has answered them (`_Upstream`); any other call is reset at Triton and
        answered now."""
        self.front.buffered -= call.reserved
        call.reserved, call.parts, call.remaining, call.prefix = 0, [], 0, b""
        if call.path == STREAM_INFER and call.messages:
            call.pending = (refusal.code, refusal.text)  # in flight until Triton ends the stream
            return [h2.frame(h2.DATA, h2.END_STREAM, call.id)]
        self.to_client(self._status(call.id, refusal.code, refusal.text, call.headers_sent))
        self.to_client(self._reset(call))
        return [h2.rst_stream(call.id)]

    # -- Triton -> client (called by `_Upstream`) -----------------------------------------------------------------
    def replaces(self, kind: int, flags: int, stream: int) -> bool:
        """Whether Triton's frame ends a stream the front refused once its earlier messages were answered
        (`_Stream.pending`), in a way the front's status may stand in for: a RST_STREAM, or trailers in one frame.
        Such a frame is read whole and handed to `server_frame`."""
        call = self.streams.get(stream) if stream else None
        if call is None or call.pending is None:
            return False
        return kind == h2.RST_STREAM or (kind == h2.HEADERS and flags & h2.END_STREAM and flags & h2.END_HEADERS)

    def server_frame(self, kind: int, flags: int, stream: int, payload: bytes | None = None) -> tuple[bytes, bool]:
        """Follow one frame Triton sends (its header; its payload where `replaces` asked for it): (frames of the
        front's own that go before it, whether the frame itself is left out)."""
        call = self.streams.get(stream) if stream else None
        if call is None:
            return b"", False
        before, drop = b"", False
        if kind == h2.HEADERS or kind == h2.RST_STREAM or (kind == h2.DATA and flags & h2.END_STREAM):
            ends = kind == h2.RST_STREAM or flags & h2.END_STREAM
            if call.pending is not None and ends:  # the refused stream's answers are through: its refusal now
                code, text = call.pending
                call.pending = None
                before = self._status(stream, code, text, call.headers_sent) + self._reset(call)
                # Triton's own end would be a second one, on a stream the client has seen end. It is left out where
                # the client needs nothing of it: a RST_STREAM, or trailers that change no HPACK table (grpc's after
                # a connection's first call). Other trailers still follow the front's, as the client's table must
                # take in what they add (clients ignore a closed stream's frames, but decode their header blocks)
                drop = kind == h2.RST_STREAM or (payload is not None and _changes_no_table(payload, flags))
            if kind == h2.HEADERS:
                call.headers_sent = True
            if ends:
                call.server_done = True
                self._forget(call)
                if kind == h2.RST_STREAM:
                    call.client_done = True
                self._done_with(call)
        return before, drop

    def server_settings(self, values: dict[int, int]) -> None:
        if h2.HEADER_TABLE_SIZE in values:  # the most the client's HPACK encoder may use (never less than before)
            self.decoder.max_allowed_table_size = max(self.decoder.max_allowed_table_size,
                                                      values[h2.HEADER_TABLE_SIZE])

    def upstream_lost(self, clean: bool) -> None:
        """Triton's connection ended: the calls it had not answered are lost (or stopped, when draining); at a frame
        boundary (`clean`) each gets that answer, then GOAWAY; the connection ends either way."""
        if self.closed:
            return
        text = STOPPED if self.front.draining else LOST
        frames = []
        for call in self.streams.values():
            if not call.server_done:
                frames.append(self._status(call.id, UNAVAILABLE, text, call.headers_sent))
            self._forget(call)
        self.streams.clear()
        self.upstream = None
        if clean and self.preface and self.transport is not None:  # (before the preface: no SETTINGS went first)
            self.transport.write(b"".join(frames) + h2.goaway(self.last_stream))
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Upstream(asyncio.Protocol):
    """The connection to Triton's private port for one client connection: Triton's bytes go to the client as they
    come; only frame headers are read, to find the boundaries where the front's own frames may go."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.transport: asyncio.Transport | None = None
        self.remaining = 0  # payload bytes of the current frame still to pass
        self.partial = b""  # a frame header (or SETTINGS frame) split across reads, held until whole
        self.in_block = False  # a header block awaiting CONTINUATION: nothing may go between its frames
        self.pending: list[bytes] = []  # the front's frames waiting for a boundary
        # Triton's first bytes (its SETTINGS), held until the client's preface shows it speaks HTTP/2: a client that
        # does not is answered in its own protocol, with nothing of Triton's before it
        self.early = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes

    @property
    def at_boundary(self) -> bool:
        """Whether the next byte to the client starts a frame outside any header block: where the front's own may go."""
        return not (self.remaining or self.partial or self.in_block)

    def inject(self, data: bytes) -> None:
        if not self.at_boundary:
            self.pending.append(data)
        else:
            self.connection.transport.write(data)

    def data_received(self, data: bytes) -> None:
        connection = self.connection
        if not connection.preface:
            self.early += data
            return
        if self.partial:
            data, self.partial = self.partial + data, b""
        out, start, at, size = [], 0, 0, len(data)
        while at < size:
            if self.remaining:
                step = min(self.remaining, size - at)
                self.remaining -= step
                at += step
                continue
            if size - at < h2.FRAME_HEADER:
                self.partial = data[at:]
                break
            length, kind, flags, stream = h2.read_header(data, at)
            settings = payload = None
            whole = kind == h2.SETTINGS and not flags & h2.ACK  # read, and sent on with the frame size lowered
            if whole or connection.replaces(kind, flags, stream):  # read whole before it is followed
                end = at + h2.FRAME_HEADER + length
                if end > size:
                    self.partial = data[at:]
                    break
                payload = data[at + h2.FRAME_HEADER:end]
            if whole:
                connection.server_settings(h2.settings_values(payload))
                settings = data[at:at + h2.FRAME_HEADER] + h2.with_setting_at_most(payload, h2.MAX_FRAME_SIZE,
                                                                                    MAX_CLIENT_FRAME)
            before, drop = connection.server_frame(kind, flags, stream, None if whole else payload)
            if self.pending and not self.in_block:
                before = b"".join(self.pending) + before
                self.pending.clear()
            if before or settings or drop:
                out.append(data[start:at])
                out.append(before)
                start = at
            if settings:
                out.append(settings)
                at = start = at + len(settings)
                continue
            if drop:  # left out: the bytes after it go on from its end
                at = start = at + h2.FRAME_HEADER + length
                continue
            if kind == h2.HEADERS or kind == h2.CONTINUATION:
                self.in_block = not flags & h2.END_HEADERS
            self.remaining = length
            at += h2.FRAME_HEADER
        if start == 0 and at == size and not out:  # the common case: every byte as it came
            out.append(data)
        else:
            out.append(data[start:at])
        if self.pending and self.at_boundary:
            out.extend(self.pending)
            self.pending.clear()
        if connection.transport is not None:
            connection.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def lost(self) -> None:
        """Triton is gone (or being let go): end the client's connection, answering its calls."""
        self.connection.upstream_lost(clean=self.at_boundary)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost()


__all__ = ["INFER", "SERVICE", "STREAM_INFER", "Connection"]
