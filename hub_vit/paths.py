"""Paths the user gives and shows: the image files of a folder, and short names for paths shown side by side (the
demo's model picker, `hub-vit classify`'s table). Standard library only: the client commands start without torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def distinct_names(paths: Sequence[Path]) -> list[str]:
    """The shortest trailing part of each path that tells it apart from the others: `model` alone; `d2/model` and
    `ft/model` for two training runs' folders (the same rule for every clashing path, not the full path for the
    second one). The same path given twice gets the same name."""
    unique = list(dict.fromkeys(paths))
    depth = dict.fromkeys(unique, 1)
    while True:
        names = {path: str(Path(*path.parts[-depth[path]:])) for path in unique}  # "/model", not "//model"
        clashing = [path for path in unique if depth[path] < len(path.parts)
                    and sum(names[other] == names[path] for other in unique) > 1]
        if not clashing:
            return [names[path] for path in paths]
        for path in clashing:
            depth[path] += 1


def image_files(folder: str | Path, flag: str, suffixes: Sequence[str], leave_out: Path | None = None) -> list[Path]:
    """The image files of `folder` and its subfolders, sorted: those whose suffix is one of `suffixes`
    (`hub_vit.image_formats.SUFFIXES`, or `OWN_FILE_SUFFIXES` where the user's own files are read). Hidden files and
    folders are left out: a zip made on a Mac unpacks `__MACOSX/._photo.jpg` (not an image) beside each photo, Jupyter
    keeps `.ipynb_checkpoints/`. So is `leave_out` (a command's output folder inside `folder`: its overlays are not
    its input the next time). NotADirectoryError naming `flag` for a file, FileNotFoundError for a folder that does
    not exist, ValueError for one without images."""
    folder = Path(folder)
    if folder.is_file():
        raise NotADirectoryError(f"{flag} {str(folder)!r} is a file; give a folder of images")
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {str(folder)!r} does not exist")
    skipped = leave_out.resolve() if leave_out is not None else None
    named = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    files = [p for p in named if not any(part.startswith(".") for part in p.relative_to(folder).parts)
             and (skipped is None or not p.resolve().is_relative_to(skipped))]
    if not files:
        besides = f" besides {len(named)} hidden or in the output folder" if named else ""
        raise ValueError(f"image folder {str(folder)!r} has no {'/'.join(suffixes)} files{besides}")
    return files


def with_folders_listed(paths: Sequence[Path], suffixes: Sequence[str], leave_out: Path | None = None) -> list[Path]:
    """`paths` in order, each folder replaced by its image files (`suffixes`; subfolders too, sorted; hidden ones and
    `leave_out`, the command's output folder, left out; `image_files`: ValueError for a folder without any), so a
    command given `photos/` classifies what is in it, and `hub-vit rollout .` run twice does not take its own overlays
    in `out/` for photos. Files are kept as given, also ones of other formats: the image's own error names them."""
    files: list[Path] = []
    for path in paths:
        files += image_files(path, "an image argument", suffixes, leave_out) if Path(path).is_dir() else [Path(path)]
    return files
