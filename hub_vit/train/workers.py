"""Stop signals and data-loader workers of a training run.

Ctrl-C and SIGTERM end a single-process run after its current step (`StopOnSignal`); the loader's worker processes
ignore both (`ignore_stop_signals`), are started with the signals held (`start_workers`) and are always shut down
(`shut_down_workers`), so a signal never kills a worker mid-step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from hub_vit.train.data import DataFolderError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """Ctrl-C (SIGINT) and SIGTERM (`kill`, `timeout`, SLURM's scancel and time limit, systemd) end a single-process
    run after the current step, with a checkpoint of it, instead of losing every step since the last checkpoint (1000
    by default). After the first signal the previous handlers are back, so a second one interrupts at once (the
    checkpoint being written is a staging folder renamed into place: it is either complete or absent)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        self._restore()

    def __enter__(self) -> StopOnSignal:
        if self.enabled:
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) == signal.SIG_IGN:  # ignored on purpose by whoever started us: keep it so
                    continue
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._handle:
                # getsignal/signal return None for a handler installed outside Python: signal.signal(signum, None)
                # raises TypeError, so the default action stands in for it
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._previous[signum]


def ignore_stop_signals(worker_id: int) -> None:
    """Data-loader workers share the process group: Ctrl-C from the terminal, and SIGTERM from `timeout` or SLURM
    (which signal the whole group), must not kill them mid-step. The main process finishes the step, writes the
    checkpoint and stops; its loader shuts them down. A worker killed by the signal used to make torch raise 'DataLoader
    worker is killed by signal: Terminated' in the main process, even inside the clean-up of a checkpoint."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held by `start_workers` until now


def start_workers(loader: DataLoader) -> Iterator:
    """`iter(loader)`, with the stop signals held (blocked) in this thread while it starts the worker processes.

    A new worker installs torch's SIGTERM handler (which re-raises a SIGTERM not sent by its parent) before it runs
    `ignore_stop_signals`; a group SIGTERM landing in between killed it, and the run failed instead of stopping
    after its step. The workers inherit the held signals and release them once they ignore them (a pending one is
    then dropped); here a pending one is delivered as soon as the mask is restored (to `StopOnSignal` in a run)."""
    if not hasattr(signal, "pthread_sigmask"):  # not on Windows, where none of this applies
        return iter(loader)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)



def one_line_errors(batches):
    """The loader's batches; a DataFolderError raised in a worker comes out with its own one-line message."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except DataFolderError as exc:
            raise DataFolderError.from_worker(exc) from None
        yield batch


@contextlib.contextmanager
def shut_down_workers(batches):
    """Stop the loader's worker processes when the loop ends, also by an exception. The workers ignore SIGTERM
    (`ignore_stop_signals`), so they must be told to exit: left to garbage collection, an iterator kept alive by
    the exception's traceback outlives the interpreter's exit, where multiprocessing terminates its daemon children
    with SIGTERM and waits for them, forever."""
    try:
        yield batches
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)  # torch's multi-process iterator; none with 0 workers
        if shutdown is not None:
            shutdown()
