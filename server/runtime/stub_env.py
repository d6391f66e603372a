"""The Python environment of Triton's Python-backend stubs: this interpreter's own, or a view of it with numpy<2.

nvidia-pytriton's stub (Triton 2.51's Python backend) misreads TYPE_STRING tensors, the encoded images, under numpy 2:
it dies on the first image with "unpack_from requires a buffer of at least 1701143913 bytes" and the model never
loads. The stub's embedded Python does not read PYTHONPATH: it takes its whole environment from the `python3` first on
PATH (that file's folder, the `pyvenv.cfg` beside it, its site-packages and their `.pth` files). The launcher puts an
environment's `bin/` first on the server's PATH:

* this interpreter's own, when its numpy is older than 2 (`pip install hub-vit[serve]` gives numpy<2:
  nvidia-pytriton declares it);
* otherwise (a GPU host's torch and scipy need numpy 2) a virtual environment of the stubs' own, built here: its
  site-packages is a view of this interpreter's import path, made of symbolic links, entry by entry in path order
  (the first of a name wins, as imports resolve; namespace folders such as `nvidia/` are merged), with
  - the numpy<2 found in the folders of `$HUB_VIT_STUB_PYTHONPATH` put first, and
  - every distribution that requires a numpy the stubs' does not satisfy left out, with its files, and every one that
    requires one left out (scipy 1.18 needs numpy 2; scikit-learn needs scipy): transformers imports them when they
    are installed but skips them when they are not.

Nothing is installed: the view links to the files that are already there, costs milliseconds, and lives in the
server's temporary workspace.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import sysconfig
import venv
from dataclasses import dataclass, field
from pathlib import Path

from hub_vit.server.runtime.triton_install import ServerError, unservable_python

# Folders holding a numpy<2 for the stubs, where this environment keeps numpy 2 (scripts/gpu_check.sh sets it to the
# carried pack's `stub-site/`).
STUB_PYTHONPATH = "HUB_VIT_STUB_PYTHONPATH"
FIRST_NUMPY_2 = (2,)
# hub-vit itself stays in the view whatever it requires: its steps import numpy, torch or onnxruntime, Pillow and
# transformers, never scikit-learn (calibrate-domain's fit) or the export side's onnx
NEVER_LEFT_OUT = ("hub-vit",)


@dataclass(frozen=True)
class StubEnvironment:
    """Where the stubs' `python3` is (`bin_dir`, put first on the server's PATH) and which numpy they import."""

    bin_dir: Path
    numpy: str | None  # its version; None: no numpy at all (the stubs then fail to load, saying so)
    numpy_folder: Path | None = None  # the folder it comes from (None: this environment's own)
    left_out: tuple[str, ...] = field(default=())  # distributions not in the stubs' view, each "name version"


def stub_folders() -> list[Path]:
    return [Path(p) for p in os.environ.get(STUB_PYTHONPATH, "").split(os.pathsep) if p]


def _numpy_in(folders: list[str]) -> importlib.metadata.Distribution | None:
    return next(iter(importlib.metadata.distributions(name="numpy", path=folders)), None)


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


def import_path() -> list[Path]:
    """This interpreter's import path without the standard library: the folders the stubs' view is made of."""
    stdlib = {Path(sysconfig.get_path(key)).resolve() for key in ("stdlib", "platstdlib")}
    found = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if not path.is_dir() or path in stdlib or path.parent in stdlib and path.name == "lib-dynload":
            continue
        if path == Path.cwd().resolve() and entry in ("", "."):
            continue  # the caller's working folder is not part of an environment
        if path not in found:
            found.append(path)
    return found


def stub_environment(workspace: Path, python: tuple[int, int] = sys.version_info[:2]) -> StubEnvironment:
    """The stubs' environment for a server whose workspace is `workspace` (built there when this one's numpy is 2.x).
    ServerError, saying how to provide one, when numpy is 2.x here and no folder of $HUB_VIT_STUB_PYTHONPATH holds a
    numpy<2, or why there is none when Python `python` (this interpreter's) is too new for any numpy<2."""
    own = _numpy_in([str(p) for p in import_path()])
    if own is None or _major_minor(own.version) < FIRST_NUMPY_2:
        return StubEnvironment(Path(sys.executable).parent, None if own is None else own.version)
    for folder in stub_folders():
        numpy = _numpy_in([str(folder)])
        if numpy is not None and _major_minor(numpy.version) < FIRST_NUMPY_2:
            return build_view(workspace / "stub-env", folder, numpy.version)
    if (too_new := unservable_python(python)) is not None:  # no numpy<2 exists for this Python: say so instead
        raise ServerError(too_new)
    given = ", ".join(str(p) for p in stub_folders()) or "not set"
    raise ServerError(
        f"numpy {own.version} is installed here, but the Triton Python-backend stub shipped in nvidia-pytriton (Triton "
        f"2.51) misreads encoded-image (TYPE_STRING) inputs under numpy 2 and crashes. Either pip install 'numpy<2' "
        f"here (nvidia-pytriton requires it), or keep numpy 2 here and give the stubs a numpy<2 of their own: pip "
        f"install --target DIR 'numpy<2', then export {STUB_PYTHONPATH}=DIR (now: {given}; no numpy<2 found there)")


def build_view(target: Path, numpy_folder: Path, numpy_version: str) -> StubEnvironment:
    """A virtual environment at `target` whose site-packages is this interpreter's import path seen through links,
    with `numpy_folder`'s numpy (`numpy_version`, < 2) first and the distributions it cannot satisfy left out."""
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=True).create(target)
    site = target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    sources = [numpy_folder.resolve(), *import_path()]
    left_out, skipped = _left_out(sources, numpy_folder.resolve(), numpy_version)
    for source in sources:
        _link_entries(source, site, skipped.get(source, set()))
    bin_dir = target / "bin"
    return StubEnvironment(bin_dir, numpy_version, numpy_folder, tuple(left_out))


