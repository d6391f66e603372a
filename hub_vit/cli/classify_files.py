"""`hub-vit classify`'s requests: a list of files sent in as few requests as the server takes, every file answered or
named with the reason it was refused, whatever else in its request."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub_vit.server.client.classifier import Classifier
from hub_vit.server.client.errors import CLIENT_ERROR_STATUSES, ImageTooLarge, refused_image, restarting
from hub_vit.server.client.messages import Prediction, split

# the waits between two tries while serve's gate says its server is restarting (s): a restart takes 1-15 s
RESTART_POLL_S = (0.5, 1.0, 2.0)


@dataclass
class Classified:
    """What `classify_files` got: {position: prediction} for the files the server classified, {position: why not}
    for those it refused or the client could not send, and `stopped`, the error that ended the run early (no server,
    a server that died with requests in flight, overload), after which the other files were not sent."""

    predictions: dict[int, Prediction] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    stopped: Exception | None = None


def classify_files(client: Classifier, images: list[Path], queue_timeout_s: float | None = None, *,
                   restart_wait_s: float = 0.0, on_restart: Callable[[], None] = lambda: None,
                   on_chunk: Callable[[Classified], None] | None = None, **request: Any) -> Classified:
    """Every file of `images` classified or named with the reason it was not (`hub-vit classify`). Requests hold at
    most the model's max_batch_size files, and no more bytes than the server takes (the client splits them). The
    server refuses a request at its first bad file and names that file's index in the request, and the client names
    a file too large to send alone: the file is set aside with the reason and the rest is sent again, so k bad files
    cost k more requests, the good files are still classified and each bad one is named by its path.
    A refusal that names no file (a file the client could not read) is resolved file by file. While serve's gate says
    its server is restarting, a request is sent again for up to `restart_wait_s` in all (`on_restart` is called when
    the first wait begins). Any other error that is not about one file ends the run: what was classified before is
    kept, with the error in `stopped`. `on_chunk(done so far)` is called as each request's files are all resolved.
    `request`: more keywords for `Classifier.classify` (explain, head_fusion, discard_ratio)."""
    done = Classified()
    waited: list[float] = []  # the seconds waited for restarts so far, one entry per wait
    for offset, chunk in split(images, client.max_batch_size()):
        pending = list(enumerate(chunk, offset))  # (position in `images`, path) still to classify
        while pending:
            try:
                answers = client.classify([path for _, path in pending], queue_timeout_s=queue_timeout_s, **request)
                done.predictions.update(zip([position for position, _ in pending], answers, strict=True))
                break
            except Exception as err:
                failed = failed_file(err, len(pending))
                if failed is not None:
                    index, message = failed
                    done.errors[pending.pop(index)[0]] = message
                    continue
                if restarting(err) and _waited_for_restart(waited, restart_wait_s, on_restart):
                    continue
                if file_error(err) is None:
                    done.stopped = err
                    return done
            if not _one_by_one(client, pending, done, queue_timeout_s, request):
                return done
            break
        if on_chunk is not None:
            on_chunk(done)
    return done


def _waited_for_restart(waited: list[float], restart_wait_s: float, on_restart: Callable[[], None]) -> bool:
    """Wait a little for a restarting server, unless `restart_wait_s` is spent; whether it waited."""
    pause = RESTART_POLL_S[min(len(waited), len(RESTART_POLL_S) - 1)]
    if sum(waited) + pause > restart_wait_s:
        return False
    if not waited:
        on_restart()
    time.sleep(pause)
    waited.append(pause)
    return True


def _one_by_one(client: Classifier, pending: list[tuple[int, Path]], done: Classified,
                queue_timeout_s: float | None, request: dict[str, Any]) -> bool:
    """A refusal that names no file: each of `pending` sent alone, its answer or its reason recorded; False when an
    error that is not about a file ended the run (`done.stopped`)."""
    for position, path in pending:
        try:
            done.predictions[position] = client.classify([path], queue_timeout_s=queue_timeout_s, **request)[0]
        except Exception as err:
            message = file_error(err)
            if message is None:
                done.stopped = err
                return False
            done.errors[position] = message
    return True


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
    if isinstance(err, ValueError):  # the client's own checks (e.g. not a regular file)
        return str(err)
    return None
