"""What every bench/results JSON records about its run, and how the bench scripts write their results.

A result file that does not say which code, libraries, CPU and settings produced it cannot be told apart from a stale
one, so each script stores `run_info(args)` under the key "run". The scripts are started as
`.venv/bin/python bench/<script>.py`, which puts bench/ on sys.path: `from run_info import ...` works from there.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hub_vit.cgroup_limits import cpu_quota

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "numpy", "onnxruntime")  # every script's results depend on these


def package_version(name: str) -> str | None:
    """The installed distribution's version (None if it is not installed), without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state(repo: Path = REPO) -> dict[str, Any]:
    """HEAD of the checkout the scripts live in and whether the work tree differs from it (untracked files count:
    a new module changes what runs; the benches' own results under bench/results do not, or one run would mark
    every later one dirty). Both None outside a git checkout or without git."""
    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *cmd], capture_output=True, text=True, check=True,
                              timeout=30).stdout
    try:
        changes = git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
        return {"commit": git("rev-parse", "HEAD").strip(), "dirty": bool(changes.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def file_at(commit: str, path: str, repo: Path = REPO) -> str:
    """`path` as it was at `commit` (git show), for the A/B scripts that run a previous version next to today's; a
    copy without git or without that commit (shallow, exported) stops the script with a message that says so."""
    try:
        return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True,
                              check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        raise SystemExit(f"needs git and the commit {commit} ({path} as it was there): run it in a full clone") \
            from None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Server generations behind a model number (`cpu family` 6 for Intel): virtual machines often show only
# "Intel(R) Xeon(R) Processor", and the same flags (AMX) on two generations measured ratios apart
INTEL_FAMILY_6 = {85: "Skylake-SP / Cascade Lake", 106: "Ice Lake-SP", 143: "Sapphire Rapids", 207: "Emerald Rapids",
                  173: "Granite Rapids"}
AMD_FAMILIES = {23: "Zen / Zen 2", 25: "Zen 3 / Zen 4", 26: "Zen 5"}


def cpu_identity(cpuinfo: str | None = None) -> dict[str, Any]:
    """The first CPU's vendor, family, model and stepping numbers (from /proc/cpuinfo, or `cpuinfo` text), with the
    generation they name where it is known; {} where none can be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first CPU's block only
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    try:
        vendor, family, model = fields["vendor_id"], int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return {}
    names = INTEL_FAMILY_6 if vendor == "GenuineIntel" and family == 6 else {}
    generation = names.get(model) or (AMD_FAMILIES.get(family) if vendor == "AuthenticAMD" else None)
    return {"vendor": vendor, "family": family, "model_number": model,
            "stepping": int(fields["stepping"]) if fields.get("stepping", "").isdigit() else None,
            "generation": generation}


def repo_path(path: Path) -> str:
    """`path` relative to the repository when it lies inside it (a result records where in the tree it was written,
    not the checkout's location on the machine that ran it), else as given."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed options, JSON-safe (paths inside the repository relative to it, other objects as strings; lists,
    numbers and flags kept)."""
    def plain(value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return repo_path(value)
        return str(value)
    return {key: plain(value) for key, value in vars(args).items()}


def run_info(args: argparse.Namespace, packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """When, which hub-vit (version, commit, dirty), which library versions (`PACKAGES` + `packages`), which CPU
    (model name, `cpu_identity`, count, usable by affinity, the cgroup's quota in CPUs or None), and the script's argv
    and parsed settings, with the user's `--note` if one was given."""
    return {
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "hub_vit": {"version": package_version("hub-vit"), **git_state()},
        "versions": {"python": platform.python_version(), **{p: package_version(p) for p in PACKAGES + packages}},
        "cpu": {"model": cpu_model(), **cpu_identity(), "count": os.cpu_count(),
                "usable": len(os.sched_getaffinity(0)), "cgroup_quota": cpu_quota()},
        "platform": platform.platform(),
        "argv": sys.argv[1:],
        "settings": settings(args),
        "note": getattr(args, "note", None) or None,
    }


def add_note_option(parser: argparse.ArgumentParser) -> None:
    # No default text: a fixed "shared machine" string was recorded even for quiet runs and contradicted the docs.
    parser.add_argument("--note", default=None, help="free text about the host or the run, stored in the results")


def side_by_side_parser(doc: str | None, *, seconds: float, reverse_help: str, out: Path) -> argparse.ArgumentParser:
    """The command line the A/B scripts share (ab_layouts, ab_load_generator: a previous version measured next to
    today's, alternately): seconds per measurement, rounds, which version goes first, where the results go, a note."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=seconds, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reverse", action="store_true", help=reverse_help)
    parser.add_argument("--out", type=Path, default=out)
    add_note_option(parser)
    return parser


def check_writable(folder: Path) -> None:
    """Create `folder` and prove a file can be written there before measuring, so a bad --out fails at once
    instead of after a long run."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".bench-write-check-"):
            pass
    except OSError as exc:
        raise SystemExit(f"cannot write results to {folder}: {exc}") from exc


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON through a temp file and os.replace: a reader (or a Ctrl-C) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
