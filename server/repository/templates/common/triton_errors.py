"""Errors the decoding Python-backend models answer one request with (copied beside their model.py, with
imageprep.py): the rest of the dynamic batch is still served."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils
from imageprep import BadImageError


def client_error(message: str) -> pb_utils.TritonError:
    """INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT) where this Triton has error codes; a plain error (500) before."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def request_error(err: Exception) -> pb_utils.TritonError:
    """A bad image is the client's error (named, 400); anything else that failed while preparing one request's
    images (a MemoryError resizing a huge image, say) is the server's (500), for that request only."""
    if isinstance(err, BadImageError):
        return client_error(str(err))
    return pb_utils.TritonError(f"could not prepare the request's images: {type(err).__name__}: {err}")
