"""The front's checks, its processes and the restart policy, without a server (test_serve_limits.py and
test_serve_framing.py: for real)."""

from __future__ import annotations

import gzip
import os
import signal
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from hub_vit.server import protocol
from hub_vit.server.front.checks import (
    RAW_HTTP_EXAMPLE,
    Refused,
    check_inference,
    inference_header,
    inference_refusal,
    inflate,
    parse_inference,
)
from hub_vit.server.front.limits import FrontLimits
from hub_vit.server.runtime.supervisor import RestartPolicy
from tests.programs import children_of


def test_inflate_stops_at_the_cap_without_inflating_the_rest():
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB in about 64 kB
    with pytest.raises(Refused) as refused:
        inflate(bomb, "gzip", 1 << 20)
    assert refused.value.status == 413 and "inflates (gzip) to more than 1048576 bytes" in refused.value.message
    assert protocol.read_too_large(refused.value.message) == 1 << 20
    assert "(hub-vit serve --max-request-mb)" in refused.value.message
    assert inflate(gzip.compress(b"abc"), "gzip", 3) == b"abc"
    assert inflate(zlib.compress(b"abc"), "deflate", 10) == b"abc"
    with pytest.raises(Refused, match="not valid gzip data"):
        inflate(b"not gzip", "gzip", 10)


@pytest.mark.parametrize("header, message", [
    ({"outputs": [{"name": "labels", "parameters": {"classification": 3}}]},
     "classification extension is not served for output 'labels': it needs a numeric output"),
    ({"inputs": [{"name": "image", "shape": [0, 1]}]}, "input 'image' has shape [0, 1]: every dimension must be"),
    ({"inputs": [{"name": "image", "shape": [2**32 + 1, 1]}]}, "has shape [4294967297, 1]"),
    ({"inputs": [{"name": "image", "shape": [1, 1], "parameters": {"binary_data_size": -1}}]},
     "tensor 'image': its parameter 'binary_data_size' must be a whole number of bytes (0 or more), got -1"),
    ({"outputs": [{"name": "labels", "parameters": {"binary_data_size": 2.5}}]}, "'binary_data_size' must be"),
    ({"parameters": {"timeout": -5}}, "the request parameter 'timeout' (its queue timeout) must be an integer number "
                                      "of microseconds from 0 to 86400000000 (one day), got -5"),
    ({"parameters": {"timeout": "5"}}, 'got "5"'),
    ({"parameters": {"timeout": 86_400_000_001}}, "got 86400000001"),
])
def test_check_inference_refuses_what_crashes_or_misleads_triton(header, message):
    with pytest.raises(Refused) as refused:
        check_inference(header, {"scores", "logits"})
    assert refused.value.status == 400 and message in refused.value.message


def test_check_inference_lets_the_rest_through():
    check_inference({"outputs": [{"name": "logits", "parameters": {"classification": 3}}]}, {"logits"})
    check_inference({"inputs": [{"name": "image", "shape": [16, 1]}], "outputs": [{"name": "labels"}]}, set())
    check_inference({"inputs": [{"name": "image", "shape": [1, 1], "parameters": {"binary_data_size": 9}}],
                     "parameters": {"timeout": 86_400_000_000}}, set())
    check_inference({"inputs": [{"name": "image", "parameters": ["not", "a", "dict"]}, "not a tensor"]}, set())
    check_inference(["not", "an", "object"], None)  # Triton's own error for it
    with pytest.raises(Refused):  # the model's outputs unknown: any classification request is refused
        check_inference({"outputs": [{"name": "logits", "parameters": {"classification": 3}}]}, None)


def test_a_queue_timeout_is_refused_where_the_server_applies_none():
    """Without a queue policy Triton ignores a request's `timeout` parameter: the front refuses it, naming why, on
    both protocols; with one (the default), it passes."""
    header = {"inputs": [{"name": "image", "shape": [1, 1]}], "parameters": {"timeout": 5000}}
    check_inference(header, set())
    with pytest.raises(Refused, match="applies no per-request queue timeout") as refused:
        check_inference(header, set(), queue_timeouts=False)
    assert refused.value.status == 400 and "--no-queue-policy" in refused.value.message
    check_inference({**header, "parameters": {"explain": True}}, set(), queue_timeouts=False)
    one = struct.pack("<I", 3) + b"abc"
    timed = _message([1, 1], one)
    timed.parameters["timeout"].int64_param = 5000
    assert inference_refusal(timed, set()) is None
    assert "applies no per-request queue timeout" in inference_refusal(timed, set(), queue_timeouts=False)
    assert inference_refusal(_message([1, 1], one), set(), queue_timeouts=False) is None
    with pytest.raises(ValueError, match="queue_timeouts must be True or False, got 1"):
        FrontLimits(queue_timeouts=1)


