"""`hub-vit classify`'s requests: a list of files sent in as few requests as the server takes, every file answered or
named with the reason it was refused, whatever else in its request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hub_vit.server.client.classifier import Classifier
from hub_vit.server.client.errors import CLIENT_ERROR_STATUSES, ImageTooLarge, refused_image
from hub_vit.server.client.messages import Prediction, split


def classify_files(client: Classifier, images: list[Path], queue_timeout_s: float | None = None,
                   **request: Any) -> tuple[dict[int, Prediction], dict[int, str]]:
    """{position: prediction} for the files the server classified, {position: why not} for the others (`hub-vit
    classify`). Requests hold at most the model's max_batch_size files, and no more bytes than the server takes (the
    client splits them). The server refuses a request at its first bad file and names that file's index in the
    request, and the client names a file too large to send alone: the file is set aside with the reason and the rest
    is sent again, so k bad files cost k more requests, the good files are still classified and each bad one is named
    by its path.
    A refusal that names no file (a file the client could not read) is resolved file by file. Other errors (no
    server, overload, unknown model) are raised: they are not about one file. `request`: more keywords for
    `Classifier.classify` (explain, head_fusion, discard_ratio)."""
    predictions: dict[int, Prediction] = {}
    errors: dict[int, str] = {}
    for offset, chunk in split(images, client.max_batch_size()):
        pending = list(enumerate(chunk, offset))  # (position in `images`, path) still to classify
        while pending:
            try:
                answers = client.classify([path for _, path in pending], queue_timeout_s=queue_timeout_s, **request)
                predictions.update(zip([position for position, _ in pending], answers, strict=True))
                break
            except Exception as err:
                failed = failed_file(err, len(pending))
                if failed is not None:
                    index, message = failed
                    errors[pending.pop(index)[0]] = message
                    continue
                if file_error(err) is None:
                    raise
            _one_by_one(client, pending, predictions, errors, queue_timeout_s, request)
            break
    return predictions, errors


def _one_by_one(client: Classifier, pending: list[tuple[int, Path]], predictions: dict[int, Prediction],
                errors: dict[int, str], queue_timeout_s: float | None, request: dict[str, Any]) -> None:
    """A refusal that names no file: each of `pending` sent alone, its answer or its reason recorded."""
    for position, path in pending:
        try:
            predictions[position] = client.classify([path], queue_timeout_s=queue_timeout_s, **request)[0]
        except Exception as err:
            message = file_error(err)
            if message is None:
                raise
            errors[position] = message


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
