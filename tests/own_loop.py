"""Servers run on an event loop of their own, in a thread, for the length of a `with` block: a front and the server
standing in for Triton, which the test then reaches from its own (blocking) clients."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

Teardown = Callable[[], Awaitable[None]]


@contextmanager
def on_own_loop(setup: Callable[[], Awaitable[Teardown]], timeout_s: float = 30.0) -> Iterator[None]:
    """Run `setup()` on a new event loop in a daemon thread and keep the loop running until the block ends; then
    await the teardown `setup` returned and join the thread."""
    ready, stop = threading.Event(), threading.Event()

    async def run() -> None:
        teardown = await setup()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await teardown()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    assert ready.wait(timeout_s), "the servers did not start"
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout_s)
