"""`hub-vit cache list` shows the download cache of Google's checkpoints beside the variant cache, and
`hub-vit cache clear downloads` empties it: only the cache's own entries (`downloads/<32 hex>/`), never other files
under it. Run as the real command, on a cache laid out by hub-vit's own downloader paths (`download.cached_path`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hub_vit.atomic import staging_file
from hub_vit.conversion.download import cached_path, gs_to_https

HUB_VIT = Path(sys.executable).with_name("hub-vit")
CATALOG_URL = "gs://big_vision/vit_s16_i1k_90ep.npz"  # simplevit_s16.i1k_90ep


def _hub_vit(*args: str, cache: Path) -> str:
    env = {**os.environ, "HUB_VIT_CACHE": str(cache), "HUB_VIT_VARIANT_CACHE": str(cache / "variants"),
           "COLUMNS": "200"}
    done = subprocess.run([str(HUB_VIT), *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", done.stdout).split())  # a table's cells, without its lines


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A download cache with a downloaded catalog checkpoint (1 MiB and its sidecar), a file placed by hand for
    another URL, an interrupted download, and files that are not the cache's."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HUB_VIT_CACHE", str(root))
    downloaded = cached_path(gs_to_https(CATALOG_URL))
    downloaded.parent.mkdir(parents=True)
    downloaded.write_bytes(b"\0" * (1 << 20))
    downloaded.with_name(downloaded.name + ".sha256").write_text("0" * 64 + "\n")
    by_hand = cached_path("https://example.org/models/mine.npz")
    by_hand.parent.mkdir(parents=True)
    by_hand.write_bytes(b"\1" * 1000)
    interrupted = cached_path("https://example.org/models/cut.npz")
    interrupted.parent.mkdir(parents=True)
    staging_file(interrupted).write_bytes(b"\2" * 10)
    (root / "downloads" / "notes.txt").write_text("mine\n")
    (root / "downloads" / "keep").mkdir()
    return root


def test_list_names_each_downloaded_checkpoint_and_how_it_got_there(cache: Path) -> None:
    listed = _hub_vit("cache", "list", cache=cache)
    assert f"download cache: {cache / 'downloads'} (3 checkpoints, 1.0 MiB)" in listed, listed
    assert "simplevit_s16.i1k_90ep vit_s16_i1k_90ep.npz 1.0 downloaded" in listed, listed
    assert "- mine.npz 0.0 placed by hand" in listed and "- - 0.0 interrupted" in listed, listed
    assert "notes.txt" not in listed and "keep" not in listed


def test_clear_downloads_removes_the_cache_s_entries_only(cache: Path) -> None:
    variant = cache / "variants" / ("a" * 64)  # an entry of the variant cache ($HUB_VIT_VARIANT_CACHE in _hub_vit)
    variant.mkdir(parents=True)
    assert "i1k_90ep (cached)" in _hub_vit("models", cache=cache)
    assert "removed 1 cached variant from" in _hub_vit("cache", "clear", cache=cache)  # the variant cache only
    assert len(list((cache / "downloads").iterdir())) == 5
    variant.mkdir()
    cleared = _hub_vit("cache", "clear", "downloads", cache=cache)
    assert f"removed 3 downloaded checkpoints (1.0 MiB) from {cache / 'downloads'}" in cleared, cleared
    assert "cached variant" not in cleared and variant.is_dir()  # was: --downloads emptied the variant cache too
    assert sorted(p.name for p in (cache / "downloads").iterdir()) == ["keep", "notes.txt"]
    assert "(cached)" not in _hub_vit("models", cache=cache)
    assert "(0 checkpoints, 0.0 MiB)" in _hub_vit("cache", "list", cache=cache)
    cleared = _hub_vit("cache", "clear", "all", cache=cache)
    assert "removed 1 cached variant from" in cleared and "removed 0 downloaded checkpoints" in cleared, cleared
    assert not variant.exists()


def test_clear_names_the_caches_it_knows(cache: Path) -> None:
    env = {**os.environ, "HUB_VIT_CACHE": str(cache), "COLUMNS": "200"}
    for args, error in ((["downloadz"], "unknown cache 'downloadz'; valid choices: variants, downloads, all"),
                        (["downloads", "--stale"], "--stale is for the variant cache")):
        done = subprocess.run([str(HUB_VIT), "cache", "clear", *args], capture_output=True, text=True, env=env)
        assert done.returncode == 2 and error in " ".join(done.stderr.split()), done.stderr
    assert len(list((cache / "downloads").iterdir())) == 5


def test_clear_downloads_says_so_when_an_entry_cannot_be_removed(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import shutil

    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    def read_only(path: Path, *args: object, **kwargs: object) -> None:  # as on a read-only mount (root ignores modes)
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(shutil, "rmtree", read_only)
    _load_commands()
    cleared = CliRunner().invoke(app, ["cache", "clear", "downloads"])
    flat = " ".join(cleared.output.split())
    first = sorted(p for p in (cache / "downloads").iterdir() if re.fullmatch("[0-9a-f]{32}", p.name))[0]
    assert cleared.exit_code == 1, flat
    assert f"cannot clear the download cache: Read-only file system: {str(first)!r}" in flat, flat
    assert "removed" not in flat, flat
