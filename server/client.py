"""Python clients for the served classifier (sync and async, HTTP and gRPC, over tritonclient).

    with Classifier("127.0.0.1:8000") as clf:               # or protocol="grpc", url "127.0.0.1:8001"
        for p in clf.classify(["cat.jpg", b"...png bytes...", pil_image]):
            print(p.labels[0], p.scores[0])
        p = clf.classify("cat.jpg", explain=True)[0]      # + p.rollout (H', W') on p.rollout_box of the image

Images travel encoded (paths are read as-is, PIL images are encoded losslessly as PNG); decoding, resizing and
normalising happen on the server, exactly once, with the model's own transform.
"""

from __future__ import annotations

import asyncio
import io
import numbers
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hub_vit.server.options import LONGEST_QUEUE_TIMEOUT_US

PROTOCOLS = ("http", "grpc")
ImageLike = Any  # str | Path | bytes | PIL.Image.Image
OUTPUTS = ("labels", "scores", "class_ids")
EXPLAIN_OUTPUTS = ("rollout", "rollout_box")  # answered to a request whose parameters say `explain` (served_rollout.py)
# Modes a PNG holds as they are; Pillow refuses to write the others (CMYK, YCbCr, LAB, HSV, RGBX, RGBa, La, PA, F,
# and the 16-bit "I;16L" / "I;16N", which `_png_ready` rewrites as "I;16") as PNG, and writing "I" is deprecated.
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I;16B")
# 16-bit greyscale in a byte order Pillow's PNG writer does not take; the samples are kept, only their layout changes.
_OTHER_16BIT_MODES = ("I;16L", "I;16N")
# Requests one AsyncClassifier.classify call keeps in flight: enough to keep the dynamic batcher fed, few enough that
# a long list does not fill the server's queue (max_queue_size) and get its tail rejected as an overload.
MAX_IN_FLIGHT = 4
# How the server names a bad image: its 0-based index within the request it came in, after the ensemble's name
# ("in ensemble 'vit', image 3: not an image: ...").
_IMAGE_ERROR = re.compile(r"^(in ensemble '[^']*', )?image (\d+): ")
# aiohttp, under tritonclient's asyncio HTTP client, asks for compressed answers by default ("Accept-Encoding: gzip,
# deflate, br"), and Triton then gzips every answer: CPU on both ends for a few hundred bytes of top-k, or float logits
# that hardly shrink (seen in a profile: about 1% of a loaded 2-core server, plus the client's inflate). The blocking
# client asks for nothing, so answers come plain.
PLAIN_ANSWERS = {"Accept-Encoding": "identity"}
# A request refused for what it holds (a bad image, a wrong tensor): HTTP 400 / gRPC INVALID_ARGUMENT.
CLIENT_ERROR_STATUSES = ("400", "StatusCode.INVALID_ARGUMENT")
# Triton's answers when it sheds load: the queue was full (max_queue_size), or the request waited in it longer than its
# queue timeout. HTTP 503 / gRPC UNAVAILABLE, the status gRPC also gives when no server answers: only these words tell.
SHED_MESSAGES = ("Exceeds maximum queue size", "Request timeout expired")


@dataclass(frozen=True)
class Prediction:
    """Top-k of one image, best first; `logits` only when asked for (`with_logits=True`). With `explain=True`,
    `rollout` is the server's attention-rollout map (H', W') on the model's patch grid (relevance mass, as
    `hub_vit.explain.attention_rollout`'s maps) and `rollout_box` the model's crop (left, top, right, bottom) in the
    image's own pixels, where the map lies (`hub_vit.explain.blend(image, rollout, rollout_box)` draws it)."""

    labels: list[str]
    scores: list[float]
    class_ids: list[int]
    logits: np.ndarray | None = None
    rollout: np.ndarray | None = None
    rollout_box: tuple[float, float, float, float] | None = None
    model_name: str | None = None  # which model and version answered (Triton's response)
    model_version: str | None = None


