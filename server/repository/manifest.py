"""Reading a written repository's manifest (`writer.MANIFEST`, written beside the configs by `write_repository`): what
`hub-vit serve --repository` serves and whether it is what this hub-vit would write (the device it records:
`runtime.device.recorded_device`).

Messages name the command-line flags (`--name`, `--flavour cpu`, `--device cpu`): `serve --repository` is the only
caller, and its user fixes the problem with those flags.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hub_vit.server.repository.writer import MANIFEST, outdated_files


def model_configs(folder: Path) -> list[Path]:
    """The `<model>/config.pbtxt` files of the repository in `folder`, sorted. ValueError when `folder` is not a folder,
    holds no model, or has a folder without a config.pbtxt: tritonserver takes every folder of its repository for a
    model, fails to load that one ("Could not determine backend") and exits, after seconds of loading the others."""
    if not folder.is_dir():
        raise ValueError(f"repository {str(folder)!r} " + ("is not a folder" if folder.exists() else "does not exist"))
    configs = sorted(folder.glob("*/config.pbtxt"))
    if not configs:
        raise ValueError(f"repository {str(folder)!r} holds no model (no <model>/config.pbtxt)")
    strays = sorted(path.name for path in folder.iterdir() if path.is_dir() and not (path / "config.pbtxt").is_file())
    if strays:
        listed = ", ".join(repr(name) for name in strays)
        raise ValueError(f"repository {str(folder)!r} has {'folders' if len(strays) > 1 else 'a folder'} without a "
                         f"config.pbtxt ({listed}): tritonserver would take {'each' if len(strays) > 1 else 'it'} for "
                         "a model and fail to start")
    return configs


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of the repository in `folder`, None when it has none (a repository written by hand)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return None
    return json.loads(manifest.read_text(encoding="utf-8"))


def served_name(folder: Path, name: str, default_name: str) -> tuple[str, dict[str, Any] | None]:
    """(the ensemble's name, the manifest) of the repository in `folder`: the manifest's model, else `name`.
    ValueError for a `--name` other than the manifest's, and for a GPU-flavour repository (the local tritonserver
    has only the Python backend)."""
    written = read_manifest(folder)
    if written is None:
        return name, None
    if name != default_name and name != written["model"]:
        raise ValueError(f"--name {name!r}: the repository serves {written['model']!r} (its manifest says so)")
    if written.get("options", {}).get("flavour") == "gpu":
        raise ValueError(f"{str(folder)!r} is a GPU-flavour repository (ONNX Runtime / TensorRT backends, KIND_GPU); "
                         "the local tritonserver has only the Python backend: regenerate it with --flavour cpu, or "
                         "serve it with the Dockerfile's image on a GPU host")
    return str(written["model"]), written


def outdated_warning(folder: Path, manifest: dict[str, Any]) -> str | None:
    """`serve --repository` serves what the folder holds: why that is not what this hub-vit would write for the same
    model and options (a repository written by an earlier version lacks its later fixes), or None when it is."""
    from hub_vit import __version__

    outdated = outdated_files(folder)
    if not outdated:
        return None
    shown = ", ".join(outdated[:3]) + (f" and {len(outdated) - 3} more" if len(outdated) > 3 else "")
    writer = f"hub-vit {manifest['hub_vit_version']}" if "hub_vit_version" in manifest else "an earlier hub-vit"
    return (f"{folder} is not what this hub-vit ({__version__}) writes for its model and options (written by "
            f"{writer}, or edited since): {shown} {'differs' if len(outdated) == 1 else 'differ'}. It is served as it "
            f"is; rebuild it with `hub-vit repository` (its {MANIFEST} records the model and options) to serve this "
            "version's configs and server code")


def cpu_variant_line(folder: Path) -> str | None:
    """'CPU variant: NAME (reason)' from a repository's manifest (`server/repository/cpu_variant.py` records it); None
    when it records none (another flavour, or a repository without a manifest)."""
    try:
        recorded = (read_manifest(folder) or {}).get("cpu_variant")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(recorded, dict):
        return None
    return f"CPU variant: {recorded.get('variant')} ({recorded.get('reason')})"
