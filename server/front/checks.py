"""The checks both fronts (HTTP and gRPC) make before a request reaches Triton 2.51, and the words they answer with.

Refused here (docs/serving.md, "Limits and security"):
* a body or message over the limit, also once inflated (`inflate`: gzip / deflate in bounded steps; a 1 MB gzip body
  inflating to 1 GB peaked at 6.6 GB RSS in Triton 2.51) -> 413 / RESOURCE_EXHAUSTED, tagged `protocol.too_large`;
* an inference request asking the classification extension of a non-numeric output (Triton 2.51 dies of SIGFPE on
  the STRING `labels`), or with a dimension of 0 or past int32 (a `[0, 1]` request was answered with rank-1 outputs;
  2^32+k was truncated to 32 bits) -> 400 / INVALID_ARGUMENT (`check_inference`);
* a per-request queue timeout where the served repository has no queue policy (Triton would ignore it)
  -> 400 / INVALID_ARGUMENT (`check_inference`);
* a rollout output (`rollout`, `rollout_box`) requested without the parameter `explain` true: Triton would answer
  200 without it, as the ensemble does not pass requested outputs on -> 400 / INVALID_ARGUMENT (`check_inference`);
* over gRPC, BYTES contents whose element count differs from the shape (`inference_refusal`);
* an HTTP inference body that is neither the protocol's JSON nor its binary form (`inference_header`: Triton 2.51
  answers an image file posted as is with HTTP 500 "failed to parse the request JSON buffer").
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from hub_vit.server import protocol

LARGEST_DIMENSION = 2**31 - 1  # Triton 2.51 keeps the batch dimension in 32 bits
NUMERIC = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
           "BF16"}
# The front's answers while no server stands behind it (a client backs off as from a refused connection), in the
# protocol's words, so clients read the state, not the sentence
STARTING = protocol.server_state(protocol.RESTARTING, "the server is starting or restarting; retry shortly")
SHUTTING_DOWN = protocol.server_state(protocol.SHUTTING_DOWN, "the server is shutting down: no new request is taken")
STOPPED = protocol.server_state(protocol.SHUTTING_DOWN, "the server stopped before answering (it is shutting down)")
# Bodies (HTTP) or messages (gRPC) held for checking past the front's share of max_buffered_bytes: retry shortly
BUSY = "the server holds too many large requests at once; retry shortly"
# A request relayed to a server that died before answering (HTTP 502, gRPC UNAVAILABLE): lost, not refused; it may
# have run (or be what killed it), so its fact is its own, not a server state a client would simply send again into
LOST = protocol.lost_in_flight("tritonserver closed the connection without an answer (it died? hub-vit serve restarts "
                               "it)")
GONE = protocol.server_state(protocol.SHUTTING_DOWN, "the server stopped and is not restarted (--max-restarts 0): "
                                                     "hub-vit serve is shutting down")


def unreachable(restarts: bool) -> str:
    """The answer where a server should be and its private port does not answer: it died (serve has not noticed
    yet) or is being replaced, "restarting"; without restarts (`--max-restarts 0`) it is gone, "shutting down"."""
    return STARTING if restarts else GONE
# The form of one image, for a client that has no copy of the docs (this text is sent to remote clients)
RAW_HTTP_EXAMPLE = ('the JSON header {"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES", '
                    '"parameters": {"binary_data_size": N + 4}}]}, then the file\'s length N as 4 little-endian '
                    "bytes, then the file, with Inference-Header-Content-Length: the header's length (hub-vit's "
                    'docs/serving.md, "Raw HTTP", builds it with curl)')
NO_QUEUE_TIMEOUTS = ("this server applies no per-request queue timeout (the request's 'timeout' parameter): it serves "
                     "without Triton's queue policy, which is what applies one (--no-queue-policy, the default on "
                     "cuda; hub-vit serve --queue-policy keeps it); send the request without a queue timeout")


def rollout_without_explain(output: object) -> str:
    """The refusal of a rollout output requested without `explain`: the model would answer 200 without the map."""
    explain, outputs = protocol.EXPLAIN_PARAMETER, " and ".join(map(repr, protocol.ROLLOUT_OUTPUTS))
    return (f"output {output!r} is part of the attention-rollout map, answered only to an explained request: send the "
            f'request parameter "{explain}": true (tritonclient: infer(..., parameters={{"{explain}": True}})), or '
            f'leave out {outputs} (hub-vit\'s docs/serving.md, "Explanations from the server")')


class Refused(Exception):
    """A request the front answers itself: HTTP `status` and the message; `close`: the connection ends after it."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.close = status, message, close