def test_a_rollout_output_needs_explain_true_on_both_protocols():
    """The ensemble does not pass requested outputs on, so without `explain` the model answers without the map:
    the front refuses a rollout output asked for without `explain` true."""
    for name in ("rollout", "rollout_box"):
        for parameters in ({}, {"explain": False}, {"explain": "true"}, {"head_fusion": "max"}):
            with pytest.raises(Refused, match=f"output '{name}' is part of the attention-rollout map") as refused:
                check_inference({"outputs": [{"name": "labels"}, {"name": name}], "parameters": parameters}, set())
            assert refused.value.status == 400 and '"explain": true' in refused.value.message
    check_inference({"outputs": [{"name": "rollout"}, {"name": "rollout_box"}], "parameters": {"explain": True}}, set())
    check_inference({"outputs": [{"name": "labels"}]}, set())
    one = struct.pack("<I", 3) + b"abc"
    asked = _message([1, 1], one, ("labels", "rollout"))
    assert "output 'rollout' is part of the attention-rollout map" in inference_refusal(asked, set())
    asked.parameters["explain"].string_param = "true"
    assert "output 'rollout' is part of the attention-rollout map" in inference_refusal(asked, set())
    asked.parameters["explain"].bool_param = True
    assert inference_refusal(asked, set()) is None


def test_limits_and_policy_refuse_bad_settings_by_name():
    with pytest.raises(ValueError, match="max_body_bytes must be a positive integer, got 0"):
        FrontLimits(max_body_bytes=0)
    with pytest.raises(ValueError, match="head_timeout_s must be a positive number of seconds"):
        FrontLimits(head_timeout_s=0)
    with pytest.raises(ValueError, match="processes must be at most 64, got 65"):
        FrontLimits(processes=65)
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


def test_grpc_checks_are_the_http_fronts_plus_contents_against_shape():
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


def test_a_shape_of_many_large_dimensions_is_refused_at_once_and_named_briefly():
    # was: 500 dimensions of 2^31-1 made a product of 4,300+ digits: formatting it raised (the connection died
    # without a status), and 60,000 of them held the event loop 3.3 s
    import time

    start = time.perf_counter()
    why = inference_refusal(_message([2**31 - 1] * 60_000, struct.pack("<I", 1) + b"x"), set())
    assert time.perf_counter() - start < 1.0
    assert why == "input 'image' has shape [2147483647, 2147483647, 2147483647, 2147483647, 2147483647, 2147483647, " \
                  "2147483647, 2147483647, ...] (60000 dimensions) (more than 18446744073709551616 elements) but its " \
                  "contents hold 1", why


def test_the_grpc_front_looks_up_no_model_triton_does_not_serve():
    # was: every new model name a client chose (up to 64 MiB each) was looked up while the event loop waited, and kept
    from hub_vit.server.front.grpc_front import MAX_NAME, GrpcFront

    front = GrpcFront(FrontLimits())
    front.target, front.served = ("127.0.0.1", 9), {"vit"}  # nothing listens on port 9: a lookup would fail, slowly
    assert front.numeric("not-served", "") is None and front.numeric("x" * (MAX_NAME + 1), "") is None
    assert front.outputs == {}


