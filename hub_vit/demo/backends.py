"""Where the demo's labels and map come from: the in-process model, or a running Triton server (`hub-vit serve`).

From Triton, the page shows the server's labels and the server's attention-rollout map (the served model's own,
requested with `explain`), and which model and version answered; the per-block view and the class-specific map stay
in-process (the server returns the full rollout only). A server whose model serves no map (an .onnx file, the GPU
flavour) still gives its labels, and the page says the map is the in-process model's. The Triton backend is
optional: if `tritonclient` is missing or the server does not answer, the page says so and shows the in-process
labels instead of failing. A server that refuses the image (HTTP 400) says why, in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hub_vit.host import install_extra

IN_PROCESS = "in-process"


def served_format(data: bytes) -> bool:
    """Whether the served preprocessing decodes `data` itself: JPEG, PNG or WebP, by the file's signature. Such an
    upload is sent as it is; anything else goes as a PNG of the decoded image (the demo reads the served formats
    only, `hub_vit.image_formats`, so that is an upload that changed since it was read)."""
    return data.startswith((b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


@dataclass(frozen=True)
class ServedAnswer:
    """One image's answer from the server: top-k `(label, score)`, the map (H', W') and the crop box it lies on
    (None when the served model has no rollout output), who answered, and the server's out-of-domain verdict and
    score (`hub_vit.server.protocol`)."""

    top: list[tuple[str, float]]
    rollout: np.ndarray | None
    box: tuple[float, float, float, float] | None
    answered_by: str  # "Triton model 'vit' v1 (simplevit_digits)"
    domain: str = "unknown"
    domain_score: float | None = None
    page_labels: bool = True  # every class of the top-k is named as the page's model names that class id


class TritonLabels:
    """Top-k labels from the served classifier at `url` (`host:port`, HTTP), via `hub_vit.server.client.classifier`.

    `served_key`: the demo's key of the model the server serves, when the demo has it in-process (`hub-vit serve
    --demo`); `served_name` says what the server serves when that is known at all. With either, the status line
    warns when the page's maps come from another model than the labels."""

    def __init__(self, url: str, model: str = "vit", timeout_s: float = 10.0, *, served_key: str | None = None,
                 served_name: str | None = None) -> None:
        from hub_vit.server.client.addresses import server_address  # numpy only; tritonclient loads on first request

        server_address(url, ("http",))  # ValueError naming the problem, before the page offers this backend
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self.served_key, self.served_name = served_key, served_name
        self.choice = f"triton ({url})"

    def mismatch(self, model_key: str) -> str | None:
        """A warning when the labels would come from another model than the maps (`model_key`), else None."""
        if self.served_key == model_key or (self.served_key is None and self.served_name is None):
            return None  # the same model, or nothing known about the server (`hub-vit demo --triton-url`)
        served = self.served_name or repr(self.served_key)
        return (f"the server serves {served}, the maps come from the in-process model {model_key!r}: these labels "
                "are not that model's")

    def top_k(self, image: Any, k: int = 5, source: str | Path | None = None,
              labels: list[str] | None = None) -> tuple[list[tuple[str, float]] | None, str]:
        """([(label, score)] or None, a status line). Never raises for an unreachable or broken server.

        `labels`: the page's model's distinct labels (`distinct_labels`), so a class both backends name alike gets
        the same key under both (see `served_labels`).

        `source`: the uploaded file; its own bytes are sent when the server decodes its format (no PNG re-encoding
        of a large photo), else the decoded `image`. One connection per request, closed at once: an idle keep-alive
        connection from the demo would hold the server's drain open for its whole exit timeout when
        `hub-vit serve --demo` is stopped."""
        payload = self._payload(image, source)
        try:
            from hub_vit.server.client.classifier import Classifier

            with Classifier(self.url, model=self.model, timeout_s=self.timeout_s) as client:
                prediction = client.classify([payload], queue_timeout_s=self._queue_timeout_s(client))[0]
        except Exception as exc:  # no tritonclient, connection refused, timeout, server error: degrade, don't crash
            return None, self._failure(exc)
        status = f"labels from **Triton** model {self.model!r} at {self.url}; maps from the in-process model"
        return _top_pairs(prediction, k, labels), status

    def _queue_timeout_s(self, client: Any) -> float | None:
        """The page's wait as the request's queue timeout, so that a request still queued when the page stops waiting
        is dropped by the server, not computed; None where the server applies none (no queue policy)."""
        return self.timeout_s if client.takes_queue_timeouts() else None

    def explain(self, image: Any, k: int = 5, source: str | Path | None = None, labels: list[str] | None = None, *,
                head_fusion: str = "mean", discard_ratio: float = 0.0) -> tuple[ServedAnswer | None, str]:
        """(the server's labels and map, a status line), or (None, why not) as `top_k`. A served model without a
        rollout output answers with its labels only (`rollout` None)."""
        payload = self._payload(image, source)
        try:
            from hub_vit.server.client.classifier import Classifier
            from hub_vit.server.client.errors import NoExplanation

            with Classifier(self.url, model=self.model, timeout_s=self.timeout_s) as client:
                timeout_s = self._queue_timeout_s(client)
                try:
                    prediction = client.classify([payload], queue_timeout_s=timeout_s, explain=True,
                                                 head_fusion=head_fusion, discard_ratio=discard_ratio)[0]
                except NoExplanation:  # its repository says so: the labels alone
                    prediction = client.classify([payload], queue_timeout_s=timeout_s)[0]
                served = client.served_model()
        except Exception as exc:
            return None, self._failure(exc)
        pairs = _top_pairs(prediction, k, labels)
        version = f" v{prediction.model_version}" if prediction.model_version else ""
        who = f"Triton model {prediction.model_name or self.model!r}{version}" + (f" ({served})" if served else "")
        answer = ServedAnswer(pairs, prediction.rollout, prediction.rollout_box, who, prediction.domain,
                              prediction.domain_score, labels is None or _named_alike(prediction, labels))
        return answer, f"labels from **Triton** ({who}) at {self.url}"

    @staticmethod
    def _payload(image: Any, source: str | Path | None) -> Any:
        """The upload's own bytes when the server decodes its format, else the decoded image (see `top_k`)."""
        if source is None:
            return image
        try:
            data = Path(source).read_bytes()
        except OSError:  # the upload left Gradio's cache meanwhile (its hourly cleanup): send the decoded image
            return image
        return data if served_format(data) else image

    def _failure(self, exc: Exception) -> str:
        """The status line for a request that got no answer: tritonclient missing, the image refused (HTTP 400: the
        server is fine and says why, in full), no room for it in the server's /dev/shm, or the server unreachable or
        failing (the first line of why)."""
        if isinstance(exc, ImportError):
            return f"Triton backend unavailable ({exc}); {install_extra('serve')}. Labels: in-process model."
        from hub_vit.server.client.errors import out_of_shared_memory, refused_image

        refused = refused_image(exc)
        if refused is not None:
            return (f"Triton server at {self.url} refused the image: {refused.reason}; labels shown from the "
                    "in-process model.")
        if out_of_shared_memory(exc):  # Triton's sentence names a pool key and is cut before its hint
            return (f"Triton server at {self.url} had no shared memory (/dev/shm) left for this image: restart it "
                    "with more (in a container: docker run --shm-size=1g); labels shown from the in-process model.")
        reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        return (f"Triton server at {self.url} not reachable or failed ({reason}); labels shown from the in-process "
                "model.")


def _named_alike(prediction: Any, page_labels: list[str]) -> bool:
    """Whether the page's model names each served class id as the server does: else the server serves another
    model, whatever serve was told."""
    return all(_page_names(page_labels, name, index)
               for name, index in zip(prediction.labels, prediction.class_ids, strict=False))


def _page_names(page_labels: list[str], name: str, index: int) -> bool:
    """Whether the page's model names class `index` as the server does (`crane` as `crane (134)` or plain `cat`)."""
    return 0 <= index < len(page_labels) and page_labels[index] in (name, f"{name} ({index})")


def _top_pairs(prediction: Any, k: int, labels: list[str] | None) -> list[tuple[str, float]]:
    """The served top-k as the page's `(label, score)` pairs, keyed as `served_labels` says."""
    triples = list(zip(prediction.labels, prediction.class_ids, prediction.scores, strict=False))[:k]
    keys = served_labels([(label, index) for label, index, _ in triples], labels)
    return list(zip(keys, [score for _, _, score in triples], strict=True))


def served_labels(classes: list[tuple[str, int]], page_labels: list[str] | None = None) -> list[str]:
    """The keys of the served top-k `[(name, class id)]` on the page: where the page's model names that class id the
    same (`crane` as `crane (134)` or plain `cat`), its distinct label, so one class has one key whichever backend
    answered and ImageNet's two cranes stay apart even when only one is in the top-k; else the served name, with
    its class id when the top-k holds that name twice."""
    names = [name for name, _ in classes]
    page = page_labels or []
    out = []
    for name, index in classes:
        if _page_names(page, name, index):
            out.append(page[index])
        else:
            out.append(f"{name} ({index})" if names.count(name) > 1 else name)
    return out
