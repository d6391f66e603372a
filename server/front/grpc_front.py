"""The gRPC front of one front process: HTTP/2 relayed to Triton's private gRPC port as it comes, watched frame by
frame on the way in, on the public gRPC port (shared with the other front processes, SO_REUSEPORT).

Each client connection gets its own connection to Triton (`grpc_calls.Connection`). The bytes go through unchanged,
both ways, so flow control, settings, pings and metadata (such as the control key of the restricted APIs) stay end to
end. On the way in the front reads every frame header, decodes every header block with hpack (keeping the client's
HPACK state) and reassembles each call's gRPC messages. A message's DATA frames are passed on as they come, except the
frame that completes the message: that frame is held until the message passes the checks, so Triton never has a
refused message whole. A refused call is ended on both sides: RST_STREAM (CANCEL) to Triton, and to the client a gRPC
status written with HPACK representations that leave the client's header table as Triton left it (`h2.grpc_status`).
What is refused, in the HTTP front's words:

* a message over the limit, from its length prefix before it is read, or once inflated (gzip / deflate message
  compression, inflated in bounded steps) -> RESOURCE_EXHAUSTED tagged `protocol.too_large`, naming the limit and
  `--max-request-mb` (Triton 2.51 takes messages up to 2 GB and inflates them whole);
* a message compressed with an encoding Triton does not read -> UNIMPLEMENTED;
* a ModelInfer message that is not a valid `ModelInferRequest` -> INVALID_ARGUMENT;
* the checks of checks.py (classification extension on a non-numeric output, a dimension of 0 or past int32, BYTES
  contents whose element count differs from the shape, a queue timeout the server does not apply) -> INVALID_ARGUMENT;
* `ModelStreamInfer`: each message is checked the same way; the first refused one is not passed on, the stream is
  closed towards Triton and ends with the refusal once Triton has answered the messages before it;
* messages being reassembled past the process's share of the bytes the front holds at once
  (`FrontLimits.max_buffered_bytes`, bounded apart from the HTTP front's bodies) -> UNAVAILABLE, retry shortly;
* no server behind it (starting, restarting; or its private port not answering: it died before serve noticed) ->
  UNAVAILABLE "starting or restarting" (with `--max-restarts 0`: "shutting down"), answered by the front itself;
  after `drain()` -> UNAVAILABLE "shutting down", while calls already relayed get their answers;
* a call relayed to a server that died or was stopped before answering -> UNAVAILABLE with the HTTP front's 502 words
  (lost, not refused: it may have run); the connection then ends (GOAWAY), and the client's next call reconnects.

Malformed HTTP/2 ends the connection. An HTTP/1.x request line (curl at this port) gets an HTTP/1.1 400 tagged
`protocol.port_speaks`, naming the HTTP port (nothing of Triton's reaches a client before its preface; a line that
arrives in pieces is waited for, up to 8 KiB and the head timeout); other bytes that are not the connection preface are
closed at once; after the preface a GOAWAY names the error: a frame over 16 KiB
(Triton's SETTINGS reach the client with their frame size lowered to that, as the front holds each client frame whole),
a header block that is not HPACK or is larger than the head limit, a padded HEADERS or DATA frame (grpc reads HEADERS
padding as header block: what the front checked would not be what Triton runs), a frame inside a header block, a
CONTINUATION of nothing. A connection that has not sent its preface and first frame within the head timeout is closed,
and connections past the process's share of `--max-connections` are closed at once.
"""

from __future__ import annotations

import asyncio
import os

from hub_vit.ports import ipv4_address
from hub_vit.server.front.checks import numeric_outputs
from hub_vit.server.front.grpc_calls import SERVICE, Connection
from hub_vit.server.front.limits import FrontLimits
from hub_vit.server.front.refusals import Refusals

# serve starts tritonserver with fork + exec while grpc threads (the metadata lookups) run in it; grpcio's fork
# handlers then only log "Other threads are currently calling into gRPC, skipping fork() handlers". Read at import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

METADATA = SERVICE + "ModelMetadata"
INDEX = SERVICE + "RepositoryIndex"
CLOSE_GRACE_S = 2.0  # at close, how long calls already relayed may still run
LOOKUP_TIMEOUT_S = 5.0
MAX_LOOKUPS, MAX_NAME = 64, 1024  # per server: models (and versions) looked up on demand; the longest name asked for


