"""The HTTP and gRPC gates' checks and the restart policy, without a server (test_serve_limits.py: for real)."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest

from hub_vit.server.front.grpc_gate import inference_refusal, parse_inference
from hub_vit.server.front.http_gate import GateLimits, Refused, check_inference, inflate
from hub_vit.server.runtime.supervisor import RestartPolicy


def test_inflate_stops_at_the_cap_without_inflating_the_rest():
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB in about 64 kB
    with pytest.raises(Refused) as refused:
        inflate(bomb, "gzip", 1 << 20)
    assert refused.value.status == 413 and "inflates (gzip) to more than 1048576 bytes" in refused.value.message
    assert inflate(gzip.compress(b"abc"), "gzip", 3) == b"abc"
    assert inflate(zlib.compress(b"abc"), "deflate", 10) == b"abc"
    with pytest.raises(Refused, match="not valid gzip data"):
        inflate(b"not gzip", "gzip", 10)


@pytest.mark.parametrize("header, message", [
    ({"outputs": [{"name": "labels", "parameters": {"classification": 3}}]},
     "classification extension is not served for output 'labels': it needs a numeric output"),
    ({"inputs": [{"name": "image", "shape": [0, 1]}]}, "input 'image' has shape [0, 1]: every dimension must be"),
    ({"inputs": [{"name": "image", "shape": [2**32 + 1, 1]}]}, "has shape [4294967297, 1]"),
])
def test_check_inference_refuses_what_crashes_or_misleads_triton(header, message):
    with pytest.raises(Refused) as refused:
        check_inference(header, {"scores", "logits"})
    assert refused.value.status == 400 and message in refused.value.message


def test_check_inference_lets_the_rest_through():
    check_inference({"outputs": [{"name": "logits", "parameters": {"classification": 3}}]}, {"logits"})
    check_inference({"inputs": [{"name": "image", "shape": [16, 1]}], "outputs": [{"name": "labels"}]}, set())
    check_inference(["not", "an", "object"], None)  # Triton's own error for it
    with pytest.raises(Refused):  # the model's outputs unknown: any classification request is refused
        check_inference({"outputs": [{"name": "logits", "parameters": {"classification": 3}}]}, None)


def test_limits_and_policy_refuse_bad_settings_by_name():
    with pytest.raises(ValueError, match="max_body_bytes must be a positive integer, got 0"):
        GateLimits(max_body_bytes=0)
    with pytest.raises(ValueError, match="head_timeout_s must be a positive number of seconds"):
        GateLimits(head_timeout_s=0)
    with pytest.raises(ValueError, match="max_failed_starts must be an integer >= 0, got -1"):
        RestartPolicy(max_failed_starts=-1)
    with pytest.raises(ValueError, match="0 < first_backoff_s <= max_backoff_s"):
        RestartPolicy(first_backoff_s=5, max_backoff_s=1)


def test_backoff_doubles_to_its_ceiling():
    policy = RestartPolicy(first_backoff_s=0.5, max_backoff_s=10)
    assert [policy.backoff_s(n) for n in (1, 2, 3, 4, 5, 6, 50)] == [0.5, 1, 2, 4, 8, 10, 10]


def _message(shape: list[int], raw: bytes, outputs: tuple[str, ...] = (), classification: bool = False):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="vit")
    request.inputs.add(name="image", datatype="BYTES", shape=shape)
    request.raw_input_contents.append(raw)
    for name in outputs:
        output = request.outputs.add(name=name)
        if classification:
            output.parameters["classification"].int64_param = 3
    return parse_inference(request.SerializeToString())


def test_grpc_checks_are_the_http_gates_plus_contents_against_shape():
    two = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 1) + b"d"
    assert inference_refusal(_message([2, 1], two), set()) is None
    assert inference_refusal(_message([1, 1], two), set()) == \
        "input 'image' has shape [1, 1] (1 elements) but its contents hold 2"
    assert "has shape [0, 1]: every dimension must be between 1 and 2147483647" in \
        inference_refusal(_message([0, 1], b""), set())
    assert "classification extension is not served for output 'labels'" in \
        inference_refusal(_message([2, 1], two, ("labels",), classification=True), {"scores", "logits"})
    assert inference_refusal(_message([2, 1], two, ("logits",), classification=True), {"logits"}) is None
    assert inference_refusal(_message([5, 1], b"\x09\0\0\0abc"), set()) is None  # broken framing: Triton says so
    assert parse_inference(b"\xff\xff not a protobuf") is None


@pytest.mark.parametrize("gate_class, thread_name", [("Gate", "hub-vit-gate"), ("GrpcGate", "hub-vit-grpc-gate")])
def test_a_gate_that_cannot_listen_leaves_no_loop_thread(gate_class, thread_name):
    import socket
    import threading

    from hub_vit.server.front import grpc_gate
    from hub_vit.server.front import http_gate as gate

    cls = getattr(gate, gate_class, None) or getattr(grpc_gate, gate_class)
    with socket.socket() as taken:  # a port someone else listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(Exception):  # noqa: B017 - the listen error as the OS words it
            cls("127.0.0.1", taken.getsockname()[1]).start()
    assert thread_name not in [t.name for t in threading.enumerate() if t.is_alive()]
