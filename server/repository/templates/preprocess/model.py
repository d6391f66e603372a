"""Triton Python-backend model written by `hub-vit repository`: encoded images -> `pixel_values`.

Input `image` (TYPE_STRING, one encoded JPEG/PNG/WebP per row) -> output `pixel_values` (FP32, (B, 3, H, W)).
The transform comes from the model's pretrained config, rendered into this model's config.pbtxt parameters.
A bad image fails only its own request, with a client error (INVALID_ARG -> HTTP 400) that names the problem.
"""

from __future__ import annotations

import json

import triton_python_backend_utils as pb_utils
from imageprep import Preprocess  # these three: copied beside this file by hub-vit repository
from stub_gc import freeze_loaded
from triton_errors import request_error


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.preprocess = Preprocess.from_params(params)  # built once per instance, reused for every request
        freeze_loaded()  # the loaded modules are out of the collector's full walks (stub_gc.py)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:  # the dynamic batcher hands us several requests at once
            images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
            try:
                pixels = self.preprocess.batch(images)  # (B, 3, H, W)
            except Exception as err:  # a bad image, or e.g. a MemoryError: this request fails, not its batch
                responses.append(pb_utils.InferenceResponse(error=request_error(err)))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("pixel_values", pixels)]))
        return responses
