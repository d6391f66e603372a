"""A disk that refuses a write once the work is under way (full, over quota, a file-size limit) ends the command with
one line naming the folder and the system's reason (exit 1), and leaves nothing half-written.

The refusals are real. Either the command runs in a process whose file-size limit (RLIMIT_FSIZE) is below the size of
the file it writes, so the kernel fails that write with EFBIG ("File too large") inside the writing library, as a full
disk fails it with ENOSPC; or the output is on a small tmpfs that fills up (where this machine may mount one).
safetensors reported the refusal as a SafetensorError, torch.save and OpenVINO's IR writer as "basic_ios::clear:
iostream error", none an OSError: `calibrate-domain` and `train` ended in a traceback, and `export onnx` reported the
OpenVINO variant as failed, wrote its report anyway and replaced the earlier export. `convert`'s own handling of the
same refusal is in test_conversion_cli.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hub_vit.catalog import default_model_folder
from hub_vit.domain import DOMAIN_FILE, STATISTICS_FILE
from tests.programs import HUB_VIT
from tests.test_train_cli import QUICK
from tests.test_train_loop import make_folder


def _run_with_file_limit(limit_bytes: int, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`hub-vit ARGS` in a process that may not write a file past `limit_bytes`: (exit code, output on one line)."""
    def limit() -> None:  # in the child, before exec: ignored SIGXFSZ makes the write fail with EFBIG, not kill
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    done = subprocess.run([*HUB_VIT, *args], capture_output=True, text=True, timeout=600, preexec_fn=limit,
                          env=None if env is None else os.environ | env)
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


def test_serve_names_the_temporary_folder_its_disk_refused(tmp_path: Path) -> None:
    # was `error: No space left on device`, naming nothing: the repository is written in $TMPDIR, before Triton starts
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    code, text = _run_with_file_limit(100_000, "serve", "--http-port", "18411", "--grpc-port", "18412",
                                      "--metrics-port", "18413", env={"TMPDIR": str(temporary)})
    assert code == 1, text
    assert (f"error: cannot write the Triton repository in the temporary folder '{temporary}': File too large; make "
            "room there, or set TMPDIR to a folder on a disk with room") in text, text
    assert not [p for p in temporary.iterdir() if p.name.startswith("hub-vit-serve-")]  # the repository is removed


def test_repository_names_its_folder_when_the_disk_refuses_it(tmp_path: Path) -> None:
    # was `No space left on device: '<OUT's hidden staging folder>/vit_classifier/1/model_attentions.onnx' (from ...)`
    out = tmp_path / "repo"
    code, text = _run_with_file_limit(100_000, "repository", str(out))
    assert code == 1, text
    assert f"error: cannot write the Triton repository to '{out}': File too large; nothing was written" in text, text
    assert list(tmp_path.iterdir()) == []


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
    from safetensors.numpy import save_file

    from hub_vit.atomic import disk_errors_as_os_errors

    target = tmp_path / "gone" / "x.safetensors"
    with pytest.raises(FileNotFoundError) as caught, disk_errors_as_os_errors(target):
        save_file({"a": np.zeros(2)}, str(target))  # SafetensorError "I/O error: No such file ... (os error 2)"
    assert caught.value.filename == str(target) and type(caught.value.__cause__).__name__ == "SafetensorError"
    with pytest.raises(RuntimeError, match="^a bug$"), disk_errors_as_os_errors(target):
        raise RuntimeError("a bug")  # no OSError behind it: a bug keeps its traceback


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for the test (skipped where this machine may not mount one)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as file:
        try:
            while True:
                file.write(b"\0" * 65_536)
                file.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def _earlier_export(out: Path) -> dict[str, bytes]:
    """A small earlier export of an OpenVINO variant in `out`: its report and the three files the report lists."""
    out.mkdir()
    files = [out / f"model.openvino-fp32.{suffix}" for suffix in ("xml", "bin", "json")]
    for path in files:
        path.write_bytes(f"earlier {path.name}".encode())
    (out / "model.export.json").write_text(json.dumps({"variants": [{"file": str(files[0])}]}))
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_export_on_a_filling_disk_stops_and_keeps_the_earlier_export(small_disk: Path) -> None:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    out = small_disk / "exports"
    before = _earlier_export(out)
    _load_commands()
    # the digits model's fp32 graphs (about 0.85 MB each) fit in the staging folder; its OpenVINO IR does not
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v",
                                      "openvino-fp32", "--random-inputs", "4", "--photos", "4"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    assert f"error: cannot write the export to '{out}': No space left on device" in text, text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no staging folder left, nothing replaced


def test_a_report_the_disk_refuses_leaves_the_earlier_export_whole(small_disk: Path) -> None:
    from hub_vit.export.export_folder import replace_previous_export
    from hub_vit.export.variants import ExportReport

    out = small_disk / "exports"
    before = _earlier_export(out)
    staged = out / ".export-test" / "staged"
    staged.mkdir(parents=True)
    (staged / "model.onnx").write_bytes(b"new graph")
    report = ExportReport(source={}, out_dir=str(out), settings={}, environment={}, variants=[],
                          report_file=str(out / "model.export.json"), model={"labels": ["x"] * 100_000})
    # the report (about 0.6 MB) is more than deleting the earlier export's files frees
    _fill(small_disk)
    with pytest.raises(OSError) as refused:
        replace_previous_export(staged, out, "model", report)
    assert refused.value.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")} == before


def test_an_openvino_write_on_a_full_disk_is_an_os_error(small_disk: Path) -> None:
    import openvino as ov

    from hub_vit.export.openvino_build import save

    parameter = ov.opset13.parameter([1, 64], ov.Type.f32)
    weights = ov.opset13.constant(np.ones((64, 4096), np.float32))  # 1 MiB of weights
    model = ov.Model([ov.opset13.matmul(parameter, weights, False, False)], [parameter])
    _fill(small_disk)
    with pytest.raises(OSError) as refused:  # was RuntimeError("basic_ios::clear: iostream error")
        save(model, small_disk / "m.xml", {})
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(small_disk / "m.xml")
