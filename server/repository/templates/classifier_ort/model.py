"""Triton Python-backend model written by `hub-vit repository`: the CPU flavour's classifier, the one step of the
ensemble clients call.

Input `image` (TYPE_STRING, one encoded JPEG/PNG/WebP per row), decoded and transformed here as the model's
pretrained config says (imageprep, parameters in config.pbtxt) -> `logits` (B, C), `scores` (B, K) softmax
probabilities, `class_ids` (B, K) and `labels` (B, K) strings, best first. All requests of one dynamic batch run as
one ORT call. A bad image fails only its own request, with a client error (INVALID_ARG -> HTTP 400) naming it.
A config whose input is `pixel_values` (FP32, (B, 3, H, W)) skips the decoding (the tests serve the GPU flavour's
ensemble with this as its classifier).
Where `hub-vit repository` chose an OpenVINO variant for this host (server/repository/cpu_variant.py), its files sit
beside the ONNX graph as `<onnx stem>.openvino.xml` / `.bin` / `.json` and are run instead, by the `OpenVINOSession`
that verified and timed them (openvino_runtime.py, copied from hub_vit); the ONNX graph stays the lock file of
`take_turns`.
Every answer also holds `domain` (B, 1) and `domain_score` (B, 1), the out-of-domain verdict and score
(domain_outputs.py), from the graph's `token_means` output where the repository serves a calibrated score.
A config with `attentions_file` also serves attention rollout: a request with parameter `explain` (served_rollout.py)
gets `rollout` (B, H', W') and `rollout_box` (B, 4) too, from a second session: the served OpenVINO variant's own
attention probabilities where one is served (its precision), else ORT on the fp32 attention graph; the others run
the plain graph exactly as without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# ONNX Runtime 1.29+ on Linux sends usage telemetry to Microsoft and keeps a device id in ~/.cache from its import on,
# unless this is set first: a served model does not phone home, in whichever Triton runs it (a value the deployment
# set is kept)
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import onnxruntime as ort  # noqa: E402 (these after the line above)
import triton_python_backend_utils as pb_utils  # noqa: E402
from cgroup_limits import usable_cores  # noqa: E402 (these seven: copied beside this file by hub-vit repository)
from domain_outputs import DomainOutputs  # noqa: E402
from imageprep import Preprocess  # noqa: E402
from openvino_runtime import OpenVINOSession, served_model  # noqa: E402 (imports openvino only for a session)
from stub_gc import freeze_loaded  # noqa: E402
from topk import top_k  # noqa: E402
from triton_errors import request_error  # noqa: E402


def _threads(setting: str, config: dict) -> int:
    """'all': every core this process may keep busy; 'share': those cores divided among this model's instances; else
    a count. Cores come from the CPU affinity mask capped by the CPU quota (`cgroup_limits`), not `os.cpu_count()`, so a
    server confined to some cores (a cpuset, `taskset`) or to a share of them (`docker run --cpus`, a Kubernetes CPU
    limit) does not start more ORT threads than it may run."""
    cores = usable_cores()
    if setting == "all":
        return cores
    if setting == "share":
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        return max(1, cores // instances)
    return max(1, int(setting))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.decodes = config["input"][0]["name"] == "image"
        self.preprocess = Preprocess.from_params(params) if self.decodes else None  # built once per instance
        options = ort.SessionOptions()
        options.intra_op_num_threads = _threads(params.get("intra_op_threads", "all"), config)
        options.inter_op_num_threads = 1
        # Spinning between ops saves wake-up latency for a compute-bound model, but steals the cores that other
        # instances' decoding and Triton's threads need; the repository decides.
        options.add_session_config_entry("session.intra_op.allow_spinning", params.get("allow_spinning", "0"))
        onnx_path = version_dir / params["onnx_file"]
        self.turn_fd: int | None = None
        if params.get("take_turns", "0") == "1":
            # Spinning instances take turns on the cores: an exclusive flock on the model file (shared by every
            # instance of this model on the host) around each run, and threads that stop spinning when it ends.
            options.add_session_config_entry("session.force_spinning_stop", "1")
            self.turn_fd = os.open(onnx_path, os.O_RDONLY)
        if served_model(onnx_path).exists():  # one session per instance, built once
            self.session = OpenVINOSession(served_model(onnx_path), options.intra_op_num_threads)
        else:
            self.session = ort.InferenceSession(str(onnx_path), sess_options=options,
                                                providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.output_names = [output.name for output in self.session.get_outputs()]  # logits[, token_means]
        self.domain = DomainOutputs(version_dir, params)
        self.k = int(params["top_k"])
        labels = (version_dir / params["labels_file"]).read_text(encoding="utf-8").splitlines()
        self.labels = np.array([label.encode("utf-8") for label in labels], dtype=np.object_)
        self.explainer = None
        if "attentions_file" in params:
            from explained import ExplainedRequests  # torch: imported by the first explained request

            # an OpenVINO variant explains at its own precision, from its own softmax outputs (one run); an ONNX
            # Runtime graph from the fp32 attention graph (docs/serving.md, "Explanations from the server")
            own = OpenVINOSession(served_model(onnx_path), options.intra_op_num_threads, attentions=True) \
                if served_model(onnx_path).exists() else None
            self.explainer = ExplainedRequests(version_dir / params["attentions_file"], options, params,
                                               self.preprocess, self.labels, self.k, self.domain, session=own)
        freeze_loaded()  # last: everything loaded above is out of the collector's full walks (stub_gc.py)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        if self.turn_fd is None:
            yield
            return
        fcntl.flock(self.turn_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.turn_fd, fcntl.LOCK_UN)

    def _pixels(self, request: object) -> np.ndarray:
        """(B, 3, H, W) float32 for one request; BadImageError names the first image that does not decode."""
        if self.decodes:
            return self.preprocess.batch(pb_utils.get_input_tensor_by_name(request, "image").as_numpy())
        return pb_utils.get_input_tensor_by_name(request, "pixel_values").as_numpy()

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        if self.explainer is not None:  # explained requests are answered apart; the rest go on as below
            requests = self.explainer.take(requests, responses, self._turn)
        arrays, owners = [], []  # the decoded requests and their places in `requests`
        for place, request in enumerate(requests):  # the dynamic batcher hands us several requests at once
            if request is None:  # answered by the explainer
                continue
            try:
                arrays.append(self._pixels(request))
                owners.append(place)
            except Exception as err:  # a bad image, or e.g. a MemoryError: this request fails, not its batch
                responses[place] = pb_utils.InferenceResponse(error=request_error(err))
        if not arrays:
            return responses
        batch = np.concatenate(arrays)  # (N, 3, H, W); built before taking the turn, so the lock covers ORT only
        with self._turn():
            found = dict(zip(self.output_names, self.session.run(None, {self.input_name: batch}), strict=True))
        logits = found["logits"].astype(np.float32, copy=False)  # (N, C)
        means = found.get("token_means")  # (N, depth, D) where the repository serves a calibrated domain score
        scores, ids = top_k(logits, self.k)
        start = 0
        for place, array in zip(owners, arrays, strict=True):
            part = slice(start, start + len(array))
            start += len(array)
            responses[place] = pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor("logits", logits[part]),
                    pb_utils.Tensor("scores", scores[part]),
                    pb_utils.Tensor("class_ids", ids[part]),
                    pb_utils.Tensor("labels", self.labels[ids[part]]),
                    *self.domain.tensors(None if means is None else means[part], len(array)),
                ]
            )
        return responses

    def finalize(self) -> None:
        if self.turn_fd is not None:
            os.close(self.turn_fd)
