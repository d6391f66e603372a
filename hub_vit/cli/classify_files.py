"""`hub-vit classify`'s requests: a list of files sent in as few requests as the server takes, every file answered or
named with the reason it was refused, whatever else in its request."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hub_vit.server.client.classifier import Classifier
from hub_vit.server.client.errors import (
    CLIENT_ERROR_STATUSES,
    ImageTooLarge,
    NoExplanation,
    NoQueueTimeouts,
    refused_image,
    restarting,
)
from hub_vit.server.client.messages import Prediction, split

T = TypeVar("T")

# the wait between two tries while serve's gate says its server is restarting: half the time waited so far, within
# these bounds (s); a restart takes 1-15 s
RESTART_POLL_S = (0.5, 2.0)
MAX_CONCURRENCY = 64  # `hub-vit classify --concurrency`: requests in flight, each a connection and a thread


class OutputFailed(Exception):
    """`classify_files`' `on_chunk` raised (the error is the `__cause__`): where the answers go failed (stdout's
    reader went away, a full disk), not a request; the run stopped."""


@dataclass
class Classified:
    """What `classify_files` got: {position: prediction} for the files the server classified, {position: why not}
    for those it refused or the client could not send, and `stopped`, the error that ended the run early (no server,
    a server that died with requests in flight, overload), after which no other request was sent."""

    predictions: dict[int, Prediction] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    stopped: Exception | None = None
    interrupted: bool = False  # Ctrl-C ended the run: what had been answered is here, the requests in flight are not

    def take(self, other: Classified) -> None:
        self.predictions.update(other.predictions)
        self.errors.update(other.errors)
        self.stopped = self.stopped or other.stopped

    def unresolved(self, count: int) -> list[int]:
        """Positions of the `count` files neither classified nor refused: the run ended before them."""
        return [i for i in range(count) if i not in self.predictions and i not in self.errors]


def classify_files(client: Classifier, images: list[Path], queue_timeout_s: float | None = None, *,
                   concurrency: int = 1, restart_wait_s: float = 0.0, on_restart: Callable[[], None] = lambda: None,
                   on_chunk: Callable[[Classified], None] | None = None, **request: Any) -> Classified:
    """Every file of `images` classified or named with the reason it was not (`hub-vit classify`), with up to
    `concurrency` requests in flight, from as many threads sharing `client` (a server's instances compute the requests
    side by side; the Classifier gives each thread its own connection).
    Requests hold at most the model's max_batch_size files, and no more bytes than the server takes (the client
    splits them). The server refuses a request at its first bad file and names that file's index in the request, and
    the client names a file too large to send alone: the file is set aside with the reason and the rest is sent
    again, so k bad files cost k more requests, the good files are still classified and each bad one is named by its
    path. A refusal that names no file (a file the client could not read) is resolved file by file.
    While serve's gate says its server is restarting, a request (the first one too, for the model's config) is sent
    again until `restart_wait_s` after the first such answer (`on_restart` is called then). Any other error that is
    not about one file ends the run: no further request is sent, and what was classified is kept, with the error in
    `stopped`. `on_chunk(done so far)` is called as the files of each request are resolved, in the order of `images`;
    what it raises (a closed stdout) stops the run: `OutputFailed` from it. Ctrl-C stops it too: what had been
    answered is returned, marked `interrupted` (the requests in flight are left to their daemon threads).
    `request`: more keywords for `Classifier.classify` (explain, head_fusion, discard_ratio)."""
    run = _Run(restart_wait_s, on_restart, on_chunk)
    # errors here (no server, not Triton, no such model) are raised: nothing was sent
    run.chunks = list(split(images, run.through_restarts(client.max_batch_size)))
    workers = [threading.Thread(target=run.work, args=(client, queue_timeout_s, request), daemon=True,
                                name=f"classify-{index}") for index in range(min(concurrency, len(run.chunks)))]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            while worker.is_alive():  # a timed join: Ctrl-C reaches this thread at once (the workers are daemons)
                worker.join(0.2)
    except KeyboardInterrupt:  # the answers so far are the caller's to show; no further request is sent
        with run.lock:  # a worker hands its answers on under the lock: none is half-reported
            run.halted = run.done.interrupted = True
            return run.finish()
    if run.on_chunk_error is not None:
        raise OutputFailed(str(run.on_chunk_error)) from run.on_chunk_error
    return run.finish()


class _Run:
    """The chunks of one `classify_files` call, taken in order by its workers; their answers handed on in order."""

    def __init__(self, restart_wait_s: float, on_restart: Callable[[], None],
                 on_chunk: Callable[[Classified], None] | None) -> None:
        self.restart_wait_s, self.on_restart, self.on_chunk = restart_wait_s, on_restart, on_chunk
        self.chunks: list[tuple[int, list[Path]]] = []  # (offset, files) of each request, set once the limit is read
        self.lock = threading.Lock()
        self.taken = 0  # chunks handed to a worker
        self.finished: dict[int, Classified] = {}  # chunk number -> its answers, until the chunks before are in
        self.reported = 0  # chunks merged into `done`, in order
        self.done = Classified()
        self.restart_deadline: float | None = None  # set by the first "restarting" answer
        self.on_chunk_error: BaseException | None = None  # on_chunk's (stdout closed by `| head`): raised by the caller
        self.halted = False  # a request stopped the run, or on_chunk failed: no further chunk is taken

    def work(self, client: Classifier, queue_timeout_s: float | None, request: dict[str, Any]) -> None:
        """One worker thread: chunks taken in order until none is left or the run halts."""
        while True:
            with self.lock:
                if self.halted or self.taken == len(self.chunks):
                    return
                number, self.taken = self.taken, self.taken + 1
            offset, chunk = self.chunks[number]
            result = self._chunk(client, list(enumerate(chunk, offset)), queue_timeout_s, request)
            with self.lock:
                self.finished[number] = result
                self.halted = self.halted or result.stopped is not None
                while self.reported in self.finished and self.done.stopped is None and not self.done.interrupted:
                    self.done.take(self.finished.pop(self.reported))
                    self.reported += 1
                    if self.on_chunk is not None and self.done.stopped is None:
                        try:
                            self.on_chunk(self.done)
                        except BaseException as err:  # where the answers go is gone: no further request is sent
                            self.on_chunk_error, self.halted = err, True
                            return

    def finish(self) -> Classified:
        """`done` with the answers of the requests in flight when the run stopped, in order."""
        for number in sorted(self.finished):
            self.done.take(self.finished[number])
        return self.done

    def _chunk(self, client: Classifier, pending: list[tuple[int, Path]], queue_timeout_s: float | None,
               request: dict[str, Any]) -> Classified:
        """One request's files (position in `images`, path) classified or named, or the error that stopped it."""
        found = Classified()
        while pending:
            try:
                answers = client.classify([path for _, path in pending], queue_timeout_s=queue_timeout_s, **request)
                found.predictions.update(zip([position for position, _ in pending], answers, strict=True))
                return found
            except Exception as err:
                failed = failed_file(err, len(pending))
                if failed is not None:
                    index, message = failed
                    found.errors[pending.pop(index)[0]] = message
                    continue
                if restarting(err) and self._waited_for_restart():
                    continue
                if file_error(err) is None:
                    found.stopped = err
                    return found
            _one_by_one(client, pending, found, queue_timeout_s, request)
            return found
        return found

    def through_restarts(self, call: Callable[[], T]) -> T:
        """`call()`, made again while the server is restarting (as a request is), until `restart_wait_s` after the
        first such answer; its other errors, or the last one, raised."""
        while True:
            try:
                return call()
            except Exception as err:
                if not (restarting(err) and self._waited_for_restart()):
                    raise

    def _waited_for_restart(self) -> bool:
        """Wait a little for a restarting server, unless `restart_wait_s` after the first such answer has passed;
        whether it waited."""
        with self.lock:
            now = time.monotonic()
            first = self.restart_deadline is None
            if self.restart_deadline is None:
                self.restart_deadline = now + self.restart_wait_s
            waited_s = self.restart_wait_s - (self.restart_deadline - now)
            pause = min(RESTART_POLL_S[1], max(RESTART_POLL_S[0], waited_s / 2))
            if now + pause > self.restart_deadline:
                return False
        if first:
            self.on_restart()
        time.sleep(pause)
        return True


