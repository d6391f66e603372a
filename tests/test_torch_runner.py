"""The torch flavour's forward pass (server/repository/torch_runner.py) on the CPU: the code a GPU host runs, less the
CUDA calls. The bf16 weights (cast, not autocast), the buckets and their padding, top-k on the device, the CUDA graph
branch's bookkeeping (with stand-in graphs), and what CUDA graph capture needs of the captured region (`_body`): no
host tensor, no host sync, shapes fixed by the bucket; that last one on the meta device, at the served model's size.
The cuda-only lines (`_warm_up`, `fetch`'s wait, the cuda dtype) run against a stand-in `torch.cuda` (FakeCuda) that
logs streams, captures, replays and waits in order.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from hub_vit.server.repository.torch_runner import Ranked, Runner, top_k
from hub_vit.server.repository.writer import template_dir
from tests.test_device_placement import HostTensors

CPU, META = torch.device("cpu"), torch.device("meta")
BUCKETS = (1, 2, 4, 8)
# bf16 keeps 8 significant bits: the digits model's logits move by up to ~3 % of the largest one (as on the GPU,
# tests/test_server_torch_cuda.py)
BF16_LOGIT_RTOL = 3e-2
# ops that wait for the device (a value read back, or a shape that depends on values): a CUDA graph cannot hold them
HOST_SYNCS = {"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.is_nonzero", "aten.equal",
              "aten.masked_select", "aten._unique2", "aten.unique_consecutive", "aten.repeat_interleave"}


def numpy_top_k():
    """The CPU flavour's top-k (templates/common/topk.py), loaded from its file as the steps load it."""
    spec = importlib.util.spec_from_file_location("served_topk", template_dir("common") / "topk.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.top_k


@pytest.fixture(scope="module")
def digits():
    """The shipped digits model and 64 held-out digits as its (N, 3, 32, 32) pixels."""
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder
    from hub_vit.train.digits import load_digits_split

    model, info = load_model_folder(default_model_folder())
    transform = create_transform(**resolve_data_config(pretrained_cfg=dict(info.pretrained_cfg)), is_training=False)
    val, _ = load_digits_split("val")
    pixels = torch.stack([transform(Image.fromarray(image).convert("RGB")) for image in val[:64]]).numpy()
    return model, pixels


def _fresh(digits):
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder

    return load_model_folder(default_model_folder())[0]


def fill_and_run(runner: Runner, pixels: np.ndarray) -> list[np.ndarray]:
    with torch.inference_mode():
        runner.batch(len(pixels)).copy_(torch.from_numpy(pixels))
    return runner.fetch(*runner.run(len(pixels)))


def test_top_k_on_the_device_is_the_cpu_flavours_top_k_ties_included():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 1000)).astype(np.float32)
    logits = torch.from_numpy(logits).to(torch.bfloat16).float().numpy()  # bf16 logits: many exact ties
    logits[:8, :5] = logits[:8, 5:10].max(1, keepdims=True) + 1  # ties for the best scores themselves
    scores, ids = top_k(torch.from_numpy(logits), 5)
    want_scores, want_ids = numpy_top_k()(logits, 5)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_allclose(scores.numpy(), want_scores, rtol=1e-6, atol=0)
    assert top_k(torch.from_numpy(logits[:, :3]), 5)[1].shape == (64, 3)  # fewer classes than k


