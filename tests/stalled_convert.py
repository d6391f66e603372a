"""`hub-vit convert` in a process of its own, held still once its staging folder is written and before the rename
that publishes it: the moment a signal or a kill leaves a `.out.tmp-*` copy of the weights behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def start_stalled_convert(checkpoint: Path, out: Path) -> subprocess.Popen[str]:
    """The running convert, once its staging folder beside `out` is complete (it then sleeps 60 s); the caller
    signals or kills it."""
    script = (
        "import sys, time\n"
        "import hub_vit.folder as folder\n"
        "write = folder._write_folder\n"
        "def slow(*args, **kwargs):\n"
        "    write(*args, **kwargs)\n"
        "    print('staged', flush=True)\n"
        "    time.sleep(60)\n"
        "folder._write_folder = slow\n"
        f"sys.argv = ['hub-vit', 'convert', {str(checkpoint)!r}, '-o', {str(out)!r}]\n"
        "from hub_vit.cli import main\n"
        "main()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip() if proc.stdout is not None else ""
        assert line == "staged", f"convert ended before staging its folder (exit {proc.poll()}): {line!r}"
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc
