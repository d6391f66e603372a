"""The gRPC front as it watches HTTP/2 go by (server/front/grpc_front.py, grpc_calls.py), between a real grpc client
and a real grpc server standing in for Triton: what it refuses must leave the connection usable (both ends' HPACK
tables in step, the client's connection window given back), and what it passes must arrive unchanged."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from hub_vit.server.front.limits import FrontLimits
from tests.own_loop import Teardown, on_own_loop

grpc = pytest.importorskip("grpc")
pytest.importorskip("hpack")

LIMIT = 1 << 20
SERVICE = "/inference.GRPCInferenceService/"


class Recorder(grpc.GenericRpcHandler):
    """Triton's stand-in: every call is answered with its message's length (4 bytes); the metadata of `ServerLive`
    calls is kept (the front itself asks for the repository index)."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []
        self.front = None  # the GrpcFront relaying to it

    def service(self, details):  # noqa: ANN001, ANN201
        async def unary(message: bytes, context) -> bytes:  # noqa: ANN001
            if details.method.endswith("/ServerLive"):
                self.metadata.append(dict(context.invocation_metadata()))
            return struct.pack(">L", len(message))

        async def stream(messages, context):  # noqa: ANN001, ANN202
            async for message in messages:
                yield struct.pack(">L", len(message))
        if details.method.endswith("/ModelStreamInfer"):
            return grpc.stream_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(unary)


@pytest.fixture(scope="module")
def front() -> Iterator[tuple[int, Recorder]]:
    """A GrpcFront (limit LIMIT) on its own event loop in a thread, relaying to a grpc aio server; (its port, the
    server's recorder)."""
    from grpc import aio

    from hub_vit.server.front.grpc_front import GrpcFront
    from hub_vit.server.runtime.launcher import free_port

    recorder, ports = Recorder(), {"public": free_port(), "upstream": free_port()}

    async def setup() -> Teardown:
        server = aio.server(options=[("grpc.max_receive_message_length", -1)])
        server.add_generic_rpc_handlers((recorder,))
        server.add_insecure_port(f"127.0.0.1:{ports['upstream']}")
        await server.start()
        relay = recorder.front = GrpcFront(FrontLimits(max_body_bytes=LIMIT))
        await relay.listen("127.0.0.1", ports["public"])
        await relay.upstream("127.0.0.1", ports["upstream"])

        async def teardown() -> None:
            await relay.close()
            await server.stop(None)
        return teardown

    with on_own_loop(setup):
        yield ports["public"], recorder


def _channel(port: int):  # noqa: ANN202
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)])


def _too_large(call, message: bytes, **options: object) -> str:  # noqa: ANN001
    """`call(message)` refused RESOURCE_EXHAUSTED by the front; its details."""
    with pytest.raises(grpc.RpcError) as refused:
        call(message, timeout=10, **options)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    return refused.value.details()


def test_calls_after_refused_ones_on_the_same_connection_keep_their_metadata(front) -> None:
    # the front decodes every header block and writes its refusals with HPACK literals: were its own frames to touch
    # the client's header table, or a header block to be kept from Triton, the next call's metadata would be misread
    port, recorder = front
    with _channel(port) as channel:
        call = channel.unary_unary(SERVICE + "ServerLive")
        for i in range(12):
            _too_large(call, b"\0" * (LIMIT + 1), metadata=(("x-refused", f"r{i}"),))
            assert call(b"abc", metadata=(("x-call", f"c{i}"), ("x-same", "kept")), timeout=10) == b"\0\0\0\x03"
            seen = recorder.metadata[-1]
            assert (seen.get("x-call"), seen.get("x-same")) == (f"c{i}", "kept"), (i, recorder.metadata[-4:])
            assert "x-refused" not in seen


def test_a_connection_s_window_survives_the_bytes_of_refused_messages(front) -> None:
    # a message refused from its prefix is not passed on, and its client keeps sending it: unless the front gives
    # those bytes back to the client's connection window, a few refused megabytes stall every later call
    port, _ = front
    with _channel(port) as channel:
        call = channel.unary_unary(SERVICE + "ServerLive")
        for _ in range(8):
            _too_large(call, b"\1" * (4 * LIMIT))
        assert call(b"x" * (LIMIT - 10), timeout=10) == struct.pack(">L", LIMIT - 10)


