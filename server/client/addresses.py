"""Where a client connects: a server address (`host:port`, or a URL of it) and the protocol spoken there, checked
before tritonclient sees them (it fails on bad ones with unrelated errors), and the rule for a wait's timeout."""

from __future__ import annotations

import numbers
import urllib.parse

from hub_vit.ports import GRPC_PORT, HTTP_PORT, LOOPBACK

PROTOCOLS = ("http", "grpc")


def plain_port_hint(url: str, error: object) -> str | None:
    """Why a TLS hello to `url` failed, when the port answered it in plain text (OpenSSL's WRONG_VERSION_NUMBER)."""
    if not (url.lower().startswith("https://") and "WRONG_VERSION_NUMBER" in str(error)):
        return None
    return (f"{url} does not speak TLS: give the address without https:// (hub-vit serve's ports speak plain HTTP and "
            "gRPC; TLS belongs to a proxy in front of them)")


def server_address(url: str, protocols: tuple[str, ...] = PROTOCOLS) -> tuple[str, bool]:
    """`host:port`, optionally written as a URL (`http://`, `grpc://`; `https://` for TLS) -> (host:port, use TLS).
    `ValueError` naming the problem otherwise: tritonclient itself fails on these with unrelated errors (a bad port
    ends in an AttributeError from its destructor). `protocols`: what the caller speaks there, for the example."""
    examples = {"http": f"{LOOPBACK}:{HTTP_PORT} for HTTP", "grpc": f"{LOOPBACK}:{GRPC_PORT} for gRPC"}
    example = "e.g. " + " or ".join(examples[protocol] for protocol in protocols)
    if not isinstance(url, str):
        raise TypeError(f"the server URL must be a string such as '{LOOPBACK}:{HTTP_PORT}', got {url!r}")
    scheme, sep, rest = _split_scheme(url)
    if not sep:
        scheme, rest = "", scheme
    if scheme not in ("", "http", "https", "grpc"):
        raise ValueError(f"unsupported scheme {scheme!r} in server URL {url!r}; give host:port ({example})")
    rest = rest.rstrip("/")
    extras = sorted((rest.index(mark), what) for mark, what in (("/", "a path"), ("?", "a query"), ("#", "a fragment"))
                    if mark in rest)
    if extras:  # named by the first of them
        raise ValueError(f"server URL {url!r} has {extras[0][1]}; give host:port only ({example})")
    if "@" in rest:  # tritonclient would take `user@host` as the host name
        raise ValueError(f"server URL {url!r} holds a user name; give host:port only ({example})")
    digits = rest.rpartition(":")[2]
    if digits.isdigit() and not 1 <= int(digits) <= 65535:  # was "must be host:port", which it was
        raise ValueError(f"server URL {url!r} has port {int(digits)}, out of range: a port is 1 to 65535 ({example})")
    try:
        parts = urllib.parse.urlsplit(f"//{rest}")
        port = parts.port
    except ValueError:
        port, parts = None, None
    if parts is None or not parts.hostname or port is None or port == 0:
        raise ValueError(f"server URL must be host:port ({example}), got {url!r}")
    return rest, scheme == "https"


def _split_scheme(url: str) -> tuple[str, str, str]:
    """(scheme in lower case, "://" or "", the rest): URL schemes are case-insensitive (`HTTP://...`)."""
    scheme, sep, rest = url.strip().partition("://")
    return (scheme.lower(), sep, rest) if sep else (scheme, sep, rest)


def resolve_protocol(url: str, protocol: str | None = None) -> str:
    """The protocol to speak to `url`: `grpc://` means gRPC and `http://` HTTP; otherwise (`host:port`, `https://`)
    `protocol`, HTTP when not given. A URL whose scheme names the other protocol than `protocol` is refused: it would
    be spoken to in the wrong language and fail with an unrelated parse error."""
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    scheme = _split_scheme(url)[0] if "://" in url else ""
    named = {"grpc": "grpc", "http": "http"}.get(scheme)
    if named is not None and protocol is not None and named != protocol:
        raise ValueError(f"server URL {url!r} is a {scheme}:// address, but the protocol asked for is {protocol}; "
                         f"drop one of them (a bare host:port takes the protocol asked for)")
    return named or protocol or "http"




def check_model_name(model: str, *, name: str = "model") -> None:
    """A served model's name (`name` in the message): Triton's are folder names, so one that is empty, or holds a
    '/', a space or a control character, names no model, and tritonclient sends it on to a bare `[404] Not Found`."""
    if not isinstance(model, str) or not model or any(c == "/" or c.isspace() or not c.isprintable() for c in model):
        raise ValueError(f"{name} must name a served model (hub-vit serve's is 'vit'): not empty, without '/', spaces "
                         f"or control characters; got {model!r}")


def check_timeout(timeout_s: float, *, name: str = "timeout_s", most: float = float("inf")) -> None:
    """A wait for an answer (`timeout_s`, named `name` in the message) must be a positive, finite number of seconds,
    at most `most`: tritonclient and sockets fail on others with unrelated errors (0: BlockingIOError; -1: "Timeout
    value out of range"; nan refused; inf and 1e300 overflow)."""
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
            or not (0 < timeout_s < float("inf") and timeout_s <= most)):
        bound = f" (at most {most:g})" if most < float("inf") else ""
        raise ValueError(f"{name} must be a positive number of seconds{bound}, got {timeout_s!r}")


