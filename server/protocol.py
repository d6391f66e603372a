"""The structured facts hub-vit's processes tell each other, each written and read here and nowhere else.

Standard library only: `hub-vit repository` copies this file beside the Python-backend models of every repository it
writes (as it copies topk.py), where they import it as `protocol`; in process it is `hub_vit.server.protocol`.

Facts that ride in an error. Triton carries a refused request's reason as one string (HTTP: the JSON `error`; gRPC:
the status details) and puts its own words before a step's ("in ensemble 'vit', "). A fact is a tag,
`[hub-vit <fact> key=value ...]`, followed by the sentence for people; `read` finds the tag wherever it stands and
returns its fields and the sentence after it, so no reader depends on the wording:

* `image-refused index=N`: image N (0-based, within the request) was refused; the sentence says why. The rest of
  the request is not answered; other requests of the same batch are.
* `server state=restarting|shutting-down`: the gate answered for a server that is not there right now (a client
  backs off as from a refused connection).
* `too-large limit=N`: the front refused a request (HTTP body, gRPC message; also once inflated) over its limit of
  N bytes (`hub-vit serve --max-request-mb`); a client splits what it sends to fit, and names a file that never can.
* `port speaks=grpc http_port=N`: the front's gRPC port answered an HTTP/1.x request (in HTTP/1.1, 400): it speaks
  gRPC, and serve's HTTP port is N; a client that sent HTTP there names the way out.

Facts in every answer (outputs of the ensemble clients call, one row per image, written by the classifier steps):

* `domain`: whether the image is the kind of image the model knows, judged by its out-of-domain score
  (`hub_vit.domain_score`): `in-domain`, `out-of-domain` ("not the kind of image this model knows"), or `unknown`
  where the served model has no score calibrated for its weights (never `in-domain` then);
* `domain_score`: that score (about 1 for images like those the model was calibrated on; above the threshold,
  out of domain), -1 where unknown (a score is never negative; NaN would make Triton's JSON answer invalid JSON).

Facts in a request (read by the classifier steps, and by serve's front, which checks a request before Triton runs it):

* the request parameter `explain` (true) asks for the attention-rollout map, the outputs `rollout` and
  `rollout_box` (`ROLLOUT_OUTPUTS`). Behind an ensemble a step is asked for every output the ensemble maps, whatever
  the client requested, so the parameter decides; a request naming a rollout output without it is refused.

Facts in a model's config (parameters of the ensemble clients call, written by `hub-vit repository`):

* `hub_vit_model`: the model the repository was built from (a name, a folder, a file);
* `hub_vit_explains`: "true" when a request may ask for the attention-rollout map (`explain`), "false" when this
  model has no explanation. A config without it was not written by hub-vit: nothing is known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

IMAGE_REFUSED = "image-refused"
SERVER = "server"
TOO_LARGE = "too-large"
PORT = "port"
RESTARTING, SHUTTING_DOWN = "restarting", "shutting-down"
LOST_IN_FLIGHT = "lost-in-flight"  # the server died with the request: it may have been computed, or be what killed it
SERVER_STATES = (RESTARTING, SHUTTING_DOWN)

EXPLAIN_PARAMETER = "explain"
ROLLOUT_OUTPUTS = ("rollout", "rollout_box")

SERVED_MODEL_PARAMETER = "hub_vit_model"
EXPLAINS_PARAMETER = "hub_vit_explains"
QUEUE_TIMEOUTS_PARAMETER = "hub_vit_queue_timeouts"
# The longest queue timeout a repository sets (one day, in microseconds), and the one it sets when none is asked
# for; Triton adds it, in ns, to a uint64 clock. A client may ask for less per request, never for more.
LONGEST_QUEUE_TIMEOUT_US = 86_400_000_000

DOMAIN_OUTPUT, DOMAIN_SCORE_OUTPUT = "domain", "domain_score"
IN_DOMAIN, OUT_OF_DOMAIN, UNKNOWN_DOMAIN = "in-domain", "out-of-domain", "unknown"
NO_DOMAIN_SCORE = -1.0
DOMAIN_VERDICTS = (IN_DOMAIN, OUT_OF_DOMAIN, UNKNOWN_DOMAIN)
# what each verdict says about an image, for people (the client, `hub-vit classify` and the demo print these)
DOMAIN_SENTENCES = {IN_DOMAIN: "the kind of image this model knows",
                    OUT_OF_DOMAIN: "not the kind of image this model knows",
                    UNKNOWN_DOMAIN: "unknown whether this model knows this kind of image (no out-of-domain score is "
                                    "calibrated for it)"}

_TAG = re.compile(r"\[hub-vit (?P<fact>[a-z-]+)(?P<fields>(?: [a-z_]+=[^\s\]]*)*)\] ?")


@dataclass(frozen=True)
class Fact:
    """One fact read from a message: its name, its fields (strings) and the sentence that follows the tag."""

    name: str
    fields: dict[str, str] = field(default_factory=dict)
    sentence: str = ""


def tagged(fact: str, sentence: str, **fields: object) -> str:
    """`[hub-vit <fact> key=value ...] sentence`. Field values must not hold spaces or ']'."""
    for key, value in fields.items():
        if not re.fullmatch(r"[^\s\]]*", str(value)):
            raise ValueError(f"field {key}={value!r} of fact {fact!r} holds a space or ']'")
    written = "".join(f" {key}={value}" for key, value in fields.items())
    return f"[hub-vit {fact}{written}] {sentence}"


def read(message: str) -> Fact | None:
    """The fact tagged in `message` (anywhere in it), or None when it carries none."""
    match = _TAG.search(message or "")
    if match is None:
        return None
    fields = dict(pair.split("=", 1) for pair in match["fields"].split())
    return Fact(match["fact"], fields, message[match.end():].strip())


def untagged(message: str) -> str:
    """`message` for people: its fact's tag removed, Triton's words and the sentence kept."""
    match = _TAG.search(message or "")
    return message if match is None else message[:match.start()] + message[match.end():]


# -- image-refused ------------------------------------------------------------------------------------------------
def image_refused(index: int, reason: str) -> str:
    """The error for a request whose image `index` (0-based within the request) is refused for `reason`."""
    return tagged(IMAGE_REFUSED, f"image {index}: {reason}", index=int(index))


@dataclass(frozen=True)
class RefusedImage:
    index: int  # within the request
    reason: str  # why, for people, without the image's number


def refused_image(message: str) -> RefusedImage | None:
    """Which image of a request was refused and why, from the server's error; None when the error is not about one
    image."""
    fact = read(message)
    if fact is None or fact.name != IMAGE_REFUSED or not fact.fields.get("index", "").isdigit():
        return None
    index = int(fact.fields["index"])
    prefix = f"image {index}: "
    reason = fact.sentence[len(prefix):] if fact.sentence.startswith(prefix) else fact.sentence
    return RefusedImage(index, reason)


def renumbered(message: str, offset: int) -> str:
    """An image refusal of a request that was part `offset` images into a longer list, numbered within that list;
    any other message unchanged."""
    refused = refused_image(message)
    if refused is None or not offset:
        return message
    match = _TAG.search(message)
    assert match is not None
    return message[:match.start()] + image_refused(refused.index + offset, refused.reason)


# -- server state -------------------------------------------------------------------------------------------------
def server_state(state: str, sentence: str) -> str:
    """The gate's answer while no server stands behind it: `state` is restarting or shutting-down."""
    if state not in SERVER_STATES:
        raise ValueError(f"unknown server state {state!r}; valid: {', '.join(SERVER_STATES)}")
    return tagged(SERVER, sentence, state=state)


