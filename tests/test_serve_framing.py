"""Request smuggling and framing against the real `hub-vit serve` (real tritonserver behind its front): each
malformed or ambiguous request is refused with a 4xx (gRPC: a refusal status, or the connection closed for a broken
HTTP/2 frame), nothing hidden in it is answered as a request of its own, and the server still serves afterwards.

The HTTP cases are the classic ways two HTTP parsers are made to disagree on where a request ends (RFC 9112 section 6.3
and 11.2; CVE-2025-23310/23311 for Triton's own chunked parser): a front that relays what it parsed differently from
Triton would let a client slip a second request past its checks.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time

import pytest

from hub_vit.server import protocol
from tests.programs import Serve
from tests.test_serve_limits import MAX_REQUEST_MB, assert_healthy, grpc_stub, infer_message

pytestmark = [pytest.mark.triton, pytest.mark.slow]

STATUS_LINE = re.compile(rb"(?m)^HTTP/1\.[01] (\d{3}) ")
HEAD_LIMIT = 64 << 10


@pytest.fixture(scope="module")
def serve() -> Serve:
    served = Serve("--max-request-mb", str(MAX_REQUEST_MB), "--front-processes", "2")
    try:
        served.wait_for("metrics")
        yield served
    finally:
        served.stop()


def exchange(port: int, data: bytes, idle_s: float = 1.5, timeout_s: float = 20.0) -> tuple[bytes, bool]:
    """Everything the server sends back for `data` on one connection, and whether it closed the connection: read
    until it does, or sends nothing for `idle_s` after answering, or `timeout_s` passed."""
    received, closed = b"", False
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sock.settimeout(idle_s if received else max(deadline - time.monotonic(), 0.1))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if received:
                    break
                continue
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    return received, closed


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    """One HTTP/2 frame (RFC 9113 section 4.1)."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def statuses(answer: bytes) -> list[int]:
    return [int(code) for code in STATUS_LINE.findall(answer)]


def health_answered(serve: Serve) -> None:
    answer, _ = exchange(serve.ports[0], b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert statuses(answer) == [200], answer


HIDDEN = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"  # a second request, hidden where a body belongs

HTTP_CASES = {
    "content-length twice, different values":
        b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 44\r\n\r\n{}" + HIDDEN,
    "content-length with transfer-encoding":
        b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\n" + HIDDEN,
    "obsolete line folding":
        b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n Content-Length: 44\r\nContent-Length: 2\r\n"
        b"\r\n{}" + HIDDEN,
    "bare LF line ends": b"GET /v2/health/ready HTTP/1.1\nHost: x\nContent-Length: 44\n\n" + HIDDEN,
    "a bad chunk size":
        b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + HIDDEN,
    "a NUL in a header value": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Value: a\0b\r\n\r\n",
    "a CR in a header value": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Value: a\rContent-Length: 44\r\n\r\n"
                              + HIDDEN,
    "a head over the limit": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * HEAD_LIMIT + b"\r\n\r\n",
    # the outer request is refused (an encoding Triton does not read); its body, a whole request, must stay a body
    "a pipelined request hidden in a body":
        b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: %d\r\n\r\n"
        % len(HIDDEN) + HIDDEN,
}


@pytest.mark.parametrize("case", list(HTTP_CASES))
def test_http_smuggling_and_framing_are_refused(serve: Serve, case: str) -> None:
    answer, _ = exchange(serve.ports[0], HTTP_CASES[case])
    codes = statuses(answer)
    # one answer, a refusal; never a second one for the request hidden after or inside it
    assert len(codes) == 1 and 400 <= codes[0] < 500, answer[:600]
    health_answered(serve)


def test_grpc_messages_just_over_the_cap_name_the_limit_and_the_flag(serve: Serve) -> None:
    import grpc

    limit, stub = MAX_REQUEST_MB << 20, grpc_stub(serve)
    from tests.test_serve_limits import grpc_refusal

    plain = infer_message([1, 1], [b"\0" * (limit + 1)])
    code, text = grpc_refusal(stub.ModelInfer, plain)
    assert code == "RESOURCE_EXHAUSTED" and protocol.read_too_large(text) == limit, text
    assert "hub-vit serve --max-request-mb" in text, text
    # compressed on the wire (a few kB), inflating past the cap
    inflated = infer_message([1, 1], [b"\0" * (limit + (1 << 20))])
    code, text = grpc_refusal(stub.ModelInfer, inflated, compression=grpc.Compression.Gzip)
    assert code == "RESOURCE_EXHAUSTED" and protocol.read_too_large(text) == limit, text
    assert "hub-vit serve --max-request-mb" in text, text
    assert_healthy(serve)


def test_grpc_malformed_messages_and_frames_are_refused(serve: Serve) -> None:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{serve.ports[1]}")
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # raw bytes in, raw bytes out
    with pytest.raises(grpc.RpcError) as refused:
        infer(b"\xff\xff\xff not a protobuf message", timeout=30)
    assert refused.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), refused.value
    channel.close()
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")  # the client preface and its SETTINGS
    broken = {
        "HTTP/1.1 on the gRPC port": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
        "a frame longer than the peer's SETTINGS allow": preface + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"\0" * 64,
        "a HEADERS frame that is not HPACK": preface + frame(1, 5, 1, b"\xff" * 5),
        "raw bytes": b"\x00\x01\x02 not HTTP/2 at all " * 8,
    }
    for case, data in broken.items():
        answer, closed = exchange(serve.ports[1], data, idle_s=10.0, timeout_s=15)
        # the server ends the connection (after an HTTP/2 GOAWAY, or at once) and relays nothing
        assert closed and b"HTTP/1.1 200" not in answer, (case, answer[:200])
    assert_healthy(serve)


