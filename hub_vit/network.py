"""Whether hub-vit may and can reach the network: the offline switches, and a reachability check bounded in time.

Downloads ask before their first request: with an offline switch on, or no answer from the host within a few
seconds, they fail at once (or use what is cached) instead of waiting out a library's retries (huggingface_hub
retries a failed connection five times over about 23 s for each file it does not have cached).
"""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 3.0
# The switches, in the order they are named: hub-vit's own, then huggingface_hub's and transformers' (which
# huggingface_hub also honours)
OFFLINE_SWITCHES = ("HUB_VIT_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class HubUnreachableError(ConnectionError):
    """The Hub cannot be reached (offline mode, no network, DNS failure, refused or timed-out connect)."""


def offline_switch() -> str | None:
    """The name of the offline switch that is on (1, true, yes or on, in any case), or None. Read at call time;
    huggingface_hub's own `constants.HF_HUB_OFFLINE`, frozen when it is imported, counts as HF_HUB_OFFLINE."""
    from huggingface_hub import constants

    def on(name: str) -> bool:
        return os.environ.get(name, "").upper() in constants.ENV_VARS_TRUE_VALUES

    if on("HUB_VIT_OFFLINE"):
        return "HUB_VIT_OFFLINE"
    # huggingface_hub reads TRANSFORMERS_OFFLINE only when HF_HUB_OFFLINE is unset or empty
    hf = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    return hf if on(hf) else "HF_HUB_OFFLINE" if constants.HF_HUB_OFFLINE else None


def offline_mode() -> bool:
    """Whether an offline switch is on (`offline_switch`)."""
    return offline_switch() is not None


def hub_endpoint(endpoint: str | None = None) -> str:
    """The Hugging Face Hub's address: `endpoint`, else HF_ENDPOINT (read at call time), else huggingface_hub's."""
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def check_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise `HubUnreachableError` when an offline switch is on (naming it; nothing is tried), or unless a TCP
    connection to the endpoint (or its proxy) opens within `timeout`.

    DNS resolution runs in a worker thread with the same deadline: `getaddrinfo` has no timeout of its own and can
    hang for tens of seconds on a machine without a network.
    """
    switch = offline_switch()
    if switch is not None:
        raise HubUnreachableError(f"{switch} is set (offline mode), so the Hub at {endpoint} is not asked; unset "
                                  f"{switch} to reach it")
    target = _proxy_for(endpoint) or endpoint
    parts = urlsplit(target if "://" in target else f"http://{target}")
    host = parts.hostname
    if not host:
        raise HubUnreachableError(f"cannot parse a host from the Hub endpoint {endpoint!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    via = f" via proxy {target}" if target != endpoint else ""
    try:
        addresses = _resolve(host, port, timeout)
    except TimeoutError as exc:
        raise HubUnreachableError(f"cannot reach the Hugging Face Hub at {endpoint}{via}: resolving {host!r} took "
                                  f"more than {timeout:g} s (no network?)") from exc
    except OSError as exc:
        raise HubUnreachableError(f"cannot reach the Hugging Face Hub at {endpoint}{via}: cannot resolve "
                                  f"{host!r} ({exc}); check the network connection") from exc
    errors = []
    for family, socktype, proto, _, address in addresses:
        try:
            with socket.socket(family, socktype, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
                return
        except OSError as exc:
            errors.append(f"{address[0]}:{address[1]}: {exc or type(exc).__name__}")
    raise HubUnreachableError(f"cannot reach the Hugging Face Hub at {endpoint}{via} within {timeout:g} s "
                              f"({'; '.join(errors)}); check the network connection")


def _proxy_for(url: str) -> str | None:
    scheme = urlsplit(url).scheme
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"):
        if os.environ.get(name):
            return os.environ[name]
    return None


def _resolve(host: str, port: int, timeout: float) -> list[tuple]:
    """`socket.getaddrinfo` with a deadline, in a daemon thread (a hung resolver must not delay interpreter exit)."""
    result: list = []
    done = threading.Event()

    def work() -> None:
        try:
            result.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            result.append(exc)
        done.set()

    threading.Thread(target=work, name="hub-vit-resolve", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"resolving {host!r} timed out")
    if isinstance(result[0], OSError):
        raise result[0]
    return result[0]


__all__ = ["CONNECT_TIMEOUT_S", "OFFLINE_SWITCHES", "HubUnreachableError", "check_reachable", "hub_endpoint",
           "offline_mode", "offline_switch"]
