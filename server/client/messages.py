"""What a request to the served classifier holds and what its answer holds: the tensors sent (encoded images, the
outputs asked for, request parameters) and the `Prediction`s read back; the model's config as a client needs it; the
statistics Triton reports."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from hub_vit.rollout_settings import check_discard_ratio, check_head_fusion
from hub_vit.server import protocol
from hub_vit.server.client.images import ImageLike, encode

OUTPUTS = ("labels", "scores", "class_ids", protocol.DOMAIN_OUTPUT, protocol.DOMAIN_SCORE_OUTPUT)
EXPLAIN_OUTPUTS = ("rollout", "rollout_box")  # answered to a request whose parameters say `explain` (served_rollout.py)
LONGEST_QUEUE_TIMEOUT_S = protocol.LONGEST_QUEUE_TIMEOUT_US // 1_000_000
# What a request adds to its images' encoded bytes: each BYTES element's 4-byte length, and around them the JSON header
# (HTTP, tritonclient's binary-data form) or the protobuf fields (gRPC) naming the model, the input, the outputs and
# the request's parameters: a few hundred bytes, bounded here with room to spare.
ELEMENT_OVERHEAD_BYTES = 4
REQUEST_OVERHEAD_BYTES = 4096
T = TypeVar("T")


@dataclass(frozen=True)
class Prediction:
    """Top-k of one image, best first; `logits` only when asked for (`with_logits=True`). With `explain=True`,
    `rollout` is the server's attention-rollout map (H', W') on the model's patch grid (relevance mass, as
    `hub_vit.explain.attention_rollout`'s maps) and `rollout_box` the model's crop (left, top, right, bottom) in the
    image's own pixels, where the map lies (`hub_vit.explain.blend(image, rollout, rollout_box)` draws it).
    `domain`: whether the image is of the kind the model knows (protocol.py: in-domain, out-of-domain, unknown; in
    words: `domain_sentence`), `domain_score` the out-of-domain score it was judged by (None where unknown)."""

    labels: list[str]
    scores: list[float]
    class_ids: list[int]
    domain: str = protocol.UNKNOWN_DOMAIN
    domain_score: float | None = None
    logits: np.ndarray | None = None
    rollout: np.ndarray | None = None
    rollout_box: tuple[float, float, float, float] | None = None
    model_name: str | None = None  # which model and version answered (Triton's response)
    model_version: str | None = None

    @property
    def domain_sentence(self) -> str:
        """`not the kind of image this model knows`, ...: the verdict for people."""
        return protocol.DOMAIN_SENTENCES[self.domain]




@dataclass(frozen=True)
class ServedConfig:
    """The served model's config as a client needs it: `max_batch_size` (the most images one request may hold; 0 = no
    limit) and the ensemble's parameters (what hub-vit says it serves: protocol.py)."""

    max_batch_size: int
    parameters: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, config: Any) -> ServedConfig:
        """From Triton's model config: HTTP's dict (gRPC's `as_json=True` nests it in "config") or gRPC's
        `ModelConfigResponse`."""
        if isinstance(config, dict):
            config = config.get("config", config)
            parameters = {key: str((value or {}).get("string_value", ""))
                          for key, value in (config.get("parameters") or {}).items()}
            return cls(int(config.get("max_batch_size", 0)), parameters)
        parameters = {key: value.string_value for key, value in config.config.parameters.items()}
        return cls(int(config.config.max_batch_size), parameters)


def split(images: list[T], limit: int, max_bytes: int = 0) -> list[tuple[int, list[T]]]:
    """(offset, images) chunks in order, each of at most `limit` images (0: no limit) and, with `max_bytes`, of
    encoded images (bytes) whose request (`request_bytes`) is at most `max_bytes`; an image too large for that
    goes in a request of its own (whether it fits is the server's to say)."""
    chunks: list[tuple[int, list[T]]] = []
    held = 0  # request_bytes of the last chunk
    for index, image in enumerate(images):
        size = len(image) + ELEMENT_OVERHEAD_BYTES if max_bytes else 0  # type: ignore[arg-type]
        if chunks and (limit <= 0 or len(chunks[-1][1]) < limit) and (not max_bytes or held + size <= max_bytes):
            chunks[-1][1].append(image)
            held += size
        else:
            chunks.append((index, [image]))
            held = REQUEST_OVERHEAD_BYTES + size
    return chunks


def request_bytes(encoded: Sequence[bytes]) -> int:
    """An upper bound on the size of one request holding these encoded images (HTTP body or gRPC message)."""
    return sum(len(image) + ELEMENT_OVERHEAD_BYTES for image in encoded) + REQUEST_OVERHEAD_BYTES


@dataclass
class RequestLimit:
    """The most bytes one request may hold, as a client learns it from the server's refusals of requests that were
    too large (HTTP 413 / gRPC RESOURCE_EXHAUSTED): the limit itself from the front's fact (protocol.py's `too-large`,
    `hub-vit serve --max-request-mb`), `known`; from a refusal without it, a bound halved at each refusal; 0 while
    nothing was refused (requests are split by count only)."""

    max_bytes: int = 0
    known: bool = False

    def refused(self, limit: int | None, sent: Sequence[bytes]) -> None:
        """A request holding `sent` was refused as too large; `limit`: the front's fact, when it carried one."""
        if limit is not None:
            self.max_bytes, self.known = limit, True
        elif not self.known:  # smaller than what was refused, so the images that were sent together now split
            self.max_bytes = max(request_bytes(sent) // 2, 1)

    def never_fits(self, image: bytes) -> bool:
        """The image alone is over a known limit: no request can carry it."""
        return self.known and len(image) + ELEMENT_OVERHEAD_BYTES > self.max_bytes




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




def check_flag(value: object, name: str) -> bool:
    """`value` as a bool; TypeError naming `name` otherwise, before any connection: `with_logits="yes"` asked for the
    logits as True would, `explain="yes"` was sent for the server to refuse, and 1 passed for True."""
    if not isinstance(value, (bool, np.bool_)):  # numpy's bool (`array.any()`) is one too
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def explain_parameters(explain: bool, head_fusion: str | None, discard_ratio: float | None) -> dict[str, Any]:
    """The request parameters that ask the server for a rollout map ({} without `explain`), checked here by the rules
    the server applies (`hub_vit.rollout_settings`, whose errors name the valid values), so that a bad one is refused
    before any connection; the server applies `hub-vit rollout`'s defaults to those left None."""
    if not check_flag(explain, "explain"):
        if head_fusion is not None or discard_ratio is not None:
            raise ValueError("head_fusion and discard_ratio set how the map is made: pass explain=True with them")
        return {}
    given = {"head_fusion": None if head_fusion is None else check_head_fusion(head_fusion),
             "discard_ratio": None if discard_ratio is None else check_discard_ratio(discard_ratio)}
    return {"explain": True} | {key: value for key, value in given.items() if value is not None}




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
    labels, scores, ids, domains, domain_scores = (result.as_numpy(name) for name in OUTPUTS)  # (B, K), (B, 1)
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
            domain=protocol.read_domain_verdict(None if domains is None else domains[i][0]),
            domain_score=protocol.read_domain_score(None if domain_scores is None else float(domain_scores[i][0])),
            logits=None if logits is None else logits[i],
            rollout=None if maps is None else maps[i],
            rollout_box=None if boxes is None else tuple(float(v) for v in boxes[i]),
            model_name=name or None,
            model_version=version or None,
        )
        for i in range(len(scores))
    ]




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


