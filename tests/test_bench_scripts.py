"""Every script in bench/ imports as `python bench/<script>.py` runs it (bench/ first on sys.path): a benchmark whose
imports broke (a helper renamed in another script) is found here, not by the next person who runs it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))


def test_the_bench_folder_is_found() -> None:
    assert {"bench_serve.py", "bench_serve_start.py", "front_cost.py", "serve_process.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_bench_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_script_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # as a script's own module is (dataclasses look it up)
    spec.loader.exec_module(module)  # runs its imports and definitions; `main()` stays behind `__name__ == "__main__"`
    if "__name__ == \"__main__\"" in script.read_text(encoding="utf-8"):
        assert callable(getattr(module, "main", None)), f"{script.name}: no main()"