class GrpcFront:
    """The gRPC front of one process. Coroutines and callbacks of the process's event loop only."""

    def __init__(self, limits: FrontLimits, http_port: int | None = None) -> None:
        self.limits = limits
        self.http_port = http_port  # the public HTTP port, named to a client that sends HTTP/1.1 to this one
        self.max_connections = limits.share(limits.max_connections)
        self.max_buffered = limits.share(limits.max_buffered_bytes)
        self.target: tuple[str, int] | None = None  # Triton's private gRPC port; None: no server ready -> "starting"
        self.outputs: dict[tuple[str, str], set[str] | None] = {}  # (model, version) -> numeric outputs, per upstream
        self.connections: set[Connection] = set()
        self.in_flight = 0  # calls relayed and not answered yet
        self.buffered = 0  # bytes of messages held for checking
        self.draining = False
        self.refusals = Refusals()  # answers the front gave itself, by code, for serve's log
        self.server: asyncio.base_events.Server | None = None
        self._prefetch: asyncio.Task | None = None
        self.served: set[str] | None = None  # the ready models, once the lookup ahead has listed them

    async def listen(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        # the IPv4 address of a name, as Triton binds it (`localhost` would add [::1])
        self.server = await loop.create_server(lambda: Connection(self), ipv4_address(host), port, backlog=1024,
                                               reuse_address=True, reuse_port=True)

    async def upstream(self, host: str | None, port: int | None) -> None:
        """Relay new connections to Triton's private port at host:port (None: no server). serve calls this once the
        old server is dead or stopped: the calls still relayed to it are answered as lost (stopped, when draining)."""
        self.target = None if host is None else (host, int(port or 0))
        self.outputs.clear()
        self.served = None
        for connection in list(self.connections):
            if connection.upstream is not None:
                connection.upstream.lost()
        if self._prefetch is not None:
            self._prefetch.cancel()
        if self.target is not None:  # the models' outputs, so a classification request is not kept waiting
            self._prefetch = asyncio.ensure_future(asyncio.to_thread(self._prefetch_outputs, self.target))

    def drain(self) -> None:
        self.draining = True

    async def drained(self, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return not self.in_flight

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._prefetch is not None:
            self._prefetch.cancel()
        for connection in list(self.connections):
            connection.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_GRACE_S
        while self.in_flight and loop.time() < deadline:  # calls already relayed end with their own answer
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            if connection.upstream is not None:  # the calls still at Triton are answered "stopped", then it closes
                connection.upstream.lost()
            else:
                connection.close()

    # -- the models' numeric outputs (the classification check) ------------------------------------------------------
    def numeric(self, model: str, version: str) -> set[str] | None:
        """The numeric outputs of `model` (None: unknown, so classification is refused). Looked up once per server,
        normally ahead of time (every ready model); another version of a served model, or any model before that
        lookup has ended, is asked for here, blocking this loop for one local call: at most MAX_LOOKUPS of them per
        server, for names of a plausible length (a client chooses them)."""
        key = (model, version)
        if key in self.outputs:
            return self.outputs[key]
        if self.target is None or (self.served is not None and model not in self.served) \
                or len(model) > MAX_NAME or len(version) > MAX_NAME or len(self.outputs) >= MAX_LOOKUPS:
            return None
        self.outputs[key] = found = _lookup(self.target, model, version)
        return found

    def _prefetch_outputs(self, target: tuple[str, int]) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        with grpc.insecure_channel(f"{target[0]}:{target[1]}") as channel:
            try:
                index = service_pb2.RepositoryIndexResponse.FromString(channel.unary_unary(INDEX)(
                    service_pb2.RepositoryIndexRequest(ready=True).SerializeToString(), timeout=LOOKUP_TIMEOUT_S))
            except grpc.RpcError:
                return
        for model in index.models:
            found = _lookup(target, model.name, "")
            if self.target == target:
                self.outputs.setdefault((model.name, ""), found)
        if self.target == target:
            self.served = {model.name for model in index.models}


def _lookup(target: tuple[str, int], model: str, version: str) -> set[str] | None:
    import grpc
    from tritonclient.grpc import service_pb2

    ask = service_pb2.ModelMetadataRequest(name=model, version=version).SerializeToString()
    with grpc.insecure_channel(f"{target[0]}:{target[1]}") as channel:
        try:
            answer = channel.unary_unary(METADATA)(ask, timeout=LOOKUP_TIMEOUT_S)
        except grpc.RpcError:
            return None
    return numeric_outputs(service_pb2.ModelMetadataResponse.FromString(answer))


__all__ = ["CLOSE_GRACE_S", "SERVICE", "GrpcFront"]
