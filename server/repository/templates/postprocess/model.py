"""Triton Python-backend model written by `hub-vit repository` (GPU flavour): logits -> top-k labels and scores.

Input `logits` (FP32, (B, C)) from the ONNX Runtime / TensorRT classifier -> `scores` (B, K) softmax
probabilities, `class_ids` (B, K) and `labels` (B, K) strings, best first; `domain` and `domain_score` say
`unknown` and -1 (domain_outputs.py): the logits alone do not tell whether an image is of the kind the model knows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from domain_outputs import DomainOutputs  # these three: copied beside this file by hub-vit repository
from stub_gc import freeze_loaded
from topk import top_k


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.k = int(params["top_k"])
        labels = (version_dir / params["labels_file"]).read_text(encoding="utf-8").splitlines()
        self.labels = np.array([label.encode("utf-8") for label in labels], dtype=np.object_)
        self.domain = DomainOutputs(version_dir, params)  # no statistics here: every answer says unknown
        freeze_loaded()  # the loaded modules are out of the collector's full walks (stub_gc.py)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy().astype(np.float32)  # (B, C)
            scores, ids = top_k(logits, self.k)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("scores", scores),
                        pb_utils.Tensor("class_ids", ids),
                        pb_utils.Tensor("labels", self.labels[ids]),
                        *self.domain.tensors(None, len(logits)),
                    ]
                )
            )
        return responses
