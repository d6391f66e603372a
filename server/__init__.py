"""Triton Inference Server deployment of hub-vit classifiers (installed as `hub_vit.server`).

* `source`: what to serve (default model, registered name, model folder, exported ONNX / engine) -> metadata.
* `options`: `ServingOptions`, the repository's knobs and defaults (light: the CLI reads it when it starts).
* `config`: `config.pbtxt` rendering (Triton's ModelConfig protobuf) from that metadata and those options.
* `repository`: writes the model repository, an ensemble clients call (CPU: one Python step that decodes, runs ONNX
  Runtime and ranks; GPU: Python preprocessing -> ORT / TensorRT classifier -> Python top-k).
* `launcher`: runs the real `tritonserver` (nvidia-pytriton's binary, or a system install) on 127.0.0.1.
* `client`: sync/async HTTP/gRPC clients; `loadtest`: closed-loop load with latency percentiles and batching stats.
* `templates/`: the Python-backend `model.py` files copied into generated repositories.

See docs/serving.md.
"""