@pytest.mark.parametrize("body, length, message", [
    # was: HTTP 500 "failed to parse the request JSON buffer" from Triton for an image file posted as is
    (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", None, "the request body is not JSON (it starts with b'\\x89PNG"),
    (b"[1, 2]", None, "the request's JSON is a list, not an object"),
    (b'{"inputs": []}', b"99", "Inference-Header-Content-Length '99' is not a length within the 14-byte body"),
    (b'{"inputs": []}', b"x", "Inference-Header-Content-Length 'x' is not a length"),
])
def test_an_inference_body_that_is_not_the_protocols_names_what_it_takes(body, length, message):
    with pytest.raises(Refused) as refused:
        inference_header("vit", body, length)
    text = refused.value.message
    assert refused.value.status == 400 and message in text, text
    assert "POST /v2/models/vit/infer takes a KServe v2 inference request" in text and RAW_HTTP_EXAMPLE in text, text
    # the form itself, not only a path in docs a remote client has no copy of
    assert '"datatype": "BYTES"' in RAW_HTTP_EXAMPLE and "4 little-endian bytes" in RAW_HTTP_EXAMPLE


def test_an_inference_body_of_the_protocol_passes():
    assert inference_header("vit", b'{"inputs": []}', None) == {"inputs": []}
    assert inference_header("vit", b'{"inputs": []}\x00\x01binary', b"14") == {"inputs": []}


def _front_pids(parent: int) -> list[int]:
    return [pid for pid, command in children_of(parent).items() if "hub_vit.server.front.worker" in command]


def test_a_front_that_cannot_bind_leaves_no_process():
    from hub_vit.server.front.workers import FrontProcesses
    from hub_vit.server.runtime.launcher import free_port

    with socket.socket() as taken:  # a port someone else listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port} is already in use"):
            FrontProcesses("127.0.0.1", free_port(), port, FrontLimits(processes=2)).start()
    assert not _front_pids(os.getpid())


def test_front_processes_run_on_uvloop():
    # the front's CPU per request is mostly its event loop and socket calls: libuv's loop is the cheaper one
    from hub_vit.server.front.workers import FrontProcesses
    from hub_vit.server.runtime.launcher import free_port

    front = FrontProcesses("127.0.0.1", free_port(), free_port(), FrontLimits(processes=2)).start()
    try:
        assert [worker.event_loop for worker in front.workers] == ["uvloop", "uvloop"]
    finally:
        front.close()


def test_a_late_reply_is_not_read_as_the_answer_to_the_next_question():
    # was: replies were matched by order, so a worker that answered after its asker stopped waiting (its loop blocked
    # past the deadline) had that late reply read as the answer to the next question, and every later one shifted
    from hub_vit.server.front.workers import FrontProcesses
    from hub_vit.server.runtime.launcher import free_port

    front = FrontProcesses("127.0.0.1", free_port(), free_port(), FrontLimits(processes=2)).start()
    stalled = front.workers[0].process
    try:
        os.kill(stalled.pid, signal.SIGSTOP)  # a worker whose event loop does not run
        answered = front.ask({"op": "upstream", "protocol": "http", "host": None, "port": None}, timeout_s=0.5)
        assert [reply.get("ok") for reply in answered] == [True]  # the other worker's; the stalled one's is to come
        os.kill(stalled.pid, signal.SIGCONT)
        for _ in range(3):
            replies = front.ask({"op": "refusals"})
            assert len(replies) == 2 and all("refusals" in reply for reply in replies), replies
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
        front.close()


def test_the_fronts_counts_are_neither_lost_to_a_late_reply_nor_waited_for_past_the_timeout():
    # a worker takes its counts when it answers: an answer that came after its asker left was dropped with them. And a
    # metrics scrape asks with a short timeout: it must not wait for a worker being replaced (which holds the workers)
    import http.client

    from hub_vit.server.front.workers import FrontProcesses
    from hub_vit.server.runtime.launcher import free_port

    http_port = free_port()
    front = FrontProcesses("127.0.0.1", http_port, free_port(), FrontLimits(processes=2)).start()
    stalled = front.workers[0].process
    try:
        for _ in range(20):  # each on a connection of its own: the kernel spreads them over both workers
            connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            connection.request("PUT", "/v2/models/vit/infer")
            assert connection.getresponse().status == 405
            connection.close()
        os.kill(stalled.pid, signal.SIGSTOP)
        front.answered(timeout_s=0.5)  # the stalled worker's answer, with its counts, comes after this gave up
        os.kill(stalled.pid, signal.SIGCONT)
        assert front.answered() == {"http": {"405": 20}}
        with front._lock:  # held, as while a dead worker is replaced (a plain wait for it would never end here)
            assert front.answered(timeout_s=0.3) == {"http": {"405": 20}}  # the totals as last known
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
        front.close()


def test_a_second_front_on_the_same_ports_fails_instead_of_sharing_them():
    # the front processes share their ports with SO_REUSEPORT, which would let a second serve's processes join them
    from hub_vit.server.front.workers import FrontProcesses, PortLock
    from hub_vit.server.runtime.launcher import free_port

    http, grpc_port = free_port(), free_port()
    first = FrontProcesses("127.0.0.1", http, grpc_port, FrontLimits(processes=2)).start()
    try:
        assert len(_front_pids(os.getpid())) == 2
        with pytest.raises(OSError, match=f"127.0.0.1:{http} is already served by another hub-vit serve "
                                          f"\\(pid {os.getpid()}\\)"):
            FrontProcesses("127.0.0.1", http, grpc_port).start()
    finally:
        first.close()
    assert not _front_pids(os.getpid())
    lock = PortLock("127.0.0.1", grpc_port)  # a serve starting at the same moment: the lock, not the bind, says no
    try:
        with pytest.raises(OSError, match=f"127.0.0.1:{grpc_port} is already served by another hub-vit serve"):
            FrontProcesses("127.0.0.1", free_port(), grpc_port).start()
    finally:
        lock.release()


def test_a_port_claim_leaves_no_file_names_its_holder_and_ends_with_a_killed_holder(tmp_path, monkeypatch):
    # a serve killed with SIGKILL cannot clean up: its claim must end with it, and nothing may stay in /tmp
    from hub_vit.server.front.workers import PortLock
    from hub_vit.server.runtime.launcher import free_port

    port = free_port()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom hub_vit.server.front.workers import PortLock\n"
                               f"claim = PortLock('127.0.0.1', {port})\nprint('held', flush=True)\nsys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(OSError, match=f"127.0.0.1:{port} is already served by another hub-vit serve "
                                          f"\\(pid {holder.pid}\\); choose another port"):
            PortLock("127.0.0.1", port)
    finally:
        holder.kill()
        holder.wait()
    claim = PortLock("127.0.0.1", port)  # the killed holder's claim ended with it
    claim.release()
    PortLock("127.0.0.1", port).release()  # and a released one is free again
    assert not list(tmp_path.iterdir())


def test_front_processes_end_with_a_serve_process_that_was_killed():
    from tests.polling import wait_until

    script = ("from hub_vit.server.front.workers import FrontProcesses\n"
              "from hub_vit.server.front.limits import FrontLimits\n"
              "from hub_vit.server.runtime.launcher import free_port\n"
              "import time\n"
              "front = FrontProcesses('127.0.0.1', free_port(), free_port(), FrontLimits(processes=2)).start()\n"
              "print('started', flush=True)\n"
              "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "started"
        workers = _front_pids(parent.pid)
        assert len(workers) == 2
        parent.kill()  # SIGKILL: no clean-up runs in it
        parent.wait(10)
        assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() and
                                          "Z" not in Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1]
                                          for pid in workers), timeout_s=10)
    finally:
        parent.kill()


