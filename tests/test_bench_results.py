"""bench/results is a record, not a pile: every result file is described in bench/results/README.md and cited by the
doc that reports its numbers, and the README lists no file that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def test_every_result_is_described_and_cited() -> None:
    files = sorted(p.name for p in RESULTS.glob("*.json"))
    assert files, "bench/results holds no result"
    readme = (RESULTS / "README.md").read_text(encoding="utf-8")
    docs = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
            for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    for name in files:
        assert f"`{name}`" in readme, f"bench/results/README.md does not describe {name}"
        assert any(name in text for text in docs.values()), f"no doc cites {name}: cite it where its numbers are"


def test_the_readme_lists_only_files_that_exist() -> None:
    readme = (RESULTS / "README.md").read_text(encoding="utf-8")
    table = [line for line in readme.splitlines() if line.startswith("| `")]  # one row per result
    listed = {name for line in table for name in re.findall(r"`([\w.-]+\.json)`", line.split("|")[1])}
    missing = sorted(name for name in listed if not (RESULTS / name).is_file())
    assert listed and not missing, f"bench/results/README.md lists files that are not there: {missing}"
