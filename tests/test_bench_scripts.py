"""Every script in bench/ imports as `python bench/<script>.py` runs it (bench/ first on sys.path): a benchmark whose
imports broke (a helper renamed in another script) is found here, not by the next person who runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_modules import BENCH, load_bench_script

SCRIPTS = sorted(BENCH.glob("*.py"))


def test_the_bench_folder_is_found() -> None:
    assert {"bench_serve.py", "bench_serve_start.py", "front_cost.py", "serve_process.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_bench_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_bench_script(script.stem, monkeypatch)  # its imports and definitions run; `main()` does not
    if "__name__ == \"__main__\"" in script.read_text(encoding="utf-8"):
        assert callable(getattr(module, "main", None)), f"{script.name}: no main()"
