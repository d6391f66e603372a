"""What a failed request means to a client: one image refused, the server shedding load, no server behind the port,
a model without explanations; and one readable line for `hub-vit classify` / `loadtest`.

hub-vit's own facts (which image, which server state) are read with `hub_vit.server.protocol`, never from the
wording. What Triton and tritonclient say themselves (a shed request, an empty reply) is read from their words,
which are all they give.
"""

from __future__ import annotations

from hub_vit.ports import DEMO_PORT, GRPC_PORT, HTTP_PORT, METRICS_PORT
from hub_vit.server import protocol
from hub_vit.server.client.addresses import plain_port_hint

# A request refused for what it holds (a bad image, a wrong tensor): HTTP 400 / gRPC INVALID_ARGUMENT.
CLIENT_ERROR_STATUSES = ("400", "StatusCode.INVALID_ARGUMENT")
# The front's refusal of a request over its size limit (`hub-vit serve --max-request-mb`): HTTP 413 / gRPC
# RESOURCE_EXHAUSTED, the latter also grpc's own "Received message larger than max" without hub-vit's fact.
TOO_LARGE_STATUSES = ("413", "StatusCode.RESOURCE_EXHAUSTED")
MAX_REQUEST_FLAG = "hub-vit serve --max-request-mb"
# Triton's answers when it sheds load: the queue was full (max_queue_size), or the request waited in it longer than its
# queue timeout. HTTP 503 / gRPC UNAVAILABLE, the status gRPC also gives when no server answers: only these words tell.
SHED_MESSAGES = ("Exceeds maximum queue size", "Request timeout expired")
# Triton's answer when a Python-backend stub's /dev/shm pool cannot grow to hold a batch (HTTP 500 / gRPC INTERNAL):
# the batch alone fails and the server serves on (server/runtime/shared_memory.py).
SHM_FULL_MESSAGE = "Failed to increase the shared memory pool size"


class ClientClosed(RuntimeError):
    """A call on a Classifier / AsyncClassifier after its `close` (or the end of its `with` block)."""

    def __init__(self, kind: str, url: str, reopen: str = "") -> None:
        super().__init__(f"this {kind} of {url} was closed (close(), or the end of its with block): make a new one"
                         + (f", or {reopen}" if reopen else ""))


class NoExplanation(ValueError):
    """The served model answers no `explain` request: its repository says so (protocol.py's `hub_vit_explains`)."""


class NoQueueTimeouts(ValueError):
    """The served model applies no per-request queue timeout: its repository has no queue policy (protocol.py's
    `hub_vit_queue_timeouts`), so the request would be refused."""


class ImageTooLarge(ValueError):
    """Image `index` (in the caller's list) cannot be sent: a request holding it alone is over the server's size
    limit. `reason` says so for people, with the limit when the server told it, and the flag that raises it."""

    def __init__(self, index: int, size: int, limit: int | None, answer: str = "") -> None:
        self.index, self.size, self.limit = index, size, limit
        if limit is not None:
            self.reason = (f"too large to send: {size} bytes, over the server's request limit of {limit} bytes "
                           f"({_mib(limit)}; {MAX_REQUEST_FLAG})")
        else:  # the server's answer carried no hub-vit fact (grpc's own words): its limit is not known here
            said = f"; the server said: {answer}" if answer else ""
            self.reason = (f"too large to send: {size} bytes, refused alone as over the server's request limit "
                           f"({MAX_REQUEST_FLAG}){said}")
        super().__init__(f"image {index}: {self.reason}")


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def too_large(err: Exception) -> bool:
    """Whether the server refused a request for its size (before reading what it holds)."""
    from tritonclient.utils import InferenceServerException

    return isinstance(err, InferenceServerException) and err.status() in TOO_LARGE_STATUSES


def too_large_limit(err: Exception) -> int | None:
    """The limit in bytes of a front that refused a request as too large (its `too-large` fact), else None."""
    message = _message(err)
    return None if message is None else protocol.read_too_large(message)


def _message(err: Exception) -> str | None:
    """tritonclient's error text, or None for an error that is not the server's answer."""
    from tritonclient.utils import InferenceServerException

    return (err.message() or "") if isinstance(err, InferenceServerException) else None


def shed(err: Exception) -> bool:
    """Whether the server refused a request to shed load (its queue was full, or the request waited longer than its
    queue timeout), rather than not answering at all."""
    message = _message(err)
    return message is not None and any(words in message for words in SHED_MESSAGES)


def out_of_shared_memory(err: Exception) -> bool:
    """Whether the server failed a batch because a Python-backend stub's /dev/shm pool could not grow to hold it."""
    message = _message(err)
    return message is not None and SHM_FULL_MESSAGE in message


