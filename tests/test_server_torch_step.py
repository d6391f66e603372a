"""The torch flavour's Python-backend `model.py` run without a server, on the CPU: a stand-in for Triton's
`triton_python_backend_utils` (tests/test_server_template.py's) hands it one dynamic batch of requests, composed
exactly. Each bad image fails its own request with imageprep's words; the other requests of the batch get the answers
they get alone. Also its settings for cuda, read without a device, and `initialize` of a cuda repository written by
the CLI, with torch.cuda and the device-side classes standing in. The real server runs the same file in
tests/test_server_torch.py.
"""

from __future__ import annotations

import gc
import importlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from google.protobuf import json_format, text_format
from PIL import Image
from tritonclient.grpc import model_config_pb2 as mc

from hub_vit.resolve import resolve_model
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository
from tests.test_server_template import _fake_pb_utils, _request

SAMPLES = sorted((Path(__file__).resolve().parents[1] / "hub_vit/assets/digits/samples").glob("*.png"))
STEP_MODULES = ("model", "imageprep", "topk", "triton_errors", "served_rollout", "image_modes", "protocol",
                "stub_gc")


def encode(array: np.ndarray, fmt: str = "JPEG", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def step():
    """The generated torch classifier step of the default model (device cpu), initialised as the backend does it."""
    with pytest.MonkeyPatch.context() as patch:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            opts = ServingOptions(flavour="torch", max_batch_size=8, preferred_batch_sizes=(4, 8))
            folder = write_repository(resolve_model(None), Path(tmp) / "r", opts) / "vit_classifier"
            patch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
            patch.syspath_prepend(str(folder / "1"))
            for name in STEP_MODULES:  # the step's own copies, put back afterwards
                patch.delitem(sys.modules, name, raising=False)
            module = importlib.import_module("model")
            config = json_format.MessageToDict(text_format.Parse((folder / "config.pbtxt").read_text(),
                                                                 mc.ModelConfig()), preserving_proto_field_name=True)
            instance = module.TritonPythonModel()
            instance.initialize({"model_config": json.dumps(config), "model_repository": str(folder),
                                 "model_version": "1"})
            yield instance, module, config
            instance.finalize()
            gc.unfreeze()  # initialize froze this test process's objects too (stub_gc.py)
            for name in STEP_MODULES:
                patch.delitem(sys.modules, name, raising=False)


@pytest.fixture(scope="module")
def photos_encoded(photos) -> dict[str, bytes]:
    chelsea = np.asarray(Image.fromarray(photos["chelsea"]).resize((451, 300)))
    return {"jpeg": encode(photos["chelsea"], quality=90), "png": encode(photos["astronaut"], "PNG"),
            "webp": encode(photos["coffee"], "WEBP", lossless=True), "chelsea_451": encode(chelsea)}


def test_a_bad_request_fails_alone_in_its_batch_with_imageprep_words(step, photos_encoded):
    instance, _, _ = step
    good = [p.read_bytes() for p in SAMPLES[:3]]
    whole = photos_encoded["chelsea_451"]
    closed = whole[:-600] + b"\xff\xd9"  # decodes on the device: only the ends-early flag catches it
    batch = [_request(good[0]), _request(b"junk"), _request(photos_encoded["jpeg"], photos_encoded["png"]),
             _request(good[1], whole[:-600]), _request(photos_encoded["webp"]), _request(),
             _request(good[2], closed, whole[:-600]), _request(whole)]
    responses = instance.execute(batch)
    assert len(responses) == len(batch)
    alone = {i: instance.execute([batch[i]])[0].outputs for i in (0, 2, 4, 7)}
    for place, response in enumerate(responses):
        if place not in alone:
            continue
        assert response.error is None, response.error.message
        for key in ("logits", "scores"):
            np.testing.assert_allclose(response.outputs[key], alone[place][key], atol=1e-5, rtol=0)
        for key in ("class_ids", "labels"):
            assert response.outputs[key].tolist() == alone[place][key].tolist()
    assert responses[2].outputs["labels"].shape == (2, 5)  # two images: answers in their order

    prep = instance.preprocess
    for place, index, data in ((1, 0, b"junk"), (3, 1, whole[:-600]), (6, 1, closed)):
        with pytest.raises(ValueError) as words:  # imageprep's own refusal of that image
            prep.decode(data)
        error = responses[place].error
        assert error is not None and error.code == "INVALID_ARG", (place, error)
        assert f"image {index}: {words.value}" in error.message, (place, error.message)
    assert "holds no image" in responses[5].error.message
    assert "truncated JPEG image: its data ends before its last rows" in responses[6].error.message


def test_an_unexpected_failure_fails_only_its_request(step, monkeypatch):
    """Not a bad image but, say, memory running out while decoding one request's image: that request gets a server
    error, the rest of the batch is answered."""
    instance, _, _ = step
    good = SAMPLES[0].read_bytes()
    real = instance.images.prep.load

    def flaky(data: bytes, header):
        if data == SAMPLES[1].read_bytes():
            raise MemoryError("cannot allocate 4 GiB")
        return real(data, header)

    monkeypatch.setattr(instance.images, "prep", _Patched(instance.images.prep, load=flaky))
    first, second = instance.execute([_request(SAMPLES[1].read_bytes()), _request(good)])
    assert second.error is None and second.outputs["labels"].shape == (1, 5)
    assert first.error is not None and first.error.code is None  # a server error (500), not the client's
    assert "MemoryError: cannot allocate 4 GiB" in first.error.message


class _Patched:
    """An object that answers as `inner`, except the attributes given."""

    def __init__(self, inner: object, **attributes: object) -> None:
        self._inner, self._attributes = inner, attributes

    def __getattr__(self, name: str) -> object:
        return self._attributes[name] if name in self._attributes else getattr(self._inner, name)


def test_explained_and_plain_requests_share_a_batch(step):
    instance, _, _ = step
    good = [p.read_bytes() for p in SAMPLES[:2]]
    explained, plain = instance.execute([_request(good[0], good[1], parameters={"explain": True}),
                                         _request(good[0])])
    assert explained.error is None and plain.error is None
    assert explained.outputs["rollout"].shape[0] == 2 and "rollout" not in plain.outputs
    assert explained.outputs["labels"][0].tolist() == plain.outputs["labels"][0].tolist()


def test_phases_are_logged_when_asked(step, tmp_path, monkeypatch):
    instance, module, _ = step
    log = tmp_path / "phases.jsonl"
    monkeypatch.setenv(module.PHASE_LOG, str(log))
    monkeypatch.setattr(instance, "phases", module.Phases())
    decode = instance.images.decode

    def decode_with_a_collection(data: list) -> list:  # a full collection during the execution: counted in it
        gc.collect()
        return decode(data)

    monkeypatch.setattr(instance.images, "decode", decode_with_a_collection)
    try:
        instance.execute([_request(SAMPLES[0].read_bytes()),
                          _request(SAMPLES[1].read_bytes(), SAMPLES[2].read_bytes())])
    finally:
        instance.phases.collections.stop()
    [line] = [json.loads(text) for text in log.read_text().splitlines()]
    assert (line["requests"], line["images"]) == (2, 3)
    assert list(line)[4:] == ["explained_ms", "decode_ms", "transform_ms", "forward_ms", "answer_ms", "gc_ms"]
    assert all(line[key] >= 0 for key in list(line)[4:])
    assert 0 < line["gc_ms"] <= line["decode_ms"]


def test_what_initialize_loaded_is_frozen_out_of_full_collections(step):
    """The model and the data path that `initialize` loaded are in the permanent generation (stub_gc.py): no full
    collection walks their objects (about 400,000 for torch, timm and hub_vit) while the step serves."""
    instance, _, _ = step
    walked = {id(obj) for obj in gc.get_objects()}  # every generation but the permanent one
    assert gc.is_tracked(instance.runner) and gc.is_tracked(instance.images)
    assert id(instance.runner) not in walked and id(instance.images) not in walked


def test_cuda_settings_are_read_without_a_device(step):
    """What `initialize` gives the Runner on a GPU host: the instance's GPU, graphs and torch.compile as configured
    (building a torch.device touches no device)."""
    _, module, config = step
    params = {key: value["string_value"] for key, value in config["parameters"].items()}
    cuda = module.runner_settings({**params, "device": "cuda", "torch_compile": "1"},
                                  {"model_instance_device_id": "1"})
    assert cuda["device"] == torch.device("cuda", 1) and cuda["graphs"] and cuda["compile_model"]
    assert cuda["buckets"] == (1, 2, 4, 8) and cuda["top_k"] == 5
    no_graphs = module.runner_settings({**params, "device": "cuda", "cuda_graphs": "0"}, {})
    assert no_graphs["device"] == torch.device("cuda", 0) and not no_graphs["graphs"]
    cpu = module.runner_settings({**params, "torch_compile": "1"}, {"model_instance_device_id": "0"})
    assert cpu["device"] == torch.device("cpu") and not cpu["graphs"] and not cpu["compile_model"]


def test_a_cuda_step_starts_on_its_instances_gpu_with_the_flags_it_was_written_with(step, tmp_path, monkeypatch):
    """`hub-vit repository --flavour torch --device cuda --no-cuda-graphs --torch-compile`, then `initialize` as Triton
    calls it for an instance on GPU 1, with torch.cuda's `set_device` and the device-side classes (the Runner, the
    image path) standing in: the flags reach the Runner through config.pbtxt, the instance's GPU is made current, and
    the process's CPU thread count (the CPU instances' share) is left alone."""
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from hub_vit.server.repository import torch_images, torch_runner
    from hub_vit.server.repository.config import cuda_graph_buckets

    _, module, _ = step
    _load_commands()
    written = CliRunner().invoke(app, ["repository", str(tmp_path / "r"), "--flavour", "torch", "--device", "cuda",
                                       "--no-cuda-graphs", "--torch-compile"])
    assert written.exit_code == 0, written.output
    folder = tmp_path / "r" / "vit_classifier"
    config = json_format.MessageToDict(text_format.Parse((folder / "config.pbtxt").read_text(), mc.ModelConfig()),
                                       preserving_proto_field_name=True)
    calls: dict[str, list] = {}

    def recorder(name: str):
        class Recorded:
            def __init__(self, *args: object, **kwargs: object) -> None:
                calls.setdefault(name, []).append((args, kwargs))
        return Recorded

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("set_device", []).append(device))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.setdefault("set_num_threads", []).append(n))
    monkeypatch.setattr(torch_runner, "Runner", recorder("Runner"))
    monkeypatch.setattr(torch_images, "ImagePath", recorder("ImagePath"))
    instance = module.TritonPythonModel()
    instance.initialize({"model_config": json.dumps(config), "model_repository": str(folder), "model_version": "1",
                         "model_instance_device_id": "1"})
    gpu = torch.device("cuda", 1)
    assert calls.pop("set_device") == [gpu] and "set_num_threads" not in calls
    [(_, runner)] = calls.pop("Runner")
    assert runner["device"] == gpu and runner["graphs"] is False and runner["compile_model"] is True
    assert runner["buckets"] == tuple(cuda_graph_buckets(config["max_batch_size"])) and runner["classes"] == 10
    [(image_path, _)] = calls.pop("ImagePath")
    assert image_path[2] == gpu
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    instance.pool.shutdown()
