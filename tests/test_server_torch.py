"""The torch flavour (the hub-vit model in PyTorch inside one Triton Python step) on the real tritonserver, with
device cpu: the code path a GPU host runs with device cuda, less the device. Compared with the ONNX CPU flavour
serving the same model folder on the same server binary: same batching, same top-1 labels, logits within
LOGITS_ATOL (both float32; the torch flavour resizes on the device with torch's filters, the CPU flavour with
Pillow's: tests/test_torch_images.py states and measures the difference), bad images answered as client errors while
the server keeps serving. Also the repository it writes, its options and `serve --device` choices.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException
from typer.testing import CliRunner

from hub_vit.resolve import resolve_model
from hub_vit.server.client.classifier import AsyncClassifier, Classifier
from hub_vit.server.repository.config import cuda_graph_buckets
from hub_vit.server.repository.metadata import graph_model, serving_metadata
from hub_vit.server.repository.options import CUDA_DEFAULTS, ServingOptions
from hub_vit.server.repository.writer import MANIFEST, outdated_files, write_repository
from hub_vit.server.runtime import device as device_module
from hub_vit.server.runtime.device import choose_device
from tests.served import classify_concurrently, start_server
from tests.test_server_triton import BAD_IMAGES, _encode, _raw_infer, _url
from tests.test_torch_images import LOGITS_ATOL

MAX_BATCH = 8


@pytest.fixture(scope="module")
def model_folder() -> Path:
    """The shipped default model (simplevit_digits)."""
    from hub_vit.catalog import default_model_folder

    return Path(default_model_folder())


@pytest.fixture(scope="module")
def photo_payloads(photos) -> list[bytes]:
    return [_encode(photos["astronaut"], "JPEG", quality=90), _encode(photos["chelsea"], "PNG"),
            _encode(photos["coffee"], "WEBP", lossless=True)]


@pytest.fixture(scope="module")
def digits() -> tuple[list[bytes], np.ndarray]:
    from hub_vit.train.digits import load_digits_split

    images, labels = load_digits_split("val")
    return [_encode(image) for image in images], labels


def _config(repo: Path) -> mc.ModelConfig:
    return text_format.Parse((repo / "vit_classifier" / "config.pbtxt").read_text(), mc.ModelConfig())


def _options(flavour: str) -> ServingOptions:
    return ServingOptions(flavour=flavour, max_batch_size=MAX_BATCH, preferred_batch_sizes=(4, 8),
                          max_queue_delay_us=2000)


@pytest.fixture(scope="module")
def torch_repo(model_folder, tmp_path_factory) -> Path:
    return write_repository(resolve_model(model_folder), tmp_path_factory.mktemp("torch") / "repository",
                            _options("torch"))


# -- the repository -----------------------------------------------------------------------------------------------
def test_torch_repository_carries_the_model_folders_own_weights(torch_repo, model_folder):
    step = torch_repo / "vit_classifier" / "1"
    assert sorted(p.name for p in step.iterdir()) == ["cgroup_limits.py", "domain.safetensors", "domain_outputs.py",
                                                      "domain_score.py", "image_formats.py", "image_modes.py",
                                                      "imageprep.py",
                                                      "labels.txt", "model", "model.py", "protocol.py",
                                                      "served_rollout.py", "stub_gc.py", "topk.py",
                                                      "triton_errors.py"]
    # the same weights file every other path loads, byte for byte; no ONNX export
    assert (step / "model" / "model.safetensors").read_bytes() == (model_folder / "model.safetensors").read_bytes()
    assert not list(torch_repo.rglob("*.onnx"))
    config = _config(torch_repo)
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.parameters["device"].string_value == "cpu"
    assert json.loads(config.parameters["buckets"].string_value) == [1, 2, 4, 8]
    manifest = json.loads((torch_repo / MANIFEST).read_text())
    assert manifest["options"]["flavour"] == "torch" and manifest["options"]["device"] == "cpu"
    assert outdated_files(torch_repo) == []


def test_cuda_repository_is_gpu_sized(model_folder, tmp_path):
    repo = write_repository(resolve_model(model_folder), tmp_path / "cuda", ServingOptions.for_device("cuda"))
    config = _config(repo)
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert config.max_batch_size == CUDA_DEFAULTS["max_batch_size"] == 256
    assert list(config.dynamic_batching.preferred_batch_size) == [16, 32, 64, 128, 256]
    assert json.loads(config.parameters["buckets"].string_value) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert [w.batch_size for w in config.model_warmup] == [1, 256]
    assert json.loads((repo / MANIFEST).read_text())["options"]["device"] == "cuda"


def test_cuda_graph_buckets_hold_every_batch_with_at_most_half_padding():
    assert cuda_graph_buckets(1) == (1,)
    assert cuda_graph_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    buckets = cuda_graph_buckets(256)
    for count in range(1, 257):
        bucket = next(b for b in buckets if b >= count)
        assert bucket < 2 * count or bucket == 1


def test_torch_flavour_refuses_an_exported_file(model_folder, tmp_path):
    source = resolve_model(model_folder)
    onnx = graph_model(serving_metadata(source), tmp_path / "model.onnx")
    with pytest.raises(ValueError, match=r"flavour 'torch' runs the hub-vit model itself in PyTorch, but .* is an "
                                         r"exported ONNX file; give a registered model name or a hub-vit model folder"):
        write_repository(onnx, tmp_path / "repo", ServingOptions(flavour="torch"))
    assert not (tmp_path / "repo").exists()


def test_runner_on_cpu_is_the_model_in_float32(model_folder):
    import torch

    from hub_vit.folder import load_model_folder
    from hub_vit.server.repository.torch_runner import Runner

    model, _ = load_model_folder(model_folder)
    runner = Runner(model, torch.device("cpu"), (32, 32), (1, 2, 4, 8))
    batch = np.random.default_rng(0).uniform(-1, 1, (5, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(runner(batch), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("options, message", [
    ({"device": "gpu"}, "unknown device 'gpu'; valid: cpu, cuda"),
    ({"device": "cuda"}, "device 'cuda' is served by flavour 'torch'"),
    ({"flavour": "gpu", "device": "cuda"}, "valid flavours for cuda: torch"),
    ({"flavour": "torch", "decode_threads": -1}, "decode_threads must be 0 (the cores shared among the instances)"),
    ({"flavour": "tpu"}, "unknown flavour 'tpu'; valid: cpu, gpu, torch"),
])
def test_bad_device_options_are_named(options, message):
    with pytest.raises(ValueError) as info:
        ServingOptions(**options)
    assert message in str(info.value)


# -- choosing the device ------------------------------------------------------------------------------------------
def test_serve_picks_cuda_and_the_torch_flavour_when_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr(device_module, "cuda_device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert choose_device(None) == device_module.DeviceChoice("cuda", "torch", "cuda:0 (NVIDIA H100 80GB HBM3)")
    assert choose_device("cpu").flavour == "cpu"  # ONNX Runtime stays the CPU's flavour
    assert choose_device(None, "cpu").device == "cpu"
    with pytest.raises(ValueError, match="flavour 'cpu' runs ONNX Runtime on the CPU; device 'cuda' is served by"):
        choose_device("cuda", "cpu")


def test_without_a_gpu_the_default_is_unchanged_and_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(device_module, "cuda_device_name", lambda: None)
    assert choose_device(None) == device_module.DeviceChoice("cpu", "cpu", "the CPU")
    assert choose_device("cpu", "torch").flavour == "torch"
    with pytest.raises(ValueError, match=r"device 'cuda' asked for, but torch sees no CUDA GPU here .* valid here: "
                                         r"cpu"):
        choose_device("cuda")
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; valid: cpu, cuda"):
        choose_device("tpu")
    with pytest.raises(ValueError, match=r"flavour 'gpu' runs in the official Triton container .* valid flavours to "
                                         r"serve here: cpu, torch"):
        choose_device(None, "gpu")


def _cli(*args: str) -> tuple[int, str]:
    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


PORTS = ("--http-port", "18451", "--grpc-port", "18452", "--metrics-port", "18453")


@pytest.mark.parametrize("args, message", [
    (("--device", "tpu"), "error: unknown --device 'tpu'; valid: cpu, cuda"),
    (("--flavour", "gpu"), "error: --flavour 'gpu' runs in the official Triton container"),
    (("--no-cuda-graphs",), "error: --cuda-graphs sets the torch flavour, but the cpu flavour serves on cpu; add "
                            "--flavour torch"),
    (("--device", "cpu", "--torch-compile"), "error: --torch-compile sets the torch flavour"),
    (("--flavour", "torch", "--device", "cpu", "--torch-compile"),  # was accepted, and ignored on the CPU
     "error: --torch-compile applies on --device cuda; the torch flavour on cpu runs the model eagerly"),
])
def test_serve_refuses_bad_device_flags_by_name(args, message):
    code, output = _cli("serve", *PORTS, *args)
    assert code == 2 and message in output, output


def test_serve_device_cuda_without_a_gpu_names_the_valid_device():
    if device_module.cuda_device_name() is not None:
        pytest.skip("this machine has a CUDA device")
    code, output = _cli("serve", *PORTS, "--device", "cuda")
    # 3 (was 2): nothing asked is wrong, this host lacks the GPU (README, "Exit codes")
    assert code == 3 and "--device 'cuda' asked for, but torch sees no CUDA GPU here" in output, output
    assert "valid here: cpu" in output


def _serve_options_on_a_gpu_host(monkeypatch, *args: str) -> tuple[int, str, list]:
    """`hub-vit serve ARGS` on a host where torch sees a GPU (faked: no device is touched), stopped right after it
    built its options: (exit code, output, [ServingOptions built]). Nothing is exported or started."""
    from hub_vit.cli import serve_run

    built: list = []

    def build_and_serve(self, options_for, device_defaulted, flavour):
        built.append(options_for(self.where))

    monkeypatch.setattr(device_module, "cuda_device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(serve_run.ServeRun, "build_and_serve", build_and_serve)
    code, output = _cli("serve", *PORTS, *args)
    return code, output, built


@pytest.mark.parametrize("args", [("--device", "cuda"), ()], ids=["asked", "chosen_by_itself"])
def test_serve_builds_gpu_sized_options_for_cuda(monkeypatch, args):
    """The GPU host's first `serve --device cuda` died building its options ("serving_options() got multiple values
    for keyword argument 'max_batch_size'"): the device's sizes and the flags' sizes were passed side by side."""
    code, output, built = _serve_options_on_a_gpu_host(monkeypatch, *args)
    assert code == 0, output
    [opts] = built
    assert (opts.device, opts.flavour) == ("cuda", "torch")
    assert opts.max_batch_size == CUDA_DEFAULTS["max_batch_size"]
    assert opts.max_queue_size == CUDA_DEFAULTS["max_queue_size"]
    assert opts.preferred_batch_sizes == CUDA_DEFAULTS["preferred_batch_sizes"]
    assert opts.classifier_instances == CUDA_DEFAULTS["classifier_instances"] == 4
    assert opts.queue_policy is CUDA_DEFAULTS["queue_policy"] is False  # the batcher prefetches


@pytest.mark.parametrize("args, policy", [
    ((), False),
    (("--queue-policy",), True),
    (("--max-queue-size", "512"), True),  # only the policy applies a queue bound or timeout: asked for, it is back
    (("--queue-timeout-us", "5000"), True),
    (("--no-queue-policy",), False),
])
def test_serve_on_cuda_has_no_queue_policy_unless_asked_for(monkeypatch, args, policy):
    code, output, built = _serve_options_on_a_gpu_host(monkeypatch, "--device", "cuda", *args)
    assert code == 0, output
    assert built[0].queue_policy is policy


def test_the_library_s_cuda_options_bring_the_queue_policy_back_with_a_queue_bound_or_timeout():
    assert ServingOptions.for_device("cuda").queue_policy is False
    assert ServingOptions.for_device("cuda", max_queue_size=512).queue_policy is True
    assert ServingOptions.for_device("cuda", queue_timeout_us=5000).queue_policy is True
    assert ServingOptions.for_device("cpu").queue_policy is True


def test_serve_on_cuda_keeps_the_sizes_given(monkeypatch):
    code, output, built = _serve_options_on_a_gpu_host(monkeypatch, "--device", "cuda", "--max-batch-size", "48",
                                                       "--max-queue-delay-us", "50")
    assert code == 0, output
    [opts] = built
    assert (opts.max_batch_size, opts.max_queue_delay_us) == (48, 50)
    assert opts.preferred_batch_sizes == (16, 32)
    assert opts.max_queue_size == CUDA_DEFAULTS["max_queue_size"]  # not given: the GPU's


def test_serve_takes_the_classifier_instances_as_repository_does(monkeypatch, tmp_path):
    code, output, built = _serve_options_on_a_gpu_host(monkeypatch, "--device", "cuda", "--instances", "2")
    assert code == 0, output
    assert built[0].classifier_instances == 2  # given: not the GPU's default of 4
    code, output, built = _serve_options_on_a_gpu_host(monkeypatch, "--device", "cpu", "--instances", "3")
    assert code == 0, output
    assert built[0].classifier_instances == 3
    code, output, built = _serve_options_on_a_gpu_host(monkeypatch, "--instances", "0")
    assert code == 2 and "--instances must be an integer from 1 to 128, got 0" in output and not built, output
    code, output = _cli("serve", *PORTS, "--instances", "3", "--repository", str(tmp_path))
    assert code == 2 and "--instances only applies when serve builds the repository" in output, output


def test_on_a_gpu_host_an_exported_file_is_served_by_onnx_runtime_on_the_cpu(monkeypatch, tmp_path):
    """`hub-vit serve model.onnx` where torch sees a GPU and --device is left to serve: the torch flavour cannot run an
    exported file, so serve says so and builds the CPU flavour's options (nothing exported or started here)."""
    from hub_vit.cli import serve_build
    from hub_vit.cli.serve_build import Refused

    built: list = []

    class Build:  # the child that would load and export: it takes the request and refuses it
        def __init__(self, request):
            built.append(request.options)

        def loaded(self):
            return Refused("stopped by the test before anything is loaded", 2)

        def stop(self):
            pass

    monkeypatch.setattr(device_module, "cuda_device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(serve_build, "RepositoryBuild", Build)
    (tmp_path / "model.onnx").write_bytes(b"not read here")
    code, output = _cli("serve", *PORTS, str(tmp_path / "model.onnx"))
    assert code != 0 and "stopped by the test" in output, output
    [opts] = built
    assert (opts.device, opts.flavour) == ("cpu", "cpu")
    assert "is an exported file, which the torch flavour cannot run; serving it with ONNX Runtime on the CPU" in output
    built.clear()  # asked for cuda by name, it is the torch flavour's refusal instead (no silent move to the CPU)
    code, output = _cli("serve", *PORTS, "--device", "cuda", str(tmp_path / "model.onnx"))
    assert [(opts.device, opts.flavour) for opts in built] == [("cuda", "torch")], output


def test_a_cuda_repository_is_served_on_a_gpu_and_refused_by_name_without_one(model_folder, tmp_path, monkeypatch):
    """`hub-vit serve --repository DIR` takes the device from DIR's manifest: a cuda repository on a GPU host runs on
    cuda:0; without a GPU it is refused with what to do, before Triton fails to load its KIND_GPU instances."""
    from hub_vit.server.runtime.device import DeviceChoice, recorded_device

    cuda = write_repository(resolve_model(model_folder), tmp_path / "cuda", ServingOptions.for_device("cuda"))
    cpu = write_repository(resolve_model(model_folder), tmp_path / "cpu", ServingOptions(flavour="torch"))
    monkeypatch.setattr(device_module, "cuda_device_name", lambda: "NVIDIA H200")
    assert recorded_device(cuda) == DeviceChoice("cuda", "torch", "cuda:0 (NVIDIA H200)")
    assert recorded_device(cpu) == DeviceChoice("cpu", "torch", "the CPU")
    monkeypatch.setattr(device_module, "cuda_device_name", lambda: None)
    with pytest.raises(ValueError, match=r"is a torch-flavour repository for device cuda, but torch sees no CUDA "
                                         r"device here; rebuild it with --device cpu, or serve it on a GPU host"):
        recorded_device(cuda)
    assert recorded_device(cpu).device == "cpu"


def test_repository_refuses_torch_flags_on_other_flavours(tmp_path):
    code, output = _cli("repository", str(tmp_path / "r"), "--decode-threads", "4")
    assert code == 2 and "--decode-threads sets the torch flavour; pass --flavour torch" in output, output
    code, output = _cli("repository", str(tmp_path / "r"), "--device", "cuda")
    assert code == 2 and "--device 'cuda' is served by --flavour 'torch'" in output, output
    # were written into the manifest of a repository whose flavour has no such setting, and nothing else
    for flags, message in ((("--gpu-backend", "tensorrt"), "--gpu-backend sets the GPU flavour's backend; pass "
                                                           "--flavour gpu (the cpu flavour has none)"),
                           (("--flavour", "torch", "--precision", "FP16"), "--precision sets the GPU flavour's "
                                                                           "backend; pass --flavour gpu (the torch "
                                                                           "flavour has none)"),
                           (("--flavour", "torch", "--spinning"), "--spinning/--no-spinning sets the CPU flavour's "
                                                                  "ONNX Runtime threads; the torch flavour runs "
                                                                  "PyTorch")):
        code, output = _cli("repository", str(tmp_path / "r"), *flags)
        assert code == 2 and message in " ".join(output.split()), (flags, output)
    code, output = _cli("repository", str(tmp_path / "r"), "--flavour", "torch", "--cuda-graphs", "--torch-compile")
    assert code == 2 and "--cuda-graphs and --torch-compile apply on --device cuda; the torch flavour on cpu runs " \
        "the model eagerly" in " ".join(output.split()), output
    assert not (tmp_path / "r").exists()


def test_repository_device_cuda_takes_gpu_sizes_unless_given(tmp_path):
    code, output = _cli("repository", str(tmp_path / "r"), "--flavour", "torch", "--device", "cuda",
                        "--max-batch-size", "64")
    assert code == 0, output
    config = _config(tmp_path / "r")
    assert config.max_batch_size == 64  # given: kept
    assert list(config.dynamic_batching.preferred_batch_size) == [16, 32, 64]
    assert not config.dynamic_batching.HasField("default_queue_policy")  # cuda: the batcher prefetches
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU


# -- the real server: torch (cpu) against ONNX Runtime (cpu) ------------------------------------------------------
@pytest.fixture(scope="module")
def servers(torch_repo, model_folder, tmp_path_factory):
    onnx_repo = write_repository(resolve_model(model_folder), tmp_path_factory.mktemp("onnx") / "repository",
                                 _options("cpu"))
    started = []
    try:
        for repo in (torch_repo, onnx_repo):
            started.append(start_server(repo))
        yield {"torch": started[0], "onnx": started[1]}
    finally:
        for server in started:
            server.stop()


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_torch_flavour_answers_as_the_onnx_flavour(servers, photo_payloads, digits, protocol):
    payloads = [*photo_payloads, *digits[0][:29]]  # 32 images: real photos and held-out digits
    answers = {}
    for flavour, server in servers.items():
        with Classifier(_url(server, protocol), protocol=protocol) as client:
            answers[flavour] = [p for chunk in range(0, len(payloads), MAX_BATCH)
                                for p in client.classify(payloads[chunk:chunk + MAX_BATCH], with_logits=True)]
    for torch_answer, onnx_answer in zip(answers["torch"], answers["onnx"], strict=True):
        assert torch_answer.labels[0] == onnx_answer.labels[0]
        np.testing.assert_allclose(torch_answer.logits, onnx_answer.logits, atol=LOGITS_ATOL, rtol=0)
        np.testing.assert_allclose(torch_answer.scores, onnx_answer.scores, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.triton
@pytest.mark.slow
def test_concurrent_requests_are_batched_into_one_forward_pass(servers, photo_payloads, digits):
    payloads = [*photo_payloads, *digits[0]][:32]
    server = servers["torch"]
    results, requests, executions = classify_concurrently(server.grpc_url, payloads)
    with Classifier(servers["onnx"].http_url) as client:
        expected = [p for i in range(0, 32, MAX_BATCH) for p in client.classify(payloads[i:i + MAX_BATCH])]
    assert [r[0].labels[0] for r in results] == [e.labels[0] for e in expected]  # top-1: LOGITS_ATOL apart
    assert requests == 32 and executions < requests, (requests, executions)


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", ["not_an_image", "truncated_jpeg", "decompression_bomb"])
def test_bad_images_are_client_errors_and_the_server_keeps_serving(servers, photos, photo_payloads, case, protocol):
    make, message = BAD_IMAGES[case]
    server = servers["torch"]
    with Classifier(_url(server, protocol), protocol=protocol) as client:
        with pytest.raises(InferenceServerException) as info:
            client.classify([photo_payloads[1], make(photos)])  # the bad one is image 1 of the request
        err = info.value
        assert message in err.message() and "image 1" in err.message(), err.message()
        assert err.status() in ("400", "StatusCode.INVALID_ARGUMENT"), err.status()
        assert client.ready() and len(client.classify(photo_payloads[0])[0].labels) == 5


@pytest.mark.triton
@pytest.mark.slow
def test_an_empty_image_from_another_client_is_a_client_error(servers, photo_payloads):
    # hub-vit's clients refuse b"" before sending; a client of its own still gets the server's refusal
    server = servers["torch"]
    with pytest.raises(InferenceServerException) as info:
        _raw_infer(server, "image", np.array([[photo_payloads[1]], [b""]], dtype=np.object_), "BYTES")
    assert "empty image" in info.value.message() and "image 1" in info.value.message(), info.value.message()
    with Classifier(server.http_url) as client:
        assert client.ready() and len(client.classify(photo_payloads[0])[0].labels) == 5


@pytest.mark.triton
@pytest.mark.slow
def test_bad_and_good_requests_in_one_batch_are_answered_apart(servers, photos, photo_payloads):
    """Requests of one dynamic batch are decoded together on the pool: the bad one fails alone."""
    bad = BAD_IMAGES["truncated_jpeg"][0](photos)
    payloads = [photo_payloads[0], bad, photo_payloads[1], photo_payloads[2], bad, photo_payloads[0]]

    async def fire():
        async with AsyncClassifier(servers["torch"].http_url) as client:
            return await asyncio.gather(*(client.classify(p) for p in payloads), return_exceptions=True)

    results = asyncio.run(fire())
    with Classifier(servers["onnx"].http_url) as client:
        expected = client.classify(photo_payloads)
    for payload, result in zip(payloads, results, strict=True):
        if payload is bad:
            assert isinstance(result, InferenceServerException) and "cannot decode JPEG" in result.message()
        else:
            assert result[0].labels[0] == expected[photo_payloads.index(payload)].labels[0]
