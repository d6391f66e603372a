"""The gRPC front of one front process: grpcio's asyncio server on the public gRPC port (shared with the other front
processes, SO_REUSEPORT), relaying every method of `inference.GRPCInferenceService` as raw bytes over one HTTP/2 channel
to Triton's private gRPC port (so a connection flood reaches only the front's descriptors). Only inference messages
are parsed (`ModelInferRequest`, tritonclient's protobuf classes). What is refused, in the HTTP front's words:

* a message over the limit, also once inflated (gzip / deflate message compression) -> RESOURCE_EXHAUSTED tagged
  `protocol.too_large`, naming the limit and `--max-request-mb`. grpc itself lets through up to twice the limit
  (`FrontLimits.grpc_receive_bytes`), so the front's own check answers those; past that grpc refuses the message from
  its length prefix, unread, in its own words (`Received message larger than max`), as no grpcio hook rewrites them
  (Triton 2.51 takes messages up to 2 GB and inflates them whole);
* a ModelInfer message that is not a valid `ModelInferRequest` -> INVALID_ARGUMENT;
* the checks of checks.py (classification extension on a non-numeric output, a dimension of 0 or past int32, BYTES
  contents whose element count differs from the shape) -> INVALID_ARGUMENT;
* `ModelStreamInfer`: each message is checked the same way; the first refused one ends the stream with its refusal
  (the answers to the messages before it have been relayed);
* no server behind it (starting, restarting; or its private port not answering: it died before serve noticed) ->
  UNAVAILABLE "starting or restarting" (with `--max-restarts 0`: "shutting down"); after `drain()` -> UNAVAILABLE
  "shutting down", while calls already relayed get their answers;
* a call relayed to a server that died or was stopped before answering -> UNAVAILABLE with the HTTP front's 502 words
  (lost, not refused: it may have run).

Malformed HTTP/2 (a frame past the negotiated size, a header block that is not HPACK, HTTP/1.1 on this port) is
grpc's own: it ends the connection. Triton's own answers (errors included) go back with Triton's status and message;
metadata (such as the control key of the restricted APIs) is passed on.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

# serve starts tritonserver with fork + exec while grpc threads run in it; grpcio's fork handlers then only log "Other
# threads are currently calling into gRPC, skipping fork() handlers". Read at import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
from grpc import aio  # noqa: E402

from hub_vit.ports import ipv4_address  # noqa: E402
from hub_vit.server.front.checks import (  # noqa: E402
    LOST,
    SHUTTING_DOWN,
    STARTING,
    STOPPED,
    inference_refusal,
    numeric_outputs,
    parse_inference,
    too_large,
    unreachable,
)
from hub_vit.server.front.limits import FrontLimits  # noqa: E402

SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
STREAM_INFER = SERVICE + "ModelStreamInfer"
METADATA = SERVICE + "ModelMetadata"
CLOSE_GRACE_S = 2.0  # at close, how long calls already taken may still run
# Metadata grpc sets itself on each call; the rest (e.g. the control key of the restricted APIs) is passed on
OWN_METADATA = ("user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout")


class GrpcFront:
    """The gRPC front of one process. Coroutines of the process's event loop only."""

    def __init__(self, limits: FrontLimits) -> None:
        self.limits = limits
        self.channel: aio.Channel | None = None  # to Triton; None: no server ready -> UNAVAILABLE "starting"
        self.outputs: dict[str, set[str] | None] = {}  # model -> its numeric outputs, per upstream
        self.calls: dict[str, Any] = {}  # method -> the channel's multicallable for it, per upstream
        self.in_flight = 0
        self.draining = False
        self.server: aio.Server | None = None

    async def listen(self, host: str, port: int) -> None:
        self.server = aio.server(options=[
            ("grpc.max_receive_message_length", self.limits.grpc_receive_bytes),  # the inflated message too
            ("grpc.max_send_message_length", -1),
            ("grpc.max_allowed_incoming_connections", self.limits.share(self.limits.max_connections)),
            ("grpc.server_handshake_timeout_ms", int(self.limits.head_timeout_s * 1000)),
            ("grpc.so_reuseport", 1),  # shared with the other front processes; workers.py keeps other serves out
        ])
        self.server.add_generic_rpc_handlers((_Relay(self),))
        # the IPv4 address, not the name: grpc binds every address a name resolves to (`localhost`: [::1] too).
        # 0.0.0.0 stays grpc's wildcard, which is dual-stack: every IPv6 address as well (exposure_warning says so)
        if not self.server.add_insecure_port(f"{ipv4_address(host)}:{port}"):
            raise OSError(f"cannot bind the gRPC port {host}:{port}")
        await self.server.start()

    async def upstream(self, host: str | None, port: int | None) -> None:
        old, self.channel = self.channel, None
        self.outputs.clear()
        self.calls.clear()
        if host is not None:
            # Triton's answers are trusted: no receive cap on them (grpc's default is 4 MiB)
            self.channel = aio.insecure_channel(f"{host}:{int(port or 0)}", options=[
                ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        if old is not None:
            await old.close(grace=None)

    def drain(self) -> None:
        self.draining = True

    async def drained(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self.in_flight

    async def close(self) -> None:
        if self.server is not None:
            # grace: the calls grpc has already taken (being refused "shutting down", or relayed past `drained`'s
            # timeout) end with their own answer; without it grpc cancels them (CANCELLED / UNAVAILABLE "Cancelling
            # all calls", to a client: neither answered nor refused). Calls it has not taken are refused unprocessed
            # (GOAWAY), and their clients' reconnects find the port closed.
            await self.server.stop(grace=CLOSE_GRACE_S)
        if self.channel is not None:
            await self.channel.close(grace=None)

    # -- the calls ---------------------------------------------------------------------------------------------------
    def _refuse_call(self) -> tuple[grpc.StatusCode, str] | None:
        if self.draining:
            return grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN
        if self.channel is None:
            return grpc.StatusCode.UNAVAILABLE, STARTING
        return None

    async def _check(self, message: bytes) -> tuple[grpc.StatusCode, str] | None:
        """Why an inference message is refused (status, message), or None."""
        oversize = self._too_large(message)
        if oversize is not None:
            return oversize
        request = parse_inference(message)
        if request is None:
            return grpc.StatusCode.INVALID_ARGUMENT, "the message is not an inference.ModelInferRequest (protobuf)"
        numeric: set[str] | None = set()  # only looked up when a request asks for classification
        if any("classification" in output.parameters for output in request.outputs):
            if request.model_name not in self.outputs:
                self.outputs[request.model_name] = await self._numeric_outputs(request.model_name,
                                                                               request.model_version)
            numeric = self.outputs[request.model_name]
        why = inference_refusal(request, numeric, self.limits.queue_timeouts)
        return None if why is None else (grpc.StatusCode.INVALID_ARGUMENT, why)

    def _too_large(self, message: bytes) -> tuple[grpc.StatusCode, str] | None:
        limit = self.limits.max_body_bytes
        if len(message) <= limit:
            return None
        why = f"the gRPC message is {len(message)} bytes (inflated, if it came compressed), over the limit of {limit}"
        return grpc.StatusCode.RESOURCE_EXHAUSTED, too_large(limit, why).message

    async def _numeric_outputs(self, model: str, version: str) -> set[str] | None:
        from tritonclient.grpc import service_pb2

        if self.channel is None:
            return None
        ask = service_pb2.ModelMetadataRequest(name=model, version=version).SerializeToString()
        try:
            answer = await self.channel.unary_unary(METADATA)(ask, timeout=10)
        except aio.AioRpcError:
            return None
        metadata = service_pb2.ModelMetadataResponse()
        metadata.ParseFromString(answer)
        return numeric_outputs(metadata)

    async def unary(self, method: str, message: bytes, context: aio.ServicerContext) -> bytes:
        refusal = self._refuse_call()
        if refusal is None and method == INFER:
            refusal = await self._check(message) or self._refuse_call()  # the server may have gone meanwhile
        elif refusal is None:
            refusal = self._too_large(message)
        if refusal is not None:
            await context.abort(*refusal)
        channel, call = self.channel, self.calls.get(method)
        assert channel is not None
        if call is None:
            call = self.calls[method] = channel.unary_unary(method)
        self.in_flight += 1
        try:
            return await call(message, metadata=_passed_on(context), timeout=context.time_remaining())
        except aio.AioRpcError as err:
            failure = self._failure(err, channel)
        except asyncio.CancelledError:
            if self.channel is channel:  # this call itself was cancelled (its client went away)
                raise
            failure = self._lost()  # its server was replaced or stopped: the channel to it was closed under the call
        finally:
            self.in_flight -= 1
        await context.abort(*failure)
        raise AssertionError("unreachable")

    def _failure(self, err: aio.AioRpcError, channel: aio.Channel) -> tuple[grpc.StatusCode, str]:
        """What a client is told of a relayed call that failed: Triton's own status and message, or, where the
        private port did not answer (the channel failed to connect: the server died before serve noticed), the same
        server state the HTTP front gives for it, never grpc's words naming the private port."""
        if err.code() == grpc.StatusCode.UNAVAILABLE and \
                channel.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return grpc.StatusCode.UNAVAILABLE, unreachable(self.limits.restarts)
        return err.code(), err.details() or ""

    def _lost(self) -> tuple[grpc.StatusCode, str]:
        """A call in flight when its server went: grpc cancels it when the channel closes, and a handler that ended
        with that cancellation sent no status, so its client waited out its whole deadline."""
        return grpc.StatusCode.UNAVAILABLE, STOPPED if self.draining else LOST

    async def stream(self, method: str, messages: AsyncIterator[bytes],
                     context: aio.ServicerContext) -> AsyncIterator[bytes]:
        refusal = self._refuse_call()
        if refusal is not None:
            await context.abort(*refusal)
        channel = self.channel
        assert channel is not None
        call = channel.stream_stream(method)(metadata=_passed_on(context), timeout=context.time_remaining())
        refused: list[tuple[grpc.StatusCode, str]] = []

        async def forward() -> None:
            async for message in messages:
                why = await self._check(message) if method == STREAM_INFER else None
                if why is not None:  # nothing more is sent; the answers to what was are still relayed
                    refused.append(why)
                    break
                await call.write(message)
            await call.done_writing()

        self.in_flight += 1
        writer = asyncio.ensure_future(forward())
        failure = None
        try:
            async for answer in call:
                yield answer
        except aio.AioRpcError as err:
            if not refused:
                failure = self._failure(err, channel)
        except asyncio.CancelledError:
            if not refused and self.channel is not channel:  # as in `unary`: the channel closed under the stream
                failure = self._lost()
        finally:
            self.in_flight -= 1
            writer.cancel()
        if refused:
            await context.abort(*refused[0])
        if failure is not None:
            await context.abort(*failure)


class _Relay(grpc.GenericRpcHandler):
    """Every `inference.GRPCInferenceService` method, as raw bytes (no (de)serialization: nothing is parsed twice)."""

    def __init__(self, front: GrpcFront) -> None:
        self.front = front

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method  # type: ignore[attr-defined]
        if not method.startswith(SERVICE):
            return None  # grpc answers UNIMPLEMENTED
        if method == STREAM_INFER:
            async def stream(messages: AsyncIterator[bytes], context: aio.ServicerContext) -> AsyncIterator[bytes]:
                async for answer in self.front.stream(method, messages, context):
                    yield answer
            return grpc.stream_stream_rpc_method_handler(stream)

        async def unary(message: bytes, context: aio.ServicerContext) -> bytes:
            return await self.front.unary(method, message, context)
        return grpc.unary_unary_rpc_method_handler(unary)


def _passed_on(context: aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    return tuple((key, value) for key, value in context.invocation_metadata() or ()
                 if not key.startswith(":") and key not in OWN_METADATA)

