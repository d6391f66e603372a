"""A fresh copy of this checkout's tracked files as they are now, for tests that must not see what the checkout holds
besides them (`.venv`, `build/`, caches): the README run as written, the wheel built from it."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tracked_copy(target: Path) -> Path:
    """`git archive` of the checkout's tracked files into `target` (created): `git stash create` makes committed and
    staged changes count; untracked files do not come along. Fails the test where the checkout is no git checkout."""
    if not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git checkout: this test copies its tracked files (git archive)")
    state = subprocess.run(["git", "stash", "create"], cwd=REPO, capture_output=True, text=True, check=True)
    tree = state.stdout.strip() or "HEAD"  # nothing changed: the commit itself
    archive = subprocess.run(["git", "archive", "--format=tar", tree], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(target, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # 3.11.4+
    return target
