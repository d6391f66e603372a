"""The CLI's tables: a rich table on a terminal, tab-separated lines when piped (`hub-vit models | grep s16`,
`hub-vit cache list | cut -f1`), so a script never reads box-drawing characters or a cell cut to fit 80 columns."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hub_vit.cli.app import console as cli_console


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
                right: Collection[str] = (), short: Mapping[str, int | None] | None = None,
                styles: Mapping[str, Mapping[str, str]] | None = None, wrap: Collection[str] = (),
                console: Console | None = None) -> None:
    """`rows` (plain text, one cell per column of `header`) under `header`, on `console` (default: the CLI's).

    Piped: the header and each row as tab-separated lines, every cell whole, no title. On a terminal: a rich table
    titled `title`; columns in `right` aligned right; `short`: columns cut to that many characters (None: left out);
    `styles`: {column: {cell text: rich style}} (`{"written": {"no": "red"}}`); only the columns in `wrap` fold onto
    more lines (a long word broken, not cut), the others keep their cells on one."""
    console = console or cli_console
    if not console.is_terminal:
        for row in (header, *rows):
            console.file.write("\t".join(cell.replace("\t", " ").replace("\n", " ") for cell in row) + "\n")
        return
    short, styles = short or {}, styles or {}
    shown = [i for i, column in enumerate(header) if short.get(column, 0) is not None]
    table = Table(title=escape(title) if title else None)
    for i in shown:
        folds = header[i] in wrap  # a word longer than its column breaks onto the next line, never ends in '…'
        table.add_column(header[i], justify="right" if header[i] in right else "left", no_wrap=not folds,
                         overflow="fold" if folds else "ellipsis")
    for row in rows:
        cells = []
        for i in shown:
            text = escape(row[i][:short.get(header[i]) or len(row[i])])
            style = styles.get(header[i], {}).get(row[i])
            cells.append(f"[{style}]{text}[/]" if style else text)
        table.add_row(*cells)
    console.print(table)


__all__ = ["print_table"]
