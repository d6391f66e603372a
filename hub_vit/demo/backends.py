"""Where the demo's labels come from: the in-process model, or a running Triton server (`hub-vit serve`).

The rollout maps always come from the in-process model (Triton returns labels, not attention). The Triton backend is
optional: if `tritonclient` is missing or the server does not answer, the page says so and shows the in-process
labels instead of failing.
"""

from __future__ import annotations

from typing import Any

IN_PROCESS = "in-process"


class TritonLabels:
    """Top-k labels from the served classifier at `url` (`host:port`, HTTP), via `hub_vit.server.client`."""

    def __init__(self, url: str, model: str = "vit", timeout_s: float = 10.0) -> None:
        from hub_vit.server.client import server_address  # numpy only; tritonclient loads on first request

        server_address(url)  # ValueError naming the problem, before the page offers this backend
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self.choice = f"triton ({url})"

    def top_k(self, image: Any, k: int = 5) -> tuple[list[tuple[str, float]] | None, str]:
        """([(label, score)] or None, a status line). Never raises for an unreachable or broken server.
        One connection per request, closed at once: an idle keep-alive connection from the demo would hold the
        server's drain open for its whole exit timeout when `hub-vit serve --demo` is stopped."""
        try:
            from hub_vit.server.client import Classifier

            with Classifier(self.url, model=self.model, timeout_s=self.timeout_s) as client:
                prediction = client.classify([image])[0]
        except ImportError as exc:
            return None, f"Triton backend unavailable ({exc}); install hub-vit[serve]. Labels: in-process model."
        except Exception as exc:  # connection refused, timeout, server-side error: degrade, don't crash the page
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            return None, (f"Triton server at {self.url} not reachable or failed ({reason}); "
                          "labels shown from the in-process model.")
        pairs = list(zip(prediction.labels, prediction.scores, strict=False))[:k]
        return pairs, f"labels from **Triton** model {self.model!r} at {self.url}; maps from the in-process model"