def _live_call(port: int) -> tuple[str, bytes | str, float]:
    """`ServerLive` through 127.0.0.1:`port`: ("answered", the answer, seconds) or (grpc's status name, its details,
    seconds)."""
    import time

    import grpc

    from hub_vit.server.front.grpc_front import SERVICE

    start = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            return "answered", channel.unary_unary(SERVICE + "ServerLive")(b"", timeout=30), time.monotonic() - start
        except grpc.RpcError as err:
            return err.code().name, err.details() or "", time.monotonic() - start


def _fake_triton(answer_after_s: float) -> object:
    """A gRPC handler answering every call `ServerLiveResponse(live=True)` after `answer_after_s` seconds."""
    import asyncio

    import grpc

    class Triton(grpc.GenericRpcHandler):
        def service(self, details):
            async def live(message: bytes, context) -> bytes:
                await asyncio.sleep(answer_after_s)
                return b"\x08\x01"
            return grpc.unary_unary_rpc_method_handler(live)
    return Triton()


async def _relayed_to(triton: object, act) -> tuple[str, bytes | str, float]:
    """`_live_call` through a GrpcFront relaying to a server answering as `triton`; `await act(front)` once the front
    holds the call."""
    import asyncio
    import time

    from grpc import aio

    from hub_vit.server.front.grpc_front import GrpcFront
    from hub_vit.server.runtime.launcher import free_port

    upstream, public = free_port(), free_port()
    server = aio.server()
    server.add_generic_rpc_handlers((triton,))
    server.add_insecure_port(f"127.0.0.1:{upstream}")
    await server.start()
    front = GrpcFront(FrontLimits())
    await front.listen("127.0.0.1", public)
    await front.upstream("127.0.0.1", upstream)
    try:
        relayed = asyncio.get_running_loop().run_in_executor(None, _live_call, public)
        deadline = time.monotonic() + 10
        while not front.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert front.in_flight == 1
        await act(front)
        return await relayed
    finally:
        await front.close()
        await server.stop(None)


