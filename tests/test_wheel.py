"""hub-vit as `pip install hub-vit` gives it: the wheel built from a fresh copy of this checkout ships every tracked
file of its packages and nothing else, and installed outside the checkout its commands find their own data (the
shipped model, the Triton templates) where the README says they are.

The suite otherwise runs the editable install, which reads the checkout's folders directly: a new template folder left
out of pyproject.toml's package list, or code that reads a file by its place in the repository, passes there and fails
for everyone who installs the package.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.tracked_copy import REPO, tracked_copy

# the repository's folders and the packages they install as (pyproject.toml, [tool.setuptools] package-dir)
INSTALLED_AS = {"hub_vit": "hub_vit", "conversion": "hub_vit/conversion", "server": "hub_vit/server",
                "model_cards": "hub_vit/model_cards"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel` builds from the checkout's tracked files as they are now (no `build/` left over here)."""
    source = tracked_copy(tmp_path_factory.mktemp("source") / "hub-vit")
    # a checkout where a template or the remote code was imported once (PYTHONDONTWRITEBYTECODE unset): its caches
    # were shipped by the package-data globs
    for folder in ("server/repository/templates/common", "hub_vit/assets/digits"):
        (source / folder / "__pycache__").mkdir(exist_ok=True)
        (source / folder / "__pycache__" / "cached.cpython-311.pyc").write_bytes(b"\0")
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(dist), str(source)], check=True, capture_output=True, timeout=300)
    (built,) = dist.glob("hub_vit-*.whl")
    return built


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files", *INSTALLED_AS], cwd=REPO, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def test_the_wheel_ships_every_tracked_file_of_its_packages_and_nothing_else(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if ".dist-info/" not in name}
    expected = {INSTALLED_AS[top] + "/" + rest for top, rest in (path.split("/", 1) for path in _tracked())}
    assert sorted(expected - shipped) == [], "tracked but not in the wheel: list the folder in pyproject.toml"
    assert sorted(shipped - expected) == [], "in the wheel but not tracked"
    for folder in ("hub_vit/assets/digits/samples", "hub_vit/server/repository/templates/preprocess"):
        assert any(name.startswith(folder + "/") for name in shipped), folder  # the test itself sees the data


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed (not editable), its dependencies taken from this one's
    site-packages (a `.pth` file: the editable install's own `.pth` hook there is not run, so `hub_vit` is the
    wheel's). Returns its `bin` folder."""
    env = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "dependencies.pth").write_text("".join(f"{path}\n" for path in sorted(here)))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    return env / "bin"


def _run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd), "XDG_CACHE_HOME": str(cwd / "cache")}
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_installed_outside_the_checkout_the_commands_find_their_own_files(installed: Path, tmp_path: Path) -> None:
    # as the README says: the shipped model is `simplevit_digits`, its folder `hub_vit.default_model_folder()`
    found = _run(installed, tmp_path, "python", "-c", "import hub_vit, json; print(json.dumps("
                 "[hub_vit.__file__, str(hub_vit.default_model_folder())]))")
    assert found.returncode == 0, found.stderr
    package, folder = (Path(path) for path in json.loads(found.stdout))
    assert not package.is_relative_to(REPO) and folder.is_relative_to(package.parent), (package, folder)
    listed = _run(installed, tmp_path, "hub-vit", "models")
    assert listed.returncode == 0 and "simplevit_digits" in listed.stdout, listed.stderr
    sample = folder / "samples" / "3_0.png"
    rollout = _run(installed, tmp_path, "hub-vit", "rollout", str(sample), "-o", "out")
    assert rollout.returncode == 0, rollout.stderr
    assert (tmp_path / "out" / "3_0_rollout.png").is_file()
    written = _run(installed, tmp_path, "hub-vit", "repository", "models")  # the templates, from the installed wheel
    assert written.returncode == 0, written.stderr
    served = tmp_path / "models" / "vit_classifier" / "1"
    assert {"model.py", "imageprep.py", "protocol.py"} <= {path.name for path in served.iterdir()}, sorted(
        str(path.relative_to(tmp_path)) for path in (tmp_path / "models").rglob("*"))
