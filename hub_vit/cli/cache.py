"""`hub-vit cache list|clear`: the CPU flavour's variant cache (server/repository/variant_cache.py), where `hub-vit
serve` and `hub-vit repository` keep the graph they chose for a model on this host."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from hub_vit.cli.app import app, console

cache_app = typer.Typer(help="The CPU variant cache: the graphs `serve` / `repository` chose on this host, reused by "
                             "the next start ($HUB_VIT_VARIANT_CACHE moves it).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("list")
def list_cmd() -> None:
    """List the cached variants: graph, request, weights, size, and whether each reads back whole."""
    from hub_vit.server.repository import variant_cache

    found = variant_cache.entries()
    console.print(f"variant cache: {escape(str(variant_cache.cache_root()))} ({len(found)} entries)", soft_wrap=True)
    if not found:
        return
    table = Table()
    for column in ("variant", "requested", "weights", "MiB", "state", "entry"):
        table.add_column(column, justify="right" if column == "MiB" else "left")
    for entry in found:
        weights = str(entry["weights"] or "-").removeprefix("tensors-sha256:")[:12]
        table.add_row(escape(str(entry["variant"])), escape(str(entry["requested"])), weights,
                      f"{entry['bytes'] / 2**20:.1f}", escape(entry["damaged"] or "whole"),
                      escape(entry["entry"].rsplit("/", 1)[-1][:12]))
    console.print(table)


@cache_app.command("clear")
def clear_cmd() -> None:
    """Remove every cached variant: the next start builds, verifies and times its candidates again."""
    from hub_vit.server.repository import variant_cache

    removed = variant_cache.clear()
    console.print(f"removed {removed} cached variant{'s' if removed != 1 else ''} from "
                  f"{escape(str(variant_cache.cache_root()))}", soft_wrap=True)
