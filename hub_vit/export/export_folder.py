"""An export owns its files in the output folder: when a run is done, the files an earlier export with the same stem
wrote there (its report and the graphs it lists) are replaced as a set, so no graph of another model is left beside
the new report. Other files in the folder are never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hub_vit.atomic import staging_dir
from hub_vit.export.metadata import REPORT_SUFFIX, engine_info
from hub_vit.openvino_runtime import ir_files


def writable_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out_dir, prefix=".probe-", delete=True)
        probe.close()
    except OSError as exc:
        raise PermissionError(f"cannot write to output folder {str(out_dir)!r}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def removed_if_left_empty(folder: Path, created: bool) -> Iterator[None]:
    try:
        yield
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise


# The name an export's work folders are named after, inside the output folder: `.hub-vit-export.tmp-<host>-<pid>-...`.
# Nothing of this name is ever written; one name for every stem, so any later export into the folder sweeps them.
STAGING_NAME = "hub-vit-export"


@contextlib.contextmanager
def staging_folder(out_dir: Path) -> Iterator[Path]:
    """An export's work folder inside `out_dir` (its graphs, built and staged), removed when the block ends.

    Named as `hub_vit.atomic` names every temporary folder, after its host and process: an export killed where no
    cleanup runs (SIGKILL, the OOM killer, a crash) leaves it behind, a copy of every graph it built (gigabytes for a
    ViT-B), and the next export into `out_dir` removes it (`staging_dir` sweeps first), never one of an export that is
    still running."""
    staging = staging_dir(out_dir / STAGING_NAME)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def files_of(graph: Path) -> list[Path]:
    """A written graph's files: the ONNX file, or an OpenVINO variant's IR pair and settings."""
    return ir_files(graph) if graph.suffix == ".xml" else [graph]


def previous_export_files(out_dir: str | Path, stem: str) -> list[Path]:
    """The files an earlier export with this stem left in `out_dir`: its report and the graphs it lists.

    Only what the report lists: a file merely named like a variant (`model.fp16.onnx` written by `--stem model.fp16`,
    or by hand) is not this stem's export. A listed file counts only if it is `<stem>.*.onnx` directly in `out_dir`,
    so an edited report cannot make an export delete an unrelated file.
    """
    out_dir = Path(out_dir)
    names = {f"{stem}{REPORT_SUFFIX}"}
    try:
        old = json.loads((out_dir / f"{stem}{REPORT_SUFFIX}").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    listed = old.get("variants") if isinstance(old, dict) else None
    for entry in listed if isinstance(listed, list) else []:
        name = Path(str(entry.get("file") or "") if isinstance(entry, dict) else "").name
        if name.startswith(f"{stem}.") and name.endswith(".onnx"):
            names.add(name)
        elif name.startswith(f"{stem}.") and name.endswith(".xml"):  # an OpenVINO variant: its three files
            names.update(p.name for p in ir_files(Path(name)))
    return sorted(p for p in (out_dir / n for n in names) if p.is_file())


def _engines_built_from(out_dir: Path, graphs: Sequence[str]) -> list[str]:
    """TensorRT engines in `out_dir` whose `<engine>.json` (`hub-vit export tensorrt`) names one of `graphs`."""
    stale = []
    for info_file in sorted(out_dir.glob("*.json")):
        engine = info_file.with_suffix("")
        info = engine_info(engine) if engine.is_file() else None
        if info and Path(str(info.get("onnx") or "")).name in graphs:
            stale.append(engine.name)
    return stale


def folders_in_the_way(out_dir: Path, names: Sequence[str]) -> None:
    """IsADirectoryError naming the first of `names` that is a folder in `out_dir`, where the export writes a file."""
    for name in names:
        if (out_dir / name).is_dir():
            raise IsADirectoryError(f"{str(out_dir / name)!r} is a folder where the export writes the file {name}: "
                                    "move it away or give another --out or --stem")


def replace_previous_export(staged: Path, out_dir: Path, stem: str, report: Any) -> None:
    """Move the staged graphs into `out_dir` in place of the earlier export's files, then write the report
    (`report.report_file`; its `removed` and `stale_engines` are filled in here).

    A graph of the earlier export that this run does not rewrite (not requested, or refused this time) would sit
    beside the new report, unlisted, and `hub-vit repository`/`serve` would take it for this model (a wrong graph,
    or Triton crashing on its input shape). The earlier report goes first and the new one comes last, so a report
    never lists the other export's files. Engines are only flagged: another command built them, at GPU cost.

    The new report is written in the staging folder before anything of the earlier export is touched: a disk that
    refuses it (full) leaves the earlier export whole; what follows are renames and deletions, which need no space.
    """
    report_path = Path(report.report_file)
    # a folder made meanwhile where a file goes: refused before anything of the earlier export is touched
    folders_in_the_way(out_dir, [*(p.name for p in staged.iterdir()), report_path.name])
    previous = previous_export_files(out_dir, stem)
    new = {p.name for p in staged.iterdir()}
    graphs = [p.name for p in previous if p != report_path]
    report.removed = [name for name in graphs if name not in new]
    report.stale_engines = _engines_built_from(out_dir, graphs)
    staged_report = staged.parent / report_path.name  # beside the staged graphs, not among them
    staged_report.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    report_path.unlink(missing_ok=True)
    for name in report.removed:
        (out_dir / name).unlink(missing_ok=True)
    for path in [*sorted(staged.iterdir()), staged_report]:  # the report last
        os.chmod(path, 0o644)  # served by other users; the staging folder's files may be 0600
        os.replace(path, out_dir / path.name)


__all__ = ["STAGING_NAME", "files_of", "folders_in_the_way", "previous_export_files", "removed_if_left_empty",
           "replace_previous_export", "staging_folder", "writable_dir"]
