"""What hub-vit's download cache holds (`download.py` writes it), and clearing it: `hub-vit cache list|clear
downloads`.

The cache's own entries are the folders `downloads/<32 hex digits>/` (`download.cached_path`), each holding one
checkpoint, its `.sha256` sidecar when hub-vit's downloader fetched it (a file placed there by hand has none), and,
after an interrupted download, the hidden staging file it was writing. Anything else under the cache folder is not
hub-vit's and is neither listed nor removed.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from hub_vit.conversion.download import cache_dir, cached_path, gs_to_https

_ENTRY = re.compile(r"[0-9a-f]{32}")
SIDECAR = ".sha256"


@dataclass(frozen=True)
class CachedCheckpoint:
    """One entry of the download cache."""

    folder: Path  # downloads/<32 hex digits>/
    file: str | None  # the checkpoint's file name; None when only an interrupted download's staging file is there
    bytes: int  # everything in the entry's folder (a staging file included)
    catalog_name: str | None  # `vit_b16.augreg_in21k_ft_in1k` when the file is a catalog weight's
    state: str  # "downloaded" (its sidecar is there), "placed by hand" (no sidecar), "interrupted" (no file)


def downloads_root(root: Path | None = None) -> Path:
    return (root if root is not None else cache_dir()) / "downloads"


def _catalog_names(downloads: Path) -> dict[Path, str]:
    """Each catalog weight's path under `downloads` -> its `name.tag`."""
    from hub_vit.catalog import MODELS

    names = {}
    for entry in MODELS.values():
        for weights in entry.weights:
            if weights.gs_url:
                relative = cached_path(gs_to_https(weights.gs_url)).relative_to(downloads_root())
                names[downloads / relative] = f"{entry.name}.{weights.tag}"
    return names


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.is_file() and not p.is_symlink()]


def _folders(root: Path | None) -> list[Path]:
    downloads = downloads_root(root)
    if not downloads.is_dir():
        return []
    return sorted(p for p in downloads.iterdir() if _ENTRY.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def entries(root: Path | None = None) -> list[CachedCheckpoint]:
    """The cache's entries (under `root`, else the cache `download` uses), by folder name."""
    names = _catalog_names(downloads_root(root))
    found = []
    for folder in _folders(root):
        files = _files(folder)
        size = sum(p.stat().st_size for p in files)
        checkpoints = [p for p in files if not p.name.startswith(".") and not p.name.endswith(SIDECAR)]
        if not checkpoints:
            found.append(CachedCheckpoint(folder, None, size, None, "interrupted"))
            continue
        for path in checkpoints:
            state = "downloaded" if (folder / (path.name + SIDECAR)).is_file() else "placed by hand"
            found.append(CachedCheckpoint(folder, path.name, size, names.get(path), state))
    return found


def clear(root: Path | None = None) -> tuple[int, int]:
    """Remove every entry of the cache: (entries removed, bytes freed). Other files under the cache stay."""
    removed = freed = 0
    for folder in _folders(root):
        size = sum(p.stat().st_size for p in _files(folder))
        shutil.rmtree(folder)
        removed, freed = removed + 1, freed + size
    return removed, freed


__all__ = ["CachedCheckpoint", "clear", "downloads_root", "entries"]
