"""Only a session's newest analysis reaches its page.

The page's controls are separate Gradio events that share the queue's slots (`concurrency_id`), so two runs of one
session can compute at once, and Gradio shows each answer as it arrives: an upload that finished after the example
picked next put the upload's labels and maps beside the example's picture. Each run takes a ticket from its session;
a run that a later one of the same session has overtaken answers `gr.skip()` for every output, leaving the page to
the newer run.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import gradio as gr

Handler = Callable[..., tuple[Any, ...]]


class SessionRuns:
    """The newest run's ticket per session (thread-safe: Gradio runs handlers in worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets = itertools.count(1)
        self._newest: dict[str, int] = {}

    def start(self, session: str) -> int:
        with self._lock:
            ticket = self._newest[session] = next(self._tickets)
        return ticket

    def is_newest(self, session: str, ticket: int) -> bool:
        with self._lock:
            return self._newest.get(session) == ticket

    def forget(self, request: gr.Request) -> None:
        """For `Blocks.unload`: the page is gone (closed or reloaded)."""
        with self._lock:
            self._newest.pop(request.session_hash or "", None)

    def __len__(self) -> int:
        return len(self._newest)


def newest_only(runs: SessionRuns, handler: Handler) -> Handler:
    """`handler` (the demo's seven inputs -> its outputs) for Gradio, answering only while it is its session's newest
    run; an overtaken run's outputs are all `gr.skip()`. Gradio passes `request` (found by its annotation)."""

    def newest(image_path: str | None, model_key: str, backend: str, head_fusion: str, discard_ratio: float,
               layer: float | None, target: str | None, request: gr.Request) -> tuple[Any, ...]:
        session = request.session_hash
        ticket = runs.start(session) if session else None  # no session (an API call without one): nothing to overtake
        answer = handler(image_path, model_key, backend, head_fusion, discard_ratio, layer, target)
        if ticket is None or runs.is_newest(session, ticket):
            return answer
        return tuple(gr.skip() for _ in answer)

    newest.__name__ = handler.__name__  # the name Gradio shows for the event (its API name)
    return newest
