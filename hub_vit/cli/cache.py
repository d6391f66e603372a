"""`hub-vit cache list|clear`: the CPU flavour's variant cache (server/repository/variant_cache.py), where `hub-vit
serve` and `hub-vit repository` keep the graph they chose for a model on this host, and the download cache of Google's
checkpoints (conversion/download_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from hub_vit.cli.app import app, console, fail, os_error_text

cache_app = typer.Typer(help="hub-vit's caches on this host: the CPU variant cache (the graphs `serve` / `repository` "
                             "chose, reused by the next start; $HUB_VIT_VARIANT_CACHE moves it) and the download cache "
                             "of Google's checkpoints ($HUB_VIT_CACHE moves it).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _root() -> Path:
    """The cache's folder; refused when it is a file (as `$HUB_VIT_VARIANT_CACHE` may name one): listing it said
    "0 entries" and clearing it "removed 0", as if it were an empty cache."""
    from hub_vit.server.repository import variant_cache

    root = variant_cache.cache_root()
    if root.exists() and not root.is_dir():
        named = f"${variant_cache.ENV} names" if os.environ.get(variant_cache.ENV) else "the variant cache is"
        raise fail(f"{named} {str(root)!r}, which is a file; the cache is a folder (made when serve or repository "
                   "first keeps a variant there): name another path")
    return root


@cache_app.command("list")
def list_cmd() -> None:
    """List the cached variants (graph, request, weights, size, whether each reads back whole) and the downloaded
    checkpoints (catalog name, file, size, how it got there)."""
    from hub_vit.server.repository import variant_cache

    root = _root()
    found = variant_cache.entries(root)
    count = f"{len(found)} entr{'y' if len(found) == 1 else 'ies'}"
    console.print(f"variant cache: {escape(str(root))} ({count})", soft_wrap=True)
    if found:
        _variants_table(found)
    _list_downloads()


def _list_downloads() -> None:
    from hub_vit.conversion import download_cache

    found = download_cache.entries()
    total = sum(entry.bytes for entry in found)
    count = f"{len(found)} checkpoint{'s' if len(found) != 1 else ''}, {total / 2**20:.1f} MiB"
    console.print(f"download cache: {escape(str(download_cache.downloads_root()))} ({count})", soft_wrap=True)
    if not found:
        return
    table = Table()
    for column in ("checkpoint", "file", "MiB", "state"):
        table.add_column(column, justify="right" if column == "MiB" else "left")
    for entry in found:
        table.add_row(escape(entry.catalog_name or "-"), escape(entry.file or "-"), f"{entry.bytes / 2**20:.1f}",
                      entry.state)
    console.print(table)


def _variants_table(found: list[dict]) -> None:
    table = Table()
    for column in ("variant", "requested", "weights", "MiB", "state", "entry"):
        table.add_column(column, justify="right" if column == "MiB" else "left")
    for entry in found:
        weights = str(entry["weights"] or "-").removeprefix("tensors-sha256:")[:12]
        table.add_row(escape(str(entry["variant"])), escape(str(entry["requested"] or "-")), weights,
                      f"{entry['bytes'] / 2**20:.1f}", escape(entry["damaged"] or "whole"),
                      escape(entry["entry"].rsplit("/", 1)[-1][:12]))
    console.print(table)


@cache_app.command("clear")
def clear_cmd(
    downloads: bool = typer.Option(False, help="Also remove the downloaded checkpoints (fetched again when next used; "
                                               "run it while nothing downloads)."),
) -> None:
    """Remove every cached variant: the next start builds, verifies and times its candidates again. Only the caches'
    own entries are removed, never other files in their folders."""
    from hub_vit.server.repository import variant_cache

    root = _root()
    try:
        removed, others = variant_cache.clear(root)
    except OSError as exc:
        raise fail(f"cannot clear the variant cache: {os_error_text(exc)}", code=1) from None
    left = f"; left {others} other file{'s' if others != 1 else ''} there (not cache entries)" if others else ""
    console.print(f"removed {removed} cached variant{'s' if removed != 1 else ''} from {escape(str(root))}{left}",
                  soft_wrap=True)
    if downloads:
        _clear_downloads()


def _clear_downloads() -> None:
    from hub_vit.conversion import download_cache

    try:
        removed, freed = download_cache.clear()
    except OSError as exc:
        raise fail(f"cannot clear the download cache: {os_error_text(exc)}", code=1) from None
    console.print(f"removed {removed} downloaded checkpoint{'s' if removed != 1 else ''} ({freed / 2**20:.1f} MiB) "
                  f"from {escape(str(download_cache.downloads_root()))}", soft_wrap=True)
