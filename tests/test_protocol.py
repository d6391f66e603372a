"""The facts hub-vit's processes tell each other (server/protocol.py): written and read by that module alone, stdlib
only, copied into every repository step that writes them, and read back wherever Triton puts them."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from hub_vit.server import protocol
from hub_vit.server.repository.writer import SERVER_PACKAGE, _package_dir

PROTOCOL_FILE = Path(protocol.__file__)


def test_the_protocol_imports_the_standard_library_only():
    """It runs inside Triton's stubs, copied beside their model.py, where hub_vit may not be importable."""
    tree = ast.parse(PROTOCOL_FILE.read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)


def test_the_copied_file_is_the_packages_own():
    assert _package_dir(SERVER_PACKAGE) / "protocol.py" == PROTOCOL_FILE


@pytest.mark.parametrize("before", ["", "in ensemble 'vit', ", "in ensemble 'my-model', step 2: "])
def test_an_image_refusal_is_read_wherever_triton_puts_it(before):
    message = before + protocol.image_refused(3, "not an image: 12 bytes starting b'hello wo' are not JPEG")
    refused = protocol.refused_image(message)
    assert refused == protocol.RefusedImage(3, "not an image: 12 bytes starting b'hello wo' are not JPEG")
    assert "image 3: not an image" in message  # and people read which image too


def test_untagged_is_the_message_for_people():
    # loadtest and classify printed the tag: "[400] in ensemble 'vit', [hub-vit image-refused index=0] image 0: ..."
    message = "[400] in ensemble 'vit', " + protocol.image_refused(0, "not an image")
    assert protocol.untagged(message) == "[400] in ensemble 'vit', image 0: not an image"
    assert protocol.untagged(protocol.server_state(protocol.RESTARTING, "retry shortly")) == "retry shortly"
    assert protocol.untagged("Triton's own words") == "Triton's own words"


def test_a_reason_that_looks_like_a_tag_is_only_a_sentence():
    message = protocol.image_refused(0, "cannot decode [hub-vit image-refused index=7] oddly named file")
    assert protocol.refused_image(message).index == 0


def test_renumbering_moves_the_index_and_keeps_everything_else():
    message = "in ensemble 'vit', " + protocol.image_refused(2, "truncated JPEG image")
    moved = protocol.renumbered(message, 16)
    assert moved.startswith("in ensemble 'vit', ") and protocol.refused_image(moved) == protocol.RefusedImage(
        18, "truncated JPEG image")
    assert protocol.renumbered("some other error", 16) == "some other error"


def test_words_alone_are_no_fact():
    """A message without the tag (Triton's own, or a sentence that merely says "image 3:") carries no fact."""
    assert protocol.refused_image("in ensemble 'vit', image 3: not an image") is None
    assert protocol.read_server_state("the server is starting or restarting; retry shortly") is None
    assert protocol.read("") is None


@pytest.mark.parametrize("state", protocol.SERVER_STATES)
def test_server_states_round_trip(state):
    assert protocol.read_server_state(protocol.server_state(state, "retry shortly")) == state


def test_bad_facts_are_refused_when_written():
    with pytest.raises(ValueError, match="unknown server state 'asleep'; valid: restarting, shutting-down"):
        protocol.server_state("asleep", "zzz")
    with pytest.raises(ValueError, match="holds a space"):
        protocol.tagged("x", "sentence", key="two words")


def test_model_parameters_round_trip():
    written = protocol.model_parameters("simplevit_digits", explains=False)
    assert protocol.served_model(written) == "simplevit_digits" and protocol.explains(written) is False
    assert protocol.explains(protocol.model_parameters("m", explains=True)) is True
    assert protocol.explains({}) is None and protocol.served_model({}) is None  # not a hub-vit repository
    assert protocol.queue_timeouts(written) is True  # the default: Triton's queue policy applies them
    assert protocol.queue_timeouts(protocol.model_parameters("m", explains=True, queue_timeouts=False)) is False
    assert protocol.queue_timeouts({}) is None


