"""The CPU classifier's Python-backend `model.py` run without a server: a stand-in for Triton's
`triton_python_backend_utils` hands it one dynamic batch of requests, as the real backend does, so the batch can be
composed exactly (the real server decides its batches itself). The real server runs the same file in
test_server_triton.py."""

from __future__ import annotations

import gc
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format

pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402

from hub_vit.resolve import resolve_model  # noqa: E402
from hub_vit.server.repository.options import ServingOptions  # noqa: E402
from hub_vit.server.repository.writer import write_repository  # noqa: E402

SAMPLES = sorted((Path(__file__).resolve().parents[1] / "hub_vit/assets/digits/samples").glob("*.png"))


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Response:
    def __init__(self, output_tensors: list | None = None, error: object = None) -> None:
        self.outputs = {t.name: t.array for t in output_tensors or []}
        self.error = error


class _TritonError:
    INVALID_ARG = "INVALID_ARG"

    def __init__(self, message: str, code: str | None = None) -> None:
        self.message, self.code = message, code


def _fake_pb_utils() -> types.ModuleType:
    """What model.py uses of `triton_python_backend_utils` (Triton 2.51): Tensor, InferenceResponse, TritonError and
    get_input_tensor_by_name."""
    module = types.ModuleType("triton_python_backend_utils")
    module.Tensor = _Tensor
    module.InferenceResponse = _Response
    module.TritonError = _TritonError
    module.get_input_tensor_by_name = lambda request, name: request.get(name)
    return module


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, monkeypatch_module):
    """The generated CPU classifier step of the default model, initialised the way the Python backend does it."""
    opts = ServingOptions(max_batch_size=8, preferred_batch_sizes=(4, 8))
    step = write_repository(resolve_model(None), tmp_path_factory.mktemp("repo") / "r", opts) / "vit_classifier"
    monkeypatch_module.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    monkeypatch_module.syspath_prepend(str(step / "1"))
    for name in ("model", "imageprep", "topk", "triton_errors", "explained", "served_rollout", "protocol",
                 "domain_outputs", "domain_score", "stub_gc"):  # the step's own
        # copies, put back afterwards
        monkeypatch_module.delitem(sys.modules, name, raising=False)
    model = importlib.import_module("model")
    config = json_format.MessageToDict(text_format.Parse((step / "config.pbtxt").read_text(), mc.ModelConfig()),
                                       preserving_proto_field_name=True)
    instance = model.TritonPythonModel()
    instance.initialize({"model_config": json.dumps(config), "model_repository": str(step), "model_version": "1"})
    yield instance
    gc.unfreeze()  # initialize froze this test process's objects too (stub_gc.py)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


class _Request(dict):
    """A request's input tensors by name, and its parameters as `request.parameters()` gives them (a JSON string)."""

    def __init__(self, tensors: dict, parameters: dict | None = None) -> None:
        super().__init__(tensors)
        self._parameters = json.dumps(parameters or {})

    def parameters(self) -> str:
        return self._parameters


def _request(*images: bytes, parameters: dict | None = None) -> _Request:
    array = np.array([[image] for image in images], dtype=np.object_).reshape(-1, 1)
    return _Request({"image": _Tensor("image", array)}, parameters)


