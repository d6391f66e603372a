"""The gRPC front of the local server: the HTTP gate's checks (gate.py) for Triton's gRPC endpoint.

`hub-vit serve` binds this gate on the public gRPC port and Triton's gRPC endpoint on a private loopback port. Every
method of `inference.GRPCInferenceService` is relayed as raw bytes over one HTTP/2 channel to Triton (so a connection
flood reaches only this process's descriptors); only inference messages are parsed (`ModelInferRequest`, from
tritonclient's protobuf classes). What is refused, with the HTTP gate's words:

* a message over `max_body_bytes`, also once inflated (gzip / deflate message compression): grpc's own
  `max_receive_message_length`, checked before the message reaches this code -> RESOURCE_EXHAUSTED (Triton 2.51
  takes messages up to 2 GB and inflates them whole);
* the classification extension on a non-numeric output (SIGFPE in Triton 2.51), a dimension of 0 or past int32, and
  BYTES contents whose element count differs from the shape (a `[0, 1]` request carrying one image was answered with
  rank-1 outputs) -> INVALID_ARGUMENT;
* `ModelStreamInfer`: each message is checked the same way; the first refused one ends the stream with
  INVALID_ARGUMENT (the answers to the messages before it have been relayed);
* no server behind it (starting, restarting) -> UNAVAILABLE "starting or restarting"; after `drain()` -> UNAVAILABLE
  "shutting down", while calls already relayed get their answers.

Triton's own answers (errors included) go back with Triton's status code and message. The gate runs its own event
loop in a thread of the serving process, as the HTTP gate does.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator
from typing import Any

# serve starts tritonserver with fork + exec while this gate's threads run; grpcio's fork handlers then only log
# "Other threads are currently calling into gRPC, skipping fork() handlers" at every (re)start. Read at import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
from grpc import aio  # noqa: E402

from hub_vit.server.front.http_gate import NUMERIC, SHUTTING_DOWN, STARTING, GateLimits, Refused, check_inference
from hub_vit.server.front.loop_thread import LoopThread, until_idle

SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
STREAM_INFER = SERVICE + "ModelStreamInfer"
METADATA = SERVICE + "ModelMetadata"
# Metadata grpc sets itself on each call; the rest (e.g. the control key of the restricted APIs) is passed on
OWN_METADATA = ("user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout")


def parse_inference(message: bytes) -> Any:
    """A serialized `ModelInferRequest`, parsed; None when it does not parse (Triton answers that itself)."""
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest()
    try:
        request.ParseFromString(message)
    except DecodeError:
        return None
    return request


def inference_refusal(request: Any, numeric_outputs: set[str] | None) -> str | None:
    """Why a `ModelInferRequest` must not reach Triton 2.51 (the HTTP gate's `check_inference`, plus BYTES contents
    that do not match their shape), or None."""
    header = {"inputs": [{"name": tensor.name, "shape": list(tensor.shape)} for tensor in request.inputs],
              "outputs": [{"name": output.name, "parameters": dict.fromkeys(output.parameters)}
                          for output in request.outputs]}
    try:
        check_inference(header, numeric_outputs)
    except Refused as refusal:
        return refusal.message
    raw = request.raw_input_contents
    for index, tensor in enumerate(request.inputs):
        if tensor.datatype != "BYTES" or index >= len(raw):
            continue
        declared, found = _product(tensor.shape), _bytes_elements(raw[index])
        if found is not None and found != declared:
            return (f"input {tensor.name!r} has shape {list(tensor.shape)} ({declared} elements) but its contents hold "
                    f"{found}")
    return None


def _product(shape: Any) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _bytes_elements(raw: bytes) -> int | None:
    """The number of length-prefixed elements in a BYTES tensor's raw contents; None when the framing is broken
    (Triton answers that itself)."""
    count, pos = 0, 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            return None
        pos += 4 + struct.unpack_from("<I", raw, pos)[0]
        count += 1
    return count if pos == len(raw) else None


class GrpcGate:
    """One gRPC front, with the HTTP gate's control methods: `start()`, `upstream(host, port)` (again after each
    restart; None: refuse as restarting), `drain()` / `drained(timeout_s)`, `close()`."""

    protocol = "grpc"  # the server endpoint it relays to (runtime.supervisor.Front)

    def __init__(self, host: str, port: int, limits: GateLimits = GateLimits()) -> None:
        self.host, self.port, self.limits = host, port, limits
        self._channel: aio.Channel | None = None  # to Triton; None: no server ready -> UNAVAILABLE "starting"
        self._outputs: dict[str, set[str] | None] = {}  # model -> its numeric outputs, per upstream
        self._calls: dict[str, Any] = {}  # method -> the channel's multicallable for it, per upstream
        self._in_flight = 0
        self._draining = False
        self._server: aio.Server | None = None
        self._runner = LoopThread("hub-vit-grpc-gate")
        self.refused: dict[str, int] = {}  # status code name -> count, for the log and tests

    # -- control, from any thread ----------------------------------------------------------------------------------
    def start(self) -> GrpcGate:
        self._runner.start()
        try:
            self._call(self._listen())
        except BaseException:
            self.close()
            raise
        return self

    def upstream(self, host: str | None, port: int | None = None) -> None:
        async def switch() -> None:
            old, self._channel = self._channel, None
            self._outputs.clear()
            self._calls.clear()
            if host is not None:
                # Triton's answers are trusted: no receive cap on them (grpc's default is 4 MiB)
                self._channel = aio.insecure_channel(f"{host}:{int(port or 0)}", options=[
                    ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
            if old is not None:
                await old.close(grace=None)
        self._call(switch())

    def drain(self) -> None:
        """New calls get UNAVAILABLE "shutting down" at once; calls already relayed still get their answers."""
        async def start_draining() -> None:
            self._draining = True
        self._call(start_draining())

    def drained(self, timeout_s: float) -> bool:
        return self._call(until_idle(lambda: self._in_flight, timeout_s), timeout_s + 5)

    def close(self) -> None:
        if not self._runner.alive:
            return
        async def stop() -> None:
            if self._server is not None:
                await self._server.stop(grace=None)
            if self._channel is not None:
                await self._channel.close(grace=None)
        try:
            self._call(stop())
        finally:
            self._runner.stop()

    def _call(self, coroutine: Any, timeout_s: float = 10.0) -> Any:
        return self._runner.call(coroutine, timeout_s)

    # -- the event loop's side -------------------------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = aio.server(options=[
            ("grpc.max_receive_message_length", self.limits.max_body_bytes),  # checked on the inflated message too
            ("grpc.max_send_message_length", -1),
            ("grpc.max_allowed_incoming_connections", self.limits.max_connections),
            ("grpc.server_handshake_timeout_ms", int(self.limits.head_timeout_s * 1000)),
            ("grpc.so_reuseport", 0),  # a second serve on the same port must fail, not share it
        ])
        self._server.add_generic_rpc_handlers((_Relay(self),))
        if not self._server.add_insecure_port(f"{self.host}:{self.port}"):
            raise OSError(f"cannot bind the gRPC port {self.host}:{self.port}")
        await self._server.start()

    def _refuse_call(self) -> tuple[grpc.StatusCode, str] | None:
        if self._draining:
            return grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN
        if self._channel is None:
            return grpc.StatusCode.UNAVAILABLE, STARTING
        return None

    async def _abort(self, context: aio.ServicerContext, code: grpc.StatusCode, message: str) -> None:
        self.refused[code.name] = self.refused.get(code.name, 0) + 1
        await context.abort(code, message)

    async def _check(self, message: bytes) -> str | None:
        request = parse_inference(message)
        if request is None:
            return None
        numeric: set[str] | None = set()  # only looked up when a request asks for classification
        if any("classification" in output.parameters for output in request.outputs):
            if request.model_name not in self._outputs:
                self._outputs[request.model_name] = await self._numeric_outputs(request.model_name,
                                                                                request.model_version)
            numeric = self._outputs[request.model_name]
        return inference_refusal(request, numeric)

    async def _numeric_outputs(self, model: str, version: str) -> set[str] | None:
        from tritonclient.grpc import service_pb2

        if self._channel is None:
            return None
        ask = service_pb2.ModelMetadataRequest(name=model, version=version).SerializeToString()
        try:
            answer = await self._channel.unary_unary(METADATA)(ask, timeout=10)
        except aio.AioRpcError:
            return None
        metadata = service_pb2.ModelMetadataResponse()
        metadata.ParseFromString(answer)
        return {output.name for output in metadata.outputs if output.datatype in NUMERIC}

    async def unary(self, method: str, message: bytes, context: aio.ServicerContext) -> bytes:
        refusal = self._refuse_call()
        if refusal is not None:
            await self._abort(context, *refusal)
        if method == INFER:
            why = await self._check(message)
            if why is not None:
                await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, why)
            refusal = self._refuse_call()  # again: the server may have gone while the check awaited its metadata
            if refusal is not None:
                await self._abort(context, *refusal)
        call = self._calls.get(method)
        if call is None:
            assert self._channel is not None
            call = self._calls[method] = self._channel.unary_unary(method)
        self._in_flight += 1
        try:
            return await call(message, metadata=_passed_on(context), timeout=context.time_remaining())
        except aio.AioRpcError as err:
            failure = (err.code(), err.details() or "")
        finally:
            self._in_flight -= 1
        await context.abort(*failure)  # Triton's own status and message
        raise AssertionError("unreachable")

    async def stream(self, method: str, messages: AsyncIterator[bytes],
                     context: aio.ServicerContext) -> AsyncIterator[bytes]:
        refusal = self._refuse_call()
        if refusal is not None:
            await self._abort(context, *refusal)
        channel = self._channel
        assert channel is not None
        call = channel.stream_stream(method)(metadata=_passed_on(context), timeout=context.time_remaining())
        refused: list[str] = []

        async def forward() -> None:
            async for message in messages:
                why = await self._check(message) if method == STREAM_INFER else None
                if why is not None:  # nothing more is sent; the answers to what was are still relayed
                    refused.append(why)
                    break
                await call.write(message)
            await call.done_writing()

        self._in_flight += 1
        writer = asyncio.ensure_future(forward())
        failure = None
        try:
            async for answer in call:
                yield answer
        except (aio.AioRpcError, asyncio.CancelledError) as err:
            if not refused and isinstance(err, aio.AioRpcError):
                failure = (err.code(), err.details() or "")
        finally:
            self._in_flight -= 1
            writer.cancel()
        if refused:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, refused[0])
        if failure is not None:
            await context.abort(*failure)


class _Relay(grpc.GenericRpcHandler):
    """Every `inference.GRPCInferenceService` method, as raw bytes (no (de)serialization: nothing is parsed twice)."""

    def __init__(self, gate: GrpcGate) -> None:
        self.gate = gate

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method  # type: ignore[attr-defined]
        if not method.startswith(SERVICE):
            return None  # grpc answers UNIMPLEMENTED
        if method == STREAM_INFER:
            async def stream(messages: AsyncIterator[bytes], context: aio.ServicerContext) -> AsyncIterator[bytes]:
                async for answer in self.gate.stream(method, messages, context):
                    yield answer
            return grpc.stream_stream_rpc_method_handler(stream)

        async def unary(message: bytes, context: aio.ServicerContext) -> bytes:
            return await self.gate.unary(method, message, context)
        return grpc.unary_unary_rpc_method_handler(unary)


def _passed_on(context: aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    return tuple((key, value) for key, value in context.invocation_metadata() or ()
                 if not key.startswith(":") and key not in OWN_METADATA)
