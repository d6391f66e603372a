"""One readable message for a request that got no answer from the model (`hub-vit classify` / `loadtest`).

The kind of failure is read from tritonclient's exception, whose status and words are all it gives: Triton's own
answer (unknown model, bad input), a shed request (queue full or timed out), or no Triton at all (nothing listening,
the other protocol's port, the metrics port).
"""

from __future__ import annotations

from hub_vit.server.client import shed


def empty_reply(err: Exception) -> bool:
    """tritonclient's JSON parser failed on an empty reply: what Triton's metrics port (8002) answers to any path."""
    return "The document is empty" in str(err)


def request_failed(protocol: str, url: str, err: Exception) -> str:
    """One readable line for a request that got no answer from the model: the error, shortened (aiohttp quotes the
    whole reply of a port that does not speak HTTP), and, unless Triton itself answered, where to look."""
    from tritonclient.utils import InferenceServerException

    text = " ".join(str(err).split()).replace(" ssl:default ", " ")  # aiohttp says "ssl:default" for plain HTTP too
    if not text:  # aiohttp's timeout has no words of its own
        text = "no answer in time" if isinstance(err, TimeoutError) else type(err).__name__
    text = text if len(text) <= 240 else text[:240] + " ..."
    if shed(err):  # gRPC says UNAVAILABLE here too, as for no server at all: the hint below would mislead
        why = ("it waited in the server's queue longer than its queue timeout (--queue-timeout-ms, or the server's "
               "--queue-timeout-us)" if "Request timeout expired" in text
               else "the server's queue was full (its --max-queue-size)")
        return f"{protocol} {url}: {text}\nthe server is overloaded and shed this request: {why}; retry later"
    if isinstance(err, InferenceServerException) and err.status() not in (None, "StatusCode.UNAVAILABLE"):
        return f"{protocol} {url}: {text}"  # Triton answered (unknown model, bad input, ...): its words suffice
    names = {"http": "HTTP", "grpc": "gRPC"}
    this, other = names[protocol], names["http" if protocol == "grpc" else "grpc"]
    return (f"{protocol} {url}: {text}\nno {this} answer from {url}: is a server running there (hub-vit serve), and "
            f"is this its {this} port, not its {other} or metrics port? Defaults: HTTP 8000, gRPC 8001 (--grpc), "
            "metrics 8002.")
