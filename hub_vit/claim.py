"""Exclusive claims among this machine's processes: a Unix socket bound to an abstract address (Linux).

Nothing on disk, so nothing is left behind; the kernel ends a claim when its holder exits, even killed; and a second
process asking for the same claim learns the holder's pid. `hub-vit serve` claims its public ports with one (a second
serve on a port shared with SO_REUSEPORT would silently join the first), `hub-vit train` its run folder (two runs of
one folder interleaved their checkpoints and metrics).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import threading

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
        self.socket.listen(16)  # so a second claimant can connect and learn who holds it (`holder`)
        self._released, self._owner = threading.Event(), os.getpid()
        # A connection the kernel queued stays in the backlog until accepted, even once its prober has gone: never
        # accepted, the backlog filled after two probes, and every later one waited its timeout and said "unknown".
        # The prober reads the pid from the connection itself (SO_PEERCRED): accepting and closing it is the answer.
        self._answering = threading.Thread(target=self._answer, args=(self.socket,), name=f"claim {name}",
                                           daemon=True)
        self._answering.start()

    def _answer(self, listening: socket.socket) -> None:
        while not self._released.is_set():
            try:
                connection, _ = listening.accept()
            except OSError:  # released (`shutdown` ends a blocked accept), or out of file descriptors for a moment
                if not self._released.wait(0.1):
                    continue
                return
            connection.close()

    def release(self) -> None:
        if self.socket is not None:
            self._released.set()
            # wakes the accept blocked in `_answer` (close alone does not on Linux); joined before the close, so that
            # it cannot accept on the descriptor's number once another file reuses it. Not in a forked child (a
            # data-loader worker): its copy shares the socket, and a shutdown there would end the parent's answers
            if os.getpid() == self._owner:
                with contextlib.suppress(OSError):
                    self.socket.shutdown(socket.SHUT_RDWR)
                self._answering.join(timeout=5)
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
