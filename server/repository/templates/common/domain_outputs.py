"""The out-of-domain answer of a classifier step (copied beside its model.py with protocol.py, and with
domain_score.py where the step serves a calibrated score): `domain` (B, 1) verdicts and `domain_score` (B, 1) FP32.

A step whose version folder holds the statistics file named by its `domain_file` parameter (`hub-vit repository`
copies the model folder's `domain.safetensors` there when it is calibrated for the served weights) scores the token
means its graph or model produces (`hub_vit.model.token_means`); any other step, or a batch without token means,
answers `unknown` and protocol.NO_DOMAIN_SCORE: a model without a calibration never says "in domain".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import protocol  # copied beside this file by hub-vit repository
import triton_python_backend_utils as pb_utils


class DomainOutputs:
    """The step's statistics (None: uncalibrated) and the two output tensors of each answer."""

    def __init__(self, version_dir: Path, params: dict[str, str]) -> None:
        path = version_dir / params.get("domain_file", "")
        self.statistics = None
        if params.get("domain_file") and path.is_file():
            from domain_score import load_statistics  # numpy + safetensors: only a calibrated step reads them

            self.statistics = load_statistics(path)

    def tensors(self, token_means: np.ndarray | None, count: int) -> list:
        """`domain` and `domain_score` for `count` images from their (count, depth, D) token means (None: none)."""
        if self.statistics is None or token_means is None:
            scores = np.full(count, protocol.NO_DOMAIN_SCORE, dtype=np.float32)
            threshold = None
        else:
            scores, threshold = self.statistics.scores(token_means), self.statistics.threshold
        verdicts = [protocol.domain_verdict(float(score), threshold).encode() for score in scores]
        return [pb_utils.Tensor(protocol.DOMAIN_OUTPUT, np.array(verdicts, dtype=np.object_).reshape(count, 1)),
                pb_utils.Tensor(protocol.DOMAIN_SCORE_OUTPUT, scores.astype(np.float32).reshape(count, 1))]

    def from_features(self, features: np.ndarray, count: int) -> list:
        """The domain tensors of `count` images from their (count, depth * D) flattened token means (zero-width: the
        model returns none)."""
        width = None if self.statistics is None else self.statistics.mean.shape[1]
        means = features.reshape(count, -1, width) if width and features.size else None
        return self.tensors(means, count)

    def split(self, outputs: np.ndarray, num_classes: int) -> tuple[np.ndarray, list]:
        """A torch step's (N, C [+ depth * D]) outputs, whose model appends the token means to its logits where the
        score is calibrated (hub_vit.server.repository.torch_domain), -> (N, C) logits and the domain tensors."""
        return outputs[:, :num_classes], self.from_features(outputs[:, num_classes:], len(outputs))
