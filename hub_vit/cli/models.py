"""`hub-vit models`: the registered architectures, their pretrained tags (which of them need no download) and
parameter counts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from hub_vit.catalog import MODELS, Weights
from hub_vit.cli.app import app, console, fail
from hub_vit.cli.tables import print_table


@app.command()
def models(
    family: str = typer.Option(None, help="Only this family: 'vit' or 'simplevit'."),
    tags: bool = typer.Option(True, help="List the pretrained tags of each model, marking those that need no download: "
                              "(shipped) in the package, (cached) in hub-vit's download cache ($HUB_VIT_CACHE)."),
) -> None:
    """List the architectures hub-vit registers with timm and transformers."""
    from hub_vit.model_cards.facts import model_num_params  # here, not at the top: it imports torch when called
    from hub_vit.resolve import cached_checkpoint

    families = sorted({e.family for e in MODELS.values()})
    family = family.lower() if family is not None else None  # `--family ViT`: names are case-insensitive to people
    if family is not None and family not in families:
        raise fail(f"unknown family {family!r}; valid choices: {', '.join(families)}")
    header = ("name", "variant", "posemb", "pool", "pre-logits", "params", "pretrained tags" if tags else "weights")
    rows = []
    for entry in MODELS.values():
        if family and entry.family != family:
            continue
        spec = entry.spec
        params = model_num_params(spec)  # built on the meta device: nothing allocated (H/14 has 632M parameters)
        tag_text = (", ".join(_tag(entry.name, w, cached_checkpoint) for w in entry.weights) if tags
                    else str(len(entry.weights)))
        rows.append((entry.name, spec.variant or "-", spec.posemb, spec.pool_type, str(spec.rep_size or "-"),
                     f"{params:,}", tag_text or "-"))
    if console.is_terminal and _table_width(header, rows) > console.width:  # one block per model, nothing cut
        for row in rows:
            console.print(row[0], style="bold", highlight=False)
            for key, value in zip(header[1:], row[1:], strict=True):
                console.print(f"  {key}: {value}", highlight=False, markup=False)
        return
    # piped: one tab-separated line per model (`hub-vit models | grep s16`); on a terminal, names and counts never
    # shorten and the tag list folds onto more lines
    print_table(header, rows, title="hub-vit models", right=("params", "weights"), wrap=(header[-1],), console=console)
    if not console.is_terminal:
        return
    if tags:
        console.print("(shipped): in the package; (cached): in hub-vit's download cache ($HUB_VIT_CACHE); the other "
                      "tags download on first use", highlight=False, markup=False)


def _tag(name: str, weights: Weights, cached_checkpoint: Callable[[str, str], Path | None]) -> str:
    """`weights.tag`, marked when loading it needs no network: shipped in the package, or already downloaded."""
    if weights.file:
        return f"{weights.tag} (shipped)"
    return f"{weights.tag} (cached)" if cached_checkpoint(name, weights.tag) is not None else weights.tag


def _table_width(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> int:
    """Columns the table needs without cutting a name or a count: each column's widest cell, 3 columns of border and
    padding per column and one more (the tag list may fold, so 12 is counted for it)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    widths[-1] = min(widths[-1], 12)
    return sum(widths) + 3 * len(widths) + 1
