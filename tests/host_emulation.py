"""A GPU host's Python environment, emulated on any CPU host: a main environment whose numpy is 2.x.

The lent GPU hosts run hub-vit from an environment with numpy 2 (their torch, scipy and transformers need it), while
the Triton stub shipped in nvidia-pytriton needs numpy<2. `emulated_host` builds such a main environment from this
one without installing anything into it: a virtual environment whose path puts a numpy 2 folder (`numpy2_folder`)
before this interpreter's own import path (its site-packages and whatever else is on it), and which runs those
folders' `.pth` import lines (the editable install of hub-vit). `numpy1_folder` is what a GPU host carries for the
stubs: a folder holding only a numpy<2 (here, links to this environment's own).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import numpy as np

NUMPY2 = "numpy>=2,<3"
# Built by `make setup` (Makefile: .venv/numpy2); a run without it builds it once from the package index
NUMPY2_FOLDER = Path(os.environ.get("HUB_VIT_NUMPY2_FOLDER", Path(sys.prefix) / "numpy2"))


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def numpy2_folder() -> Path:
    """A folder holding numpy 2.x only (`pip install --target`), made once."""
    if not any(NUMPY2_FOLDER.glob("numpy-2.*.dist-info")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                        str(NUMPY2_FOLDER), NUMPY2], check=True)
    return NUMPY2_FOLDER


def numpy1_folder(target: Path) -> Path:
    """A folder holding only this environment's numpy (1.x): links to its package, libraries and metadata."""
    assert int(np.__version__.split(".")[0]) < 2, f"this environment's numpy is {np.__version__}, not 1.x"
    own = Path(np.__file__).parent.parent
    target.mkdir(parents=True)
    for entry in own.iterdir():
        if entry.name == "numpy" or entry.name.startswith(("numpy-", "numpy.libs")):
            (target / entry.name).symlink_to(entry)
    return target


def layered_environment(target: Path, first: list[Path] | tuple[Path, ...] = ()) -> Path:
    """A virtual environment at `target` whose import path is `first`, then this interpreter's (its site-packages and
    whatever else is on it), and which runs those folders' `.pth` import lines (an editable install's finder); nothing
    is installed into this environment, and what is installed into the new one stays there. Returns its `python`.
    (scripts/gpu_check.sh installs hub-vit into such an environment on top of a GPU host's own.)"""
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=True).create(target)
    stdlib = Path(sysconfig.get_path("stdlib")).resolve()
    own = [Path(entry).resolve() for entry in sys.path[1:] if entry and Path(entry).is_dir()]
    own = [path for path in dict.fromkeys(own) if not path.is_relative_to(stdlib)]  # site-packages, PYTHONPATH
    (site_packages(target) / "00-host.pth").write_text("".join(f"{path}\n" for path in [*first, *own]),
                                                       encoding="utf-8")
    imports = [line for folder in own for pth in sorted(folder.glob("*.pth"))
               for line in pth.read_text(encoding="utf-8").splitlines() if line.startswith("import ")]
    (site_packages(target) / "01-host-imports.pth").write_text("".join(f"{line}\n" for line in imports),
                                                             encoding="utf-8")
    return target / "bin" / "python"


def emulated_host(target: Path) -> Path:
    """A virtual environment at `target` whose numpy is 2.x and which otherwise imports this environment's packages;
    returns its `python`."""
    return layered_environment(target, [numpy2_folder()])


if __name__ == "__main__":  # python tests/host_emulation.py TARGET: a layered environment at TARGET (no numpy 2)
    print(layered_environment(Path(sys.argv[1])))