def _left_out(sources: list[Path], numpy_folder: Path, numpy_version: str
              ) -> tuple[list[str], dict[Path, set[str]]]:
    """Distributions the stubs must not see: any numpy but `numpy_folder`'s, those whose requirements exclude
    `numpy_version`, and, until none is added, those that require one left out (scikit-learn requires scipy: with
    scipy gone but sklearn still there, transformers 5.17 finds sklearn, imports it, and that import fails on scipy).
    Returns their "name version" and, per source folder, the top-level names of their files."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    found = []  # (source, distribution, canonical name, the names it requires, whether it excludes the stubs' numpy)
    for source in sources:
        for dist in importlib.metadata.distributions(path=[str(source)]):
            needs, excludes_numpy = set(), False
            for text in dist.requires or ():
                try:
                    requirement = Requirement(text)
                except InvalidRequirement:
                    continue
                if requirement.marker is not None:  # extras' and platform-conditional requirements do not bind here
                    continue
                needed = canonicalize_name(requirement.name)
                needs.add(needed)
                if needed == "numpy":
                    excludes_numpy |= not requirement.specifier.contains(numpy_version, prereleases=True)
            found.append((source, dist, canonicalize_name(dist.metadata["Name"] or ""), needs, excludes_numpy))
    dropped = {index for index, (source, _, name, _, excludes_numpy) in enumerate(found)
               if (source != numpy_folder if name == "numpy" else excludes_numpy)}
    gone = {found[i][2] for i in dropped} - {"numpy"}
    while True:  # what requires a distribution left out goes too, but hub-vit (what the steps run)
        more = {i for i, (_, _, name, needs, _) in enumerate(found)
                if i not in dropped and name not in ("numpy", *NEVER_LEFT_OUT) and needs & gone}
        if not more:
            break
        dropped |= more
        gone |= {found[i][2] for i in more}
    names, skipped = [], {}
    for index in sorted(dropped):
        source, dist, name, _, _ = found[index]
        if name != "numpy":
            names.append(f"{dist.metadata['Name']} {dist.version}")
        skipped.setdefault(source, set()).update(_top_level(dist))
    return sorted(names, key=str.lower), skipped


def _top_level(dist: importlib.metadata.Distribution) -> set[str]:
    """The first path component of every file a distribution installed (its packages, modules, `.libs` folder,
    `.dist-info`), as listed in its RECORD."""
    found = set()
    for file in dist.files or ():  # the .dist-info's own files are in RECORD too
        parts = Path(str(file)).parts
        if parts and parts[0] not in ("..", "/"):
            found.add(parts[0])
    return found


def _link_entries(source: Path, site: Path, skipped: set[str]) -> None:
    """Link each entry of `source` into `site` unless skipped or already there; a namespace folder (a package folder
    without `__init__.py`, such as `nvidia/`) already there is merged entry by entry."""
    for entry in sorted(source.iterdir()):
        if entry.name in skipped or entry.name == "__pycache__":
            continue
        link = site / entry.name
        if entry.suffix == ".pth" and entry.is_file():
            _copy_pth(entry, link)
        elif not link.exists() and not link.is_symlink():
            link.symlink_to(entry)
        elif _namespace(entry) and _namespace(link):
            if link.is_symlink():  # first seen in one source: becomes a folder holding both sources' entries
                first = link.resolve()
                link.unlink()
                link.mkdir()
                _link_entries(first, link, set())
            _link_entries(entry, link, set())


def _copy_pth(source: Path, target: Path) -> None:
    """A `.pth` file's `import` lines (an editable install's finder, setuptools' distutils hook); its folder lines are
    left out: every folder of this interpreter's import path is in the view already, and appended after it they
    would bring back what the view leaves out."""
    if target.exists():
        return
    lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    target.write_text("".join(line + "\n" for line in lines if line.startswith(("import ", "import\t"))),
                      encoding="utf-8")


def _namespace(path: Path) -> bool:
    return path.is_dir() and not path.name.endswith((".dist-info", ".egg-info", ".libs")) \
        and not (path / "__init__.py").exists()


__all__ = ["STUB_PYTHONPATH", "StubEnvironment", "build_view", "import_path", "stub_environment", "stub_folders"]
