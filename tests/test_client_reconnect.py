"""A gRPC client reconnects soon after its server comes back, however long it was away.

grpc's default reconnect backoff grows 1.6x per failed attempt up to 120 s: a client that had seen the server down
for a minute (a redeploy, `hub-vit serve` stopped and started again) kept failing with "failed to connect to all
addresses" for tens of seconds after it was back. The clients cap it (`RECONNECT_BACKOFF_MS`: at most 2 s).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from grpc import aio

from hub_vit.server.client.classifier import RECONNECT_BACKOFF_MS, AsyncClassifier, Classifier
from hub_vit.server.runtime.launcher import free_port

SERVICE = "/inference.GRPCInferenceService/"
OUTAGE_S = 30.0  # grpc's default backoff has grown to about 17 s (+-20 %) by then; the capped one stays at 2 s


class _Ready(grpc.GenericRpcHandler):
    """Triton's readiness methods, answering ready: all a client asks here."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        from tritonclient.grpc import service_pb2

        answers = {"ServerReady": service_pb2.ServerReadyResponse(ready=True),
                   "ModelReady": service_pb2.ModelReadyResponse(ready=True)}
        answer = answers.get(details.method.removeprefix(SERVICE))  # type: ignore[attr-defined]
        if answer is None:
            return None

        async def unary(message: bytes, context: aio.ServicerContext) -> bytes:
            return answer.SerializeToString()
        return grpc.unary_unary_rpc_method_handler(unary)


@contextmanager
def ready_server(port: int) -> Iterator[None]:
    """A gRPC server on 127.0.0.1:`port`, in a thread of its own, until the block ends."""
    loop = asyncio.new_event_loop()
    started, stop = threading.Event(), asyncio.Event()

    async def run() -> None:
        server = aio.server()
        server.add_generic_rpc_handlers((_Ready(),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        started.set()
        await stop.wait()
        await server.stop(None)

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def _reconnect_s(ready) -> float:
    """Seconds from the server's start to the first readiness answer, after OUTAGE_S of failed calls every 0.2 s."""
    port = free_port()
    ask = ready(port)
    end = time.monotonic() + OUTAGE_S
    while time.monotonic() < end:
        try:
            answered = ask()  # Classifier.ready: False where no server answers
        except Exception:  # noqa: BLE001 (UNAVAILABLE, as tritonclient reports it)
            answered = False
        assert not answered
        time.sleep(0.2)
    with ready_server(port):
        back = time.monotonic()
        while time.monotonic() - back < 60:
            try:
                if ask():
                    return time.monotonic() - back
            except Exception:  # noqa: BLE001 (still backing off)
                time.sleep(0.05)
    raise AssertionError("no answer within 60 s of the server's return")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_grpc_client_reconnects_within_seconds_of_its_servers_return(kind: str) -> None:
    def ready(port: int):
        if kind == "sync":
            client = Classifier(f"127.0.0.1:{port}", protocol="grpc", timeout_s=1)
            return client.ready
        client = AsyncClassifier(f"127.0.0.1:{port}", protocol="grpc", timeout_s=1)
        loop = asyncio.new_event_loop()  # one loop for all calls: the client's channel belongs to it

        async def ready() -> bool:
            return (await (await client._current()).is_server_ready(client_timeout=1))
        return lambda: loop.run_until_complete(ready())

    waited = _reconnect_s(ready)
    cap_s = RECONNECT_BACKOFF_MS["grpc.max_reconnect_backoff_ms"] / 1000
    assert waited < 2 * cap_s + 1, f"{waited:.1f} s after the server was back"  # was 10 to 40 s
