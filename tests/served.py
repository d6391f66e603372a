"""Serving a repository for a test: held-out digits as PNG requests, the real Triton's logits for them, and the fp32
PyTorch logits of the same requests to judge them against."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

if TYPE_CHECKING:
    from hub_vit.server.client.classifier import Classifier
    from hub_vit.server.runtime.launcher import TritonServer


def digit_pngs(count: int) -> list[bytes]:
    """The first `count` held-out digits (never trained on), PNG-encoded."""
    from hub_vit.train.digits import load_digits_split

    images, _ = load_digits_split("val")
    payloads = []
    for image in images[:count]:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        payloads.append(buffer.getvalue())
    return payloads


def unpaid_reason(variant: str) -> str | None:
    """Why `variant` does not pay off on this host (the units it is declared to need are missing), as a skip reason;
    None where it does. Its tests that hold it to its bounds run only where `all` and `auto` would build it."""
    from hub_vit.export import registry

    unpaid = registry.get(variant).unpaid()
    return f"{variant} does not pay off on this host: {'; '.join(unpaid)}" if unpaid else None


def start_server(repo: Path, *, exit_timeout_s: int = 20, timeout_s: float = 180) -> TritonServer:
    """The real Triton serving `repo` on free loopback ports, every model ready; stop it, or use it in a `with`."""
    from hub_vit.server.runtime.launcher import TritonServer, free_port

    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          exit_timeout_s=exit_timeout_s)
    return server.start(timeout_s=timeout_s)


def served_logits(repo: Path, payloads: list[bytes]) -> np.ndarray:
    """(N, C) logits the real Triton, serving `repo` over HTTP, answers for `payloads`."""
    from hub_vit.server.client.classifier import Classifier

    with start_server(repo) as server, Classifier(server.http_url) as client:
        return np.stack([p.logits for p in client.classify(payloads, with_logits=True)])


def fp32_logits(model: torch.nn.Module, pretrained_cfg: Mapping[str, Any], payloads: list[bytes]) -> np.ndarray:
    """(N, C) logits of `model` in PyTorch for `payloads`, through timm's eval transform for `pretrained_cfg`."""
    from timm.data import create_transform, resolve_data_config

    transform = create_transform(**resolve_data_config(pretrained_cfg=dict(pretrained_cfg)), is_training=False)
    batch = torch.stack([transform(Image.open(io.BytesIO(p)).convert("RGB")) for p in payloads])
    with torch.no_grad():
        return model(batch).numpy()


def quiet_statistics(client: Classifier, pause_s: float = 0.3) -> dict:
    """Statistics once two reads `pause_s` apart agree: nothing sent earlier is still being counted (Triton counts a
    request just after answering it, so an earlier test's last request on a server its module shares may otherwise
    land in what the caller measures next: 32 + 1 requests)."""
    import time

    latest = client.statistics()
    while True:
        time.sleep(pause_s)
        again = client.statistics()
        if again == latest:
            return latest
        latest = again


def classify_concurrently(grpc_url: str, payloads: list[bytes]) -> tuple[list[Any], int, int]:
    """Each payload as a request of its own, all sent at once over one gRPC connection: each request's answer (a list
    of one prediction) and the requests and executions the classifier counted meanwhile (its statistics, settled)."""
    import asyncio

    from hub_vit.server.client.classifier import AsyncClassifier, Classifier
    from hub_vit.server.client.loadtest import settled_statistics

    with Classifier(grpc_url, protocol="grpc") as reader:
        before = quiet_statistics(reader)

    async def fire() -> tuple[list[Any], dict]:
        async with AsyncClassifier(grpc_url, protocol="grpc") as client:
            results = await asyncio.gather(*(client.classify(p) for p in payloads))
            return results, await settled_statistics(client, before, len(payloads))

    results, after = asyncio.run(fire())
    requests, executions = (after["vit_classifier"][key] - before["vit_classifier"][key]
                            for key in ("inference_count", "execution_count"))
    return results, requests, executions