def encode(image: ImageLike) -> bytes:
    """Path / bytes / PIL image -> encoded bytes as sent to the server."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, (str, Path)):
        path = Path(image)
        if path.is_dir():
            raise ValueError(f"{str(path)!r} is a directory; give image files (JPEG, PNG or WebP)")
        if not path.exists():
            raise ValueError(f"image file {str(path)!r} does not exist")
        if not path.is_file():
            raise ValueError(f"{str(path)!r} is not a regular file; give image files (JPEG, PNG or WebP)")
        return path.read_bytes()
    if hasattr(image, "save") and hasattr(image, "mode"):
        buffer = io.BytesIO()
        _png_ready(image).save(buffer, format="PNG")
        return buffer.getvalue()
    raise ValueError(f"cannot send {type(image).__name__}; valid image types: path, bytes, PIL.Image")


def _png_ready(image: Any) -> Any:
    """A PIL image in a mode PNG can hold, converted the way the server's decoder would treat it."""
    if image.mode in PNG_MODES:
        return image
    if image.mode in _OTHER_16BIT_MODES:  # same samples, rewritten little-endian as "I;16", which PNG can hold
        from PIL import Image

        return Image.frombytes("I;16", image.size, np.asarray(image).astype("<u2").tobytes())
    if image.mode == "F":
        raise ValueError("cannot send a mode 'F' (32-bit float) PIL image: its value range is unknown; convert it to "
                         "'L' or 'RGB' first")
    if image.mode == "I":
        from hub_vit.image_modes import to_8bit

        return to_8bit(image)  # 16-bit samples in 32-bit ints -> their high bytes, as the server does for 16-bit PNGs
    from hub_vit.image_modes import ALPHA_MODES, flatten_alpha

    if image.mode in ALPHA_MODES:  # RGBa, La, PA: composited onto white here, as the server does with RGBA / LA
        return flatten_alpha(image)
    return image.convert("RGB")  # CMYK, YCbCr, ...


def server_address(url: str) -> tuple[str, bool]:
    """`host:port`, optionally written as a URL (`http://`, `grpc://`; `https://` for TLS) -> (host:port, use TLS).
    `ValueError` naming the problem otherwise: tritonclient itself fails on these with unrelated errors (a bad port
    ends in an AttributeError from its destructor)."""
    example = "e.g. 127.0.0.1:8000 for HTTP or 127.0.0.1:8001 for gRPC"
    if not isinstance(url, str):
        raise TypeError(f"the server URL must be a string such as '127.0.0.1:8000', got {url!r}")
    scheme, sep, rest = _split_scheme(url)
    if not sep:
        scheme, rest = "", scheme
    if scheme not in ("", "http", "https", "grpc"):
        raise ValueError(f"unsupported scheme {scheme!r} in server URL {url!r}; give host:port ({example})")
    rest = rest.rstrip("/")
    if "/" in rest or "?" in rest or "#" in rest:
        raise ValueError(f"server URL {url!r} has a path; give host:port only ({example})")
    if "@" in rest:  # tritonclient would take `user@host` as the host name
        raise ValueError(f"server URL {url!r} holds a user name; give host:port only ({example})")
    try:
        parts = urllib.parse.urlsplit(f"//{rest}")
        port = parts.port
    except ValueError:
        port, parts = None, None
    if parts is None or not parts.hostname or port is None or port == 0:
        raise ValueError(f"server URL must be host:port ({example}), got {url!r}")
    return rest, scheme == "https"


def _split_scheme(url: str) -> tuple[str, str, str]:
    """(scheme in lower case, "://" or "", the rest): URL schemes are case-insensitive (`HTTP://...`)."""
    scheme, sep, rest = url.strip().partition("://")
    return (scheme.lower(), sep, rest) if sep else (scheme, sep, rest)


