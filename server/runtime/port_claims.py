"""Ports `free_port` handed out lately on this host, by any process of this user, so two processes never pick the
same one: a port is free when it is picked (bind to port 0, close), but its server binds it only later (Triton binds
after loading its models, seconds to minutes), and in between the kernel may give the same port to another process's
bind to port 0. Two `hub-vit serve` started at once (private ports), a supervisor starting several, or a test suite
in several processes would then start a server on a port another one is about to take.

The claims live in one small file in the temporary folder, `hub-vit-ports-<uid>` (`port unix-time` lines), read and
rewritten under an exclusive `flock`. A claim is dropped after `CLAIM_S`. The file is opened without following links,
and one that is not a plain file of this user's is not used (a shared /tmp). When it cannot be used at all (no
temporary folder, a read-only one), `free_port` keeps its in-process rule alone: nothing fails for want of it.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLAIM_S = 900.0  # longer than any server's start: a big model on a slow disk loads for minutes before Triton binds


def claims_file() -> Path:
    return Path(tempfile.gettempdir()) / f"hub-vit-ports-{os.getuid()}"


@contextmanager
def recent_claims() -> Iterator[dict[int, float]]:
    """The ports claimed in the last `CLAIM_S` seconds (port -> when), held under the file's lock for the block;
    what the block adds is written back. An empty dict that nothing keeps when the file cannot be used."""
    try:
        fd = os.open(claims_file(), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:  # no temporary folder, a read-only one, a link planted where the file goes
        yield {}
        return
    with os.fdopen(fd, "r+", encoding="ascii", errors="replace") as file:
        facts = os.fstat(fd)
        if not stat.S_ISREG(facts.st_mode) or facts.st_uid != os.getuid():  # another user's file: not ours to trust
            yield {}
            return
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the file is closed
        claims = _read(file.read(), now=time.time())
        yield claims
        try:
            file.seek(0)
            file.truncate()
            file.write("".join(f"{port} {when:.0f}\n" for port, when in sorted(claims.items())))
            file.flush()
        except OSError:  # a full disk: these claims are lost, the port is still handed out
            pass


def _read(text: str, *, now: float) -> dict[int, float]:
    """The claims in `text` that are still current; a damaged line (a write cut short) is skipped."""
    claims: dict[int, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            try:
                when = float(parts[1])
            except ValueError:
                continue
            if now - CLAIM_S < when <= now + 60:  # a clock set back more than a minute drops the claim
                claims[int(parts[0])] = when
    return claims


__all__ = ["CLAIM_S", "claims_file", "recent_claims"]
