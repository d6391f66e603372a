"""Checking TCP ports before a server starts, so a taken or invalid port is one clear error instead of a failure deep
in tritonserver's log or a traceback from uvicorn."""

from __future__ import annotations

import errno
import socket

# `hub-vit serve`'s default ports, stated once: serve's options, the clients' default addresses, `make serve`, and every
# help text and hint that names a port take them from here.
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
DEMO_PORT = 7860
LOOPBACK = "127.0.0.1"


class PortError(ValueError):
    """A port setting that cannot work; the message names the setting as the caller knows it."""


class PortInUse(PortError):
    """Something already listens on the port of `setting` (`http_port`, ...)."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


def check_host(host: str, setting: str = "--host") -> None:
    """`PortError` unless `host` is an IPv4 address or name of this machine that a server can bind. IPv6 is refused:
    tritonserver 2.51 takes `host:port` without brackets and fails to bind '::1:8001'."""
    if ":" in host:
        raise PortError(f"{setting} {host!r}: IPv6 addresses are not supported by the local tritonserver; use an IPv4 "
                        "address such as 127.0.0.1 (loopback) or 0.0.0.0 (every interface)")
    ipv4_address(host, setting)
    with socket.socket(socket.AF_INET) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            raise PortError(f"{setting} {host!r} is not an address of this machine ({exc.strerror}); use 127.0.0.1, "
                            "0.0.0.0 or one of this machine's own addresses") from None


def ipv4_address(host: str, setting: str = "--host") -> str:
    """The IPv4 address `host` names (itself when it is one). Triton 2.51 takes its HTTP and metrics addresses
    literally: given a name such as `localhost` it binds 255.255.255.255, so nothing reaches it."""
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except OSError:
        raise PortError(f"{setting} {host!r}: cannot resolve this name to an IPv4 address") from None


def port_in_use(host: str, port: int) -> bool:
    """Something listens on (host, port). SO_REUSEADDR as servers set it, so a port in TIME_WAIT counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except PermissionError:
            raise PortError(f"port {port} on {host} needs root (ports below 1024 are privileged); choose a port "
                            "above 1023") from None
        except socket.gaierror:  # was reported as the port in use
            raise PortError(f"host {host!r}: cannot resolve this name to an address") from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise PortError(f"host {host!r} is not an address of this machine to listen on ({exc.strerror}); use "
                            "127.0.0.1, 0.0.0.0 or one of this machine's own addresses") from None
    return False


def check_ports(host: str, ports: dict[str, int], *, in_use: bool = True) -> None:
    """`PortError` unless every port (setting name -> number) is a TCP port, no two are equal, and (with `in_use`)
    nothing listens on any of them yet."""
    for setting, port in ports.items():
        if not 1 <= port <= 65535:
            raise PortError(f"{setting} {port} is not a TCP port (1-65535)")
    by_port: dict[int, list[str]] = {}
    for setting, port in ports.items():
        by_port.setdefault(port, []).append(setting)
    for port, settings in by_port.items():
        if len(settings) > 1:
            raise PortError(f"{' and '.join(settings)} are both {port}; each server needs its own port")
    taken = [(setting, port) for setting, port in ports.items() if in_use and port_in_use(host, port)]
    if len(taken) == 1:
        setting, port = taken[0]
        raise PortInUse(f"{setting} {port}: {host}:{port} is already in use (another server?); choose another port",
                        setting)
    if taken:  # every one named at once: they were found one per attempt
        raise PortInUse(f"{', '.join(f'{setting} {port}' for setting, port in taken)}: all already in use on {host} "
                        "(another server, or an earlier run of this command?); choose other ports",
                        taken[0][0])
