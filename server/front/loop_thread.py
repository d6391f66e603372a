"""An asyncio event loop on a daemon thread, driven from other threads: what serve's HTTP and gRPC gates run on.

`call` runs a coroutine on the loop and waits for its result; `stop` ends the loop and joins the thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


async def until_idle(in_flight: Callable[[], int], timeout_s: float) -> bool:
    """Poll `in_flight()` (on the loop) until it is 0 or `timeout_s` has passed; whether it reached 0."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while in_flight() and loop.time() < deadline:
        await asyncio.sleep(0.02)
    return not in_flight()
