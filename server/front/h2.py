"""HTTP/2 as the gRPC front watches it go by (RFC 9113): frame headers read and written, and the few frames the front
writes itself, whose header blocks use HPACK representations that leave both ends' header tables unchanged (RFC 7541:
an indexed static entry, literals without indexing), so a frame the front adds never puts the client's table out of
step with Triton's."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # a client's first bytes
FRAME_HEADER = 9  # length (24 bits), type, flags, stream (31 bits)

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# error codes
NO_ERROR, PROTOCOL_ERROR = 0x0, 0x1
FRAME_SIZE_ERROR = 0x6
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB
# settings
HEADER_TABLE_SIZE = 0x1
MAX_FRAME_SIZE = 0x5
DEFAULT_MAX_FRAME_SIZE = 16384
DEFAULT_HEADER_TABLE_SIZE = 4096

_HEADER = struct.Struct(">HBBBL")  # the 24-bit length as 16 + 8 bits


def read_header(buffer: bytes | bytearray | memoryview, at: int) -> tuple[int, int, int, int]:
    """(payload length, type, flags, stream id) of the frame header at `buffer[at:at + 9]`."""
    high, low, kind, flags, stream = _HEADER.unpack_from(buffer, at)
    return (high << 8) | low, kind, flags, stream & 0x7FFFFFFF


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream) + payload


def unpadded(payload: bytes | memoryview, flags: int, kind: int) -> bytes | memoryview:
    """A DATA or HEADERS frame's content: without its padding, and a HEADERS frame's without its priority fields.
    ValueError when the padding is longer than the frame."""
    start, pad = 0, 0
    if flags & PADDED:
        if not payload:
            raise ValueError("a padded frame without its pad length")
        start, pad = 1, payload[0]
    if kind == HEADERS and flags & PRIORITY_FLAG:
        start += 5
    if start + pad > len(payload):
        raise ValueError("the padding is longer than the frame")
    return payload[start:len(payload) - pad]


def settings_values(payload: bytes | memoryview) -> dict[int, int]:
    """A SETTINGS frame's values by identifier (the last of a repeated one counts)."""
    whole = bytes(payload[:len(payload) - len(payload) % 6])
    return dict(struct.iter_unpack(">HL", whole))


def with_setting_at_most(payload: bytes, ident: int, most: int) -> bytes:
    """A SETTINGS payload with setting `ident` lowered to `most` wherever it is higher (the same length)."""
    out = bytearray(payload)
    for at in range(0, len(payload) - len(payload) % 6, 6):
        found, value = struct.unpack_from(">HL", payload, at)
        if found == ident and value > most:
            struct.pack_into(">HL", out, at, ident, most)
    return bytes(out)


def rst_stream(stream: int, code: int = CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">L", code))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">L", increment))


def goaway(last_stream: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">LL", last_stream, code) + debug)


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541, 5.1) whose first byte carries `first` above its `prefix_bits`-bit prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = bytearray([first | limit]), value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, neither string Huffman-coded (RFC 7541, 6.2.2):
    the decoder's dynamic table is left as it was."""
    return b"\x00" + _integer(len(name), 7, 0) + name + _integer(len(value), 7, 0) + value


MAX_MESSAGE = 4096  # bytes of a grpc-message the front writes
STATUS_200 = b"\x88"  # the static table's entry 8, ":status: 200" (an indexed field: no table change)


def grpc_message(text: str) -> bytes:
    """`text` as a grpc-message value: UTF-8, percent-encoding every byte outside printable ASCII and '%' itself
    (the gRPC HTTP/2 protocol's rule)."""
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode())


def grpc_status(stream: int, code: int, text: str, headers_sent: bool) -> bytes:
    """The HEADERS frame ending `stream` with gRPC status `code` and message `text`: trailers after response headers
    already sent, else a trailers-only answer (the :status and content-type a response begins with, too)."""
    block = b"" if headers_sent else STATUS_200 + _literal(b"content-type", b"application/grpc")
    message = grpc_message(text)
    if len(message) > MAX_MESSAGE:  # well within any peer's frame size; never a cut escape
        message = message[:MAX_MESSAGE]
        cut = message.find(b"%", MAX_MESSAGE - 2)
        message = message if cut < 0 else message[:cut]
    block += _literal(b"grpc-status", str(code).encode()) + _literal(b"grpc-message", message)
    return frame(HEADERS, END_HEADERS | END_STREAM, stream, block)
