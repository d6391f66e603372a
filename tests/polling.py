"""Waiting in tests for what the OS does a moment later (a SIGKILLed process is gone once it next runs)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll `condition` until it is true or `timeout_s` has passed; whether it became true (the caller asserts, with
    its own message)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True