def _one_by_one(client: Classifier, pending: list[tuple[int, Path]], found: Classified,
                queue_timeout_s: float | None, request: dict[str, Any]) -> None:
    """A refusal that names no file: each of `pending` sent alone, its answer or its reason recorded, until an error
    that is not about a file stops it (`found.stopped`)."""
    for position, path in pending:
        try:
            found.predictions[position] = client.classify([path], queue_timeout_s=queue_timeout_s, **request)[0]
        except Exception as err:
            message = file_error(err)
            if message is None:
                found.stopped = err
                return
            found.errors[position] = message


def failed_file(err: Exception, count: int) -> tuple[int, str] | None:
    """(index in the request, reason) when the server refused one of the `count` files sent by naming it, or the
    client found one too large to send."""
    if isinstance(err, ImageTooLarge):
        return (err.index, err.reason) if err.index < count else None
    failed = refused_image(err)
    return (failed.index, failed.reason) if failed is not None and failed.index < count else None


def file_error(err: Exception) -> str | None:
    """The reason one file failed, when the error is about that file (sent alone, or read by the client); None when
    it is not about a file (no server, overload, ...)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(err, ImageTooLarge):
        return err.reason
    if isinstance(err, InferenceServerException):
        if err.status() not in CLIENT_ERROR_STATUSES:
            return None
        failed = refused_image(err)  # the file's path replaces the image's number
        return failed.reason if failed is not None else " ".join((err.message() or str(err)).split())
    if isinstance(err, OSError) and err.filename is not None:  # unreadable (permissions, removed since the start);
        return f"cannot read the file: {err.strerror or err}"  # a socket error has no file name: not about a file
    if isinstance(err, (NoExplanation, NoQueueTimeouts)):  # what the request asks of this server: no file's fault
        return None
    if isinstance(err, ValueError):  # the client's own checks (e.g. not a regular file)
        return str(err)
    return None