def resolve_protocol(url: str, protocol: str | None = None) -> str:
    """The protocol to speak to `url`: `grpc://` means gRPC and `http://` HTTP; otherwise (`host:port`, `https://`)
    `protocol`, HTTP when not given. A URL whose scheme names the other protocol than `protocol` is refused: it would
    be spoken to in the wrong language and fail with an unrelated parse error."""
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    scheme = _split_scheme(url)[0] if "://" in url else ""
    named = {"grpc": "grpc", "http": "http"}.get(scheme)
    if named is not None and protocol is not None and named != protocol:
        raise ValueError(f"server URL {url!r} is a {scheme}:// address, but the protocol asked for is {protocol}; "
                         f"drop one of them (a bare host:port takes the protocol asked for)")
    return named or protocol or "http"


def _module(protocol: str, aio: bool = False) -> Any:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if protocol == "http":
        import tritonclient.http as http
        import tritonclient.http.aio as http_aio

        return http_aio if aio else http
    import tritonclient.grpc as grpc
    import tritonclient.grpc.aio as grpc_aio

    return grpc_aio if aio else grpc


def as_batch(images: Sequence[ImageLike] | ImageLike) -> list[ImageLike]:
    """One image or a list/tuple of them -> a non-empty list."""
    batch = list(images) if isinstance(images, (list, tuple)) else [images]
    if not batch:
        raise ValueError("no images given; pass at least one path, bytes object or PIL image")
    return batch


def batch_limit(config: Any) -> int:
    """Triton's model config (HTTP: a dict; gRPC: a `ModelConfigResponse`) -> its `max_batch_size`, the most images
    one request may hold; 0 means the model declares no limit."""
    if isinstance(config, dict):
        return int(config.get("config", config).get("max_batch_size", 0))  # gRPC's as_json=True nests it in "config"
    return int(config.config.max_batch_size)


def split(images: list[ImageLike], limit: int) -> list[tuple[int, list[ImageLike]]]:
    """(offset, images) chunks of at most `limit` images (all in one when `limit` is 0: no limit), in order."""
    size = limit if limit > 0 else len(images)
    return [(start, images[start:start + size]) for start in range(0, len(images), size)]


def _renumbered(err: Exception, offset: int) -> Exception:
    """A server error about "image i" of a chunk, renumbered to the image's index in the caller's whole list (the
    chunks are this client's doing; the caller only sees its list)."""
    from tritonclient.utils import InferenceServerException

    if offset == 0 or not isinstance(err, InferenceServerException):
        return err
    message = _IMAGE_ERROR.sub(lambda m: f"{m[1] or ''}image {int(m[2]) + offset}: ", err.message() or "", count=1)
    return InferenceServerException(message, status=err.status(), debug_details=err.debug_details())


LONGEST_QUEUE_TIMEOUT_S = LONGEST_QUEUE_TIMEOUT_US // 1_000_000


def check_timeout(timeout_s: float, *, name: str = "timeout_s", most: float = float("inf")) -> None:
    """A wait for an answer (`timeout_s`, named `name` in the message) must be a positive, finite number of seconds,
    at most `most`: tritonclient and sockets fail on others with unrelated errors (0: BlockingIOError; -1: "Timeout
    value out of range"; nan refused; inf and 1e300 overflow)."""
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
            or not (0 < timeout_s < float("inf") and timeout_s <= most)):
        bound = f" (at most {most:g})" if most < float("inf") else ""
        raise ValueError(f"{name} must be a positive number of seconds{bound}, got {timeout_s!r}")


def queue_timeout(seconds: float | None) -> dict[str, int]:
    """`queue_timeout_s` -> tritonclient's `infer(timeout=...)` keyword (microseconds; Triton takes it from the
    request's parameters when the model's queue policy allows an override, as generated repositories do)."""
    if seconds is None:
        return {}
    # numbers.Real takes numpy scalars too; at most the repository's own default (one day), the longest timeout
    # Triton applies (a longer one is not even parsed: HTTP 500 / a protobuf range error on gRPC)
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not 0 < seconds <= LONGEST_QUEUE_TIMEOUT_S:
        raise ValueError(f"the queue timeout must be a positive number of seconds, at most {LONGEST_QUEUE_TIMEOUT_S} "
                         f"(one day), got {seconds!r}")
    return {"timeout": max(1, round(float(seconds) * 1e6))}


