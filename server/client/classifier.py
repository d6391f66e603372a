"""Python clients for the served classifier (sync and async, HTTP and gRPC, over tritonclient).

    with Classifier("127.0.0.1:8000") as clf:               # or protocol="grpc", url "127.0.0.1:8001"
        for p in clf.classify(["cat.jpg", b"...png bytes...", pil_image]):
            print(p.labels[0], p.scores[0])
        p = clf.classify("cat.jpg", explain=True)[0]      # + p.rollout (H', W') on p.rollout_box of the image

Images travel encoded (`images.py`); decoding, resizing and normalising happen on the server, exactly once, with the
model's own transform. What a request and its answer hold is `messages.py`; what a failure means, `errors.py`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hub_vit.ports import HTTP_PORT, LOOPBACK
from hub_vit.server import protocol
from hub_vit.server.client.addresses import PROTOCOLS, check_model_name, check_timeout, resolve_protocol, server_address
from hub_vit.server.client.errors import (
    ClientClosed,
    ImageTooLarge,
    NoExplanation,
    NoQueueTimeouts,
    no_server,
    renumbered,
    too_large,
    too_large_limit,
)
from hub_vit.server.client.images import ImageLike, as_batch, check_images, encode, encoded_off_loop
from hub_vit.server.client.messages import (
    Prediction,
    PreparedRequest,
    RequestLimit,
    ServedConfig,
    build_request,
    check_flag,
    explain_parameters,
    model_counts,
    parse_result,
    queue_timeout,
    split,
)

# Requests one AsyncClassifier.classify call keeps in flight: enough to keep the dynamic batcher fed, few enough that
# a long list does not fill the server's queue (max_queue_size) and get its tail rejected as an overload.
MAX_IN_FLIGHT = 4
# aiohttp, under tritonclient's asyncio HTTP client, asks for compressed answers by default ("Accept-Encoding: gzip,
# deflate, br"), and Triton then gzips every answer: CPU on both ends for a few hundred bytes of top-k, or float logits
# that hardly shrink (seen in a profile: about 1% of a loaded 2-core server, plus the client's inflate). The blocking
# client asks for nothing, so answers come plain.
PLAIN_ANSWERS = {"Accept-Encoding": "identity"}


# gRPC's reconnect backoff, capped: grpc's default grows 1.6x per failed attempt up to 120 s, so a client that saw a
# server down for a minute kept failing ("failed to connect to all addresses") for tens of seconds after it was back.
# Not `grpc.min_reconnect_backoff_ms`: grpc takes it as each connection attempt's timeout too (20 s by default), and
# at 250 ms a server slow to complete its HTTP/2 handshake failed the call (UNAVAILABLE, not its deadline).
RECONNECT_BACKOFF_MS = {"grpc.initial_reconnect_backoff_ms": 250, "grpc.max_reconnect_backoff_ms": 2000}


def grpc_channel_args() -> list[tuple[str, int]]:
    """tritonclient's own gRPC channel settings (message sizes, keep-alive), which any `channel_args` replace whole,
    with the reconnect backoff capped (RECONNECT_BACKOFF_MS)."""
    from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions

    keepalive = KeepAliveOptions()
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            *RECONNECT_BACKOFF_MS.items()]


def _module(protocol: str, aio: bool = False) -> Any:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if protocol == "http":
        import tritonclient.http as http
        import tritonclient.http.aio as http_aio

        return http_aio if aio else http
    import tritonclient.grpc as grpc
    import tritonclient.grpc.aio as grpc_aio

    return grpc_aio if aio else grpc


def requests(encoded: list[bytes], offset: int, limit: RequestLimit) -> deque[tuple[int, list[bytes]]]:
    """Encoded images (`offset`, ... in the caller's list; at most the model's max_batch_size) in requests no larger
    than the server takes as far as `limit` knows; `ImageTooLarge` for one over a known limit, before anything is
    sent."""
    for index, image in enumerate(encoded):
        if limit.never_fits(image):
            raise ImageTooLarge(offset + index, len(image), limit.max_bytes)
    return deque((offset + start, chunk) for start, chunk in split(encoded, 0, limit.max_bytes))


def smaller_requests(err: Exception, offset: int, chunk: list[bytes],
                     limit: RequestLimit) -> deque[tuple[int, list[bytes]]]:
    """What to send instead of `chunk` (images `offset`, ... of the caller's list) after the server refused it with
    `err`: after a refusal for its size, the same images in smaller requests (learning the limit from the front's
    fact, or halving). Raises the error the caller gets otherwise: `ImageTooLarge` for an image refused alone as
    too large, the server's error, renumbered to the caller's list, for any other refusal."""
    if not too_large(err):
        raise renumbered(err, offset) from None
    limit.refused(too_large_limit(err), chunk)  # also from an image refused alone: the next requests are told
    if len(chunk) == 1:
        raise ImageTooLarge(offset, len(chunk[0]), too_large_limit(err), " ".join(str(err).split())) from None
    return requests(chunk, offset, limit)


def refusal(model: str, config: ServedConfig, explain: bool, queue_timeout_s: float | None) -> ValueError | None:
    """The error for a request the served model's repository says it would refuse (protocol.py), before it is sent:
    `explain` without an explanation, a queue timeout without a queue policy; None otherwise."""
    if explain and (refused := no_explanation(model, config)) is not None:
        return refused
    if queue_timeout_s is not None and protocol.queue_timeouts(config.parameters) is False:
        return NoQueueTimeouts(f"the served model {model!r} applies no per-request queue timeout: its server runs "
                               "without Triton's queue policy, which is what applies one (hub-vit serve "
                               "--no-queue-policy, the default on cuda; --queue-policy keeps it); send the request "
                               "without a queue timeout (queue_timeout_s; hub-vit classify and loadtest: "
                               "--queue-timeout-ms)")
    return None


def no_explanation(model: str, config: ServedConfig) -> NoExplanation | None:
    """The error for an `explain` request to a model whose repository says it has no explanation (protocol.py), or
    None (it has one, or its config does not say: Triton then answers for itself)."""
    if protocol.explains(config.parameters) is not False:
        return None
    return NoExplanation(f"the served model {model!r} has no explanation (no rollout output): explanations are "
                         "served by the CPU and torch flavours of a repository built from a hub-vit model (a name or "
                         "folder, not an .onnx file), with options.explain on; ask without explain (hub-vit "
                         "classify: --explain)")


class Classifier:
    """Blocking client. `url` is `host:port` (8000 for HTTP, 8001 for gRPC by default); see `server_address`.
    `protocol` is "http" or "grpc"; None (the default) takes it from a `grpc://` / `http://` URL, else HTTP.

    One Classifier may be shared by threads (a web app's request handlers): tritonclient's HTTP client belongs to the
    thread that made it (geventhttpclient: a request from another thread waited forever), so each thread that calls
    gets an HTTP client of its own, closed when the thread ends or by `close` (the thread's gevent loop is destroyed
    once the thread has ended, at `close` or when another thread makes its client); gRPC's client, whose channel is
    thread-safe, is one. A process forked from the one that made it (multiprocessing, gunicorn --preload) makes its
    own clients at its first call."""

    def __init__(self, url: str = f"{LOOPBACK}:{HTTP_PORT}", *, protocol: str | None = None, model: str = "vit",
                 timeout_s: float = 60.0) -> None:
        address, tls = server_address(url)
        protocol = resolve_protocol(url, protocol)
        check_timeout(timeout_s)
        check_model_name(model)
        self.module, self.model, self.protocol = _module(protocol), model, protocol
        if protocol == "http":
            settings = {"ssl": tls, "connection_timeout": timeout_s, "network_timeout": timeout_s}
        else:
            settings = {"ssl": tls, "channel_args": grpc_channel_args()}
        self._connect = lambda: self.module.InferenceServerClient(address, **settings)
        self.url, self._closed = url, False
        self._start()  # its first client made here, so a bad address is refused now
        self._inherited: list[Any] = []  # a forked child's copies of its parent's clients: never used, never closed
        self.timeout_s = timeout_s
        # gRPC calls take their deadline per call (HTTP's was set on the connection): a server that accepts and then
        # stalls must not hang the caller
        self._deadline = {"client_timeout": timeout_s} if protocol == "grpc" else {}
        self._config: ServedConfig | None = None  # read from the server once
        self.request_limit = RequestLimit()  # learned from the server's refusals of requests too large

    def config(self) -> ServedConfig:
        """The served model's batch limit and what its repository says it serves (read once)."""
        if self._config is None:
            self._config = ServedConfig.read(self.client.get_model_config(self.model, **self._deadline))
        return self._config

    def max_batch_size(self) -> int:
        """Most images the served model takes in one request (its config's `max_batch_size`; 0 = no limit)."""
        return self.config().max_batch_size

    def classify(self, images: Iterable[ImageLike] | ImageLike, *, with_logits: bool = False,
                 queue_timeout_s: float | None = None, explain: bool = False, head_fusion: str | None = None,
                 discard_ratio: float | None = None) -> list[Prediction]:
        """Predictions in the order of `images`; a list longer than the model's `max_batch_size` is sent as several
        requests (the server refuses larger ones), and so are images together larger than the server takes in one
        request (`hub-vit serve --max-request-mb`: learned from its first refusal). A server error names the image by
        its index in `images`; `ImageTooLarge` names one that no request can carry.
        `queue_timeout_s`: the server rejects a request ("Request timeout expired", HTTP 503 / gRPC UNAVAILABLE)
        that waits longer than this in a step's queue, instead of computing an answer nobody waits for any more;
        None: the repository's own limit (none by default).
        `explain`: each Prediction also holds the server's rollout map and the crop box it covers; `head_fusion`
        ('mean', 'max', 'min') and `discard_ratio` ([0, 1)) as in `hub-vit rollout`, its defaults when None.
        Every argument, and every image as far as it can be without reading it (empty bytes, an empty or missing
        file), is checked before any connection: ValueError / TypeError naming it."""
        batch = as_batch(images)
        with_logits = check_flag(with_logits, "with_logits")
        parameters = explain_parameters(explain, head_fusion, discard_ratio)  # `explain` checked with its settings
        check_images(batch)  # before the config's round trip too: a bad image was found only once connected
        kwargs = queue_timeout(queue_timeout_s) | self._deadline | ({"parameters": parameters} if parameters else {})
        refused = refusal(self.model, self.config(), explain, queue_timeout_s) if explain or queue_timeout_s else None
        if refused is not None:
            raise refused
        limit = self.max_batch_size() if len(batch) > 1 else 0  # one image fits any model: no config round trip
        predictions: list[Prediction] = []
        for start, images in split(batch, limit):  # encoded one max_batch_size at a time
            pending = requests([encode(image) for image in images], start, self.request_limit)
            while pending:
                offset, chunk = pending.popleft()
                inputs, outputs = build_request(self.module, chunk, with_logits, explain)
                try:
                    result = self.client.infer(self.model, inputs, outputs=outputs, **kwargs)
                except Exception as err:
                    pending.extendleft(reversed(smaller_requests(err, offset, chunk, self.request_limit)))
                    continue
                predictions.extend(parse_result(result, with_logits, explain))
        return predictions

    def served_model(self) -> str | None:
        """The model the served ensemble was generated from (written by `hub-vit repository`: protocol.py), or None
        for a model hub-vit did not generate."""
        return protocol.served_model(self.config().parameters)

    def takes_queue_timeouts(self) -> bool:
        """Whether the served model applies `classify(queue_timeout_s=...)` (its repository has Triton's queue
        policy); True when its config does not say (a repository hub-vit did not write: Triton decides)."""
        return protocol.queue_timeouts(self.config().parameters) is not False

    def ready(self) -> bool:
        """Whether the server and the model are ready; False, too, when no server answers at the address (nothing
        listens, a restart, no answer within `timeout_s`), so `if client.ready():` needs no try."""
        from tritonclient.utils import InferenceServerException

        try:
            return (bool(self.client.is_server_ready(**self._deadline))
                    and bool(self.client.is_model_ready(self.model, **self._deadline)))
        except (ConnectionError, TimeoutError):  # HTTP: refused, reset, timed out (socket.timeout included)
            return False
        except InferenceServerException as err:  # gRPC: no server, no answer in time, or serve's gate's state
            if err.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED") or no_server(err):
                return False
            raise

    def statistics(self) -> dict[str, dict[str, int]]:
        return model_counts(self.client.get_inference_statistics(**self._deadline), self.protocol)

    def _start(self) -> None:
        """The clients of this process: the first (the calling thread's, and gRPC's only), none for other threads."""
        self._pid = os.getpid()
        self._first = self._connect()
        self._first_thread = threading.current_thread()  # over HTTP, the thread whose client it is
        self._own = threading.local()  # .client: this thread's HTTP client, dropped (and closed) when the thread ends
        self._own.client = self._first
        # (thread, its HTTP client, its gevent hub) for each other thread that made a client: gevent keeps a thread's
        # hub and its loop's descriptors after the thread ends, and the client its connection until it is collected;
        # both are released once the thread has ended (`_release_ended_threads`)
        self._threads: list[tuple[threading.Thread, Any, Any]] = []
        self._made = threading.Lock()  # new in a forked child: the parent's may have been held at the fork

    @property
    def client(self) -> Any:
        """The tritonclient client of the calling thread (HTTP), or the one client (gRPC), of this process;
        ClientClosed after `close` (a closed gRPC channel said "Cannot invoke RPC on closed channel!", an HTTP client
        something else)."""
        if self._closed:
            own = getattr(self._own, "client", None) if os.getpid() == self._pid else None
            if own is not None and self.protocol == "http":  # left open by `close` in another thread: closed here
                own.close()
            raise ClientClosed("Classifier", self.url)
        if os.getpid() != self._pid:
            # a forked child (multiprocessing's fork, gunicorn --preload) holds copies of its parent's connections:
            # over HTTP both processes read answers from the same socket and took each other's (wrong labels), and a
            # gRPC channel does not work across a fork. The child makes its own; the copies stay untouched, since
            # closing them could end the parent's connections.
            self._inherited += [self._first, *(client for _, client, _ in self._threads)]
            if self.protocol == "http":  # geventhttpclient's loop shares its parent's epoll: it hung the child's calls
                import gevent

                gevent.reinit()
            self._start()
        if self.protocol == "grpc":
            return self._first
        client = getattr(self._own, "client", None)
        if client is None:
            import gevent

            self._release_ended_threads()  # a thread per request (a threaded web server): each new one frees the ended
            client = self._own.client = self._connect()
            with self._made:
                self._threads.append((threading.current_thread(), client, gevent.get_hub()))
        return client

    def close(self) -> None:
        """Close its clients; a second call does nothing, any other call after it raises ClientClosed. Over HTTP, a
        thread still running keeps its client until its next call (which closes it, then raises ClientClosed) or its
        end: a geventhttpclient connection is its thread's, and closing it under that thread's request in flight
        crashed the process (SIGSEGV: Ctrl-C in `hub-vit classify` closes the client while its workers still wait)."""
        self._closed = True
        here = threading.current_thread()
        with self._made:
            owned = [(self._first_thread, self._first), *((thread, client) for thread, client, _ in self._threads)]
        for thread, client in owned:
            if self.protocol == "grpc" or thread is here or not thread.is_alive():  # gRPC's channel is thread-safe
                client.close()
        self._release_ended_threads()

    def _release_ended_threads(self) -> None:
        """Close the HTTP clients of the threads that made one and have ended, and destroy their gevent hubs (and
        loops: 2 descriptors each; gevent allows it from another thread once that thread has exited). Those still
        running keep theirs (their client is closed by `close`)."""
        with self._made:
            ended = [(client, hub) for thread, client, hub in self._threads if not thread.is_alive()]
            self._threads = [entry for entry in self._threads if entry[0].is_alive()]
        for client, hub in ended:
            client.close()
            hub.destroy(destroy_loop=True)

    def __enter__(self) -> Classifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClassifier:
    """asyncio client (tritonclient's aio modules); the arguments and results of `Classifier`, plus `connections`."""

    def __init__(self, url: str = f"{LOOPBACK}:{HTTP_PORT}", *, protocol: str | None = None, model: str = "vit",
                 timeout_s: float = 60.0, connections: int = 100) -> None:
        """`timeout_s`: longest wait for each answer (HTTP: aiohttp's total timeout per request; gRPC: each call's
        deadline). `connections`: most HTTP connections open at once (tritonclient's `conn_limit`, 100 by default),
        so the requests one wants in flight at once; beyond it they queue inside the client, unseen by the server.
        gRPC multiplexes every request over one channel."""
        address, tls = server_address(url)
        protocol = resolve_protocol(url, protocol)
        check_timeout(timeout_s)
        check_model_name(model)
        if isinstance(connections, bool) or not isinstance(connections, int) or connections < 1:  # 0 was made 1
            raise ValueError(f"connections must be an integer >= 1 (HTTP connections open at once), got "
                             f"{connections!r}")
        self.module, self.model, self.protocol = _module(protocol, aio=True), model, protocol
        extra = ({"conn_limit": connections, "conn_timeout": timeout_s} if protocol == "http"
                 else {"channel_args": grpc_channel_args()})
        self._make = lambda: self.module.InferenceServerClient(address, ssl=tls, **extra)
        self.url, self._closed = url, False
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the event loop `_client` belongs to
        self._stale: list[Any] = []  # clients of event loops that have ended, to be closed
        self.timeout_s = timeout_s
        self._headers = PLAIN_ANSWERS if protocol == "http" else None
        self._deadline = {"client_timeout": timeout_s} if protocol == "grpc" else {}
        self._config: ServedConfig | None = None  # read from the server once
        self.request_limit = RequestLimit()  # as Classifier's

    @property
    def client(self) -> Any:
        """The tritonclient aio client of the running event loop, made at its first use there: such a client belongs
        to the loop it was made in, so one made outside a coroutine failed (HTTP: "no running event loop"; gRPC:
        every call "attached to a different loop"), and so did the same AsyncClassifier in a second `asyncio.run`.
        The client of an earlier loop is kept to be closed (`_current`, `close`): left to the garbage collector, its
        aiohttp session warned "Unclosed client session". ClientClosed after `close` (it made a new client
        before, silently, unlike `Classifier`)."""
        if self._closed:
            raise ClientClosed("AsyncClassifier", self.url, reopen="open it again with `async with`")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._client is not None:
                self._stale.append(self._client)
            self._client, self._loop = self._make(), loop
        return self._client

    async def _current(self) -> Any:
        """`client`, once the clients of ended loops are closed (their loop is closed, so closing them only marks
        them closed: no socket of theirs is used)."""
        client = self.client
        while self._stale:
            await self._stale.pop().close()
        return client

    async def config(self) -> ServedConfig:
        """As `Classifier.config`."""
        if self._config is None:
            client = await self._current()
            self._config = ServedConfig.read(await client.get_model_config(self.model, **self._deadline))
        return self._config

    async def ready(self) -> bool:
        """As `Classifier.ready`: whether the server and the model are ready; False, too, when no server answers at
        the address (nothing listens, a restart, no answer within `timeout_s`)."""
        from tritonclient.utils import InferenceServerException

        unanswered: tuple[type[BaseException], ...] = (TimeoutError, OSError)  # refused (aiohttp's is an OSError)
        if self.protocol == "http":
            import aiohttp  # tritonclient's aio HTTP client is aiohttp's: a server that disconnected is no OSError

            unanswered += (aiohttp.ClientConnectionError,)
        client = await self._current()
        try:
            return (bool(await client.is_server_ready(**self._deadline))
                    and bool(await client.is_model_ready(self.model, **self._deadline)))
        except unanswered:
            return False
        except InferenceServerException as err:  # gRPC: no server, no answer in time, or serve's gate's state
            if err.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED") or no_server(err):
                return False
            raise

    async def max_batch_size(self) -> int:
        """Most images the served model takes in one request (its config's `max_batch_size`; 0 = no limit)."""
        return (await self.config()).max_batch_size

    async def classify(self, images: Iterable[ImageLike] | ImageLike, *, with_logits: bool = False,
                       queue_timeout_s: float | None = None, explain: bool = False, head_fusion: str | None = None,
                       discard_ratio: float | None = None) -> list[Prediction]:
        """As `Classifier.classify`; the requests of a long list run concurrently (at most MAX_IN_FLIGHT at once)."""
        batch = as_batch(images)
        with_logits = check_flag(with_logits, "with_logits")
        parameters = explain_parameters(explain, head_fusion, discard_ratio)  # `explain` checked with its settings
        timeout = queue_timeout(queue_timeout_s) | ({"parameters": parameters} if parameters else {})
        if any(isinstance(image, (str, Path)) for image in batch):  # stat()ed: off the event loop, as files are read
            await asyncio.to_thread(check_images, batch)
        else:
            check_images(batch)
        refused = refusal(self.model, await self.config(), explain, queue_timeout_s) \
            if explain or queue_timeout_s else None
        if refused is not None:
            raise refused
        limit = await self.max_batch_size() if len(batch) > 1 else 0
        gate, client = asyncio.Semaphore(MAX_IN_FLIGHT), await self._current()

        async def one(start: int, images: list[ImageLike]) -> list[Prediction]:
            predictions: list[Prediction] = []
            async with gate:
                encoded = (await asyncio.to_thread(lambda: [encode(image) for image in images])
                           if encoded_off_loop(images) else [encode(image) for image in images])  # when sent
                pending = requests(encoded, start, self.request_limit)
                while pending:
                    offset, chunk = pending.popleft()
                    inputs, outputs = build_request(self.module, chunk, with_logits, explain)
                    try:
                        result = await client.infer(self.model, inputs, outputs=outputs, headers=self._headers,
                                                    **timeout, **self._deadline)
                    except Exception as err:
                        pending.extendleft(reversed(smaller_requests(err, offset, chunk, self.request_limit)))
                        continue
                    predictions.extend(parse_result(result, with_logits, explain))
            return predictions

        tasks = [asyncio.ensure_future(one(offset, chunk)) for offset, chunk in split(batch, limit)]
        try:
            chunks = await asyncio.gather(*tasks)
        except BaseException:  # one chunk failed (or we were cancelled): the rest would only load the server
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [prediction for chunk in chunks for prediction in chunk]

    def prepare(self, images: Iterable[ImageLike] | ImageLike, *,
                queue_timeout_s: float | None = None) -> PreparedRequest:
        """One request holding `images` (at most the model's `max_batch_size`; `classify` splits, this does not),
        encoded and serialised now, for `send`. `queue_timeout_s`: as in `classify`."""
        batch = as_batch(images)
        timeout = queue_timeout(queue_timeout_s)
        check_images(batch)  # each named by its index in `images`, as `classify` names them
        inputs, outputs = build_request(self.module, batch, with_logits=False)
        return PreparedRequest(inputs, outputs, len(batch), timeout.get("timeout"))

    async def send(self, request: PreparedRequest) -> None:
        """Send a prepared request and wait for its answer; raises the server's error as `classify` does. The answer
        is checked (one row of scores per image), not turned into `Prediction`s."""
        client = await self._current()
        result = await client.infer(self.model, request.inputs, outputs=request.outputs, headers=self._headers,
                                    timeout=request.timeout_us, **self._deadline)
        scores = result.as_numpy("scores")  # (B, K)
        if scores is None or len(scores) != request.images:
            rows = "no scores" if scores is None else f"{len(scores)} rows of scores"
            raise ValueError(f"the server answered {rows} for a request of {request.images} images")

    async def server_id(self) -> str:
        """The server's id (`GET /v2` "name"; `hub-vit serve` gives every server it starts its own): a changed id
        means another server process, whose statistics counters started from zero."""
        metadata = await (await self._current()).get_server_metadata(**self._deadline)
        return str(metadata["name"] if isinstance(metadata, dict) else metadata.name)

    async def statistics(self) -> dict[str, dict[str, int]]:
        return model_counts(await (await self._current()).get_inference_statistics(**self._deadline), self.protocol)

    async def close(self) -> None:
        """Close its clients: the running loop's, and those of loops that have ended. A second call does nothing, any
        other call after it raises ClientClosed until an `async with` opens it again."""
        self._closed = True
        clients, self._stale = [*self._stale, *([self._client] if self._client is not None else [])], []
        self._client, self._loop = None, None
        for client in clients:
            await client.close()

    async def __aenter__(self) -> AsyncClassifier:
        """Open (again, after `close`): a module-level client is used as `async with clf:` in each event loop that
        uses it (each `asyncio.run`), its block closing that loop's connections."""
        self._closed = False
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


