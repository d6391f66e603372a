"""A disk that refuses a write once the work is under way (full, over quota, a file-size limit) ends the command with
one line naming the folder and the system's reason (exit 1), and leaves nothing half-written.

The refusal is real: the command runs in a process whose file-size limit (RLIMIT_FSIZE) is below the size of the file
it writes, so the kernel fails that write with EFBIG ("File too large") inside the writing library, as a full disk
fails it with ENOSPC. safetensors reported it as a SafetensorError and torch.save as "basic_ios::clear: iostream
error", neither an OSError: both ended in a traceback (`calibrate-domain`, `train`). `convert`'s own handling of the
same refusal is in test_conversion_cli.
"""

from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hub_vit.catalog import default_model_folder
from hub_vit.domain import DOMAIN_FILE, STATISTICS_FILE
from tests.test_train_cli import QUICK
from tests.test_train_loop import make_folder

HUB_VIT = [sys.executable, "-c", "from hub_vit.cli import main; main()"]


def _run_with_file_limit(limit_bytes: int, *args: str) -> tuple[int, str]:
    """`hub-vit ARGS` in a process that may not write a file past `limit_bytes`: (exit code, output on one line)."""
    def limit() -> None:  # in the child, before exec: ignored SIGXFSZ makes the write fail with EFBIG, not kill
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    done = subprocess.run([*HUB_VIT, *args], capture_output=True, text=True, timeout=600, preexec_fn=limit)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*"))


def test_calibrate_domain_on_a_refusing_disk_is_one_line_and_keeps_the_old_record(tmp_path: Path) -> None:
    from hub_vit.train.digits import write_image_folder

    digits = Path(shutil.copytree(default_model_folder(), tmp_path / "digits"))
    data = write_image_folder(tmp_path / "data")
    record, statistics = (digits / DOMAIN_FILE).read_bytes(), (digits / STATISTICS_FILE).read_bytes()
    assert len(statistics) > 16_384  # the statistics file is what the limit refuses
    code, text = _run_with_file_limit(16_384, "calibrate-domain", str(digits), "--images", str(data / "train"),
                                      "--held-out", str(data / "val"))
    assert code == 1, text
    assert f"error: cannot write to '{digits}': File too large" in text and "Traceback" not in text, text
    assert (digits / DOMAIN_FILE).read_bytes() == record and (digits / STATISTICS_FILE).read_bytes() == statistics
    assert _hidden(digits) == []  # no temporary file left beside them


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("data"), per_class=4, val_per_class=1)


def test_train_on_a_refusing_disk_is_one_line_and_says_what_is_kept(data: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "run"
    # a checkpoint's optimizer state (state.pt, torch.save) is its largest file: the first checkpoint is refused
    args = ["train", str(data), "--out", str(run), "--model", "simplevit_digits", "--steps", "2", "--set",
            "checkpoint_every_steps=1", *QUICK]
    code, text = _run_with_file_limit(200_000, *args)
    assert code == 1, text
    assert f"error: cannot write to '{run}': File too large" in text and "Traceback" not in text, text
    assert "resume" not in text  # nothing was trained: nothing to resume, and the run folder it made is removed
    assert not (tmp_path / "runs").exists()

    code, text = _run_with_file_limit(2**40, *args, "--stop-at", "1")  # stops after step 1, its checkpoint written
    assert code == 0 and (run / "checkpoints" / "step_000000001").is_dir(), text
    code, text = _run_with_file_limit(200_000, *args)  # resumes, and step 2's checkpoint is refused
    assert code == 1, text
    assert (f"error: cannot write to '{run}': File too large; the checkpoints written before are kept: make room and "
            "run the same command to resume") in text, text
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000000001"]  # no half-written step 2


def test_only_the_systems_refusal_becomes_an_os_error(tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    from hub_vit.atomic import disk_errors_as_os_errors

    target = tmp_path / "gone" / "x.safetensors"
    with pytest.raises(FileNotFoundError) as caught, disk_errors_as_os_errors(target):
        save_file({"a": np.zeros(2)}, str(target))  # SafetensorError "I/O error: No such file ... (os error 2)"
    assert caught.value.filename == str(target) and type(caught.value.__cause__).__name__ == "SafetensorError"
    with pytest.raises(RuntimeError, match="^a bug$"), disk_errors_as_os_errors(target):
        raise RuntimeError("a bug")  # no OSError behind it: a bug keeps its traceback
