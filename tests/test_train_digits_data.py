"""`hub_vit.train.digits.write_image_folder`: an interrupted or failed write leaves no half-filled folder, and the
temp folder of a process that died is removed by the next run (environment review, finding 7)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from PIL import Image

from hub_vit.train import digits


def _failing_save(monkeypatch: pytest.MonkeyPatch, error: BaseException, after: int = 5) -> None:
    real_save = Image.Image.save
    calls = [0]

    def save(self: Image.Image, *args: object, **kwargs: object) -> None:
        calls[0] += 1
        if calls[0] > after:
            raise error
        real_save(self, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", save)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")],
                         ids=["ctrl-c", "disk-full"])
def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    # `.data.<pid>.tmp` with the PNGs written so far used to stay in the run folder for good
    _failing_save(monkeypatch, error)
    with pytest.raises(type(error)):
        digits.write_image_folder(tmp_path / "data")
    assert list(tmp_path.iterdir()) == []


def test_temp_folders_of_dead_processes_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = tmp_path / ".data.999999999.tmp"  # above any pid_max: no such process
    alive = tmp_path / f".data.{os.getppid()}.tmp"  # another rank of a torchrun job may be writing this one
    unrelated = tmp_path / ".data.notapid.tmp"
    for folder in (dead, alive, unrelated):
        (folder / "train").mkdir(parents=True)
    _failing_save(monkeypatch, KeyboardInterrupt(), after=0)  # the clean-up runs before the writing starts
    with pytest.raises(KeyboardInterrupt):
        digits.write_image_folder(tmp_path / "data")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, unrelated.name])


def test_ctrl_c_while_the_cli_writes_the_data_leaves_no_run_folder(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # `hub-vit train --preset digits --out X` interrupted ~4 s in (while writing the digits PNGs) used to leave an
    # empty X behind, exit 130 and print nothing
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _failing_save(monkeypatch, KeyboardInterrupt())
    _load_commands()
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--preset", "digits", "--out", str(out), "--no-progress"])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []
