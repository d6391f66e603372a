"""The torch flavour on a CUDA device: the forward pass (bf16 weights, CUDA graph buckets, top-k on the device)
against fp32 eager; the data path with nvJPEG (torch_images) against imageprep: pixels, EXIF orientations, truncated
JPEGs refused in imageprep's words; and the real tritonserver serving it on KIND_GPU instances against the ONNX CPU
flavour (same labels, scores within BF16_SCORE_ATOL), bad input, batching, and `hub-vit serve` choosing cuda by itself.

Skipped without a CUDA device (the CI machine has none); scripts/gpu_check.sh runs it on a GPU host. The CPU half of
the same code path runs everywhere in tests/test_server_torch.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tritonclient.utils import InferenceServerException

from hub_vit.resolve import resolve_model
from hub_vit.server.client.classifier import Classifier
from hub_vit.server.repository.config import cuda_graph_buckets
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository
from hub_vit.server.runtime.launcher import free_port
from tests.programs import HUB_VIT
from tests.served import classify_concurrently, start_server
from tests.test_server_triton import BAD_IMAGES, _encode, _url

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

# bf16 keeps 8 significant bits: softmax scores of the digits model move by up to ~1e-2 against float32
BF16_SCORE_ATOL = 2e-2
BF16_LOGIT_RTOL = 3e-2  # of the largest logit's magnitude
MAX_BATCH = 64
# nvJPEG is not libjpeg: its IDCT and chroma upsampling differ (libjpeg's "fancy" upsampling interpolates chroma, a
# decoder that replicates it differs at colour edges by tens of levels), so pixels are compared on average and at
# their 99.9th percentile, in uint8 levels; a wrong orientation, crop or resize moves the mean by far more
NVJPEG_MEAN_LEVELS, NVJPEG_P999_LEVELS = 2.0, 24.0
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def model_folder() -> Path:
    from hub_vit.catalog import default_model_folder

    return Path(default_model_folder())


@pytest.fixture(scope="module")
def payloads(photos) -> list[bytes]:
    from hub_vit.train.digits import load_digits_split

    images, _ = load_digits_split("val")
    return [_encode(photos["astronaut"], "JPEG", quality=90), _encode(photos["chelsea"], "PNG"),
            _encode(photos["coffee"], "WEBP", lossless=True), *[_encode(image) for image in images[:45]]]


@pytest.mark.parametrize("graphs", [True, False])
def test_runner_buckets_match_fp32_eager(graphs):
    import timm

    import hub_vit  # noqa: F401  (registers the timm names)
    from hub_vit.server.repository.torch_runner import Runner

    model = timm.create_model("simplevit_s16", pretrained=False).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)  # a zero-initialised head would give all-zero logits
    batch = np.random.default_rng(0).uniform(-1, 1, (5, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    runner = Runner(model, torch.device("cuda"), (224, 224), cuda_graph_buckets(8), graphs=graphs)
    assert set(runner.graphs) == (set(cuda_graph_buckets(8)) if graphs else set())
    for rows in (slice(0, 5), slice(0, 1), slice(2, 5)):  # buckets 8, 1 and 4, each padded past the rows sent
        got = runner(batch[rows])
        scale = np.abs(expected).max()
        assert np.abs(got - expected[rows]).max() <= BF16_LOGIT_RTOL * scale
        assert (got.argmax(1) == expected[rows].argmax(1)).all()


def test_runner_graphs_rank_as_eager_does():
    """The captured region holds the top-k: a graph replay ranks as the eager pass does on the same input."""
    import timm

    import hub_vit  # noqa: F401
    from hub_vit.server.repository.torch_runner import Runner

    model = timm.create_model("simplevit_s16", pretrained=False).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    pixels = torch.rand(3, 3, 224, 224) * 2 - 1
    ranked = {}
    for graphs in (True, False):
        runner = Runner(model, CUDA, (224, 224), (1, 4), graphs=graphs)
        with torch.inference_mode():
            runner.batch(3).copy_(pixels)
        ranked[graphs] = runner.fetch(*runner.run(3))
    for with_graph, eager in zip(ranked[True], ranked[False], strict=True):
        np.testing.assert_allclose(with_graph, eager, rtol=0, atol=1e-3)


def _levels(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    levels = np.abs(got - want) * 127.5  # std 0.5: back in uint8 levels
    return float(levels.mean()), float(np.percentile(levels, 99.9))


def test_nvjpeg_data_path_matches_imageprep(imageprep, photos, monkeypatch):
    """JPEGs (4:2:0, 4:4:4, progressive, grey) decoded by nvJPEG in one batch with a PNG and the digits samples
    decoded by imageprep, all transformed on the GPU: imageprep's pixels within the nvJPEG tolerance, and through the
    digits model the same top-1."""
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder
    from hub_vit.server.repository.torch_images import ImagePath
    from tests.test_torch_images import SAMPLES, device_pixels, encode, on_the_device, prep_for

    data = [encode(photos["chelsea"], quality=90), encode(photos["astronaut"], subsampling=0, quality=95),
            encode(photos["coffee"], progressive=True), encode(photos["astronaut"][..., 0], quality=90),
            encode(photos["coffee"], "PNG"), *[p.read_bytes() for p in SAMPLES]]
    for size, interpolation in ((224, "bicubic"), (32, "bilinear")):
        prep = prep_for(imageprep, size, interpolation, crop_pct=0.875 if size == 224 else 1.0)
        path = ImagePath(imageprep, prep, CUDA)
        calls = on_the_device(monkeypatch)
        pixels = device_pixels(path, data)
        assert calls == [[data[0], data[1], data[3]]]  # the sequential JPEGs: nvJPEG
        want = np.stack([prep(item) for item in data])
        mean, p999 = _levels(pixels, want)
        assert mean <= NVJPEG_MEAN_LEVELS and p999 <= NVJPEG_P999_LEVELS, (size, mean, p999)
    model, _ = load_model_folder(default_model_folder())
    with torch.no_grad():
        got, expected = model(torch.from_numpy(pixels)).numpy(), model(torch.from_numpy(want)).numpy()
    assert (got.argmax(1) == expected.argmax(1)).all()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientations_on_cuda(imageprep, photos, orientation):
    from hub_vit.server.repository.torch_images import ImagePath
    from tests.test_torch_images import device_pixels, prep_for, with_orientation

    data = with_orientation(photos["chelsea"][:, :400], orientation)
    prep = prep_for(imageprep, 224)
    pixels = device_pixels(ImagePath(imageprep, prep, CUDA), [data])
    mean, p999 = _levels(pixels, prep(data)[None])
    assert mean <= NVJPEG_MEAN_LEVELS and p999 <= NVJPEG_P999_LEVELS, (mean, p999)


@pytest.mark.parametrize("case", ["cut short, closed again", "a few rows more declared", "cut short",
                                  "flat mid-grey, complete"])
def test_truncated_jpegs_are_refused_on_cuda_in_imageprep_words(imageprep, photos, monkeypatch, case):
    """nvJPEG decodes a JPEG whose data ends early without a word, its missing blocks left as its memory held them:
    such an image is refused with imageprep's words before nvJPEG sees it; a complete image ending in mid-grey is
    decoded by imageprep and kept."""
    from hub_vit.server.repository.torch_images import ImagePath
    from tests.test_torch_images import device_pixels, encode, on_the_device, prep_for, truncated

    data = {**truncated(photos), "flat mid-grey, complete": encode(np.full((300, 451, 3), 128, np.uint8))}[case]
    prep = prep_for(imageprep, 224)
    path = ImagePath(imageprep, prep, CUDA)
    calls = on_the_device(monkeypatch)
    [item] = path.decode([data])
    assert calls == []
    if case.endswith("complete"):
        mean, p999 = _levels(device_pixels(path, [data], [item]), prep(data)[None])
        assert mean <= NVJPEG_MEAN_LEVELS and p999 <= NVJPEG_P999_LEVELS
        return
    with pytest.raises(imageprep.BadImageError) as words:
        prep.decode(data)
    assert isinstance(item, imageprep.BadImageError), f"{case}: accepted on the GPU, refused by imageprep"
    assert str(item) == str(words.value)


@pytest.fixture(scope="module")
def servers(model_folder, tmp_path_factory):
    source = resolve_model(model_folder)
    cuda = ServingOptions.for_device("cuda", max_batch_size=MAX_BATCH,
                                     preferred_batch_sizes=(16, 32, 64), max_queue_delay_us=2000)
    cpu = ServingOptions(max_batch_size=16, preferred_batch_sizes=(4, 8, 16))
    started = {}
    try:
        for flavour, opts in (("cuda", cuda), ("onnx", cpu)):
            repo = write_repository(source, tmp_path_factory.mktemp(flavour) / "repository", opts)
            started[flavour] = start_server(repo)
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_flavour_answers_as_the_onnx_cpu_flavour(servers, payloads, protocol):
    answers = {}
    for flavour, server in servers.items():
        with Classifier(_url(server, protocol), protocol=protocol) as client:
            answers[flavour] = client.classify(payloads)
    margins_ok = 0
    for gpu, cpu in zip(answers["cuda"], answers["onnx"], strict=True):
        np.testing.assert_allclose(gpu.scores, cpu.scores, atol=BF16_SCORE_ATOL, rtol=0)
        if cpu.scores[0] - cpu.scores[1] > 2 * BF16_SCORE_ATOL:  # not a near-tie: bf16 must not reorder it
            assert gpu.labels[0] == cpu.labels[0]
            margins_ok += 1
    assert margins_ok >= len(payloads) // 2


def test_concurrent_requests_share_executions_and_buckets(servers, payloads):
    server = servers["cuda"]
    results, requests, executions = classify_concurrently(server.grpc_url, payloads)
    with Classifier(server.http_url) as client:
        alone = [client.classify([p])[0] for p in payloads[:8]]  # bucket 1 each time
    for together, single in zip(results, alone, strict=False):
        np.testing.assert_allclose(together[0].scores, single.scores, atol=BF16_SCORE_ATOL, rtol=0)
    assert requests == len(payloads) and executions < requests, (requests, executions)


@pytest.mark.parametrize("case", ["not_an_image", "truncated_jpeg", "decompression_bomb"])
def test_bad_images_on_the_gpu_server_are_client_errors(servers, photos, payloads, case):
    make, message = BAD_IMAGES[case]
    with Classifier(servers["cuda"].http_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.classify([payloads[0], make(photos)])
        assert message in info.value.message() and "image 1" in info.value.message()
        assert info.value.status() == "400"
        assert client.ready() and len(client.classify(payloads[0])[0].labels) == 5


def test_serve_picks_cuda_by_itself_and_says_so(model_folder):
    ports = [str(free_port()) for _ in range(3)]
    command = [*HUB_VIT, "serve", str(model_folder),
               "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2], "--quiet",
               "--max-batch-size", "32"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            line = process.stdout.readline()
            lines.append(line)
            if "metrics" in line:
                break
        text = "".join(lines)
        assert "device   cuda:0 (" in text and "(torch flavour)" in text, text
        with Classifier(f"127.0.0.1:{ports[0]}") as client:
            assert client.max_batch_size() == 32
            assert len(client.classify(sorted(model_folder.glob("samples/*.png"))[:3])) == 3
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0
