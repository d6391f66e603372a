"""Flags `hub-vit classify` and `hub-vit loadtest` share: the server's address and protocol, the request's queue
timeout, and the sample images of a model folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hub_vit.cli.app import fail
from hub_vit.ports import GRPC_PORT, HTTP_PORT, LOOPBACK

# The server's address and protocol, for `classify` and `loadtest`. gRPC has a port of its own: `--grpc` alone takes
# its default address, `--grpc` with a `--url` needs that URL to name the gRPC port.
Url = Annotated[str, typer.Option(show_default=False,
                                  help=f"The server's address, host:port (default {LOOPBACK}:{HTTP_PORT}, HTTP; with "
                                       f"--grpc {LOOPBACK}:{GRPC_PORT}, the gRPC port).")]
Grpc = Annotated[bool, typer.Option("--grpc", help=f"Speak gRPC instead of HTTP, to the server's gRPC port: "
                                                   f"{GRPC_PORT} by default, so a --url must name that port too.")]
# `classify` and `loadtest`: how long the client waits for any one answer (a server that took the connection and
# stays silent held both for tritonclient's 60 s whatever --duration said).
ClientTimeout = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each answer of the server.")]
# `classify` also waits, up to this in all, for a server `hub-vit serve` restarts (its ports answer "restarting")
ClassifyTimeout = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each answer of the server, and "
                                                "in all for a server hub-vit serve restarts to come back.")]
DEFAULT_CLIENT_TIMEOUT_S = 60.0


def client_timeout(seconds: float) -> float:
    """`--timeout` checked by the clients' own rule, in the flag's words."""
    from hub_vit.server.client.addresses import check_timeout

    try:
        check_timeout(seconds, name="--timeout")
    except ValueError as err:
        raise fail(str(err)) from None
    return seconds


# `classify` and `loadtest`: the client's side of the same limit, per request.
RequestQueueTimeoutMs = Annotated[float, typer.Option(
    show_default=False, help="Ask the server to reject each request that waits longer than this many ms in its queue "
                             "(\"Request timeout expired\") instead of computing it late (default: the server's own "
                             "limit).")]


def queue_timeout_s(ms: float | None) -> float | None:
    """`--queue-timeout-ms` -> seconds for the client, checked by the client's own rule (`client.queue_timeout`) and
    refused in the flag's words."""
    from hub_vit.server.client.messages import LONGEST_QUEUE_TIMEOUT_S, queue_timeout

    seconds = None if ms is None else ms / 1000
    try:
        queue_timeout(seconds)
    except ValueError:
        raise fail(f"--queue-timeout-ms must be a positive number of milliseconds, at most one day "
                   f"({LONGEST_QUEUE_TIMEOUT_S * 1000}), got {ms}") from None
    return seconds


def endpoint(url: str | None, grpc: bool) -> tuple[str, str]:
    """`--url` / `--grpc` -> (url, protocol): a `grpc://` URL speaks gRPC without `--grpc`; an `http://` one with
    `--grpc` is refused (it names two protocols)."""
    from hub_vit.server.client.addresses import resolve_protocol, server_address

    if url is None:
        return (f"{LOOPBACK}:{GRPC_PORT}", "grpc") if grpc else (f"{LOOPBACK}:{HTTP_PORT}", "http")
    try:
        server_address(url)  # a mistyped address is the user's mistake (exit 2), found before any connection
    except ValueError as err:
        raise fail(f"--url: {err}") from None
    try:
        return url, resolve_protocol(url, "grpc" if grpc else None)
    except ValueError:  # the one contradiction left: http:// with --grpc
        raise fail(f"--url {url!r} is an HTTP address, but --grpc is given; give the gRPC address (host:port, "
                   f"default port {GRPC_PORT}) or drop --grpc") from None


def samples_of(folder: Path) -> list[Path]:
    """A model folder's sample images (`samples/*.png`, as the shipped model has), sorted; none for anything else."""
    return sorted(folder.glob("samples/*.png")) if folder.is_dir() else []


def sample_images() -> list[Any]:
    """The shipped model's held-out samples if present, else a few synthetic PNGs."""
    from hub_vit.catalog import default_model_folder

    samples = samples_of(default_model_folder())
    if samples:
        return samples
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)) for _ in range(4)]


def request_failure(protocol: str, url: str, model: str, err: Exception, answered: int = 0) -> str:
    """`request_failed`'s line for `err` (`answered`: images the server answered before), and for a model the server
    does not serve, the models it does (read from its statistics, which the front leaves open; the repository index
    is a restricted API)."""
    from hub_vit.server.client.classifier import Classifier
    from hub_vit.server.client.errors import request_failed, unknown_model

    message = request_failed(protocol, url, err, answered)
    if not unknown_model(err):
        return message
    try:
        with Classifier(url, protocol=protocol, timeout_s=10.0) as client:
            served = sorted(client.statistics())
        # a hub-vit repository's steps (`vit_classifier`) take tensors, not images: only the models its config says
        # it serves are offered (all of them for a repository hub-vit did not write)
        offered = [name for name in served if _classifies_images(url, protocol, name)] or served
    except Exception:  # the list is a help, not the error: without it the error stands as Triton said it
        return message
    return (f"{message}\nthe server serves no model {model!r}; models it serves: {', '.join(offered) or 'none'} "
            "(--model names one)")


def _classifies_images(url: str, protocol: str, name: str) -> bool:
    from hub_vit.server.client.classifier import Classifier

    with Classifier(url, protocol=protocol, model=name, timeout_s=10.0) as client:
        return client.served_model() is not None


def client_settings(url: str | None, grpc: bool, queue_timeout_ms: float | None, timeout: float, model: str
                    ) -> tuple[str, str, float | None, float]:
    """(url, protocol, each request's queue timeout in s, the wait for each answer in s) from the flags `classify`
    and `loadtest` share, each checked and refused in its flag's words (`--model` too)."""
    from hub_vit.server.client.addresses import check_model_name

    try:
        check_model_name(model, name="--model")
    except ValueError as err:
        raise fail(str(err)) from None
    queue_s, wait_s = queue_timeout_s(queue_timeout_ms), client_timeout(timeout)
    return (*endpoint(url, grpc), queue_s, wait_s)