def read_server_state(message: str) -> str | None:
    """restarting / shutting-down when the gate answered for an absent server; None for anything else."""
    fact = read(message)
    state = None if fact is None or fact.name != SERVER else fact.fields.get("state")
    return state if state in SERVER_STATES else None


def lost_in_flight(sentence: str) -> str:
    """The gate's answer for a request its server took and died with (HTTP 502, gRPC UNAVAILABLE): unlike a
    restarting server's answer, it is not safe to send again unasked."""
    return tagged(LOST_IN_FLIGHT, sentence)


def read_lost_in_flight(message: str) -> bool:
    fact = read(message)
    return fact is not None and fact.name == LOST_IN_FLIGHT


# -- too-large ----------------------------------------------------------------------------------------------------
def too_large(limit: int, sentence: str) -> str:
    """The front's refusal of a request over its limit of `limit` bytes."""
    return tagged(TOO_LARGE, sentence, limit=int(limit))


def read_too_large(message: str) -> int | None:
    """The front's limit in bytes when it refused a request as too large; None for anything else."""
    fact = read(message)
    limit = None if fact is None or fact.name != TOO_LARGE else fact.fields.get("limit", "")
    return int(limit) if limit and limit.isdigit() else None


# -- port ---------------------------------------------------------------------------------------------------------
PORT_KINDS = ("http", "grpc", "metrics")  # what a port of serve's speaks
def port_speaks(speaks: str, sentence: str, **ports: int) -> str:
    """The front's answer at a port to a client speaking another protocol, or asking the metrics port for anything but
    metrics: the port speaks `speaks` (http / grpc / metrics); `ports`: serve's ports of the other protocols
    (`http_port=8000`)."""
    return tagged(PORT, sentence, speaks=speaks, **{name: int(port) for name, port in ports.items()})


