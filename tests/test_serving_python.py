"""Which Python can serve: nvidia-pytriton's stubs (Triton 2.51) need numpy<2, which has no release for Python 3.13 or
later. Three places act on it and must agree with `NEWEST_SERVING_PYTHON` (server/runtime/triton_install.py): the
serve extra's marker (pip installs nvidia-pytriton only up to it), the Makefile's choice of interpreter, and serve's
refusal on a newer Python, given before anything is built.

was: on Python 3.13 (Debian 13's python3) `make serve` and `make test` stopped in pip with "ResolutionImpossible"
about numpy, and `pip install 'hub-vit[serve]'` could not even install the clients.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from typer.testing import CliRunner

from hub_vit.server.runtime import launcher, triton_install
from hub_vit.server.runtime.triton_install import (
    NEWEST_SERVING_PYTHON,
    ServerError,
    dotted,
    find_triton,
    unservable_python,
)

ROOT = Path(__file__).resolve().parents[1]
NEWEST = NEWEST_SERVING_PYTHON
TOO_NEW = (NEWEST[0], NEWEST[1] + 1)


def test_the_serve_extra_installs_nvidia_pytriton_only_where_it_can_serve():
    requirements = [Requirement(r) for r in importlib.metadata.requires("hub-vit") or []]
    pytriton = [r for r in requirements if r.name == "nvidia-pytriton"]
    assert len(pytriton) == 1 and pytriton[0].marker is not None, pytriton
    marker = pytriton[0].marker
    assert marker.evaluate({"python_version": dotted(NEWEST), "extra": "serve"})
    assert not marker.evaluate({"python_version": dotted(TOO_NEW), "extra": "serve"})
    clients = [r.name for r in requirements if r.marker is not None and r.marker.evaluate(
        {"python_version": dotted(TOO_NEW), "extra": "serve"})]
    assert {"tritonclient", "grpcio"} <= set(clients), clients  # the clients still come with the extra there


def test_a_too_new_python_is_named_with_the_way_out():
    assert unservable_python(NEWEST) is None and unservable_python((3, 11)) is None
    said = unservable_python(TOO_NEW)
    assert said is not None
    for part in (f"from Python {dotted(TOO_NEW)}", "numpy<2", f"only up to Python {dotted(NEWEST)}",
                 "nvcr.io/nvidia/tritonserver", "clients"):
        assert part in said, said


@pytest.mark.skipif(Path("/opt/tritonserver").exists(), reason="a system tritonserver is found first")
def test_without_the_wheel_a_too_new_python_is_told_why(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(triton_install.importlib.util, "find_spec",
                        lambda name, *args: None if name == "pytriton" else real_find_spec(name, *args))
    monkeypatch.setattr(triton_install.shutil, "which", lambda name, *args: None)
    with pytest.raises(ServerError) as too_new:
        find_triton(TOO_NEW)
    assert str(too_new.value) == unservable_python(TOO_NEW)
    with pytest.raises(ServerError, match=r"tritonserver not found: install the serve extra, which brings "
                                          r"nvidia-pytriton \(pip install '\.\[serve\]' in hub-vit's clone, or the "
                                          r"wheel built there with \[serve\]\)"):  # hub-vit is not on PyPI
        find_triton(NEWEST)


def test_serve_refuses_a_python_it_cannot_serve_from_before_building(monkeypatch):
    from hub_vit.cli import _load_commands, app

    def cannot(python: tuple[int, int] = TOO_NEW) -> triton_install.TritonInstall:
        raise ServerError(unservable_python(TOO_NEW) or "")

    monkeypatch.setattr(triton_install, "find_triton", cannot)
    monkeypatch.setattr(launcher, "find_triton", cannot)  # were the early check gone, the start would fail, later
    _load_commands()
    ports = [str(launcher.free_port()) for _ in range(3)]
    result = CliRunner().invoke(app, ["serve", "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port",
                                      ports[2]])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2 and f"cannot run Triton from Python {dotted(TOO_NEW)}" in flat, flat
    assert "building the Triton repository" not in flat, flat


@pytest.mark.parametrize(("flags", "named"), [
    (["--top-k", "0"], "--top-k"),
    (["--cpu-variant", "int3"], "--cpu-variant"),
    (["--device", "tpu"], "--device"),
    (["--repository", "no-such-folder"], "--repository"),
])
def test_serve_names_a_mistyped_option_before_a_missing_triton(monkeypatch, flags, named):
    """was: the Triton check came first, so a user without tritonserver fixed that only to learn of a typo."""
    from hub_vit.cli import _load_commands, app

    def missing(python: tuple[int, int] = NEWEST) -> triton_install.TritonInstall:
        raise ServerError("tritonserver not found: install the serve extra")

    monkeypatch.setattr(triton_install, "find_triton", missing)
    _load_commands()
    ports = [str(launcher.free_port()) for _ in range(3)]
    result = CliRunner().invoke(app, ["serve", "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port",
                                      ports[2], *flags])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2 and named in flat and "tritonserver not found" not in flat, flat


# -- the Makefile's interpreter ------------------------------------------------------------------------------------
def _interpreters(folder: Path, **versions: tuple[int, int]) -> Path:
    """Stand-ins for `python3`, `python3.12`, ... on an otherwise empty PATH: each runs this interpreter with its
    `sys.version_info` set to the given version, so the Makefile's own check decides."""
    folder.mkdir()
    for name, (major, minor) in versions.items():
        script = folder / name.replace("_", ".")
        script.write_text(
            "#!/bin/sh\n"
            f'[ "$1" = --version ] && {{ echo "Python {major}.{minor}.0"; exit 0; }}\n'
            f'[ "$1" = -c ] && exec {sys.executable} -c '
            f'"import sys; sys.version_info = ({major}, {minor}, 0, \'final\', 0); exec(sys.argv[1])" "$2"\n'
            f'echo "stand-in python {major}.{minor} ran: $*"\n')
        script.chmod(0o755)
    return folder


def _make(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    assert make is not None
    return subprocess.run([make, "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(folder), "HOME": str(folder.parent)})


def test_make_takes_python3_when_it_can_serve_else_a_python3_1x_that_can(tmp_path):
    venv = tmp_path / "v"
    fits = _interpreters(tmp_path / "fits", python3=NEWEST, python3_11=(3, 11))
    assert f"python3 -m venv {venv}" in _make(fits, "-n", "setup", f"VENV={venv}").stdout
    too_new = _interpreters(tmp_path / "too-new", python3=TOO_NEW, python3_11=(3, 11))
    shown = _make(too_new, "-n", "setup", f"VENV={venv}").stdout
    assert f"python3.11 -m venv {venv}" in shown and f"python3 -m venv {venv}" not in shown, shown


def test_make_setup_without_a_python_that_can_serve_says_which_it_needs(tmp_path):
    venv = tmp_path / "v"
    done = _make(_interpreters(tmp_path / "bin", python3=TOO_NEW), "setup", f"VENV={venv}")
    said = " ".join(done.stderr.split())
    assert done.returncode != 0 and not venv.exists(), done.stdout + done.stderr
    for part in (f"need Python 3.11 to {dotted(NEWEST)}", f"python3 is Python {dotted(TOO_NEW)}.0", "numpy<2",
                 "make PYTHON=python3.12 serve"):
        assert part in said, said