def test_a_grpc_call_still_relayed_when_the_front_closes_gets_triton_s_answer():
    # was: closing cancelled it (a client saw UNAVAILABLE "Cancelling all calls" or CANCELLED: neither answered nor
    # refused); also the calls being refused "shutting down" at that instant
    import asyncio

    async def drain_then_close(front) -> None:  # Triton answers after the front has been told to close
        front.drain()
        assert not await front.drained(0.05)  # still in flight when the drain's time is up
        await front.close()

    code, answer, _ = asyncio.run(_relayed_to(_fake_triton(0.5), drain_then_close))
    assert (code, answer) == ("answered", b"\x08\x01")


@pytest.mark.parametrize("stopping", [False, True])
def test_a_tritonserver_gone_mid_request_is_named_by_whether_serve_is_stopping(stopping: bool) -> None:
    # was: also while serve stopped (a second signal stops Triton at once) the answer said "it died? hub-vit serve
    # restarts it", and nothing restarted it; a stop is now the protocol's shutting-down fact
    import asyncio

    from hub_vit.server.front.http_front import HttpFront
    from hub_vit.server.runtime.launcher import free_port

    async def scenario() -> tuple[int, dict]:
        front = HttpFront(FrontLimits())
        taken = asyncio.Event()

        async def vanishing_triton(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")  # the relayed request's head: then gone without an answer
            taken.set()
            await asyncio.sleep(0.2)
            writer.close()

        triton = await asyncio.start_server(vanishing_triton, "127.0.0.1", 0)
        public = free_port()
        await front.listen("127.0.0.1", public)
        await front.upstream("127.0.0.1", triton.sockets[0].getsockname()[1])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", public)
            writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(taken.wait(), 10)
            if stopping:
                front.drain()
            got = await _http_answer(reader)
            writer.close()
            return got
        finally:
            await front.close()
            triton.close()

    _assert_lost(*asyncio.run(scenario()), stopping)


async def _http_answer(reader) -> tuple[int, dict | None]:
    """(status, JSON body or None when empty) of the next HTTP answer on `reader`."""
    import asyncio
    import json

    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                 .split(b":")[1])
    body = await reader.readexactly(length)
    return int(head.split()[1]), json.loads(body) if length else None


def _assert_lost(status: int, body: dict | None, stopping: bool) -> None:
    """The front's answer for a request relayed to a tritonserver that went away with it: lost (502), or, while
    serve stops, stopped before answering (503, shutting-down)."""
    assert body is not None
    if stopping:
        assert status == 503 and protocol.read_server_state(body["error"]) == protocol.SHUTTING_DOWN, body
        assert "the server stopped before answering (it is shutting down)" in body["error"], body
    else:
        assert status == 502 and "it died? hub-vit serve restarts it" in body["error"], body


@pytest.mark.parametrize("stopping", [False, True])
def test_a_request_on_a_pooled_connection_to_a_tritonserver_that_died_is_lost_not_restarting(stopping: bool) -> None:
    # was: a request in flight on a pooled connection when Triton died was retried on a fresh one, which could not
    # connect, and answered 503 "restarting": the client's promise that it never reached a server, so `hub-vit
    # classify` sent it again, to the next server too (it may be what killed the first); while serve stopped as well
    import asyncio

    from hub_vit.server.front.http_front import HttpFront
    from hub_vit.server.runtime.launcher import free_port

    async def scenario() -> tuple[int, dict | None]:
        front = HttpFront(FrontLimits())
        taken = asyncio.Event()
        triton: asyncio.Server | None = None

        async def dying_triton(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")  # the first request: answered, the connection kept (pooled)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")  # the second, on the same connection: the server dies with it
            assert triton is not None
            triton.close()  # no new connection can be made: a dead server's port
            taken.set()
            await asyncio.sleep(0.1)
            writer.transport.abort()

        triton = await asyncio.start_server(dying_triton, "127.0.0.1", 0)
        public = free_port()
        await front.listen("127.0.0.1", public)
        await front.upstream("127.0.0.1", triton.sockets[0].getsockname()[1])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", public)
            writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await _http_answer(reader))[0] == 200
            writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(taken.wait(), 10)
            if stopping:
                front.drain()
            got = await _http_answer(reader)
            writer.close()
            return got
        finally:
            await front.close()

    status, body = asyncio.run(scenario())
    assert body is not None and protocol.read_server_state(body["error"]) != protocol.RESTARTING, body
    _assert_lost(status, body, stopping)


