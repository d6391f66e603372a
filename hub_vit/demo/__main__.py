"""`python -m hub_vit.demo [--port N] [--model-folder DIR ...] [--triton-url HOST:PORT]`: same as `hub-vit demo`."""

from __future__ import annotations

import typer

from hub_vit.cli.explain import demo

if __name__ == "__main__":
    typer.run(demo)