def shed(err: Exception) -> bool:
    """Whether the server refused a request to shed load (its queue was full, or the request waited longer than its
    queue timeout), rather than not answering at all."""
    from tritonclient.utils import InferenceServerException

    return isinstance(err, InferenceServerException) and any(words in (err.message() or "")
                                                             for words in SHED_MESSAGES)


def no_server(err: Exception) -> bool:
    """Whether `hub-vit serve`'s HTTP gate answered for a server that is not there right now (restarting, shutting
    down): like a refused connection, not an answer of the model's."""
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.gate import NO_SERVER_MESSAGES

    return isinstance(err, InferenceServerException) and any(words in (err.message() or "")
                                                             for words in NO_SERVER_MESSAGES)


def failed_image(err: Exception) -> tuple[int, str] | None:
    """The server's refusal of one image -> (the image's index in the request, the reason without the "image i: "
    prefix); None for any other error (no server, overload, a wrong tensor, too large a batch)."""
    from tritonclient.utils import InferenceServerException

    if not isinstance(err, InferenceServerException) or err.status() not in CLIENT_ERROR_STATUSES:
        return None
    message = " ".join((err.message() or "").split())
    match = _IMAGE_ERROR.match(message)
    return None if match is None else (int(match[2]), message[match.end():])


def explain_parameters(explain: bool, head_fusion: str | None, discard_ratio: float | None) -> dict[str, Any]:
    """The request parameters that ask the server for a rollout map ({} without `explain`). The server checks the
    values (its client error names the valid ones) and applies `hub-vit rollout`'s defaults to those left None."""
    if not explain:
        if head_fusion is not None or discard_ratio is not None:
            raise ValueError("head_fusion and discard_ratio set how the map is made: pass explain=True with them")
        return {}
    given = {"head_fusion": head_fusion, "discard_ratio": discard_ratio}
    return {"explain": True} | {key: value for key, value in given.items() if value is not None}


def _no_rollout(err: Exception) -> Exception:
    """A server whose model has no `rollout` output refuses the request naming it; say what that means."""
    from tritonclient.utils import InferenceServerException

    if isinstance(err, InferenceServerException) and "rollout" in (err.message() or "") \
            and "output" in (err.message() or ""):
        return ValueError(f"the served model has no rollout output ({err.message()}): explanations are served by "
                          "the CPU and torch flavours of a repository built from a hub-vit model (a name or folder, "
                          "not an .onnx file), with options.explain on")
    return err


@dataclass(frozen=True)
class PreparedRequest:
    """One request's tensors, built once (`AsyncClassifier.prepare`) and sent as often as wanted (`send`): what a
    load generator sends, so that its own CPU per request stays small next to the server's."""

    inputs: list[Any]
    outputs: list[Any]
    images: int
    timeout_us: int | None = None  # the request's queue timeout (None: the repository's own)


