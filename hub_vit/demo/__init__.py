"""hub_vit.demo: the Gradio attention-rollout demo (`hub-vit demo`, `python -m hub_vit.demo`).

`models` lists and caches the models (no gradio import), `backends` takes labels from the in-process model or a
running Triton server, `app` builds and launches the page (imports gradio, the `demo` extra).
"""