def too_large(limit: int, why: str) -> Refused:
    """413 for a request over the front's limit of `limit` bytes: tagged with the limit, naming the flag."""
    return Refused(413, protocol.too_large(limit, f"{why} (hub-vit serve --max-request-mb)"), close=True)


def inflate(body: bytes, encoding: str, limit: int, what: str = "the request body") -> bytes:
    """`body` inflated (gzip or deflate, as Triton 2.51 reads them), refused once it passes `limit` bytes: at most
    `limit` + 64 KiB is ever held. `what` names the body in the refusal."""
    inflater = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15)  # 47: gzip or zlib header
    out, pending = [], body
    size = 0
    try:
        while pending:
            chunk = inflater.decompress(pending, 1 << 16)
            pending = inflater.unconsumed_tail
            size += len(chunk)
            if size > limit:
                raise too_large(limit, f"{what} inflates ({encoding}) to more than {limit} bytes, the limit")
            out.append(chunk)
            if inflater.eof:
                break
        out.append(inflater.flush())
    except zlib.error as err:
        raise Refused(400, f"{what} is not valid {encoding} data: {err}") from None
    return b"".join(out)


def inference_header(model: str, body: bytes, header_length: bytes | None) -> dict[str, Any]:
    """The JSON header of an HTTP inference request's body (KServe v2: a JSON object, or with the
    Inference-Header-Content-Length header that many bytes of JSON followed by the tensors' binary data); 400 naming
    what the endpoint expects when the body is neither."""
    def refused(what: str) -> Refused:
        return Refused(400, f"{what}: POST /v2/models/{model}/infer takes a KServe v2 inference request, a JSON object "
                            '{"inputs": [...]} or, with an Inference-Header-Content-Length header, that JSON followed '
                            f"by the inputs' binary data; an image file is sent as a BYTES input: {RAW_HTTP_EXAMPLE}")
    json_part = body
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise refused(f"Inference-Header-Content-Length {header_length[:40].decode('latin-1')!r} is not a length "
                          f"within the {len(body)}-byte body")
        json_part = body[:int(header_length)]
    try:
        header = json.loads(json_part)
    except ValueError:  # UnicodeDecodeError included
        raise refused(f"the request body is not JSON (it starts with {body[:16]!r})") from None
    if not isinstance(header, dict):
        raise refused(f"the request's JSON is a {type(header).__name__}, not an object")
    return header


def wants_classification(header: dict[str, Any]) -> bool:
    """Whether an inference request's JSON header asks the classification extension of any output."""
    return any(isinstance(output, dict) and isinstance(output.get("parameters"), dict)
               and "classification" in output["parameters"] for output in header.get("outputs") or ())


def check_inference(header: object, numeric_outputs: set[str] | None, queue_timeouts: bool = True) -> None:
    """Refuse (400) what crashes or misleads Triton 2.51 in an inference request's JSON header: the classification
    extension on a non-numeric output, a dimension of 0 or beyond int32, and a per-request queue timeout (parameter
    `timeout`) where the server applies none (`queue_timeouts` False: no queue policy, so Triton would ignore it).
    `numeric_outputs`: the model's numeric outputs (None: unknown, so any classification request is refused).
    Also a rollout output requested without `explain` true (the model would answer without it). Anything else is
    left to Triton."""
    if not isinstance(header, dict):
        return
    parameters = header.get("parameters")
    if not queue_timeouts and isinstance(parameters, dict) and "timeout" in parameters:
        raise Refused(400, NO_QUEUE_TIMEOUTS)
    if isinstance(parameters, dict) and "timeout" in parameters and not _count(parameters["timeout"],
                                                                                protocol.LONGEST_QUEUE_TIMEOUT_US):
        raise Refused(400, "the request parameter 'timeout' (its queue timeout) must be an integer number of "
                           f"microseconds from 0 to {protocol.LONGEST_QUEUE_TIMEOUT_US} (one day), got "
                           f"{_shown(parameters['timeout'])}")
    explained = isinstance(parameters, dict) and parameters.get(protocol.EXPLAIN_PARAMETER) is True
    for output in header.get("outputs") or ():
        if not isinstance(output, dict):
            continue
        if not explained and output.get("name") in protocol.ROLLOUT_OUTPUTS:
            raise Refused(400, rollout_without_explain(output["name"]))
        parameters = output.get("parameters")
        if isinstance(parameters, dict) and "classification" in parameters:
            name = output.get("name")
            if numeric_outputs is None or name not in numeric_outputs:
                raise Refused(400, f"the classification extension is not served for output {name!r}: it needs a "
                                   "numeric output, and Triton 2.51 crashes on a STRING one; request 'labels' and "
                                   "'scores' (already the top-k, best first) without 'classification'")
    for tensor in (*(header.get("inputs") or ()), *(header.get("outputs") or ())):
        given = tensor.get("parameters") if isinstance(tensor, dict) else None
        if isinstance(given, dict) and "binary_data_size" in given and not _count(given["binary_data_size"], 2**63 - 1):
            raise Refused(400, f"tensor {tensor.get('name')!r}: its parameter 'binary_data_size' must be a whole "
                               f"number of bytes (0 or more), got {_shown(given['binary_data_size'])}")
    for tensor in header.get("inputs") or ():
        if not isinstance(tensor, dict) or not isinstance(tensor.get("shape"), list):
            continue
        for dim in tensor["shape"]:
            if isinstance(dim, int) and not 1 <= dim <= LARGEST_DIMENSION:
                raise Refused(400, f"input {tensor.get('name')!r} has shape {tensor['shape']}: every dimension must "
                                   f"be between 1 and {LARGEST_DIMENSION}")


