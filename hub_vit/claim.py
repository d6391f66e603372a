"""Exclusive claims among this machine's processes: a Unix socket bound to an abstract address (Linux).

Nothing on disk, so nothing is left behind; the kernel ends a claim when its holder exits, even killed; and a second
process asking for the same claim learns the holder's pid. `hub-vit serve` claims its public ports with one (a second
serve on a port shared with SO_REUSEPORT would silently join the first), `hub-vit train` its run folder (two runs of
one folder interleaved their checkpoints and metrics).
"""

from __future__ import annotations

import errno
import socket
import struct

MAX_NAME_BYTES = 100  # an abstract address holds at most 107 bytes after its leading NUL


class Claimed(OSError):
    """Another process holds the claim; `holder` is its pid, or "unknown"."""

    def __init__(self, name: str, holder: str) -> None:
        super().__init__(errno.EADDRINUSE, f"{name!r} is claimed by process {holder}")
        self.name, self.holder = name, holder


class Claim:
    """Holds `name` until `release()` (or this process ends); Claimed when another process holds it."""

    def __init__(self, name: str) -> None:
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"a claim's name must be 1 to {MAX_NAME_BYTES} bytes, got {name!r}")
        self.name, self.address = name, "\0" + name
        self.socket: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.socket.bind(self.address)
        except OSError as exc:
            self.socket.close()
            self.socket = None
            if exc.errno != errno.EADDRINUSE:
                raise
            raise Claimed(name, holder(self.address)) from None
        self.socket.listen(1)  # so a second claimant can connect and learn who holds it

    def release(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(address: str) -> str:
    """The pid of the process listening on the abstract `address` (SO_PEERCRED), or "unknown"."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(address)
            pid, _uid, _gid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                   struct.calcsize("3i")))
        except OSError:
            return "unknown"
    return str(pid)
