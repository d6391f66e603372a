"""`ServingOptions`: the knobs of a generated Triton repository, and their defaults.

Kept apart from `config` (which renders Triton's protobuf messages, importing tritonclient) so the CLI can read the
defaults when it starts without paying for those imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hub_vit.server.protocol import LONGEST_QUEUE_TIMEOUT_US  # a client may ask for less per request (config._batching)

FLAVOURS = ("cpu", "gpu", "torch")
# Where the torch flavour runs its model (the cpu flavour runs on the CPU, the gpu flavour on the GPU, by definition).
DEVICES = ("cpu", "cuda")
GPU_BACKENDS = ("onnxruntime", "tensorrt")
PRECISIONS = ("FP16", "FP32")

# The largest value of each option that Triton's ModelConfig field (model_config.proto) can hold.
_UINT32 = 2**32 - 1
_CONFIG_LIMITS = {"max_queue_size": (_UINT32, "a uint32")}
# Each instance is a process of its own (a Python-backend stub) with its own copy of the model and room for a batch:
# `--instances 1000` wrote a repository no host starts (1000 processes loading the model at once)
MOST_INSTANCES = 128
# A request alone waits the whole delay whenever an instance is free; a delay of seconds is a unit slip (ms or s for
# us) that makes every lone request wait that long, past clients' timeouts (60 s by default)
LONGEST_QUEUE_DELAY_US = 10_000_000
# Each instance runs one batch of max_batch_size at start (warm-up; the torch flavour also captures CUDA graphs up to
# it): 4096 ViT inputs at 224 px are 2.4 GB of pixels, while 1,000,000 would exhaust any host before serving
LARGEST_BATCH = 4096

# The torch flavour on a GPU: a ViT-S/16 runs hundreds of images per execution in a few milliseconds, so batches are
# GPU-sized (CUDA graph buckets are the powers of two up to max_batch_size) and the queue holds several full batches.
# The batcher waits as briefly as on the CPU: a lone request waits the whole delay whenever an instance is free
# (bench/request_path.py's "queue"), while under load batches fill as the instances compute, whatever the delay.
# Four classifier instances: each runs its batch's CPU share (headers, scan checks, the Python per request) while
# another's runs on the GPU. On an H200 (16 cores), S/16 at c256: 2 instances 2,053 / 1,882 images/s (HTTP / gRPC)
# with the GPU 22 % busy, 4 instances 3,384 / 3,007 with it 36-47 % busy (bench/results/gpu_serving_h200.json).
# No queue policy, so Triton's batcher prefetches: with one, batches that hold half the requests in flight let the
# instances fall into taking turns (the torch flavour on 2 CPU cores, batches up to 256 at c256: 964 requests/s with
# it, 1,496 without; bench/results/queue_policy_avx512bf16.json). A queue bound or timeout asks for it back
# (`for_device`).
CUDA_DEFAULTS: dict[str, object] = {
    "flavour": "torch",
    "max_batch_size": 256,
    "preferred_batch_sizes": (16, 32, 64, 128, 256),
    "max_queue_delay_us": 100,
    "max_queue_size": 2048,
    "classifier_instances": 4,
    "queue_policy": False,
}
# The options that only a queue policy applies: given on cuda, they bring the policy back
QUEUE_POLICY_FIELDS = ("max_queue_size", "queue_timeout_us")


@dataclass(frozen=True)
class ServingOptions:
    """Knobs of the generated repository (batching, queueing, instances); every one has a CPU-friendly default."""

    name: str = "vit"  # the ensemble clients call; its steps are `<name>_classifier` (+ `_preprocess`, ... on GPU)
    flavour: str = "cpu"
    max_batch_size: int = 16
    preferred_batch_sizes: tuple[int, ...] = (4, 8, 16)
    max_queue_delay_us: int = 100  # short: on CPU, requests queue up while an execution runs anyway
    max_queue_size: int = 256  # beyond this, requests are rejected at once (UNAVAILABLE / HTTP 503)
    # Longest a request may wait in a step's queue before it is rejected (HTTP 503 / gRPC UNAVAILABLE "Request timeout
    # expired"); 0 = no limit. A client may ask for less per request (client.Classifier.classify(queue_timeout_s=...)).
    queue_timeout_us: int = 0
    top_k: int = 5
    # Triton's queue policy on every batched step: the queue bound (max_queue_size), queue_timeout_us, and clients'
    # shorter per-request queue timeouts. Any policy turns off the batcher's prefetching in Triton's core, and then a
    # free instance can wait up to 500 ms for its next batch (docs/serving.md, "The queue policy";
    # bench/ab_queue_policy.py). False writes none, so Triton prefetches; the queue is then bounded only by the front's
    # connections, and the front refuses requests that carry a queue timeout (Triton would ignore it).
    queue_policy: bool = True
    # Two instances of the CPU classifier (which also decodes) and of the GPU flavour's Python steps by default.
    # With the queue policy, Triton 2.51's dynamic batcher is woken when an execution ends before that instance is
    # back waiting for work; finding none waiting, it sleeps until the next arrival or its 500 ms timeout. With one
    # instance per step, c16 load showed 500 ms stalls (p99 515 ms); with two, an idle instance is almost always
    # there when the batcher looks. docs/serving.md.
    preprocess_instances: int = 2
    classifier_instances: int = 2
    # ORT threads per classifier instance. 0 = decide from the model's compute: all of the host's cores for a
    # compute-bound model (SPIN_MIN_GMACS per image or more), the cores shared among the instances for a tiny one,
    # whose per-op thread hand-offs cost more than they save (digits model: 0.35 vs 0.49 ms CPU per image).
    intra_op_threads: int = 0
    # ORT worker threads spin between ops: for a compute-bound model this saves the wake-up latency of every op
    # (Ti/16 at 224 px, served at concurrency 1: p50 +2 to +6 ms over in-process instead of +5 to +12 ms). Several
    # spinning instances would starve each other, so they then take turns on the cores (one ORT run at a time; the
    # second instance decodes its batch meanwhile and keeps Triton's batcher from stalling). A tiny model never
    # spins: its threads would starve the other instance's decoding and Triton's HTTP/gRPC threads. None = decide
    # from the model; bench/bench_serve.py.
    ort_spinning: bool | None = None
    max_pixels: int = 40_000_000  # most pixels one image may have, decoded or resized before the crop
    # The CPU flavour also serves attention rollout (outputs `rollout`, `rollout_box`) for a request that asks for it
    # (parameter `explain`): a second ORT session on the attention graph, used only by those requests.
    explain: bool = True
    gpu_backend: str = "onnxruntime"  # onnxruntime (+ TensorRT accelerator) or tensorrt (a .plan engine)
    precision: str = "FP16"
    trt_cache_dir: str = "/tmp/hub-vit-trt-cache"
    # Torch flavour (one Python step: decode, then the hub-vit model in PyTorch, then top-k): `device` "cuda" runs
    # the model on the instance's GPU (KIND_GPU, JPEGs decoded there, bf16 weights), "cpu" in float32.
    device: str = "cpu"
    cuda_graphs: bool = True  # cuda: one CUDA graph per batch bucket, captured while the model loads
    torch_compile: bool = False  # cuda: torch.compile before the capture (minutes of warm-up per bucket)
    decode_threads: int = 0  # torch flavour: images decoded in parallel per instance; 0 = the cores / instances
    # CPU flavour: the ONNX graph served (server/repository/cpu_variant.py): "auto" = the fastest variant on this host
    # that passes the verification criterion, measured when the repository is built; or one variant by name (still
    # verified). The library default keeps the plain fp32 graph (no build-time measuring); `hub-vit serve / repository`
    # use auto.
    cpu_variant: str = "fp32"

    def __post_init__(self) -> None:
        self._check_numbers()
        self._check_choices()

    def _check_choices(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; valid: {', '.join(DEVICES)}")
        if self.device == "cuda" and self.flavour != "torch":
            raise ValueError(f"device 'cuda' is served by flavour 'torch' (flavour {self.flavour!r} has no device "
                             "choice: 'cpu' runs on the CPU, 'gpu' on the GPU); valid flavours for cuda: torch")
        from hub_vit.server.repository.cpu_variant import AUTO, check_cpu_variant

        check_cpu_variant(self.cpu_variant)
        if self.cpu_variant not in (AUTO, "fp32") and self.flavour != "cpu":
            raise ValueError(f"cpu_variant {self.cpu_variant!r} chooses the CPU flavour's graph; flavour "
                             f"{self.flavour!r} has none: use flavour cpu, or cpu_variant auto")
        if not isinstance(self.decode_threads, int) or self.decode_threads < 0:
            raise ValueError(f"decode_threads must be 0 (the cores shared among the instances) or a positive "
                             f"integer, got {self.decode_threads!r}")

    def _check_numbers(self) -> None:
        if self.flavour not in FLAVOURS:
            raise ValueError(f"unknown flavour {self.flavour!r}; valid: {', '.join(FLAVOURS)}")
        if self.gpu_backend not in GPU_BACKENDS:
            raise ValueError(f"unknown gpu_backend {self.gpu_backend!r}; valid: {', '.join(GPU_BACKENDS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")
        for key in ("max_batch_size", "top_k", "preprocess_instances", "classifier_instances", "max_pixels",
                    "max_queue_size"):
            value, most = getattr(self, key), {"max_batch_size": LARGEST_BATCH, "preprocess_instances": MOST_INSTANCES,
                                               "classifier_instances": MOST_INSTANCES}.get(key)
            if not isinstance(value, int) or value < 1:
                bounds = "a positive integer" if most is None else f"an integer from 1 to {most}"
                raise ValueError(f"{key} must be {bounds}, got {value!r}")
        for key in ("max_queue_delay_us", "queue_timeout_us"):  # Triton's config holds them as uint64
            value = getattr(self, key)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be 0 or a positive number of microseconds, got {value!r}")
        if self.max_batch_size > LARGEST_BATCH:
            raise ValueError(f"max_batch_size must be at most {LARGEST_BATCH} (each instance warms up with one batch "
                             f"of this size when the server starts), got {self.max_batch_size}")
        if self.max_queue_delay_us > LONGEST_QUEUE_DELAY_US:
            raise ValueError(f"max_queue_delay_us must be at most {LONGEST_QUEUE_DELAY_US} (10 s; a request alone "
                             f"waits the whole delay), got {self.max_queue_delay_us}; it is in microseconds")
        if not isinstance(self.queue_policy, bool):  # a string such as "no" would read as True
            raise ValueError(f"queue_policy must be True or False, got {self.queue_policy!r}")
        if self.queue_timeout_us and not self.queue_policy:
            raise ValueError(f"queue_timeout_us={self.queue_timeout_us} is applied by Triton's queue policy, which "
                             "queue_policy=False leaves out: keep the policy, or leave queue_timeout_us at 0")
        if self.queue_timeout_us > LONGEST_QUEUE_TIMEOUT_US:
            raise ValueError(f"queue_timeout_us must be at most {LONGEST_QUEUE_TIMEOUT_US} (one day), got "
                             f"{self.queue_timeout_us}; 0 = no limit")
        for key in ("preprocess_instances", "classifier_instances"):
            if getattr(self, key) > MOST_INSTANCES:
                raise ValueError(f"{key} must be at most {MOST_INSTANCES} (each instance is a process of its own, "
                                 f"with its own copy of the model), got {getattr(self, key)}")
        for key, (limit, kind) in _CONFIG_LIMITS.items():  # else protobuf's "Value out of range", naming nothing
            value = getattr(self, key)
            if value > limit:
                raise ValueError(f"{key} must be at most {limit} (Triton's config holds it as {kind}), got {value}")
        if not isinstance(self.intra_op_threads, int) or self.intra_op_threads < 0:
            raise ValueError(f"intra_op_threads must be 0 (decide from the model) or a positive integer, "
                             f"got {self.intra_op_threads!r}")
        bad = [s for s in self.preferred_batch_sizes if not 1 <= s <= self.max_batch_size]
        if bad:
            raise ValueError(f"preferred batch sizes {bad} are outside 1..max_batch_size={self.max_batch_size}")
        # ASCII: the name is part of the Python-backend stub's model path, which the stub reads as ASCII only
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", self.name):
            raise ValueError(f"name {self.name!r} (the model clients call) may only use ASCII letters, digits, '_' "
                             "and '-'")

    @classmethod
    def for_device(cls, device: str, **given: object) -> ServingOptions:
        """Options for `device`: the torch flavour's GPU-sized batching on "cuda" (CUDA_DEFAULTS) for every field
        not `given` (a queue bound or timeout given brings the queue policy back); "cpu" keeps the class defaults."""
        defaults = dict(CUDA_DEFAULTS) if device == "cuda" else {}
        if any(key in given for key in QUEUE_POLICY_FIELDS):
            defaults.pop("queue_policy", None)
        return cls(**{**defaults, "device": device, **given})

    def step(self, role: str) -> str:
        return f"{self.name}_{role}"
