"""The JAX ground-truth fixtures are byte-for-byte what Google's code wrote: sha256 of every file vs index.json.

An edited fixture would silently move the golden values every parity test compares against; this test makes that
impossible without also editing index.json (which the fixtures' README and PROVENANCE.md describe).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
INDEX = json.loads((JAX / "index.json").read_text())
NOT_INDEXED = {"index.json", "PROVENANCE.md"}  # the index itself, and the repo's own provenance note


@pytest.mark.parametrize("name", sorted(INDEX["files"]))
def test_fixture_file_matches_index(name: str) -> None:
    path = JAX / name
    assert path.is_file(), f"fixture {name} listed in index.json is missing"
    data = path.read_bytes()
    entry = INDEX["files"][name]
    assert len(data) == entry["bytes"], f"{name}: {len(data)} bytes, index.json says {entry['bytes']}"
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{name}: sha256 differs from index.json"


def test_no_unlisted_fixture_files() -> None:
    present = {p.relative_to(JAX).as_posix() for p in JAX.rglob("*") if p.is_file()}
    unlisted = sorted(present - set(INDEX["files"]) - NOT_INDEXED)
    assert not unlisted, f"files in tests/fixtures/jax not covered by index.json: {unlisted}"


def test_index_total_size() -> None:
    total = sum(e["bytes"] for e in INDEX["files"].values())
    assert total == INDEX["total_bytes_excluding_index"]