def test_http1_at_the_grpc_port_is_answered_in_http1_naming_the_http_port(serve: Serve) -> None:
    # was: Triton's binary SETTINGS frame, then the connection closed (curl: "Received HTTP/0.9 when not allowed")
    answer, closed = exchange(serve.ports[1], b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", timeout_s=15)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert closed and head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:200]  # nothing of Triton's first
    error = json.loads(body)["error"]
    assert protocol.untagged(error) == (f"this is hub-vit serve's gRPC port: it speaks gRPC (HTTP/2) only; send "
                                        f"HTTP/REST requests to port {serve.ports[0]}"), error
    assert protocol.read_port_speaks(error) == protocol.PortSpeaks("grpc", {"http_port": serve.ports[0]}), error
    # hub-vit's clients say what to do: add --grpc, or the HTTP port (they said "the port answered in HTTP/2")
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from tests.programs import SAMPLES

    _load_commands()
    grpc_url = f"127.0.0.1:{serve.ports[1]}"
    for command in (["classify", "--url", grpc_url], ["loadtest", "--requests", "2", "--url", grpc_url]):
        result = CliRunner().invoke(app, [*command, str(SAMPLES[0])])
        output = " ".join(result.output.split())
        assert result.exit_code == 1, output
        assert (f"hub-vit serve answered that this is its gRPC port {grpc_url} speaks gRPC: add --grpc, or give the "
                f"server's HTTP port ({serve.ports[0]}).") in output, output
    result = CliRunner().invoke(app, ["health", "--url", grpc_url])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and (f"answered that this is hub-vit serve's gRPC port: give the server's HTTP port "
                                      f"({serve.ports[0]})") in output, output
    health_answered(serve)


def test_an_image_posted_as_the_inference_body_is_told_what_the_endpoint_takes(serve: Serve) -> None:
    # was: HTTP 500 "failed to parse the request JSON buffer" from Triton (`curl --data-binary @3_0.png .../infer`)
    from tests.programs import SAMPLES
    from tests.test_serve_limits import post

    status, text = post(serve.ports[0], "/v2/models/vit/infer", SAMPLES[0].read_bytes(),
                        {"Content-Type": "application/x-www-form-urlencoded"})  # what curl --data-binary sends
    assert status == 400, text
    message = json.loads(text)["error"]  # the form itself: a remote client has no copy of the docs
    assert "the request body is not JSON" in message and "POST /v2/models/vit/infer takes a KServe v2 inference " \
        "request" in message and '"datatype": "BYTES"' in message and "4 little-endian bytes" in message, message
    health_answered(serve)
