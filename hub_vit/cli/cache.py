"""`hub-vit cache list|clear`: the CPU flavour's variant cache (server/repository/variant_cache.py), where `hub-vit
serve` and `hub-vit repository` keep the graph they chose for a model on this host, and the download cache of Google's
checkpoints (conversion/download_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape

from hub_vit.cli.app import app, console, fail, os_error_text
from hub_vit.cli.tables import print_table

cache_app = typer.Typer(help="hub-vit's caches on this host: the CPU variant cache (the graphs `serve` / `repository` "
                             "chose, reused by the next start; $HUB_VIT_VARIANT_CACHE moves it) and the download cache "
                             "of Google's checkpoints ($HUB_VIT_CACHE moves it).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _root() -> Path:
    """The cache's folder; refused when it, or a folder above it, is a file (as `$HUB_VIT_VARIANT_CACHE` or
    `$HUB_VIT_CACHE` may name one): listing it said "0 entries" and clearing it "removed 0", as if it were an empty
    cache."""
    from hub_vit.atomic import file_in_the_way
    from hub_vit.conversion import download_cache
    from hub_vit.server.repository import variant_cache

    root = variant_cache.cache_root()
    for cache, folder in (("variant cache", root), ("download cache", download_cache.downloads_root())):
        blocker = file_in_the_way(folder)
        if blocker is None:
            continue
        env = next((name for name in (variant_cache.ENV, "HUB_VIT_CACHE") if os.environ.get(name)), None)
        named = f"${env} names {os.environ[env]!r}" if env else f"the {cache} is {str(folder)!r}"
        if blocker == folder:
            why = f"{named}, which is a file"
        else:
            why = (f"{named}{f', so the {cache} is {str(folder)!r}' if env else ''}: {str(blocker)!r}, a folder "
                   "above it, is a file")
        raise fail(f"{why}; the cache is a folder (made when hub-vit first keeps something there): name another path")
    return root


@cache_app.command("list")
def list_cmd() -> None:
    """List the cached variants (graph, request, weights, size, whether each reads back whole and can still be reused
    here) and the downloaded checkpoints (catalog name, file, size, how it got there). Piped, each is a tab-separated
    table, never cut."""
    from hub_vit.server.repository import variant_cache

    root = _root()
    found = variant_cache.entries(root)
    stale = sum(entry["damaged"] is None and entry["stale"] is not None for entry in found)
    count = f"{len(found)} entr{'y' if len(found) == 1 else 'ies'}" + (f", {stale} stale" if stale else "")
    _say(f"variant cache: {root} ({count})")
    if found:
        _variants_table(found)
    if stale:
        _say("stale: no start of this installation on this host reuses it (`hub-vit cache clear --stale` removes "
             "those)")
    _list_downloads()


def _say(line: str) -> None:
    console.print(escape(line), soft_wrap=True, highlight=False)


def _list_downloads() -> None:
    from hub_vit.conversion import download_cache

    found = download_cache.entries()
    total = sum(entry.bytes for entry in found)
    count = f"{len(found)} checkpoint{'s' if len(found) != 1 else ''}, {total / 2**20:.1f} MiB"
    _say(f"download cache: {download_cache.downloads_root()} ({count})")
    if found:
        print_table(("checkpoint", "file", "MiB", "state"),
                    [(entry.catalog_name or "-", entry.file or "-", f"{entry.bytes / 2**20:.1f}", entry.state)
                     for entry in found], right=("MiB",))


def _variants_table(found: list[dict]) -> None:
    rows = []
    for entry in found:
        state = entry["damaged"] or (f"stale: {entry['stale']}" if entry["stale"] else "whole")
        rows.append((str(entry["variant"]), str(entry["requested"] or "-"),
                     str(entry["weights"] or "-").removeprefix("tensors-sha256:"), f"{entry['bytes'] / 2**20:.1f}",
                     state, entry["entry"]))
    print_table(("variant", "requested", "weights", "MiB", "state", "entry"), rows, right=("MiB",),
                short={"weights": 12, "entry": None}, wrap=("state",))


CACHES = ("variants", "downloads", "all")  # what `hub-vit cache clear` empties


@cache_app.command("clear")
def clear_cmd(
    which: str = typer.Argument("variants", help="Which cache to empty: 'variants' (the CPU variants serve and "
                                                 "repository chose), 'downloads' (Google's checkpoints, fetched again "
                                                 "when next used; run it while nothing downloads) or 'all'."),
    stale: bool = typer.Option(False, help="Remove only the variants this installation on this host never reuses "
                                           "(built with other library versions, other hub-vit code or on another "
                                           "CPU) and damaged ones; on a cache shared by hosts or environments, "
                                           "theirs are stale here. For 'variants' only."),
) -> None:
    """Empty the variant cache (the next start builds, verifies and times its candidates again; --stale: only the
    entries no start here can reuse), the download cache, or both. Only the caches' own entries are removed, never
    other files in their folders. Run it while no serve or repository build writes to the cache."""
    which = which.lower()
    if which not in CACHES:
        raise fail(f"unknown cache {which!r}; valid choices: {', '.join(CACHES)}")
    if stale and which != "variants":
        raise fail(f"--stale is for the variant cache ('hub-vit cache clear variants --stale'); {which!r} has no stale "
                   "entries: a downloaded checkpoint is the file at its URL")
    if which in ("variants", "all"):
        _clear_variants(stale)
    if which in ("downloads", "all"):
        _clear_downloads()


def _clear_variants(stale: bool) -> None:
    from hub_vit.server.repository import variant_cache

    root = _root()
    try:
        removed, others = variant_cache.clear(root, only_unusable=stale)
    except OSError as exc:
        raise fail(f"cannot clear the variant cache: {os_error_text(exc)}", code=1) from None
    left = f"; left {others} other file{'s' if others != 1 else ''} there (not cache entries)" if others else ""
    what = "stale or damaged cached variant" if stale else "cached variant"
    _say(f"removed {removed} {what}{'s' if removed != 1 else ''} from {root}{left}")


def _clear_downloads() -> None:
    from hub_vit.conversion import download_cache

    try:
        removed, freed = download_cache.clear()
    except OSError as exc:
        raise fail(f"cannot clear the download cache: {os_error_text(exc)}", code=1) from None
    _say(f"removed {removed} downloaded checkpoint{'s' if removed != 1 else ''} ({freed / 2**20:.1f} MiB) from "
         f"{download_cache.downloads_root()}")