def test_weights_are_cast_to_bf16_and_agree_with_float32(digits):
    model, pixels = digits
    with torch.no_grad():
        expected = model(torch.from_numpy(pixels)).numpy()
    runner = Runner(_fresh(digits), CPU, (32, 32), (64,), dtype=torch.bfloat16)
    assert {p.dtype for p in runner.model.parameters()} == {torch.bfloat16}  # cast, not autocast
    logits, scores, ids, features = fill_and_run(runner, pixels)
    assert features.shape == (len(pixels), 0)  # a plain classifier returns no features
    assert logits.dtype == np.float32 and ids.dtype == np.int64
    assert np.abs(logits - expected).max() <= BF16_LOGIT_RTOL * np.abs(expected).max()
    assert (ids[:, 0] == expected.argmax(1)).mean() >= 0.98  # near-ties may flip in bf16
    want_scores, want_ids = numpy_top_k()(logits, 5)  # the ranking of the logits it returned
    np.testing.assert_allclose(scores, want_scores, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(ids, want_ids)


def test_every_count_runs_in_the_smallest_bucket_and_padding_never_leaks(digits):
    model, pixels = digits
    with torch.no_grad():
        expected = model(torch.from_numpy(pixels[:8])).numpy()
    runner = Runner(_fresh(digits), CPU, (32, 32), BUCKETS)
    assert [runner.bucket(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    fill_and_run(runner, pixels[8:16])  # the buckets now hold other images past any later count
    for count in (8, 3, 5, 1, 2):
        logits, _, ids, _ = fill_and_run(runner, pixels[:count])
        np.testing.assert_allclose(logits, expected[:count], atol=1e-5, rtol=0)
        assert (ids[:, 0] == expected[:count].argmax(1)).all()
    with pytest.raises(ValueError, match=r"a batch of 9 images is more than the largest bucket, 8 \(max_batch_size\)"):
        runner.batch(9)


class CaptureCheck(HostTensors):
    """HostTensors, plus every op that would wait for the device (HOST_SYNCS)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in HOST_SYNCS or name.replace("aten::", "aten.") in HOST_SYNCS:
            self.syncs.append(name)
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("name", ["simplevit_s16", "vit_b16"])
def test_the_captured_region_holds_no_host_tensor_no_sync_and_static_shapes(name):
    """`_body` (what `torch.cuda.graph` captures) of the served models at full size, on the meta device in bf16."""
    import timm

    import hub_vit  # noqa: F401  (registers the timm names)

    with META:
        model = timm.create_model(name)
    runner = Runner(model, META, (224, 224), (4, 16), top_k=5, dtype=torch.bfloat16)
    for size in (4, 16):
        with torch.inference_mode(), CaptureCheck(META) as check:
            ranked = runner._body(runner.inputs[size])
        assert check.found == [] and check.syncs == [], (check.found, check.syncs)
        assert isinstance(ranked, Ranked)
        assert [tuple(t.shape) for t in ranked] == [(size, 1000), (size, 5), (size, 5), (size, 0)]
        assert [t.dtype for t in ranked] == [torch.float32, torch.float32, torch.int64, torch.float32]


def test_the_check_sees_a_host_sync():
    """The capture check itself: reading a value back (what `.item()` or a data-dependent branch does) is reported."""
    x = torch.ones(4)
    with CaptureCheck(CPU) as check:
        float(x.sum())
    assert check.syncs, "a value read back to the host went unnoticed"


def test_bad_buckets_and_k_are_named(digits):
    with pytest.raises(ValueError, match=r"buckets must be increasing positive batch sizes, got \(4, 2\)"):
        Runner(_fresh(digits), CPU, (32, 32), (4, 2))
    with pytest.raises(ValueError, match="top_k must be at least 1, got 0"):
        Runner(_fresh(digits), CPU, (32, 32), (4,), top_k=0)


def test_explained_requests_still_get_attentions_from_a_bf16_model(digits):
    model, pixels = digits
    runner = Runner(_fresh(digits), CPU, (32, 32), (4,), dtype=torch.bfloat16)
    logits, attentions, probe = runner.with_attentions(pixels[:2])
    assert logits.shape == (2, 10) and logits.dtype == np.float32
    assert attentions.dtype == torch.float32 and attentions.shape[:2] == (2, model.spec.depth)
    assert probe is None  # a GAP model has no MAP probe


# -- the cuda-only lines, with torch.cuda standing in -----------------------------------------------------------------
class FakeCuda:
    """torch.cuda's stream, graph and sync calls as `_warm_up` and `fetch` make them, on the CPU: a log of what ran
    where, and graphs whose `replay` recomputes `_body` on the input it captured into the outputs it captured (what a
    real replay does: a graph captured on a copy of a bucket's input would replay stale pixels)."""

    def __init__(self, runner: Runner) -> None:
        self.log: list[tuple] = []
        self.side_stream = False
        self.capturing: FakeCuda.Graph | None = None
        self.pools: list[object] = []
        body, fake = runner._body, self

        def recording_body(pixels: torch.Tensor) -> Ranked:
            ranked = body(pixels)
            if fake.capturing is not None:
                fake.capturing.captured = (pixels, ranked, body)
                fake.log.append(("capture", len(pixels)))
            else:
                fake.log.append(("side stream" if fake.side_stream else "current stream", len(pixels)))
            return ranked

        runner._body = recording_body

    class Graph:
        def __init__(self, fake: FakeCuda) -> None:
            self.fake, self.captured = fake, None

        def replay(self) -> None:
            pixels, ranked, body = self.captured
            self.fake.log.append(("replay", len(pixels)))
            for static, new in zip(ranked, body(pixels), strict=True):
                static.copy_(new)

    class Stream:
        def __init__(self, fake: FakeCuda, name: str) -> None:
            self.fake, self.name = fake, name

        def wait_stream(self, other: FakeCuda.Stream) -> None:
            self.fake.log.append(("wait", self.name, other.name))

        def synchronize(self) -> None:
            self.fake.log.append(("synchronize", self.name))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from contextlib import contextmanager

        fake = self

        @contextmanager
        def stream(side: FakeCuda.Stream):
            assert side.name == "side"
            fake.side_stream = True
            yield
            fake.side_stream = False

        @contextmanager
        def graph(graph: FakeCuda.Graph, pool: object = None):
            assert not fake.side_stream and fake.capturing is None
            fake.pools.append(pool)
            fake.capturing = graph
            yield
            fake.capturing = None

        def pool_handle() -> object:
            fake.log.append(("pool",))
            return object()

        for name, value in {"Stream": lambda device: FakeCuda.Stream(fake, "side"),
                            "current_stream": lambda device: FakeCuda.Stream(fake, "current"),
                            "stream": stream, "graph": graph, "CUDAGraph": lambda: FakeCuda.Graph(fake),
                            "graph_pool_handle": pool_handle,
                            "synchronize": lambda device: fake.log.append(("synchronize", "device"))}.items():
            monkeypatch.setattr(torch.cuda, name, value)


def _as_on_cuda(digits, monkeypatch) -> tuple[Runner, FakeCuda]:
    runner = Runner(_fresh(digits), CPU, (32, 32), BUCKETS)  # on cuda the constructor runs _warm_up: called below
    fake = FakeCuda(runner)
    fake.install(monkeypatch)
    runner.cuda = True
    return runner, fake


def test_warm_up_runs_each_bucket_on_a_side_stream_then_captures_largest_first_and_runs_replay_them(digits,
                                                                                                 monkeypatch):
    model, pixels = digits
    with torch.no_grad():
        expected = model(torch.from_numpy(pixels[:8])).numpy()
    runner, fake = _as_on_cuda(digits, monkeypatch)
    runner._warm_up(True)
    side = [("side stream", size) for size in BUCKETS for _ in range(2)]  # torch.compile compiles on these runs
    captured = [event for size in sorted(BUCKETS, reverse=True) for event in (("capture", size), ("replay", size))]
    assert fake.log == [("wait", "side", "current"), *side, ("wait", "current", "side"), ("synchronize", "device"),
                        ("pool",), *captured, ("synchronize", "device")]
    assert len(fake.pools) == len(BUCKETS) and len(set(map(id, fake.pools))) == 1  # one memory pool for all
    assert sorted(runner.graphs) == list(BUCKETS)

    fake.log.clear()
    for count in (3, 8, 1, 6):  # each run replays its bucket's graph; fetch waits once, after the copies
        logits, _, ids, _ = fill_and_run(runner, pixels[:count])
        np.testing.assert_allclose(logits, expected[:count], atol=1e-5, rtol=0)
        assert (ids[:, 0] == expected[:count].argmax(1)).all()
    assert fake.log == [event for size in (4, 8, 1, 8) for event in (("replay", size), ("synchronize", "current"))]


def test_without_graphs_the_buckets_are_warmed_up_and_run_eagerly(digits, monkeypatch):
    model, pixels = digits
    runner, fake = _as_on_cuda(digits, monkeypatch)
    runner._warm_up(False)
    assert [event for event in fake.log if event[0] in ("capture", "replay", "pool")] == []
    assert [event for event in fake.log if event[0] == "side stream"] == [("side stream", s) for s in BUCKETS
                                                                          for _ in range(2)]
    assert runner.graphs == {}
    fake.log.clear()
    with torch.no_grad():
        expected = model(torch.from_numpy(pixels[:3])).numpy()
    np.testing.assert_allclose(fill_and_run(runner, pixels[:3])[0], expected, atol=1e-5, rtol=0)
    assert fake.log == [("current stream", 3), ("synchronize", "current")]  # eager: only the 3 rows run


@pytest.mark.parametrize(("bf16", "dtype"), [(True, torch.bfloat16), (False, torch.float16)])
def test_on_cuda_the_weights_are_bf16_or_fp16_where_the_gpu_has_no_bf16(monkeypatch, bf16, dtype):
    from hub_vit.server.repository.torch_runner import default_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    assert default_dtype(torch.device("cuda", 1)) == dtype
    assert default_dtype(CPU) == torch.float32