def no_server(err: Exception) -> bool:
    """Whether `hub-vit serve`'s gate answered for a server that is not there right now (restarting, shutting down):
    like a refused connection, not an answer of the model's."""
    message = _message(err)
    return message is not None and protocol.read_server_state(message) is not None


def restarting(err: Exception) -> bool:
    """Whether `hub-vit serve`'s gate answered that its server is starting or restarting: the request never reached a
    server, so sending it again once the server is back is safe (unlike one lost in flight when a server died)."""
    message = _message(err)
    return message is not None and protocol.read_server_state(message) == protocol.RESTARTING


def refused_image(err: Exception) -> protocol.RefusedImage | None:
    """The server's refusal of one image (its index in the request, the reason); None for any other error (no
    server, overload, a wrong tensor, too large a batch)."""
    from tritonclient.utils import InferenceServerException

    if not isinstance(err, InferenceServerException) or err.status() not in CLIENT_ERROR_STATUSES:
        return None
    return protocol.refused_image(" ".join((err.message() or "").split()))


def renumbered(err: Exception, offset: int) -> Exception:
    """A server error about image i of a request that began `offset` images into the caller's list, about image
    i + offset (the chunks are the client's doing; the caller only sees its list)."""
    from tritonclient.utils import InferenceServerException

    message = _message(err)
    if not offset or message is None or protocol.refused_image(message) is None:
        return err
    assert isinstance(err, InferenceServerException)
    return InferenceServerException(protocol.renumbered(message, offset), status=err.status(),
                                    debug_details=err.debug_details())


def unknown_model(err: Exception) -> bool:
    """Triton answered that it serves no model of the requested name (its words "Request for unknown model", over
    either protocol: its error statuses for it differ between versions)."""
    from tritonclient.utils import InferenceServerException

    return isinstance(err, InferenceServerException) and "Request for unknown model" in (err.message() or "")


def not_triton(err: Exception) -> bool:
    """tritonclient could not read an HTTP answer as Triton's JSON: another web server (a web page) answered."""
    return "an exception occurred in the client while decoding the response" in str(err)


def empty_reply(err: Exception) -> bool:
    """tritonclient's JSON parser failed on an empty reply: what Triton's metrics port answers to any path."""
    return "The document is empty" in str(err)


def other_protocol(err: Exception) -> bool:
    """The port spoke the other protocol: HTTP/2 frames to an HTTP/1.1 client (aiohttp's and geventhttpclient's
    "Expected HTTP/"), or HTTP/1.x to a gRPC one (grpc's "Trying to connect an http1.x server")."""
    text = str(err)
    return "Expected HTTP/" in text or "Trying to connect an http1.x server" in text


def _timed_out(err: Exception) -> bool:
    """The client's own timeout ended the wait: HTTP's socket timeout, gRPC's deadline (Triton's queue timeout is
    UNAVAILABLE "Request timeout expired", `shed`)."""
    from tritonclient.utils import InferenceServerException

    return isinstance(err, TimeoutError) or (isinstance(err, InferenceServerException)
                                             and err.status() == "StatusCode.DEADLINE_EXCEEDED")


def _cancelled_by_grpc(err: Exception) -> bool:
    """grpc's own cancellation, with no words of Triton's or the front's: what a client gets for a call its server
    received as it stopped (grpc/grpc#41785). This client never cancels a call it waits for (its timeout is
    DEADLINE_EXCEEDED)."""
    from tritonclient.utils import InferenceServerException

    return isinstance(err, InferenceServerException) and err.status() == "StatusCode.CANCELLED" and \
        (err.message() or "").strip() == "CANCELLED"


