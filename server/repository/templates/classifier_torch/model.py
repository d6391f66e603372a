"""Triton Python-backend model written by `hub-vit repository --flavour torch`: the torch flavour's classifier, the one
step of the ensemble clients call (the CPU flavour's inputs and outputs, the model run in PyTorch).

Input `image` (TYPE_STRING, one encoded JPEG/PNG/WebP per row), decoded and transformed by imageprep (the CPU
flavour's code: EXIF, bomb guard, the model's own resize/crop/normalise) on a thread pool -> the hub-vit model from
the model folder beside this file (`model/`: config.json + model.safetensors, the weights every path loads) ->
`logits` (B, C) float32, `scores` (B, K) softmax probabilities, `class_ids` (B, K) and `labels` (B, K), best first.
All requests of one dynamic batch run as one forward pass. A bad image fails only its own request, with a client
error (INVALID_ARG -> HTTP 400) naming it by its index in the request.

device "cuda": the instance's GPU (KIND_GPU), bf16 autocast (fp16 where the GPU has no bf16), batches copied from
pinned host memory, and one CUDA graph per batch bucket (every bucket captured and run in `initialize`, so Triton
reports ready only once every shape has run). device "cpu": float32, eager; the tests serve it on any machine.
Every answer also holds `domain` (B, 1) and `domain_score` (B, 1), the out-of-domain verdict and score
(domain_outputs.py); where the repository serves a calibrated score, the model carries the token means it reads
(hub_vit.server.repository.torch_domain).
A config with `rollout_grid` also serves attention rollout: a request with parameter `explain` (served_rollout.py)
runs an eager pass that returns the attentions and gets `rollout` (B, H', W') and `rollout_box` (B, 4) too; the
others run exactly as without it.
Needs hub_vit and torch in the server's Python environment (where `hub-vit serve` runs).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from domain_outputs import DomainOutputs  # these four: copied beside this file by hub-vit repository
from imageprep import BadImageError, Preprocess
from topk import top_k
from triton_errors import client_error, request_error


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _share(setting: str, config: dict) -> int:
    """'0': this process's cores divided among the model's instances (each decodes while another computes); else a
    count."""
    if int(setting) > 0:
        return int(setting)
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    return max(1, _cores() // instances)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.preprocess = Preprocess.from_params(params)
        threads = _share(params.get("decode_threads", "0"), config)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode")
        if params["device"] == "cuda":
            device = torch.device("cuda", int(args.get("model_instance_device_id") or 0))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
            torch.set_num_threads(threads)  # the instances share the cores, as the CPU flavour's ORT sessions do
        from hub_vit.folder import load_model_folder  # the one loader of model folders (imports torch and timm)
        from hub_vit.server.repository.torch_runner import Runner  # the one GPU path; bench/gpu_check.py times the same

        model, _ = load_model_folder(version_dir / params["model_dir"])
        self.domain = DomainOutputs(version_dir, params)
        if self.domain.statistics is not None:  # the out-of-domain score's features ride with the logits
            from hub_vit.server.repository.torch_domain import LogitsAndTokenMeans

            model = LogitsAndTokenMeans(model)
        self.runner = Runner(model, device, self.preprocess.crop_size, tuple(json.loads(params["buckets"])),
                             graphs=params.get("cuda_graphs", "1") == "1",
                             compile_model=params.get("torch_compile", "0") == "1")
        self.k = int(params["top_k"])
        labels = (version_dir / params["labels_file"]).read_text(encoding="utf-8").splitlines()
        self.labels = np.array([label.encode("utf-8") for label in labels], dtype=np.object_)
        self.rollout = None  # (grid, readout, prefix tokens) when the repository serves rollout
        if "rollout_grid" in params:
            self.rollout = (tuple(json.loads(params["rollout_grid"])), params["rollout_readout"],
                            int(params["rollout_prefix_tokens"]))

    def _decode(self, data: object) -> np.ndarray | Exception:
        try:
            return self.preprocess(data if isinstance(data, bytes) else bytes(data))  # (3, H, W)
        except Exception as err:  # a bad image, or e.g. a MemoryError: its request fails, not the batch
            return err

    def _decode_all(self, requests: list) -> tuple[list, list[tuple[int, np.ndarray]]]:
        """Every image of every request decoded on the pool at once -> (responses with the failed requests' errors,
        [(place, (B, 3, H, W))] for the others). A request's first bad image names it, as Preprocess.batch does."""
        rows = []  # (place in `requests`, index in the request, encoded bytes)
        responses: list = [None] * len(requests)
        for place, request in enumerate(requests):
            if request is None:  # answered by the explained path
                continue
            images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().reshape(-1)
            if images.size == 0:
                empty = BadImageError("the request holds no image; send at least one encoded JPEG, PNG or WebP")
                responses[place] = pb_utils.InferenceResponse(error=request_error(empty))
            rows.extend((place, index, data) for index, data in enumerate(images))
        decoded: dict[int, list[np.ndarray]] = {}
        for (place, index, _), result in zip(rows, self.pool.map(self._decode, [r[2] for r in rows]), strict=True):
            if responses[place] is not None:
                continue
            if isinstance(result, Exception):
                err = result.of_image(index) if isinstance(result, BadImageError) else result
                responses[place] = pb_utils.InferenceResponse(error=request_error(err))
                decoded.pop(place, None)
                continue
            decoded.setdefault(place, []).append(result)
        return responses, [(place, np.stack(arrays)) for place, arrays in decoded.items()]

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
                logits, attentions, probe = self.runner.with_attentions(pixels)
            except Exception as err:  # a bad image fails its own request only
                responses[place] = pb_utils.InferenceResponse(error=request_error(err))
                continue
            maps = rollout_maps(attentions, *self.rollout, settings, probe)  # (B, H', W')
            responses[place] = self._answer(logits, [pb_utils.Tensor("rollout", maps),
                                                     pb_utils.Tensor("rollout_box", boxes)])
        return responses, rest

    def _answer(self, logits: np.ndarray, extra: list | None = None) -> object:
        logits, domain = self.domain.split(logits, len(self.labels))  # (N, C) and the domain outputs
        scores, ids = top_k(logits, self.k)
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("logits", logits),
            pb_utils.Tensor("scores", scores),
            pb_utils.Tensor("class_ids", ids),
            pb_utils.Tensor("labels", self.labels[ids]),
            *domain,
            *(extra or []),
        ])

    def execute(self, requests: list) -> list:
        explained: list = [None] * len(requests)
        if self.rollout is not None:  # explained requests are answered apart; the rest go on as below
            explained, requests = self._take_explained(requests)
        responses, ok = self._decode_all(requests)
        responses = [mine if mine is not None else theirs for mine, theirs in zip(responses, explained, strict=True)]
        if not ok:
            return responses
        batch = np.concatenate([pixels for _, pixels in ok])  # (N, 3, H, W); N <= max_batch_size
        logits = self.runner(batch).astype(np.float32, copy=False)  # (N, C)
        start = 0
        for place, pixels in ok:
            responses[place] = self._answer(logits[start:start + len(pixels)])
            start += len(pixels)
        return responses

    def finalize(self) -> None:
        self.pool.shutdown(wait=False)