def test_too_large_round_trips_its_limit():
    message = "in ensemble 'vit', " + protocol.too_large(64 << 20, "the request body is 90000000 bytes, over the limit")
    assert protocol.read_too_large(message) == 64 << 20
    assert protocol.read_too_large(protocol.server_state("restarting", "retry")) is None


# -- the out-of-domain verdict ---------------------------------------------------------------------------------------
def test_the_port_a_client_reached_round_trips_with_the_other_ports():
    written = protocol.port_speaks("grpc", "this is the gRPC port", http_port=8000)
    assert protocol.read_port_speaks(f"Bad Request: {written}") == protocol.PortSpeaks("grpc", {"http_port": 8000})
    assert protocol.untagged(written) == "this is the gRPC port"
    metrics = protocol.port_speaks("metrics", "this is the metrics port", http_port=8000)
    assert protocol.read_port_speaks(metrics) == protocol.PortSpeaks("metrics", {"http_port": 8000})
    assert protocol.read_port_speaks(protocol.port_speaks("smtp", "x")) is None  # only serve's kinds of port
    assert protocol.read_port_speaks(protocol.too_large(10, "x")) is None


def test_a_verdict_needs_a_score_and_a_threshold_and_unknown_is_never_in_domain():
    assert protocol.domain_verdict(0.9, 2.5) == protocol.IN_DOMAIN
    assert protocol.domain_verdict(2.5, 2.5) == protocol.IN_DOMAIN  # the threshold is the largest score let in
    assert protocol.domain_verdict(5.8, 2.5) == protocol.OUT_OF_DOMAIN
    for score, threshold in ((None, 2.5), (0.9, None), (float("nan"), 2.5), (protocol.NO_DOMAIN_SCORE, 2.5)):
        assert protocol.domain_verdict(score, threshold) == protocol.UNKNOWN_DOMAIN
    assert set(protocol.DOMAIN_SENTENCES) == set(protocol.DOMAIN_VERDICTS)
    assert protocol.DOMAIN_SENTENCES[protocol.OUT_OF_DOMAIN] == "not the kind of image this model knows"


@pytest.mark.parametrize("written, verdict", [(b"in-domain", "in-domain"), ("out-of-domain", "out-of-domain"),
                                              (b"unknown", "unknown"), (b"maybe", "unknown"), (None, "unknown")])
def test_a_verdict_read_back_is_one_of_the_three(written, verdict):
    assert protocol.read_domain_verdict(written) == verdict


def test_no_score_reads_as_none():
    assert protocol.read_domain_score(1.25) == 1.25 and protocol.read_domain_score(0.0) == 0.0
    assert protocol.read_domain_score(protocol.NO_DOMAIN_SCORE) is None
    assert protocol.read_domain_score(float("nan")) is None and protocol.read_domain_score(None) is None


def test_the_client_reads_the_verdict_of_each_image():
    """`parse_result` on an answer as tritonclient gives it (as_numpy per output, the response for the names)."""
    import numpy as np

    from hub_vit.server.client.messages import parse_result

    outputs = {"labels": np.array([[b"9"], [b"3"]], dtype=object), "scores": np.array([[0.96], [0.95]], np.float32),
               "class_ids": np.array([[9], [3]]), "domain": np.array([[b"out-of-domain"], [b"unknown"]], dtype=object),
               "domain_score": np.array([[5.84], [protocol.NO_DOMAIN_SCORE]], np.float32)}

    class Answer:
        def as_numpy(self, name):
            return outputs.get(name)

        def get_response(self):
            return {"model_name": "vit", "model_version": "1"}

    astronaut, digit = parse_result(Answer(), with_logits=False)
    assert (astronaut.domain, digit.domain) == ("out-of-domain", "unknown")
    assert astronaut.domain_score == pytest.approx(5.84) and digit.domain_score is None
    assert astronaut.domain_sentence == "not the kind of image this model knows"
