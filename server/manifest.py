"""Reading a written repository's manifest (`repository.MANIFEST`, written beside the configs by `write_repository`):
what `hub-vit serve --repository` serves, on which device, and whether it is what this hub-vit would write.

Messages name the command-line flags (`--name`, `--flavour cpu`, `--device cpu`): `serve --repository` is the only
caller, and its user fixes the problem with those flags.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hub_vit.server.device import DeviceChoice, cuda_device_name
from hub_vit.server.repository import MANIFEST, outdated_files


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of the repository in `folder`, None when it has none (a repository written by hand)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return None
    return json.loads(manifest.read_text(encoding="utf-8"))


def recorded_device(folder: Path) -> DeviceChoice:
    """The device and flavour a repository's manifest records (an unreadable one: the CPU flavour); ValueError for a
    cuda one where torch sees no CUDA device (its KIND_GPU instances would fail to load)."""
    try:
        options = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("options", {})
    except (OSError, ValueError, AttributeError):
        options = {}
    flavour, device = str(options.get("flavour", "cpu")), str(options.get("device", "cpu"))
    if device != "cuda":
        return DeviceChoice("cpu", flavour, "the CPU")
    name = cuda_device_name()
    if name is None:
        raise ValueError(f"{str(folder)!r} is a torch-flavour repository for device cuda, but torch sees no CUDA "
                         "device here; rebuild it with --device cpu, or serve it on a GPU host")
    return DeviceChoice("cuda", flavour, f"cuda:0 ({name})")


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
