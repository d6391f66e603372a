"""Triton Python-backend model written by `hub-vit repository --flavour torch`: the torch flavour's classifier, the one
step of the ensemble clients call (the CPU flavour's inputs and outputs, the model run in PyTorch).

Input `image` (TYPE_STRING, one encoded JPEG/PNG/WebP per row) -> the images of every request of one dynamic batch
prepared together on the model's device by `hub_vit.server.repository.torch_images` (imageprep's header checks on the
CPU first; JPEGs decoded on the device in one call, others by imageprep on a thread pool; resize, crop and normalise
on the device) -> one pass of `torch_runner.Runner` over them (the hub-vit model from the model folder beside this
file, `model/`: config.json + model.safetensors, the weights every path loads; softmax and top-k on the device) ->
`logits` (B, C) float32, `scores` (B, K), `class_ids` (B, K) and `labels` (B, K), best first. A bad image fails only
its own request, with a client error (INVALID_ARG -> HTTP 400) naming it by its index in the request, in imageprep's
words.

device "cuda": the instance's GPU (KIND_GPU), nvJPEG, weights in bf16 (fp16 where the GPU has no bf16), one CUDA graph
per batch bucket (every bucket captured and run in `initialize`, so Triton reports ready only once every shape has
run). device "cpu": the same code on the CPU (libjpeg-turbo through torchvision, float32, eager); the tests serve it
on any machine.
A config with `rollout_grid` also serves attention rollout: a request with parameter `explain` (served_rollout.py)
runs an eager pass on imageprep's CPU pixels (those of `hub-vit rollout`) that returns the attentions and gets
`rollout` (B, H', W') and `rollout_box` (B, 4) too; the others run exactly as without it.
With $HUB_VIT_PHASE_LOG set in the server's environment, each execution appends one JSON line there: its phases'
durations (bench/bench_serve.py --phases reads them).
Every answer also holds `domain` (B, 1) and `domain_score` (B, 1), the out-of-domain verdict and score
(domain_outputs.py); where the repository serves a calibrated score, the model carries the token means it reads
(hub_vit.server.repository.torch_domain), which the runner returns beside the logits.
Needs hub_vit, torch and torchvision in the server's Python environment (where `hub-vit serve` runs).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import imageprep  # these seven: copied beside this file by hub-vit repository
import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from cgroup_limits import usable_cores
from domain_outputs import DomainOutputs
from imageprep import BadImageError, Preprocess
from stub_gc import CollectionClock, freeze_loaded
from topk import top_k
from triton_errors import client_error, request_error

PHASE_LOG = "HUB_VIT_PHASE_LOG"


def _share(setting: str, config: dict) -> int:
    """'0': this process's cores divided among the model's instances (each decodes while another computes); else a
    count."""
    if int(setting) > 0:
        return int(setting)
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    return max(1, usable_cores() // instances)


def runner_settings(params: dict[str, str], args: dict) -> dict:
    """The Runner's settings from the config's parameters and Triton's `initialize` arguments (no device touched)."""
    cuda = params["device"] == "cuda"
    return {"device": torch.device("cuda", int(args.get("model_instance_device_id") or 0)) if cuda
            else torch.device("cpu"),
            "buckets": tuple(json.loads(params["buckets"])), "top_k": int(params["top_k"]),
            "graphs": cuda and params.get("cuda_graphs", "1") == "1",
            "compile_model": cuda and params.get("torch_compile", "0") == "1"}