@dataclass(frozen=True)
class PortSpeaks:
    speaks: str  # http / grpc / metrics: what the port the client reached speaks
    ports: dict[str, int]  # serve's ports of the other protocols, as `http_port`


def read_port_speaks(message: str) -> PortSpeaks | None:
    """What the port speaks when the front said the client reached the other protocol's port; None otherwise."""
    fact = read(message)
    if fact is None or fact.name != PORT or fact.fields.get("speaks") not in PORT_KINDS:
        return None
    ports = {name: int(value) for name, value in fact.fields.items() if name.endswith("_port") and value.isdigit()}
    return PortSpeaks(fact.fields["speaks"], ports)


# -- the out-of-domain verdict -------------------------------------------------------------------------------------
def domain_verdict(score: float | None, threshold: float | None) -> str:
    """The verdict for one image's score against the served threshold; unknown without either (or a NaN score)."""
    if score is None or threshold is None or score != score or score < 0:
        return UNKNOWN_DOMAIN
    return OUT_OF_DOMAIN if score > threshold else IN_DOMAIN


def read_domain_score(value: float | None) -> float | None:
    """A `domain_score` output element -> the score, or None where there is none (NO_DOMAIN_SCORE, NaN, absent)."""
    if value is None or value != value or value < 0:
        return None
    return float(value)


def read_domain_verdict(value: bytes | str | None) -> str:
    """A `domain` output element -> one of DOMAIN_VERDICTS; anything else (absent, an unknown word) is unknown."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return text if text in DOMAIN_VERDICTS else UNKNOWN_DOMAIN


# -- model config parameters --------------------------------------------------------------------------------------
def model_parameters(served_model: str, explains: bool, queue_timeouts: bool = True) -> dict[str, str]:
    """The ensemble's parameters that tell clients what it serves, and whether it applies their per-request queue
    timeouts (only a repository with Triton's queue policy does)."""
    return {SERVED_MODEL_PARAMETER: served_model, EXPLAINS_PARAMETER: "true" if explains else "false",
            QUEUE_TIMEOUTS_PARAMETER: "true" if queue_timeouts else "false"}


def served_model(parameters: dict[str, str]) -> str | None:
    """The model a hub-vit repository was built from, from its ensemble's parameters (None: not hub-vit's)."""
    return parameters.get(SERVED_MODEL_PARAMETER) or None


def explains(parameters: dict[str, str]) -> bool | None:
    """Whether the served model answers `explain` requests with a rollout map; None when the config does not say
    (a repository hub-vit did not write, or an earlier hub-vit wrote)."""
    value = parameters.get(EXPLAINS_PARAMETER)
    return None if value is None else value == "true"


def queue_timeouts(parameters: dict[str, str]) -> bool | None:
    """Whether the served model applies a request's own queue timeout; None when the config does not say (a
    repository hub-vit did not write, or an earlier hub-vit wrote: those had the queue policy that applies it)."""
    value = parameters.get(QUEUE_TIMEOUTS_PARAMETER)
    return None if value is None else value == "true"
