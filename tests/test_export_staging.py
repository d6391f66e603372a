"""An export's work folder inside its output folder follows `hub_vit.atomic`'s naming, so an export killed where no
cleanup runs (SIGKILL, the OOM killer) leaves nothing that the next export into that folder keeps. Was: a
`tempfile.TemporaryDirectory(prefix=".export-")` that no later export removed (11 MB of graphs for the 0.8 MB digits
model, gigabytes for a ViT-B). The exports run for real, in a process of their own, on the shipped digits model."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from hub_vit.atomic import staging_dir
from hub_vit.catalog import default_model_folder
from hub_vit.cli import _load_commands, app
from hub_vit.export.export_folder import STAGING_NAME

# fp32 only, few verification inputs, the faster exporter: seconds, not minutes
QUICK = ["-v", "fp32", "--random-inputs", "4", "--photos", "4", "--exporter", "torchscript"]


def _start_stalled_export(out: Path, stem: str = "model") -> subprocess.Popen[str]:
    """`hub-vit export onnx` of the digits model, held still once every graph is built and staged, before anything is
    moved into `out` (it then sleeps 60 s): the moment a kill leaves its work folder behind."""
    script = (
        "import sys, time\n"
        "import hub_vit.export.variants as variants\n"
        "replace = variants.replace_previous_export\n"
        "def stalled(*args, **kwargs):\n"
        "    print('staged', flush=True)\n"
        "    time.sleep(60)\n"
        "    replace(*args, **kwargs)\n"
        "variants.replace_previous_export = stalled\n"
        f"sys.argv = ['hub-vit', 'export', 'onnx', {str(default_model_folder())!r}, '-o', {str(out)!r}, "
        f"'--stem', {stem!r}, *{QUICK!r}]\n"
        "from hub_vit.cli import main\n"
        "main()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]  # export prints its own lines first
            lines.append(line)
            if line.strip() == "staged":
                return proc
        raise AssertionError(f"export ended before staging its graphs (exit {proc.wait()}): {''.join(lines)}")
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_killed_exports_work_folder_is_swept_by_the_next_export_and_a_live_ones_kept(tmp_path: Path) -> None:
    out = tmp_path / "ex"
    out.mkdir()
    # a running export's work folder (this process's, alive throughout): the next export must leave it alone
    live = staging_dir(out / STAGING_NAME)
    (live / "fp32.onnx").write_bytes(b"being built")
    proc = _start_stalled_export(out, stem="other")  # another stem: its leftovers are swept all the same
    try:
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.stdout.close()  # type: ignore[union-attr]
    left = [name for name in _hidden(out) if name != live.name]
    # named after its host and process, as `hub_vit.atomic` names every temporary folder
    assert len(left) == 1 and left[0].startswith(f".{STAGING_NAME}.tmp-") and f"-{proc.pid}-" in left[0], left
    killed = out / left[0]
    assert (killed / "staged" / "other.onnx").is_file() and (killed / "fp32.onnx").is_file()  # the graphs it built

    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), *QUICK])
    assert result.exit_code == 0, result.output
    assert not killed.exists()
    assert _hidden(out) == [live.name] and (live / "fp32.onnx").read_bytes() == b"being built"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["model.export.json", "model.onnx"]