def test_a_grpc_call_still_at_triton_when_the_front_closes_is_answered_shutting_down() -> None:
    # was: past the close's grace the connection was closed under it: the client got grpc's own "Socket closed"
    # (UNAVAILABLE, untagged), which it could not tell from a server that died
    import asyncio

    async def drain_then_close(front) -> None:
        front.drain()
        assert not await front.drained(0.05)
        await front.close()

    code, details, seconds = asyncio.run(_relayed_to(_fake_triton(30), drain_then_close))
    assert code == "UNAVAILABLE" and protocol.read_server_state(details) == protocol.SHUTTING_DOWN, (code, details)
    assert seconds < 10, seconds


@pytest.mark.parametrize("stopping", [False, True])
def test_a_grpc_call_whose_server_goes_is_answered_at_once(stopping: bool) -> None:
    # was: serve closing the channel to a dead (or stopped) server cancelled the relayed call inside the front, whose
    # handler then ended without a status: the client waited out its whole deadline (DEADLINE_EXCEEDED after 60 s),
    # where an HTTP client got its 502 within a second
    import asyncio

    async def server_gone(front) -> None:  # a server whose model step died: the call is never answered
        if stopping:
            front.drain()
        await front.upstream(None, None)  # what serve does once the server is dead (or stopped)

    code, details, seconds = asyncio.run(_relayed_to(_fake_triton(60), server_gone))
    assert code == "UNAVAILABLE" and seconds < 10, (code, details, seconds)
    if stopping:
        assert protocol.read_server_state(details) == protocol.SHUTTING_DOWN, details
    else:
        assert "tritonserver closed the connection without an answer" in details, details
        assert protocol.read_server_state(details) is None  # lost, not refused: a client does not just resend it


def test_a_grpc_server_that_does_not_answer_its_port_is_restarting_not_grpc_s_words() -> None:
    # was: "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:56775" (the private port), which
    # clients could not tell from any other UNAVAILABLE, so they did not wait for the restart
    import asyncio

    from hub_vit.server.front.grpc_front import GrpcFront
    from hub_vit.server.runtime.launcher import free_port

    async def scenario(restarts: bool) -> tuple[str, bytes | str, float]:
        public = free_port()
        front = GrpcFront(FrontLimits(restarts=restarts))
        await front.listen("127.0.0.1", public)
        await front.upstream("127.0.0.1", free_port())  # a server that died before serve noticed: nothing listens
        try:
            return await asyncio.get_running_loop().run_in_executor(None, _live_call, public)
        finally:
            await front.close()

    code, details, _ = asyncio.run(scenario(restarts=True))
    assert code == "UNAVAILABLE" and protocol.read_server_state(details) == protocol.RESTARTING, details
    code, details, _ = asyncio.run(scenario(restarts=False))  # serve --max-restarts 0: it is not coming back
    assert code == "UNAVAILABLE" and protocol.read_server_state(details) == protocol.SHUTTING_DOWN, details


def test_the_grpc_front_binds_the_ipv4_address_a_name_stands_for() -> None:
    # was: `--host localhost` also opened the gRPC port on [::1] (grpc binds every address a name resolves to), which
    # an IPv4-only firewall rule does not cover
    import asyncio

    from hub_vit.server.front.grpc_front import GrpcFront
    from hub_vit.server.runtime.launcher import free_port

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")

    def accepts(family: socket.AddressFamily, address: str, port: int) -> bool:
        with socket.socket(family) as probe:
            probe.settimeout(2.0)
            return probe.connect_ex((address, port)) == 0

    async def scenario() -> tuple[bool, bool]:
        port = free_port()
        front = GrpcFront(FrontLimits())
        await front.listen("localhost", port)
        try:
            return accepts(socket.AF_INET, "127.0.0.1", port), accepts(socket.AF_INET6, "::1", port)
        finally:
            await front.close()

    assert asyncio.run(scenario()) == (True, False)
