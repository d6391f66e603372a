"""Stop signals as exceptions that are never lost: a handler raises `StopRequested` where the signal lands, so the
`finally` / `except BaseException` blocks that remove staging and temporary folders run (Python's default SIGTERM
ends the process at once, skipping them).

Python drops an exception raised while a `__del__` or a weakref callback runs (torch runs them all through an
export): it prints "Exception ignored in ... Traceback ... SystemExit: 143" and goes on. `raise_on(...)` installs
`sys.unraisablehook` so that a dropped stop, or a dropped Ctrl-C (KeyboardInterrupt), is raised again a moment later
(SIGALRM), in the program's own code, and nothing is printed.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any


class StopRequested(SystemExit):
    """A stop signal, raised where it landed; its code is 128 + the signal's number, the shell's convention."""


def raise_on(signals: Sequence[signal.Signals], *, once: bool = False) -> None:
    """Make each of `signals` raise `StopRequested` (those ignored stay ignored: under `nohup` a closed terminal's
    SIGHUP stops nothing). `once`: the first stop ignores the later ones, so a second signal cannot cut the clean-up
    short."""
    def stop(signum: int, frame: object) -> None:
        if once:
            for stopping in signals:
                signal.signal(stopping, signal.SIG_IGN)
        raise StopRequested(128 + signum)

    for stopping in signals:
        if signal.getsignal(stopping) != signal.SIG_IGN:
            signal.signal(stopping, stop)
    sys.unraisablehook = _dropped


def cleaning_up() -> None:
    """From here on nothing stops the process: Ctrl-C's SIGINT and serve's SIGTERM both reach a build child, and the
    second must not cut short the clean-up the first began (a stop raised again after a drop is cancelled too)."""
    for stopping in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stopping, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, 0)


def _dropped(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, (StopRequested, KeyboardInterrupt)):
        _raise_again(unraisable.exc_value)
        return
    sys.__unraisablehook__(unraisable)


def _raise_again(dropped: BaseException) -> None:
    def again(signum: int, frame: object) -> None:
        raise StopRequested(dropped.code) if isinstance(dropped, StopRequested) else KeyboardInterrupt

    signal.signal(signal.SIGALRM, again)
    signal.setitimer(signal.ITIMER_REAL, 0.05)


__all__ = ["StopRequested", "cleaning_up", "raise_on"]
