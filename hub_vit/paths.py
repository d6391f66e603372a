"""Paths the user gives and shows: the image files of a folder, and short names for paths shown side by side (the
demo's model picker, `hub-vit classify`'s table). Standard library only: the client commands start without torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass
class ListedImages:
    """What a command reads (`files`, in order) and the images its folders held in formats it does not read
    (`other_formats`: by name, left out and named in a note)."""

    files: list[Path]
    other_formats: list[Path] = field(default_factory=list)


def _listed(folder: Path, suffixes: Sequence[str], others: Mapping[str, str], leave_out: Path | None,
            ) -> tuple[list[Path], list[Path], int]:
    """`folder`'s files of `suffixes` and of `others`' suffixes, sorted, neither hidden nor under `leave_out`, and the
    count of those left out as hidden or under `leave_out`."""
    skipped = leave_out.resolve() if leave_out is not None else None
    named = sorted(p for p in folder.rglob("*") if p.is_file() and (p.suffix.lower() in suffixes
                                                                    or p.suffix.lower() in others))
    kept = [p for p in named if not any(part.startswith(".") for part in p.relative_to(folder).parts)
            and (skipped is None or not p.resolve().is_relative_to(skipped))]
    files = [p for p in kept if p.suffix.lower() in suffixes]
    return files, [p for p in kept if p.suffix.lower() not in suffixes], len(named) - len(kept)


def folder_images(folder: str | Path, flag: str, suffixes: Sequence[str], leave_out: Path | None = None,
                  others: Mapping[str, str] | None = None) -> ListedImages:
    """The image files of `folder` and its subfolders, sorted: those whose suffix is one of `suffixes`
    (`hub_vit.image_formats.SUFFIXES`, or `OWN_FILE_SUFFIXES` where the user's own files are read), and apart those of
    `others` (suffix -> format name, `hub_vit.image_formats.OTHER_SUFFIXES`: images of formats not read). Hidden files
    and folders are left out: a zip made on a Mac unpacks `__MACOSX/._photo.jpg` (not an image) beside each photo,
    Jupyter keeps `.ipynb_checkpoints/`. So is `leave_out` (a command's output folder inside `folder`: its overlays are
    not its input the next time). NotADirectoryError naming `flag` for a file, FileNotFoundError for a folder that
    does not exist, ValueError for one without images (naming the images of other formats it holds)."""
    folder = Path(folder)
    if folder.is_file():
        raise NotADirectoryError(f"{flag} {str(folder)!r} is a file; give a folder of images")
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {str(folder)!r} does not exist")
    others = {suffix: name for suffix, name in (others or {}).items() if suffix not in suffixes}
    files, other_formats, hidden = _listed(folder, suffixes, others, leave_out)
    if not files:
        besides = f" besides {hidden} hidden or in the output folder" if hidden else ""
        kinds = _kinds(other_formats, others)
        them = "them" if len(other_formats) > 1 else "it"
        held = f"; it holds {len(other_formats)} {kinds} (convert {them} to one of these)" if other_formats else ""
        raise ValueError(f"image folder {str(folder)!r} has no {'/'.join(suffixes)} files{besides}{held}")
    return ListedImages(files, other_formats)


def image_files(folder: str | Path, flag: str, suffixes: Sequence[str], leave_out: Path | None = None,
                others: Mapping[str, str] | None = None, taken: str = "") -> list[Path]:
    """`folder_images`' files, for readers of the user's own folders (calibration and verification images). A folder
    that also holds images of `others`' formats is refused (ValueError naming them; `taken`: the formats read, as
    people write them): a score fitted, or a graph judged, on part of the folder the user gave is not what was asked
    for, as `hub-vit train` refuses a file it cannot read."""
    listed = folder_images(folder, flag, suffixes, leave_out, others)
    if listed.other_formats:
        many = len(listed.other_formats) > 1
        them = "them" if many else "it"
        raise ValueError(f"{flag} {str(folder)!r} holds {len(listed.other_formats)} "
                         f"{_kinds(listed.other_formats, others or {})} that {'are' if many else 'is'} not read: "
                         f"{first_few(listed.other_formats)}; convert {them} to {taken}, or move {them} out of the "
                         "folder")
    return listed.files


def with_folders_listed(paths: Sequence[Path], suffixes: Sequence[str], leave_out: Path | None = None,
                        others: Mapping[str, str] | None = None) -> ListedImages:
    """`paths` in order, each folder replaced by its image files (`folder_images`: subfolders too, sorted; hidden ones
    and `leave_out`, the command's output folder, left out; ValueError for a folder without any), so a command given
    `photos/` classifies what is in it, and `hub-vit rollout .` run twice does not take its own overlays in `out/` for
    photos. Files are kept as given, also ones of other formats: the image's own error names them. A folder's images
    of `others`' formats are left out and listed in `other_formats`."""
    listed = ListedImages([])
    for path in paths:
        if Path(path).is_dir():
            found = folder_images(path, "an image argument", suffixes, leave_out, others)
            listed.files.extend(found.files)
            listed.other_formats.extend(found.other_formats)
        else:
            listed.files.append(Path(path))
    return listed


def left_out_note(other_formats: Sequence[Path], others: Mapping[str, str], taken: str, shown: int = 3) -> str:
    """One line for the images of other formats a folder held: how many, which formats, the first `shown` of them,
    and what to do (`taken`: the formats read, as people write them)."""
    them = "them" if len(other_formats) > 1 else "it"
    return (f"left out {len(other_formats)} {_kinds(other_formats, others)}: {first_few(other_formats, shown)}; "
            f"convert {them} to {taken} to include {them}")


def listed(names: Sequence[str], most: int = 5) -> str:
    """`a, b, c, d, e, ...`: the first `most` of `names`, an ellipsis for the rest (what a folder holds, a head's
    labels, in one line)."""
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def first_few(paths: Sequence[Path | str], shown: int = 3) -> str:
    """`a.heic, b.heic, c.heic and 2 more`: the first `shown` of `paths` (a note stays one readable line for a folder
    of thousands)."""
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(str(path) for path in paths[:shown]) + more


def _kinds(paths: Sequence[Path], others: Mapping[str, str]) -> str:
    """`GIF / TIFF images`: the formats of `paths`, in first-seen order, as in "left out 2 GIF / TIFF images"."""
    kinds = " / ".join(dict.fromkeys(others.get(path.suffix.lower(), path.suffix) for path in paths))
    return f"{kinds} image{'s' if len(paths) != 1 else ''}"
