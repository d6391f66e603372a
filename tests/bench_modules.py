"""A bench/ script as a module in a test, imported as `python bench/<script>.py` imports it: bench/ first on sys.path
(the scripts import each other by bare name) and the module registered under its name while the test runs
(dataclasses look their module up there). Fresh for each call; the monkeypatch puts sys.path and sys.modules back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """bench/`name`.py, executed now (its `main()` stays behind `__name__ == "__main__"`)."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module
