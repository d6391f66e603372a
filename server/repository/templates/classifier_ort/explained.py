"""The CPU classifier's explained requests (copied beside its model.py when the repository serves rollout): those
whose parameters ask for `explain` run the attention graph and are answered with the labels and the rollout map.

Requests that do not ask are left to model.py's plain path untouched, so they pay only for reading their parameters.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from served_rollout import ExplainSettings, pixels_and_boxes, rollout_maps, split_explained
from stub_gc import freeze_loaded
from topk import top_k
from triton_errors import client_error, request_error


class ExplainedRequests:
    """A second session that writes logits and attentions (B, depth, heads, N, N)[, pool_attention], built once per
    instance: `session` when given (the served OpenVINO variant with its softmax outputs), else ORT on the fp32
    attention graph; and the rollout settings the repository recorded in config.pbtxt."""

    def __init__(self, graph: Path, options: ort.SessionOptions, params: dict[str, str], preprocess: Any,
                 labels: np.ndarray, k: int, domain: Any, session: Any = None) -> None:
        self.session = session or ort.InferenceSession(str(graph), sess_options=options,
                                                       providers=["CPUExecutionProvider"])
        self.torch_loaded = False  # torch is imported by the first explained request (served_rollout.py)
        self.outputs = [output.name for output in self.session.get_outputs()]
        self.grid = tuple(json.loads(params["rollout_grid"]))
        self.readout, self.prefix = params["rollout_readout"], int(params["rollout_prefix_tokens"])
        self.preprocess, self.labels, self.k = preprocess, labels, k
        self.domain = domain  # domain_outputs.DomainOutputs: the answers' `domain` and `domain_score`

    def take(self, requests: list, responses: list, turn: Callable[[], AbstractContextManager]) -> list:
        """Answer (in `responses`) the requests that ask for an explanation, or whose explanation parameters are
        bad; returns `requests` with those replaced by None, for the plain path."""
        asked: list[tuple[int, np.ndarray, np.ndarray, ExplainSettings]] = []
        wanted, rest = split_explained(requests, responses, lambda message: pb_utils.InferenceResponse(
            error=client_error(message)))
        for place, request, settings in wanted:
            try:
                images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
                asked.append((place, *pixels_and_boxes(self.preprocess, images), settings))
            except Exception as err:  # a bad image fails its own request only
                responses[place] = pb_utils.InferenceResponse(error=request_error(err))
        if asked:
            self._answer(asked, responses, turn)
        return rest

    def _answer(self, asked: list, responses: list, turn: Callable[[], AbstractContextManager]) -> None:
        if not self.torch_loaded:
            import torch

            import hub_vit.explain.rollout  # noqa: F401 - the rollout's modules, loaded before the freeze below

            # The rollout's torch ops are small (depth x (B, N, N) elementwise and vector-matrix products); with
            # torch's default pool (one thread per core) they fight ORT's spinning threads for the same cores and ran
            # ~5x slower under load. One thread keeps them off ORT's cores' backs; ORT does the heavy work.
            torch.set_num_threads(1)
            freeze_loaded()  # torch's objects out of the collector's full walks, as what the step loaded (stub_gc.py)
            self.torch_loaded = True
        batch = np.concatenate([pixels for _, pixels, _, _ in asked])  # (N, 3, H, W)
        with turn():
            found = dict(zip(self.outputs, self.session.run(None, {"pixel_values": batch}), strict=True))
        logits = found["logits"].astype(np.float32, copy=False)  # (N, C)
        scores, ids = top_k(logits, self.k)
        start = 0
        for place, pixels, boxes, settings in asked:
            part = slice(start, start + len(pixels))
            start += len(pixels)
            probe, means = found.get("pool_attention"), found.get("token_means")
            maps = rollout_maps(found["attentions"][part], self.grid, self.readout, self.prefix, settings,
                                None if probe is None else probe[part])
            responses[place] = pb_utils.InferenceResponse([
                pb_utils.Tensor("logits", logits[part]),
                pb_utils.Tensor("scores", scores[part]),
                pb_utils.Tensor("class_ids", ids[part]),
                pb_utils.Tensor("labels", self.labels[ids[part]]),
                pb_utils.Tensor("rollout", maps),
                pb_utils.Tensor("rollout_box", boxes),
                *self.domain.tensors(None if means is None else means[part], len(pixels)),
            ])
