"""The Makefile, run with real `make` against stand-ins: interpreters that report a chosen Python version and a
`.venv` of stand-ins. What each test pins is what a user of `make setup` or `make serve` sees: which of the three
Python problems it is (missing, too old, too new), a PYTHON= that an existing `.venv` would silently ignore, and where
torch comes from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="GNU make is not installed")


def _interpreter(folder: Path, name: str, version: tuple[int, int]) -> Path:
    """A stand-in `name` on `folder`: runs this interpreter with `sys.version_info` set to `version`, so the
    Makefile's own checks decide; `--version` answers as Python does."""
    folder.mkdir(parents=True, exist_ok=True)
    major, minor = version
    script = folder / name
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --version ] && {{ echo "Python {major}.{minor}.0"; exit 0; }}\n'
        f'[ "$1" = -c ] && exec {sys.executable} -c '
        f'"import sys; sys.version_info = ({major}, {minor}, 0, \'final\', 0); exec(sys.argv[1])" "$2"\n'
        "exit 99\n")
    script.chmod(0o755)
    return script


def _make(path: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """`make -C <repo> args` with PATH set to `path` alone (the stand-ins; make's recipes run /bin/bash by path)."""
    assert MAKE is not None
    return subprocess.run([MAKE, "-C", str(ROOT), "--no-print-directory", *args], capture_output=True, text=True,
                          timeout=timeout_s, env={"PATH": path, "HOME": path})


def _flat(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + done.stderr).split())


# -- setup's Python check ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("version", "said", "not_said"), [
    ((3, 10), "python3.10 is Python 3.10.0: hub-vit needs Python 3.11 or later", "numpy<2"),
    ((3, 13), "python3.13 is Python 3.13.0: the tritonserver they run (nvidia-pytriton, Triton 2.51) has "
              "Python-backend stubs that need numpy<2, which has no release for Python 3.13 or later",
     "3.11 or later"),
], ids=["too-old", "too-new"])
def test_setup_says_whether_the_python_named_is_too_old_or_too_new(tmp_path, version, said, not_said):
    # was: a Python 3.10 was refused with the numpy<2 reason, which is about 3.13 and later
    name = f"python{version[0]}.{version[1]}"
    bin_dir = tmp_path / "bin"
    _interpreter(bin_dir, name, version)
    venv = tmp_path / "v"
    done = _make(str(bin_dir), "setup", f"PYTHON={name}", f"VENV={venv}")
    flat = _flat(done)
    assert done.returncode != 0 and not venv.exists(), flat
    assert f"need Python 3.11 to 3.12, and {said}. Install one (uv python install 3.12, or pyenv)" in flat, flat
    assert "make PYTHON=python3.12 serve" in flat and not_said not in flat, flat


def test_setup_names_a_python_that_is_not_there(tmp_path):
    # was: "/bin/bash: line 1: python3.99: command not found" and "python3.99 is /bin/bash: line 1: ...: the
    # tritonserver ..." (the numpy<2 reason, for an interpreter that does not exist)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    venv = tmp_path / "v"
    done = _make(str(bin_dir), "setup", "PYTHON=python3.99", f"VENV={venv}")
    flat = _flat(done)
    assert done.returncode != 0 and not venv.exists(), flat
    assert "and python3.99 was not found. Install one (uv python install 3.12, or pyenv) and name it: make " \
           "PYTHON=python3.12 serve" in flat, flat
    assert "command not found" not in flat and "numpy" not in flat, flat


def test_setup_shows_why_a_python_on_path_did_not_run(tmp_path):
    """A pyenv shim of a version the directory has not selected is on PATH but does not run: pyenv's first line
    says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python3.12"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\necho >&2\n"
                    "echo \"The \\`python3.12' command exists in these Python versions:\" >&2\nexit 127\n")
    shim.chmod(0o755)
    done = _make(str(bin_dir), "setup", "PYTHON=python3.12", f"VENV={tmp_path / 'v'}")
    flat = _flat(done)
    assert done.returncode != 0, flat
    assert "and python3.12 did not run (pyenv: python3.12: command not found). Install one" in flat, flat
    assert "exists in these" not in flat and "numpy" not in flat, flat


# -- PYTHON= against an existing .venv -----------------------------------------------------------------------------
def _existing_venv(tmp_path: Path, version: tuple[int, int]) -> Path:
    """A made `.venv` (both of setup's stamps newer than pyproject.toml) whose python is a stand-in of `version`."""
    venv = tmp_path / "venv"
    _interpreter(venv / "bin", "python", version)
    (venv / "numpy2").mkdir()
    later = time.time() + 3600  # newer than pyproject.toml, however recently that was edited
    for stamp in (venv / ".installed", venv / "numpy2" / ".installed"):
        stamp.touch()
        os.utime(stamp, (later, later))
    return venv


@pytest.mark.parametrize(("python", "version", "is_said"), [
    ("python3.12", (3, 12), "is Python 3.12"),
    ("python3.99", None, "is not found"),
], ids=["another-version", "not-found"])
def test_a_python_named_on_the_command_line_that_is_not_the_venvs_is_refused(tmp_path, python, version, is_said):
    # was: `make PYTHON=python3.12 serve` went on with the existing .venv and its Python 3.11, saying nothing
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if version is not None:
        _interpreter(bin_dir, python, version)
    venv = _existing_venv(tmp_path, (3, 11))
    done = _make(str(bin_dir), "setup", f"PYTHON={python}", f"VENV={venv}")
    flat = _flat(done)
    assert done.returncode != 0, flat
    assert f"the existing {venv} uses Python 3.11, and PYTHON={python} {is_said}: make keeps an existing {venv} as " \
           f"it is. Run make clean first to make it anew with {python}, or leave PYTHON= out to use it." in flat, flat


def test_the_venvs_own_python_or_none_named_goes_on(tmp_path):
    bin_dir = tmp_path / "bin"
    _interpreter(bin_dir, "python3.11", (3, 11))
    _interpreter(bin_dir, "python3", (3, 13))  # what make would pick for itself does not matter once .venv exists
    venv = _existing_venv(tmp_path, (3, 11))
    for named in (["PYTHON=python3.11"], []):
        done = _make(str(bin_dir), "setup", *named, f"VENV={venv}")
        assert done.returncode == 0, _flat(done)


# -- torch from another index --------------------------------------------------------------------------------------
def test_torch_index_url_installs_torch_from_it_first(tmp_path):
    bin_dir = tmp_path / "bin"
    _interpreter(bin_dir, "python3", (3, 12))
    venv = tmp_path / "v"
    url = "https://download.pytorch.org/whl/cpu"
    shown = _make(str(bin_dir), "-n", "setup", f"VENV={venv}", f"TORCH_INDEX_URL={url}").stdout.splitlines()
    torch_line = f"{venv}/bin/python -m pip install --quiet --index-url {url} torch torchvision"
    assert torch_line in shown, shown
    assert shown.index(torch_line) < shown.index(f"{venv}/bin/python -m pip install --quiet -e '.[all]'"), shown
    default = _make(str(bin_dir), "-n", "setup", f"VENV={venv}").stdout
    assert "--index-url" not in default and "torchvision" not in default, default  # unset: pip's own index, as before


# -- make serve ----------------------------------------------------------------------------------------------------