def test_a_bad_request_fails_alone_in_its_batch(classifier):
    good = [p.read_bytes() for p in SAMPLES[:4]]
    truncated = good[1][: len(good[1]) // 2]
    batch = [_request(good[0]), _request(b"junk"), _request(good[1], good[2]), _request(good[3], truncated),
             _request(good[3]), _request()]
    responses = classifier.execute(batch)
    assert len(responses) == len(batch)
    alone = [classifier.execute([_request(image)])[0] for image in (good[0], good[1], good[2], good[3])]
    expected = {i: r.outputs for i, r in enumerate(alone)}

    def same(response, *which: int) -> None:
        assert response.error is None, response.error.message
        for key in ("logits", "scores"):
            np.testing.assert_allclose(response.outputs[key], np.concatenate([expected[i][key] for i in which]),
                                       rtol=1e-5, atol=1e-6)
        for key in ("class_ids", "labels"):
            assert response.outputs[key].tolist() == np.concatenate([expected[i][key] for i in which]).tolist()

    same(responses[0], 0)
    same(responses[2], 1, 2)  # two images: answers in their order
    same(responses[4], 3)
    for place, message in ((1, "image 0: not an image"), (3, "image 1: cannot decode PNG"), (5, "holds no image")):
        error = responses[place].error
        assert error is not None and message in error.message and error.code == "INVALID_ARG", (place, error)
    assert responses[1].outputs == {} and responses[3].outputs == {}


def test_an_unexpected_failure_fails_only_its_request(classifier, monkeypatch):
    """Not a bad image but, say, memory running out while resizing one request's image: that request gets a server
    error naming it, and the rest of the batch is answered."""
    good = SAMPLES[0].read_bytes()
    transform = type(classifier.preprocess)  # a frozen dataclass: patch its class for this test
    real = transform.batch

    def flaky(self, images: np.ndarray) -> np.ndarray:
        if images.reshape(-1)[0] == b"boom":
            raise MemoryError("cannot allocate 4 GiB")
        return real(self, images)

    monkeypatch.setattr(transform, "batch", flaky)
    first, second = classifier.execute([_request(b"boom"), _request(good)])
    assert second.error is None and second.outputs["labels"].shape == (1, 5)
    assert first.error is not None and first.error.code is None  # a server error (500), not the client's
    assert "MemoryError: cannot allocate 4 GiB" in first.error.message


def test_explained_plain_and_bad_requests_share_a_batch(classifier):
    """One dynamic batch of an explained request, a plain one and one with a bad explanation parameter: each gets
    its own answer; only the explained one carries the rollout map and its crop box."""
    good = [p.read_bytes() for p in SAMPLES[:2]]
    explained, plain, bad = classifier.execute([
        _request(good[0], good[1], parameters={"explain": True, "head_fusion": "max"}),
        _request(good[0]),
        _request(good[1], parameters={"explain": True, "discard_ratio": 2}),
    ])
    assert explained.error is None and plain.error is None
    assert explained.outputs["rollout"].shape == (2, 8, 8) and explained.outputs["rollout_box"].shape == (2, 4)
    assert "rollout" not in plain.outputs
    np.testing.assert_allclose(explained.outputs["logits"][:1], plain.outputs["logits"], atol=1e-6)
    assert bad.error.code == "INVALID_ARG"
    assert "discard_ratio must be a number in [0, 1), got 2" in bad.error.message


def test_every_answer_of_a_batch_carries_its_own_domain_verdict(classifier):
    """Plain and explained requests of one batch: each image's verdict and score, in its request's order, from the
    graph's token means and the statistics copied into the step (the shipped model is calibrated)."""
    from hub_vit.export.verify import load_photos
    from tests.test_server_triton import _encode

    digit, photo = SAMPLES[0].read_bytes(), _encode(load_photos(["astronaut"])["astronaut"], "JPEG")
    plain, explained = classifier.execute([_request(digit, photo),
                                           _request(photo, digit, parameters={"explain": True})])
    inside, outside = b"in-domain", b"out-of-domain"
    for response, expected in ((plain, [inside, outside]), (explained, [outside, inside])):
        assert response.error is None and response.outputs["domain"].tolist() == [[v] for v in expected]
        assert response.outputs["domain_score"].shape == (2, 1) and response.outputs["domain_score"].dtype == np.float32
    np.testing.assert_allclose(plain.outputs["domain_score"][::-1], explained.outputs["domain_score"], rtol=1e-4)


def test_what_initialize_loaded_is_frozen_out_of_full_collections(classifier):
    """The step's session and preprocessing, loaded by `initialize`, are in the permanent generation (stub_gc.py):
    no full collection walks them while the step serves."""
    walked = {id(obj) for obj in gc.get_objects()}  # every generation but the permanent one
    assert gc.is_tracked(classifier.preprocess) and gc.is_tracked(classifier.domain)
    assert id(classifier.preprocess) not in walked and id(classifier.domain) not in walked
