"""The CLI's tables (`hub_vit/cli/tables.py`): tab-separated lines when piped, every cell whole; on a terminal a table
whose folding columns break a long word instead of cutting it to '…'."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from hub_vit.cli import _load_commands, app
from hub_vit.cli.tables import print_table

HEADER = ("name", "tags", "digest", "path")
ROWS = [("vit_ti16", "augreg_in21k_ft_in1k, augreg_in21k_ft_in1k_384", "a57264f46a0d3128f824", "/cache/020aea13")]


def _shown(terminal: bool, width: int = 200) -> str:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=terminal, width=width, color_system=None)
    print_table(HEADER, ROWS, title="models", short={"digest": 12, "path": None}, wrap=("tags",), console=console)
    return screen.getvalue()


def test_piped_is_tab_separated_and_whole() -> None:
    assert _shown(terminal=False).splitlines() == ["\t".join(HEADER), "\t".join(ROWS[0])]


def test_a_narrow_terminal_folds_the_wrapping_column_and_cuts_only_what_is_asked() -> None:
    text = _shown(terminal=True, width=40)
    assert "…" not in text and "┃" in text and all(len(line) <= 40 for line in text.splitlines()), text
    assert "a57264f46a0d" in text and "a57264f46a0d3" not in text and "/cache" not in text, text
    # each tag's characters are all there, in order, whatever the lines they were folded onto
    cells = "".join(line.split("│")[2].strip() for line in text.splitlines() if line.count("│") == 4)
    assert cells == "augreg_in21k_ft_in1k,augreg_in21k_ft_in1k_384", text


def test_rollout_piped_prints_its_labels_as_tab_separated_lines(tmp_path: Path) -> None:
    # was: a box-drawn table (┃, ━╇━) in a file that `> out.txt` wrote
    Image.new("RGB", (32, 32), "white").save(tmp_path / "a.png")
    _load_commands()
    result = CliRunner().invoke(app, ["rollout", str(tmp_path / "a.png"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    table = lines[lines.index("label\tprobability") + 1:][:5]
    assert len(table) == 5 and all(float(line.split("\t")[1]) >= 0 for line in table), result.stdout
    assert "┃" not in result.stdout and "━" not in result.stdout
