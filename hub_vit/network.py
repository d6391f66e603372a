"""Whether hub-vit may and can reach the network: the offline switches, and a reachability check bounded in time.

Downloads ask before their first request: with an offline switch on, or no answer from the host within a few
seconds, they fail at once (or use what is cached) instead of waiting out a library's retries (huggingface_hub
retries a failed connection five times over about 23 s for each file it does not have cached).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)
Loaded = TypeVar("Loaded")

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


def load_cache_only_when_unreachable(path: Any, kwargs: dict[str, Any], load: Callable[[dict[str, Any]], Loaded],
                                     file: str, hint: str = "") -> Loaded:
    """`load(kwargs)`: a transformers `from_pretrained` of `path` that reads `file` first. When `path` names a Hub repo
    that cannot be reached now (an offline switch is on, or no connection opens within `CONNECT_TIMEOUT_S`: a few
    milliseconds without DNS), it loads from the local cache only, at once, with a warning saying why; a repo whose
    `file` is not cached then raises `HubUnreachableError` naming the Hub, the reason, the cache (and `hint`).
    Otherwise each read of a file that is not cached waits out huggingface_hub's retries, about 23 s, before it
    fails in huggingface_hub's words (which advise setting `local_files_only=False`: the caller never set it)."""
    kwargs, unreachable = cache_only_when_unreachable(path, kwargs)
    try:
        return load(kwargs)
    except OSError as err:
        if unreachable is None or not _cache_miss(err, path, file, kwargs):
            raise
        from huggingface_hub.constants import HF_HUB_CACHE

        cache = kwargs.get("cache_dir") or HF_HUB_CACHE
        raise HubUnreachableError(f"cannot load {str(path)!r}: {unreachable}, and the local cache ({cache}) does "
                                  f"not hold it{hint and chr(10) + hint}") from err


def cache_only_when_unreachable(path: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], HubUnreachableError | None]:
    """`kwargs` for a `from_pretrained` of `path`, with `local_files_only=True` (and a warning) when `path` names a
    Hub repo that cannot be reached now, and why (None: as given: a local path, or the Hub answers)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(path, (str, os.PathLike)) or os.path.exists(path) or kwargs.get("local_files_only"):
        return kwargs, None
    try:
        validate_repo_id(os.fspath(path))
    except HFValidationError:  # a local path that does not exist: transformers says so itself
        return kwargs, None
    try:
        check_reachable(hub_endpoint())  # an offline switch on counts as unreachable
    except HubUnreachableError as unreachable:
        logger.warning(f"{unreachable}: loading {str(path)!r} from the local cache only")
        return {**kwargs, "local_files_only": True}, unreachable
    return kwargs, None


def _cache_miss(err: OSError, path: Any, file: str, kwargs: dict[str, Any]) -> bool:
    """Whether a cache-only load of the Hub repo `path` failed (`err`) for want of a file in huggingface_hub's cache:
    a file it read (`err`'s cause), or `file`, which transformers' image processor reads without saying so."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import LocalEntryNotFoundError

    if isinstance(err.__cause__, LocalEntryNotFoundError):
        return True
    name = f"{kwargs['subfolder']}/{file}" if kwargs.get("subfolder") else file
    found = try_to_load_from_cache(os.fspath(path), name, cache_dir=kwargs.get("cache_dir"),
                                   revision=kwargs.get("revision"))
    return not isinstance(found, str)


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


__all__ = ["CONNECT_TIMEOUT_S", "OFFLINE_SWITCHES", "HubUnreachableError", "cache_only_when_unreachable",
           "check_reachable", "hub_endpoint", "load_cache_only_when_unreachable", "offline_mode", "offline_switch"]
