"""What the CLI prints stays whole off a terminal: through a pipe, into a file or a CI log, rich would lay tables out
for 80 columns and cut cells (`int8-dy…` twice in `hub-vit export`'s variant column)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A table as `hub-vit export` prints one: names that differ only past 7 characters, and a long note
TABLE = """
from rich.table import Table
from hub_vit.cli.app import console, err_console
table = Table(title="hub-vit export -> exports/digits")
for column in ("variant", "written", "note"):
    table.add_column(column)
table.add_row("int8-dynamic", "no", "verification failed: top-1 agreement 96.9% < 99% over 32 photos (by 2.1%)")
table.add_row("int8-dynamic-s8", "no", "verification failed: top-1 agreement 93.8% < 99% over 32 photos (by 5.2%)")
(err_console if "--stderr" in __import__("sys").argv else console).print(table)
"""


def _printed(*args: str, columns: str | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-c", TABLE, *args], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL, check=True)  # no terminal anywhere, as in CI


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_tables_are_not_cut_through_a_pipe(stream: str) -> None:
    # was: "int8-dy…" in both rows, the notes cut off at 80 columns
    result = _printed(*(["--stderr"] if stream == "stderr" else []))
    text = getattr(result, stream)
    assert "…" not in text, text
    for cell in ("int8-dynamic ", "int8-dynamic-s8", "top-1 agreement 93.8% < 99% over 32 photos (by 5.2%)"):
        assert cell in text, text
    rows = [line for line in text.splitlines() if "int8" in line]
    assert len(rows) == 2, text  # one line per row: nothing wrapped either


def test_an_explicit_width_is_still_obeyed() -> None:
    text = _printed(columns="60").stdout
    assert max(len(line) for line in text.splitlines()) <= 60, text
