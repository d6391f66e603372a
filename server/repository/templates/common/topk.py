"""Top-k over logits, shared by the Python-backend models that answer with labels (copied beside their model.py)."""

from __future__ import annotations

import numpy as np


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, C) logits -> (B, K) softmax scores and class ids, best first (stable order on ties)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    ids = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(probs, ids, axis=1).astype(np.float32), ids.astype(np.int64)