def request_failed(protocol_name: str, url: str, err: Exception, answered: int = 0) -> str:
    """One readable line for a request that got no answer from the model: the error, shortened (aiohttp quotes the
    whole reply of a port that does not speak HTTP), and, unless Triton itself answered, where to look. `answered`:
    images this server had answered before, so a lost connection is a server that went away, not a wrong port."""
    from tritonclient.utils import InferenceServerException

    # aiohttp says "ssl:default" for plain HTTP too
    text = " ".join(protocol.untagged(str(err)).split()).replace(" ssl:default ", " ")
    if not text:  # aiohttp's timeout has no words of its own
        text = "no answer in time" if isinstance(err, TimeoutError) else type(err).__name__
    text = text if len(text) <= 240 else text[:240] + " ..."
    if shed(err):  # gRPC says UNAVAILABLE here too, as for no server at all: the hint below would mislead
        why = ("it waited in the server's queue longer than its queue timeout (--queue-timeout-ms, or the server's "
               "--queue-timeout-us)" if "Request timeout expired" in text
               else "the server's queue was full (its --max-queue-size)")
        return f"{protocol_name} {url}: {text}\nthe server is overloaded and shed this request: {why}; retry later"
    names = {"http": "HTTP", "grpc": "gRPC"}
    this, other = names[protocol_name], names["http" if protocol_name == "grpc" else "grpc"]
    if _timed_out(err):  # something took the connection and stayed silent: often a server that is there
        return (f"{protocol_name} {url}: {text}\nno {this} answer from {url} within the client's timeout: a server "
                "there may be overloaded, or hold lone requests to batch them (hub-vit serve --max-queue-delay-us); "
                f"else check that a server runs there and that this is its {this} port")
    if (hint := plain_port_hint(url, err)) is not None:  # a TLS hello, answered in plain text
        return f"{protocol_name} {url}: {text}\n{hint}"
    if not_triton(err):  # another web server there: its page is no answer of Triton's
        text = text.split(" response: ", 1)[0]  # not the page itself
        return (f"{protocol_name} {url}: {text}\n{url} answered, but not as Triton does (no Triton JSON): is this a "
                f"Triton server's {this} port? Defaults: HTTP {HTTP_PORT}, gRPC {GRPC_PORT} (--grpc); the demo's "
                f"page ({DEMO_PORT}) is not one.")
    ports = f"Defaults: HTTP {HTTP_PORT}, gRPC {GRPC_PORT} (--grpc), metrics {METRICS_PORT}."  # where to look
    spoken = protocol.read_port_speaks(_message(err) or "")
    if spoken is not None and spoken.speaks != protocol_name:  # serve's front said which port this is
        port = spoken.ports.get(f"{protocol_name}_port")
        given = f"give the server's {this} port{f' ({port})' if port else ''}. {ports}"
        if spoken.speaks == "metrics":
            return f"{protocol_name} {url}: hub-vit serve answered that this is its metrics port\n{given}"
        switch = "leave out --grpc" if protocol_name == "grpc" else "add --grpc"
        return (f"{protocol_name} {url}: hub-vit serve answered that this is its {other} port\n{url} speaks {other}: "
                f"{switch}, or {given}")
    if other_protocol(err):  # the reply quoted as bytes says nothing to a person: what it was, and the way out
        said, spoken = ("HTTP/1.x", "gRPC's HTTP/2") if protocol_name == "grpc" else ("HTTP/2", "HTTP/1.1")
        switch = "leave out --grpc" if protocol_name == "grpc" else "add --grpc"
        return (f"{protocol_name} {url}: the port answered in {said}, not {spoken}\n{url} speaks {other} (a server's "
                f"{other} port?): {switch}, or give the server's {this} port. {ports}")
    if empty_reply(err):  # Triton's metrics port answers every path with 200 and an empty body
        return (f"{protocol_name} {url}: an empty reply, not Triton's JSON\n{url} answers as Triton's metrics port "
                f"does: give the server's {this} port. {ports}")
    if _cancelled_by_grpc(err):
        return (f"{protocol_name} {url}: {text}\nthe server cancelled this request before computing it: a gRPC server "
                "that stops cancels the calls it has not started yet (grpc/grpc#41785); retry once it serves again")
    if out_of_shared_memory(err):  # Triton's own hint about Docker is cut off above, and names no size
        return (f"{protocol_name} {url}: {text}\nthe server's shared memory (/dev/shm) had no room for this batch of "
                "images: Triton's Python backend passes every batch through it, and this server has too little of it "
                "for batches this large (hub-vit serve says so at its start); restart the server with more (in a "
                "container: docker run --shm-size=1g), or send fewer or smaller images per request")
    if protocol.read_lost_in_flight(_message(err) or ""):  # serve's front: its server died with the request
        after = f" after {answered:,} image{'s' if answered != 1 else ''}" if answered else ""
        return (f"{protocol_name} {url}: {text}\nthe server at {url} died with this request in flight{after} "
                "(hub-vit serve restarts it); the request was not sent again: it may be what killed the server")
    if isinstance(err, InferenceServerException) and err.status() not in (None, "StatusCode.UNAVAILABLE"):
        return f"{protocol_name} {url}: {text}"  # Triton answered (unknown model, bad input, ...): its words suffice
    if answered:
        return (f"{protocol_name} {url}: {text}\nthe server at {url} stopped answering after {answered:,} image"
                f"{'s' if answered != 1 else ''}: it was stopped, or it died")
    return (f"{protocol_name} {url}: {text}\nno {this} answer from {url}: is a server running there (hub-vit serve), "
            f"and is this its {this} port, not its {other} or metrics port? {ports}")