def build_request(module: Any, images: Sequence[ImageLike], with_logits: bool,
                  explain: bool = False) -> tuple[list[Any], list[Any]]:
    data = np.array([[encode(image)] for image in images], dtype=np.object_)  # (B, 1) encoded bytes
    tensor = module.InferInput("image", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    names = OUTPUTS + (("logits",) if with_logits else ()) + (EXPLAIN_OUTPUTS if explain else ())
    return [tensor], [module.InferRequestedOutput(name) for name in names]


def parse_result(result: Any, with_logits: bool, explain: bool = False) -> list[Prediction]:
    labels, scores, ids = (result.as_numpy(name) for name in OUTPUTS)  # (B, K) each
    logits = result.as_numpy("logits") if with_logits else None
    # (B, H', W') maps and (B, 4) boxes
    maps, boxes = (result.as_numpy(name) for name in EXPLAIN_OUTPUTS) if explain else (None, None)
    answered = result.get_response()  # HTTP: a dict; gRPC: a ModelInferResponse
    name, version = ((answered.get("model_name"), answered.get("model_version")) if isinstance(answered, dict)
                     else (answered.model_name, answered.model_version))
    if explain and (maps is None or boxes is None):
        raise ValueError("the server answered without the rollout map it was asked for (its model's step does not "
                         "read the `explain` parameter: a repository from an earlier hub-vit? rebuild it)")
    return [
        Prediction(
            labels=[label.decode("utf-8") if isinstance(label, bytes) else str(label) for label in labels[i]],
            scores=scores[i].astype(float).tolist(),
            class_ids=ids[i].astype(int).tolist(),
            logits=None if logits is None else logits[i],
            rollout=None if maps is None else maps[i],
            rollout_box=None if boxes is None else tuple(float(v) for v in boxes[i]),
            model_name=name or None,
            model_version=version or None,
        )
        for i in range(len(scores))
    ]


class Classifier:
    """Blocking client. `url` is `host:port` (8000 for HTTP, 8001 for gRPC by default); see `server_address`.
    `protocol` is "http" or "grpc"; None (the default) takes it from a `grpc://` / `http://` URL, else HTTP."""

    def __init__(self, url: str = "127.0.0.1:8000", *, protocol: str | None = None, model: str = "vit",
                 timeout_s: float = 60.0) -> None:
        address, tls = server_address(url)
        protocol = resolve_protocol(url, protocol)
        check_timeout(timeout_s)
        self.module, self.model, self.protocol = _module(protocol), model, protocol
        if protocol == "http":
            self.client = self.module.InferenceServerClient(address, ssl=tls, connection_timeout=timeout_s,
                                                            network_timeout=timeout_s)
        else:
            self.client = self.module.InferenceServerClient(address, ssl=tls)
        self.timeout_s = timeout_s
        # gRPC calls take their deadline per call (HTTP's was set on the connection): a server that accepts and then
        # stalls must not hang the caller
        self._deadline = {"client_timeout": timeout_s} if protocol == "grpc" else {}
        self._limit: int | None = None  # the model's max_batch_size, read from the server once

    def max_batch_size(self) -> int:
        """Most images the served model takes in one request (its config's `max_batch_size`; 0 = no limit)."""
        if self._limit is None:
            self._limit = batch_limit(self.client.get_model_config(self.model, **self._deadline))
        return self._limit

    def classify(self, images: Sequence[ImageLike] | ImageLike, *, with_logits: bool = False,
                 queue_timeout_s: float | None = None, explain: bool = False, head_fusion: str | None = None,
                 discard_ratio: float | None = None) -> list[Prediction]:
        """Predictions in the order of `images`; a list longer than the model's `max_batch_size` is sent as several
        requests (the server refuses larger ones). A server error names the image by its index in `images`.
        `queue_timeout_s`: the server rejects a request ("Request timeout expired", HTTP 503 / gRPC UNAVAILABLE)
        that waits longer than this in a step's queue, instead of computing an answer nobody waits for any more;
        None: the repository's own limit (none by default).
        `explain`: each Prediction also holds the server's rollout map and the crop box it covers; `head_fusion`
        ('mean', 'max', 'min') and `discard_ratio` ([0, 1)) as in `hub-vit rollout`, its defaults when None."""
        batch = as_batch(images)
        parameters = explain_parameters(explain, head_fusion, discard_ratio)
        kwargs = queue_timeout(queue_timeout_s) | self._deadline | ({"parameters": parameters} if parameters else {})
        limit = self.max_batch_size() if len(batch) > 1 else 0  # one image fits any model: no config round trip
        predictions: list[Prediction] = []
        for offset, chunk in split(batch, limit):
            inputs, outputs = build_request(self.module, chunk, with_logits, explain)
            try:
                result = self.client.infer(self.model, inputs, outputs=outputs, **kwargs)
            except Exception as err:
                raise _no_rollout(_renumbered(err, offset)) from None
            predictions.extend(parse_result(result, with_logits, explain))
        return predictions

    def served_model(self) -> str | None:
        """The model the served ensemble was generated from (its config's `hub_vit_model` parameter, written by
        `hub-vit repository`), or None for a model hub-vit did not generate."""
        config = self.client.get_model_config(self.model, **self._deadline)
        parameters = config.get("config", config).get("parameters", {}) if isinstance(config, dict) else \
            {key: {"string_value": value.string_value} for key, value in config.config.parameters.items()}
        return (parameters.get("hub_vit_model") or {}).get("string_value") or None

    def ready(self) -> bool:
        return (bool(self.client.is_server_ready(**self._deadline))
                and bool(self.client.is_model_ready(self.model, **self._deadline)))

    def statistics(self) -> dict[str, dict[str, int]]:
        return model_counts(self.client.get_inference_statistics(**self._deadline), self.protocol)


    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Classifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClassifier:
    """asyncio client (tritonclient's aio modules); the arguments and results of `Classifier`, plus `connections`."""

    def __init__(self, url: str = "127.0.0.1:8000", *, protocol: str | None = None, model: str = "vit",
                 timeout_s: float = 60.0, connections: int = 100) -> None:
        """`timeout_s`: longest wait for each answer (HTTP: aiohttp's total timeout per request; gRPC: each call's
        deadline). `connections`: most HTTP connections open at once (tritonclient's `conn_limit`, 100 by default),
        so the requests one wants in flight at once; beyond it they queue inside the client, unseen by the server.
        gRPC multiplexes every request over one channel."""
        address, tls = server_address(url)
        protocol = resolve_protocol(url, protocol)
        check_timeout(timeout_s)
        self.module, self.model, self.protocol = _module(protocol, aio=True), model, protocol
        extra = {"conn_limit": max(1, connections), "conn_timeout": timeout_s} if protocol == "http" else {}
        self.client = self.module.InferenceServerClient(address, ssl=tls, **extra)
        self.timeout_s = timeout_s
        self._headers = PLAIN_ANSWERS if protocol == "http" else None
        self._deadline = {"client_timeout": timeout_s} if protocol == "grpc" else {}
        self._limit: int | None = None  # the model's max_batch_size, read from the server once

    async def max_batch_size(self) -> int:
        """Most images the served model takes in one request (its config's `max_batch_size`; 0 = no limit)."""
        if self._limit is None:
            self._limit = batch_limit(await self.client.get_model_config(self.model, **self._deadline))
        return self._limit

    async def classify(self, images: Sequence[ImageLike] | ImageLike, *, with_logits: bool = False,
                       queue_timeout_s: float | None = None, explain: bool = False, head_fusion: str | None = None,
                       discard_ratio: float | None = None) -> list[Prediction]:
        """As `Classifier.classify`; the requests of a long list run concurrently (at most MAX_IN_FLIGHT at once)."""
        batch = as_batch(images)
        parameters = explain_parameters(explain, head_fusion, discard_ratio)
        timeout = queue_timeout(queue_timeout_s) | ({"parameters": parameters} if parameters else {})
        limit = await self.max_batch_size() if len(batch) > 1 else 0
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def one(offset: int, chunk: list[ImageLike]) -> list[Prediction]:
            async with gate:
                inputs, outputs = build_request(self.module, chunk, with_logits, explain)  # encoded when sent
                try:
                    result = await self.client.infer(self.model, inputs, outputs=outputs, headers=self._headers,
                                                     **timeout, **self._deadline)
                except Exception as err:
                    raise _no_rollout(_renumbered(err, offset)) from None
            return parse_result(result, with_logits, explain)

        tasks = [asyncio.ensure_future(one(offset, chunk)) for offset, chunk in split(batch, limit)]
        try:
            chunks = await asyncio.gather(*tasks)
        except BaseException:  # one chunk failed (or we were cancelled): the rest would only load the server
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [prediction for chunk in chunks for prediction in chunk]

    def prepare(self, images: Sequence[ImageLike] | ImageLike, *,
                queue_timeout_s: float | None = None) -> PreparedRequest:
        """One request holding `images` (at most the model's `max_batch_size`; `classify` splits, this does not),
        encoded and serialised now, for `send`. `queue_timeout_s`: as in `classify`."""
        batch = as_batch(images)
        timeout = queue_timeout(queue_timeout_s)
        inputs, outputs = build_request(self.module, batch, with_logits=False)
        return PreparedRequest(inputs, outputs, len(batch), timeout.get("timeout"))

    async def send(self, request: PreparedRequest) -> None:
        """Send a prepared request and wait for its answer; raises the server's error as `classify` does. The answer
        is checked (one row of scores per image), not turned into `Prediction`s."""
        result = await self.client.infer(self.model, request.inputs, outputs=request.outputs, headers=self._headers,
                                         timeout=request.timeout_us, **self._deadline)
        scores = result.as_numpy("scores")  # (B, K)
        if scores is None or len(scores) != request.images:
            rows = "no scores" if scores is None else f"{len(scores)} rows of scores"
            raise ValueError(f"the server answered {rows} for a request of {request.images} images")

    async def server_id(self) -> str:
        """The server's id (`GET /v2` "name"; `hub-vit serve` gives every server it starts its own): a changed id
        means another server process, whose statistics counters started from zero."""
        metadata = await self.client.get_server_metadata(**self._deadline)
        return str(metadata["name"] if isinstance(metadata, dict) else metadata.name)

    async def statistics(self) -> dict[str, dict[str, int]]:
        return model_counts(await self.client.get_inference_statistics(**self._deadline), self.protocol)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> AsyncClassifier:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def model_counts(stats: Any, protocol: str) -> dict[str, dict[str, int]]:
    """Triton statistics -> {model: {inference_count, execution_count, success, fail, queue_ns, compute_ns}}."""
    if protocol == "grpc":
        from google.protobuf.json_format import MessageToDict

        stats = MessageToDict(stats, preserving_proto_field_name=True)
    out: dict[str, dict[str, int]] = {}
    for entry in stats.get("model_stats", []):
        infer = entry.get("inference_stats", {})
        out[entry["name"]] = {
            "inference_count": int(entry.get("inference_count", 0)),
            "execution_count": int(entry.get("execution_count", 0)),
            "success": int(infer.get("success", {}).get("count", 0)),
            "fail": int(infer.get("fail", {}).get("count", 0)),
            "queue_ns": int(infer.get("queue", {}).get("ns", 0)),
            "compute_ns": int(infer.get("compute_infer", {}).get("ns", 0)),
        }
    return out


def classify_files(client: Classifier, images: list[Path], queue_timeout_s: float | None = None,
                   **request: Any) -> tuple[dict[int, Prediction], dict[int, str]]:
    """{position: prediction} for the files the server classified, {position: why not} for the others (`hub-vit
    classify`). Requests hold at most the model's max_batch_size files. The server refuses a request at its first bad
    file and names that file's index in the request: the file is set aside with the reason and the rest is sent again,
    so k bad files cost k more requests, the good files are still classified and each bad one is named by its path.
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
    """(index in the request, reason) when the server refused one of the `count` files sent by naming it."""
    failed = failed_image(err)
    return failed if failed is not None and failed[0] < count else None


def file_error(err: Exception) -> str | None:
    """The reason one file failed, when the error is about that file (sent alone, or read by the client); None when
    it is not about a file (no server, overload, ...)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(err, InferenceServerException):
        if err.status() not in CLIENT_ERROR_STATUSES:
            return None
        failed = failed_image(err)  # "image 0: not an image: ...": the file's path replaces the prefix
        return failed[1] if failed is not None else " ".join((err.message() or str(err)).split())
    if isinstance(err, OSError) and err.filename is not None:  # unreadable (permissions, removed since the start);
        return f"cannot read the file: {err.strerror or err}"  # a socket error has no file name: not about a file
    if isinstance(err, ValueError):  # the client's own checks (e.g. not a regular file)
        return str(err)
    return None
