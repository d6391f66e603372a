"""Triton Python-backend model written by `hub-vit repository`: encoded images -> `pixel_values`.

Input `image` (TYPE_STRING, one encoded JPEG/PNG/WebP per row) -> output `pixel_values` (FP32, (B, 3, H, W)).
The transform comes from the model's pretrained config, rendered into this model's config.pbtxt parameters.
A bad image fails only its own request, with a client error (INVALID_ARG -> HTTP 400) that names the problem.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from imageprep import BadImageError, Preprocess


def client_error(message: str) -> pb_utils.TritonError:
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.preprocess = Preprocess(  # built once per instance, reused for every request
            crop_size=tuple(json.loads(params["crop_size"])),
            scale_size=tuple(json.loads(params["scale_size"])),
            interpolation=params["interpolation"],
            crop_mode=params["crop_mode"],
            mean=tuple(json.loads(params["mean"])),
            std=tuple(json.loads(params["std"])),
            max_pixels=int(params["max_pixels"]),
        )

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:  # the dynamic batcher hands us several requests at once
            images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().reshape(-1)  # (B,) bytes
            try:
                batch = [self._one(index, data) for index, data in enumerate(images)]
            except BadImageError as err:
                responses.append(pb_utils.InferenceResponse(error=client_error(str(err))))
                continue
            pixels = np.stack(batch)  # (B, 3, H, W)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("pixel_values", pixels)]))
        return responses

    def _one(self, index: int, data: object) -> np.ndarray:
        if not isinstance(data, bytes):
            data = bytes(data)
        try:
            return self.preprocess(data)
        except BadImageError as err:
            raise BadImageError(f"image {index}: {err}") from None