def _count(value: object, most: int) -> bool:
    """Whether a JSON value is an integer from 0 to `most` (Triton 2.51 answers 500, "attempt to access JSON
    non-unsigned-integer as unsigned-integer", for a negative or fractional one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _shown(value: object) -> str:
    return json.dumps(value)[:40]


def numeric_outputs(metadata: Any) -> set[str]:
    """The numeric outputs of a model, from its metadata (HTTP: the JSON dict; gRPC: a ModelMetadataResponse)."""
    if isinstance(metadata, dict):
        return {o["name"] for o in metadata.get("outputs", ()) if isinstance(o, dict) and o.get("datatype") in NUMERIC}
    return {output.name for output in metadata.outputs if output.datatype in NUMERIC}


# -- gRPC ------------------------------------------------------------------------------------------------------------
def parse_inference(message: bytes) -> Any:
    """A serialized `ModelInferRequest`, parsed; None when it does not parse."""
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest()
    try:
        request.ParseFromString(message)
    except DecodeError:
        return None
    return request


def inference_refusal(request: Any, numeric: set[str] | None, queue_timeouts: bool = True) -> str | None:
    """Why a `ModelInferRequest` must not reach Triton 2.51 (`check_inference`'s reasons, plus BYTES contents that
    do not match their shape), or None."""
    header = {"inputs": [{"name": tensor.name, "shape": list(tensor.shape)} for tensor in request.inputs],
              "outputs": [{"name": output.name, "parameters": dict.fromkeys(output.parameters)}
                          for output in request.outputs],
              "parameters": {name: _value(parameter) for name, parameter in request.parameters.items()}}
    try:
        check_inference(header, numeric, queue_timeouts)
    except Refused as refusal:
        return refusal.message
    raw = request.raw_input_contents
    for index, tensor in enumerate(request.inputs):
        if tensor.datatype != "BYTES" or index >= len(raw):
            continue
        found = _bytes_elements(raw[index])
        if found is None:
            continue
        declared = _product_up_to(tensor.shape, MOST_ELEMENTS)
        if declared != found:
            count = f"{declared}" if declared <= MOST_ELEMENTS else f"more than {MOST_ELEMENTS}"
            return (f"input {tensor.name!r} has shape {_shape_text(tensor.shape)} ({count} elements) but its contents "
                    f"hold {found}")
    return None


def _value(parameter: Any) -> object:
    """An `InferParameter`'s value (bool, int, str or float), None when it has none."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


MOST_ELEMENTS = 2**64  # past this a tensor's element count is only "more than": no number of thousands of digits


def _product_up_to(shape: Any, most: int) -> int:
    """The product of `shape`, or `most` + 1 once it passes `most` (a shape of thousands of large dimensions would
    otherwise make a number of thousands of digits, slowly)."""
    total = 1
    for dim in shape:
        total *= dim
        if total > most:
            return most + 1
    return total


def _shape_text(shape: Any, shown: int = 8) -> str:
    dims = list(shape[:shown + 1])
    if len(dims) <= shown:
        return str(dims)
    return f"[{', '.join(map(str, dims[:shown]))}, ...] ({len(shape)} dimensions)"


def _bytes_elements(raw: bytes) -> int | None:
    """The number of length-prefixed elements in a BYTES tensor's raw contents; None when the framing is broken
    (Triton answers that itself)."""
    count, pos = 0, 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            return None
        pos += 4 + struct.unpack_from("<I", raw, pos)[0]
        count += 1
    return count if pos == len(raw) else None
