"""Triton Inference Server deployment of hub-vit classifiers (installed as `hub_vit.server`), in layers that point
down (pyproject.toml's import contracts; docs/architecture.md):

* `serving`: `hub-vit serve`'s run: a written repository served by the runtime behind the front.
* `runtime/` (the tritonserver process, its stubs' environment, supervision) | `front/` (the HTTP and gRPC gates).
* `client/` (HTTP/gRPC clients, load generator) | `repository/` (writing and reading model repositories).
* `protocol`: the structured facts these parts tell each other across processes (stdlib only, copied into every
  repository).

See docs/serving.md.
"""