class Phases:
    """Monotonic timestamps of one execution's phases, appended as one JSON line to $HUB_VIT_PHASE_LOG (when set):
    {"pid", "requests", "images", "start_ns", "<phase>_ms": ... in the order marked, "gc_ms"}; `gc_ms`: the time the
    process spent in garbage collections during the execution (every thread waits for them)."""

    def __init__(self) -> None:
        path = os.environ.get(PHASE_LOG)
        self.file = open(path, "a", buffering=1, encoding="utf-8") if path else None  # noqa: SIM115 - kept open
        self.collections, self.gc_at_start = CollectionClock(), 0
        if self.file is not None:
            self.collections.start()

    def start(self) -> list[tuple[str, int]] | None:
        self.gc_at_start = self.collections.ns
        return [("start", time.perf_counter_ns())] if self.file else None

    @staticmethod
    def mark(marks: list[tuple[str, int]] | None, name: str) -> None:
        if marks is not None:
            marks.append((name, time.perf_counter_ns()))

    def write(self, marks: list[tuple[str, int]] | None, requests: int, images: int) -> None:
        if marks is None or self.file is None:
            return
        line = {"pid": os.getpid(), "requests": requests, "images": images, "start_ns": marks[0][1]}
        line |= {f"{name}_ms": (now - before) / 1e6
                 for (_, before), (name, now) in zip(marks, marks[1:], strict=False)}
        line["gc_ms"] = (self.collections.ns - self.gc_at_start) / 1e6
        self.file.write(json.dumps(line) + "\n")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.preprocess = Preprocess.from_params(params)
        threads = _share(params.get("decode_threads", "0"), config)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode")
        settings = runner_settings(params, args)
        if settings["device"].type == "cuda":
            torch.cuda.set_device(settings["device"])
        else:
            torch.set_num_threads(threads)  # the instances share the cores, as the CPU flavour's ORT sessions do
        from hub_vit.folder import load_model_folder  # the one loader of model folders (imports torch and timm)
        from hub_vit.server.repository.torch_images import ImagePath  # the data path; bench/gpu_check.py times it
        from hub_vit.server.repository.torch_runner import Runner  # the one GPU path; bench/gpu_check.py times it

        model, _ = load_model_folder(version_dir / params["model_dir"])
        labels = (version_dir / params["labels_file"]).read_text(encoding="utf-8").splitlines()
        self.labels = np.array([label.encode("utf-8") for label in labels], dtype=np.object_)
        self.domain = DomainOutputs(version_dir, params)
        if self.domain.statistics is not None:  # the out-of-domain score's features ride with the logits
            from hub_vit.server.repository.torch_domain import LogitsAndTokenMeans

            model = LogitsAndTokenMeans(model)
        self.images = ImagePath(imageprep, self.preprocess, settings["device"], self.pool)
        self.runner = Runner(model, crop=self.preprocess.crop_size, classes=len(labels), **settings)
        self.k = settings["top_k"]
        self.rollout = None  # (grid, readout, prefix tokens) when the repository serves rollout
        if "rollout_grid" in params:
            self.rollout = (tuple(json.loads(params["rollout_grid"])), params["rollout_readout"],
                            int(params["rollout_prefix_tokens"]))
        self.phases = Phases()
        freeze_loaded()  # last: everything loaded above is out of the collector's full walks (stub_gc.py)

    def _take_explained(self, requests: list) -> tuple[list, list]:
        """Answer the requests that ask for an explanation (or whose explanation parameters are bad); returns their
        responses and `requests` with those replaced by None, for the plain path."""
        from served_rollout import pixels_and_boxes, rollout_maps, split_explained  # imports hub_vit.explain

        responses: list = [None] * len(requests)
        asked, rest = split_explained(requests, responses, lambda message: pb_utils.InferenceResponse(
            error=client_error(message)))
        for place, request, settings in asked:
            try:
                images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
                pixels, boxes = pixels_and_boxes(self.preprocess, images)  # (B, 3, H, W), (B, 4)
                outputs, attentions, probe = self.runner.with_attentions(pixels)
            except Exception as err:  # a bad image fails its own request only
                responses[place] = pb_utils.InferenceResponse(error=request_error(err))
                continue
            maps = rollout_maps(attentions, *self.rollout, settings, probe)  # (B, H', W')
            logits, domain = self.domain.split(outputs, len(self.labels))  # (B, C) and the domain outputs
            scores, ids = top_k(logits, self.k)
            responses[place] = self._answer(logits, scores, ids, [*domain, pb_utils.Tensor("rollout", maps),
                                                                  pb_utils.Tensor("rollout_box", boxes)])
        return responses, rest

    def _answer(self, logits: np.ndarray, scores: np.ndarray, ids: np.ndarray, extra: list | None = None) -> object:
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("logits", logits),
            pb_utils.Tensor("scores", scores),
            pb_utils.Tensor("class_ids", ids),
            pb_utils.Tensor("labels", self.labels[ids]),
            *(extra or []),
        ])

    def _refuse(self, responses: list, place: int, index: int, err: Exception) -> None:
        """Request `place` fails at its image `index` (its first bad image names it)."""
        err = err.of_image(index) if isinstance(err, BadImageError) else err
        responses[place] = pb_utils.InferenceResponse(error=request_error(err))

    def _classify(self, requests: list, marks: list | None = None) -> list:
        """Every image of every plain request decoded, transformed and classified together -> responses (None where a
        request was answered elsewhere). `marks`: this execution's phase marks (Phases), when they are logged."""
        responses: list = [None] * len(requests)
        rows = []  # (place in `requests`, index in the request, encoded bytes), in request order
        for place, request in enumerate(requests):
            if request is None:  # answered by the explained path
                continue
            images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().reshape(-1)
            if images.size == 0:
                responses[place] = pb_utils.InferenceResponse(error=request_error(BadImageError.empty_request()))
            rows.extend((place, index, data if isinstance(data, bytes) else bytes(data))
                        for index, data in enumerate(images))
        decoded = self.images.decode([data for _, _, data in rows])
        self.phases.mark(marks, "decode")
        for (place, index, _), item in zip(rows, decoded, strict=True):
            if isinstance(item, Exception) and responses[place] is None:  # rows run in index order: the first
                self._refuse(responses, place, index, item)               # refused image names its request
        kept = [row for row, (place, _, _) in enumerate(rows) if responses[place] is None]
        if not kept:
            return responses
        with torch.inference_mode():
            order = self.images.transform_into([decoded[row] for row in kept], self.runner.batch(len(kept)))
            self.phases.mark(marks, "transform")
            logits, scores, ids, features = self.runner.fetch(*self.runner.run(len(kept)))
        self.phases.mark(marks, "forward")
        placed: dict[int, list[tuple[int, int]]] = {}  # place -> [(index in the request, batch row)]
        for batch_row, row in enumerate(kept[k] for k in order):
            placed.setdefault(rows[row][0], []).append((rows[row][1], batch_row))
        for place, members in placed.items():
            at = [batch_row for _, batch_row in sorted(members)]  # the request's images in its order
            responses[place] = self._answer(logits[at], scores[at], ids[at],
                                            self.domain.from_features(features[at], len(at)))
        self.phases.mark(marks, "answer")
        self.phases.write(marks, sum(r is not None for r in requests), len(rows))
        return responses

    def execute(self, requests: list) -> list:
        marks = self.phases.start()
        explained: list = [None] * len(requests)
        if self.rollout is not None:  # explained requests are answered apart; the rest go on as below
            explained, requests = self._take_explained(requests)
        self.phases.mark(marks, "explained")
        responses = self._classify(requests, marks)
        return [mine if mine is not None else theirs for mine, theirs in zip(responses, explained, strict=True)]

    def finalize(self) -> None:
        self.pool.shutdown(wait=False)
