"""Shared pytest fixtures: repository paths, real photos, the JAX ground-truth fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
JAX_FIXTURES = FIXTURES / "jax"


@pytest.fixture(autouse=True)
def _deterministic_cpu() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def jax_fixtures() -> Path:
    return JAX_FIXTURES


@pytest.fixture(scope="session")
def jax_index() -> dict:
    return json.loads((JAX_FIXTURES / "index.json").read_text())


def real_photos() -> dict[str, np.ndarray]:
    """Real photographs bundled with scikit-image (RGB uint8 HxWx3): astronaut, chelsea (a cat), coffee."""
    from skimage import data

    return {"astronaut": data.astronaut(), "chelsea": data.chelsea(), "coffee": data.coffee()}


@pytest.fixture(scope="session")
def photos() -> dict[str, np.ndarray]:
    return real_photos()
