"""The garbage collector of a Python-backend step (copied beside its model.py): what `initialize` loaded is frozen out
of it, so that no full collection walks it again while the step serves.

CPython starts a full collection once the objects promoted since the last one pass a quarter of those that lived
through it; a busy step promotes its requests' objects (futures, tensors, images alive when a young collection ran),
so one starts every few seconds. Each walks every object alive, the loaded modules and model included: for the torch
flavour about 400,000 of them (torch, timm, hub_vit), about 0.2 s on a 2-core Zen 5 host, holding the GIL, so every
thread of the step (the decode pool's included) stops meanwhile. Frozen (`gc.freeze`: the permanent generation), they
are never walked again: a full collection then walks what the requests left, a few milliseconds. What is frozen is
what the step holds until it ends anyway (modules, weights, sessions); cycles made while loading are collected first.
"""

from __future__ import annotations

import gc
import os
import time

FREEZE_ENV = "HUB_VIT_GC_FREEZE"  # "0" in the server's environment: leave the collector as Python has it (benchmarks)


def freeze_loaded() -> None:
    """Collect the garbage `initialize` left, then move every object still alive to the permanent generation."""
    if os.environ.get(FREEZE_ENV, "1") == "0":
        return
    gc.collect()
    gc.freeze()


class CollectionClock:
    """The time this process has spent in garbage collections since `start` (`gc.callbacks`): every thread waits for
    them, so a step's phases and a benchmark's steps count them apart. `stop` takes the callback out again."""

    def __init__(self) -> None:
        self.ns, self._began = 0, 0

    def start(self) -> CollectionClock:
        gc.callbacks.append(self._collection)
        return self

    def stop(self) -> None:
        gc.callbacks.remove(self._collection)

    def _collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter_ns()
        else:
            self.ns += time.perf_counter_ns() - self._began
