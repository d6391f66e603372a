"""Shared pytest fixtures: repository paths, real photos, the JAX ground-truth fixtures."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
JAX_FIXTURES = FIXTURES / "jax"


def pytest_configure(config: pytest.Config) -> None:
    """The warning filters torch_images sets once for the step's process, set for every test (pytest puts the filters
    back after each test, so one set at import would hold only in the test that imported the module)."""
    from hub_vit.server.repository.torch_images import QUIET_WARNINGS

    for message in QUIET_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{message}")


@pytest.fixture(autouse=True)
def _deterministic_cpu() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _own_variant_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU flavour's variant cache in a folder of each test's own (the processes a test starts inherit it): no
    test reuses what another one chose (a damaged build would be served from an earlier test's entry), nor fills
    the user's cache."""
    monkeypatch.setenv("HUB_VIT_VARIANT_CACHE", str(tmp_path_factory.mktemp("variant-cache")))


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a stalled server: the kernel's backlog takes them)."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.fixture()
def web_page_port(tmp_path: Path) -> Iterator[int]:
    """A port where a web server that is not Triton answers (Python's http.server over an empty folder: its pages are
    HTML, its 404s too), as the demo's port or another service would."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def jax_fixtures() -> Path:
    return JAX_FIXTURES


@pytest.fixture(scope="session")
def jax_index() -> dict:
    return json.loads((JAX_FIXTURES / "index.json").read_text())


@pytest.fixture(scope="session")
def imageprep() -> ModuleType:
    """The served preprocessing module (`server/repository/templates/preprocess/imageprep.py`), loaded from its file
    the way a generated repository's Python backend loads it, i.e. without hub_vit on the path of its own imports."""
    from hub_vit.server.repository.writer import template_dir

    spec = importlib.util.spec_from_file_location("imageprep", template_dir("preprocess") / "imageprep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["imageprep"] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def real_photos() -> dict[str, np.ndarray]:
    """Real photographs bundled with scikit-image (RGB uint8 HxWx3): astronaut, chelsea (a cat), coffee."""
    from skimage import data

    return {"astronaut": data.astronaut(), "chelsea": data.chelsea(), "coffee": data.coffee()}


@pytest.fixture(scope="session")
def photos() -> dict[str, np.ndarray]:
    return real_photos()