def test_messages_across_many_frames_and_compressed_ones_arrive_whole(front) -> None:
    port, _ = front
    with _channel(port) as channel:
        call = channel.unary_unary(SERVICE + "ServerLive")
        body = bytes(range(256)) * (LIMIT // 256 - 1)  # some 64 DATA frames
        assert call(body, timeout=10) == struct.pack(">L", len(body))
        assert call(body, compression=grpc.Compression.Gzip, timeout=10) == struct.pack(">L", len(body))
        # inflating past the limit: refused in the front's words, tagged with the limit
        from hub_vit.server import protocol

        details = _too_large(call, b"\0" * (4 * LIMIT), compression=grpc.Compression.Gzip)
        assert protocol.read_too_large(details) == LIMIT, details
        assert call(b"", timeout=10) == b"\0\0\0\0"


def _raw(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send `data` on a new connection; (what came back within 3 s, whether the front closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as raw:
        raw.sendall(data)
        got = b""
        try:
            while chunk := raw.recv(65536):
                got += chunk
        except TimeoutError:
            return got, False
        return got, True


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">L", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">L", stream) + payload


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"")


@pytest.mark.parametrize("case, data, words", [
    ("a header block that is not HPACK", PREFACE + _frame(1, 5, 1, b"\xff" * 5), b"not HPACK"),
    ("a frame longer than Triton's SETTINGS allow", PREFACE + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"\0" * 64,
     b"a frame of 16777215 bytes, over the"),
    ("DATA inside a header block", PREFACE + _frame(1, 0, 1, b"\x83") + _frame(0, 0, 1, b"\0"), b"CONTINUATION"),
    ("a CONTINUATION of nothing", PREFACE + _frame(9, 4, 1, b"\x83"), b"continues no header block"),
    # grpc reads a HEADERS frame's padding as header block: here a :path the front never saw (was: checks bypassed)
    ("a padded HEADERS frame", PREFACE + _frame(1, 0x4 | 0x8, 1, b"\x01\x83\x44"), b"padded frame"),
    ("a padded DATA frame", PREFACE + _frame(1, 0x4, 1, b"\x83") + _frame(0, 0x8, 1, b"\x00" + b"\0" * 5),
     b"padded frame"),
])
def test_broken_http2_ends_the_connection_with_a_goaway_naming_it(front, case: str, data: bytes, words: bytes) -> None:
    port, _ = front
    answer, closed = _raw(port, data)
    goaway = answer.find(b"\x07\x00\x00\x00\x00\x00")  # a GOAWAY frame's type, flags and stream 0
    assert closed and goaway >= 3 and words in answer[goaway:], (case, answer[:300])
    with _channel(port) as channel:  # and the front still serves
        assert channel.unary_unary(SERVICE + "ServerLive")(b"ok", timeout=10) == b"\0\0\0\x02"



def test_a_stream_s_refused_message_ends_it_after_the_answers_to_those_before(front) -> None:
    # the messages before the refused one may share its DATA frame: they go on, and are answered, before the refusal
    port, _ = front
    with _channel(port) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        for _ in range(5):
            answers = stream(iter([b"", b"", b"\0" * (LIMIT + 1)]), timeout=10)
            assert [next(answers), next(answers)] == [b"\0\0\0\0"] * 2
            with pytest.raises(grpc.RpcError) as refused:
                next(answers)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert channel.unary_unary(SERVICE + "ServerLive")(b"ok", timeout=10) == b"\0\0\0\x02"


class _RawClient:
    """An HTTP/2 client on a plain socket that keeps every frame the server sent, each header block decoded in order
    (as a client's HPACK table follows the server's): (stream, type, flags, fields or payload)."""

    def __init__(self, port: int) -> None:
        from hpack import Decoder, Encoder

        self.socket = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder, self.decoder = Encoder(), Decoder()
        self.frames: list[tuple[int, int, int, object]] = []
        self.unread = b""
        self.socket.sendall(PREFACE)

    def call(self, stream: int, method: str, *messages: bytes, end: bool = True) -> None:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method),
                                     (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
        self.socket.sendall(_frame(1, 0x4, stream, block))
        self.send(stream, *messages, end=end)

    def send(self, stream: int, *messages: bytes, end: bool = False) -> None:
        body = b"".join(struct.pack(">BL", 0, len(m)) + m for m in messages)
        self.socket.sendall(_frame(0, 0x1 if end else 0, stream, body))

    def read_until(self, done, seconds: float = 10):  # noqa: ANN001, ANN201
        """Frames until `done(frame)` holds for one of them (that frame), else an AssertionError."""
        import time

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            while len(self.unread) >= 9:
                length = int.from_bytes(self.unread[:3], "big")
                if len(self.unread) < 9 + length:
                    break
                kind, flags = self.unread[3], self.unread[4]
                stream = int.from_bytes(self.unread[5:9], "big") & 0x7FFFFFFF
                payload = self.unread[9:9 + length]
                self.unread = self.unread[9 + length:]
                content = dict(self.decoder.decode(payload)) if kind == 1 else payload
                self.frames.append(frame := (stream, kind, flags, content))
                if done(frame):
                    return frame
            self.socket.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = self.socket.recv(1 << 16)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            self.unread += chunk
        raise AssertionError(f"not seen; frames: {self.frames}")


def _trailers_of(stream: int):  # noqa: ANN202
    return lambda frame: frame[0] == stream and frame[1] == 1 and frame[2] & 0x1


def test_a_refused_stream_ends_once_where_triton_s_own_end_adds_nothing_the_client_needs(front) -> None:
    # was: the front's refusal (trailers ending the stream) and then Triton's own trailers, a second end of a stream
    # the client had seen end (grpc's clients ignore it; HTTP/2 lets a client treat it as a connection error). Triton's
    # trailers are left out now when they are indexed fields only, which change no HPACK table: the next call's header
    # blocks still decode in step
    port, _ = front
    client = _RawClient(port)
    with client.socket:
        client.call(1, "ServerLive", b"ok")  # its trailers add `grpc-status: 0` to the table: indexed from now on
        client.read_until(_trailers_of(1))
        for stream in (3, 5):
            client.call(stream, "ModelStreamInfer", b"", end=False)
            client.read_until(lambda frame, s=stream: frame[0] == s and frame[1] == 0)  # its answer
            # a message over the limit, refused from its prefix once the answers before it are through
            client.socket.sendall(_frame(0, 0, stream, struct.pack(">BL", 0, LIMIT + 1)))
            refusal = client.read_until(_trailers_of(stream))
            assert refusal[3]["grpc-status"] == "8", refusal  # RESOURCE_EXHAUSTED
        client.call(7, "ServerLive", b"abc")
        assert client.read_until(_trailers_of(7))[3]["grpc-status"] == "0"
    ends = [stream for stream, kind, flags, _ in client.frames if kind == 1 and flags & 0x1]
    assert ends == [1, 3, 5, 7], client.frames  # one end each
    answer = [content for stream, kind, _, content in client.frames if stream == 7 and kind == 0]
    assert answer == [struct.pack(">BL", 0, 4) + b"\0\0\0\x03"], client.frames


def test_header_blocks_that_change_no_hpack_table_are_told_from_those_that_do() -> None:
    # what may be left out of a stream's end: blocks written by hpack's encoder, and grpc's trailers as a grpc server
    # wrote them after a connection's first call (indexed `grpc-status: 0`, `grpc-message: ""` without indexing)
    from hpack import Encoder, NeverIndexedHeaderTuple

    from hub_vit.server.front.grpc_calls import _changes_no_table

    encoder = Encoder()
    added = encoder.encode([("grpc-status", "0")])  # a literal with incremental indexing
    assert not _changes_no_table(added, 0)
    indexed = encoder.encode([("grpc-status", "0")], huffman=False)
    unindexed = bytes.fromhex("be000c677270632d6d65737361676500")  # grpc's, as the stand-in server wrote them
    never = encoder.encode([NeverIndexedHeaderTuple("x-" + "long" * 40, "v" * 300)])  # long: multi-byte lengths
    for block in (indexed, unindexed, never, indexed + unindexed + never):
        assert _changes_no_table(block, 0), block
    assert not _changes_no_table((indexed + unindexed)[:-1], 0)  # cut inside a string
    encoder.header_table_size = 1024
    assert not _changes_no_table(encoder.encode([("grpc-status", "0")]), 0)  # a table size update
    padded = bytes([3]) + indexed + b"\0" * 3
    assert _changes_no_table(padded, 0x8) and not _changes_no_table(bytes([9]) + indexed, 0x8)


def test_a_header_block_decoded_once_is_read_again_only_while_the_table_is_unchanged() -> None:
    # the front decodes a repeated block of indexed fields once; after a table change the same bytes mean other fields
    from hpack import Encoder

    from hub_vit.server.front.grpc_calls import Connection
    from hub_vit.server.front.grpc_front import GrpcFront

    connection, client = Connection(GrpcFront(FrontLimits())), Encoder()
    first = client.encode([("grpc-encoding", "gzip"), (":path", "/a")])  # literals, indexed into both tables
    assert connection._read_block(first) == (b"/a", b"gzip")
    again = client.encode([(":path", "/a")])  # now a table index
    assert connection._read_block(again) == (b"/a", b"") == connection._read_block(again)
    assert connection._read_block(client.encode([(":path", "/b")])) == (b"/b", b"")
    shifted = client.encode([(":path", "/b")])
    assert shifted == again  # the same bytes ...
    assert connection._read_block(shifted) == (b"/b", b"")  # ... meaning the new field


def _frame_kinds(data: bytes) -> list[int]:
    """The type of each whole HTTP/2 frame in `data`, a server's bytes from its first frame on."""
    kinds, at = [], 0
    while len(data) - at >= 9:
        length = int.from_bytes(data[at:at + 3], "big")
        if len(data) - at < 9 + length:
            break
        kinds.append(data[at + 3])
        at += 9 + length
    return kinds


def test_calls_refused_while_their_client_still_sends_are_forgotten(front) -> None:
    # was: each stayed in the connection's state until its client half-closed it (Triton had been told to reset it,
    # so its stream limit no longer bounded them): a client could pile up 100,000 of them. Now the client is told to
    # stop (RST_STREAM NO_ERROR after the status) and what it already sent is dropped
    import time

    from hpack import Encoder

    port, recorder = front
    client, frames = Encoder(), []
    for stream in range(1, 600, 2):
        block = client.encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ServerLive"),
                               (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
        over = struct.pack(">BL", 0, LIMIT + 1)  # a message over the limit, refused from its prefix
        frames.append(_frame(1, 0x4, stream, block) + _frame(0, 0, stream, over) + _frame(0, 0, stream, b"\0" * 64))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(PREFACE + b"".join(frames))
        deadline, answer = time.monotonic() + 10, b""
        while _frame_kinds(answer).count(3) < 300 and time.monotonic() < deadline:  # an RST_STREAM for each call
            answer += raw.recv(1 << 20)
        held = [len(connection.streams) for connection in list(recorder.front.connections)]
        assert held and max(held) == 0, held
    assert (recorder.front.in_flight, recorder.front.buffered) == (0, 0)


def test_an_http1_request_line_split_across_reads_is_still_answered_in_http1(front) -> None:
    # was: a first read without the whole request line (a slow client, a small segment) closed the connection without
    # a word; only a line read whole got the HTTP/1.1 400 that names the protocol
    import json
    import time

    from hub_vit.server import protocol

    port, _ = front
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        for part in (b"G", b"ET /v2/health/ready HT", b"TP/1.1\r", b"\nHost: x\r\n\r\n"):
            raw.sendall(part)
            time.sleep(0.2)  # each part is read on its own
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:200]
    assert protocol.read_port_speaks(json.loads(body)["error"]).speaks == "grpc"


def test_bytes_that_cannot_become_a_request_line_are_closed_at_once(front) -> None:
    # what is neither a preface nor an HTTP/1.x request line in the making is not waited for
    port, _ = front
    for data in (b"get /v2 HTTP/1.1", b"GET /v2 HTTP/2.0\r\n", b"\x16\x03\x01\x02\x00"):  # the last: a TLS hello
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(data)
            raw.settimeout(2)  # far below the head timeout: closed for what it is, not for being slow
            assert raw.recv(65536) == b"", data


def test_a_message_in_a_compression_triton_does_not_read_is_refused_naming_those_it_reads(front) -> None:
    # Triton 2.51 inflates gzip and deflate only: a message in another encoding is refused before it reaches it, in
    # grpc's status for an unsupported compression (UNIMPLEMENTED, as grpc's own servers answer it)
    import time
    import urllib.parse

    from hpack import Decoder, Encoder

    port, _ = front
    block = Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ServerLive"),
                              (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
                              ("grpc-encoding", "br")])
    message = struct.pack(">BL", 1, 5) + b"hello"  # flagged compressed
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(PREFACE + _frame(1, 0x4, 1, block) + _frame(0, 0x1, 1, message))
        answer, deadline, trailers = b"", time.monotonic() + 10, None
        decoder = Decoder()
        while trailers is None and time.monotonic() < deadline:
            answer += raw.recv(1 << 16)
            at = 0
            while len(answer) - at >= 9:
                length = int.from_bytes(answer[at:at + 3], "big")
                if len(answer) - at < 9 + length:
                    break
                kind, flags, stream = answer[at + 3], answer[at + 4], int.from_bytes(answer[at + 5:at + 9], "big")
                if kind == 1 and stream == 1:
                    fields = dict(decoder.decode(answer[at + 9:at + 9 + length]))
                    if flags & 0x1:  # END_STREAM: the trailers
                        trailers = fields
                at += 9 + length
            answer = answer[at:]
    assert trailers is not None, "no trailers for the call"
    assert trailers["grpc-status"] == "12", trailers  # UNIMPLEMENTED
    assert urllib.parse.unquote(trailers["grpc-message"]) == ("message compression 'br' is not read by this server "
                                                              "(gzip and deflate are)"), trailers
