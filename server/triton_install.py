"""Finding a runnable tritonserver: the nvidia-pytriton wheel's binary and its Python-backend stub for this
interpreter (or a system install), the numpy the stubs will import, and whether the host has an NVIDIA driver."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


class ServerError(RuntimeError):
    """tritonserver could not be found, did not become ready, or died."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    python_backend: Path  # folder with libtriton_python.so + triton_python_backend_utils.py
    stub: Path | None  # the stub for this interpreter (None: the backend folder already has one)
    libs: tuple[Path, ...]


def find_triton() -> TritonInstall:
    """Locate tritonserver: the nvidia-pytriton wheel first, then a system install (`/opt/tritonserver`)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # Find the wheel's files without importing `pytriton`: its __init__ imports PyTriton's own client stack (zmq,
    # sh, wrapt, ...), which serving the binary does not need and which may be missing or broken.
    spec = importlib.util.find_spec("pytriton")
    if spec is not None and spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations)))
        root = package / "tritonserver"
        stubs = root / "python_backend_stubs"
        binary, stub = root / "bin" / "tritonserver", stubs / version / "triton_python_backend_stub"
        if binary.is_file():
            if not stub.is_file():
                found = sorted(p.parent.name for p in stubs.glob("*/triton_python_backend_stub"))
                raise ServerError(f"nvidia-pytriton has no Python backend stub for Python {version}; "
                                  f"stubs exist for: {', '.join(found) or 'none'}")
            check_stub_numpy()
            libs = package.parent / "nvidia_pytriton.libs"
            return TritonInstall(binary, root / "backends" / "python", stub, (libs,))
    system = Path("/opt/tritonserver")
    binary = Path(shutil.which("tritonserver") or system / "bin" / "tritonserver")
    if binary.is_file():
        return TritonInstall(binary, system / "backends" / "python", None, (system / "lib",))
    raise ServerError("tritonserver not found: install the serve extra (pip install 'hub-vit[serve]', which brings "
                      "nvidia-pytriton) or run inside an nvcr.io/nvidia/tritonserver container")


# Folders put first on the Python path of the server's stubs only: where hub-vit's own environment must keep numpy 2
# (a GPU host's torch), a numpy<2 for the stubs goes into a folder of its own, named here (scripts/gpu_check.sh).
STUB_PYTHONPATH = "HUB_VIT_STUB_PYTHONPATH"


def stub_path() -> list[Path]:
    return [Path(p) for p in os.environ.get(STUB_PYTHONPATH, "").split(os.pathsep) if p]


def installed_numpy() -> str | None:
    """The numpy the stubs import: the first one in $HUB_VIT_STUB_PYTHONPATH's folders, else this environment's."""
    for folder in stub_path():
        found = importlib.metadata.distributions(name="numpy", path=[str(folder)])
        version = next((dist.version for dist in found), None)
        if version is not None:
            return version
    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_stub_numpy() -> None:
    """nvidia-pytriton's stubs (Triton 2.51's Python backend) misread TYPE_STRING tensors, the encoded images, under
    numpy 2: the stub dies on the first image with "unpack_from requires a buffer of at least 1701143913 bytes" and
    the model never loads (reproduced with Python 3.12 + numpy 2.5). The stub imports numpy from this environment,
    so say so before starting rather than after a crashed warmup. nvidia-pytriton itself declares numpy<2."""
    version = installed_numpy()
    if version is not None and int(version.split(".")[0]) >= 2:
        raise ServerError(f"numpy {version} is installed, but the Triton Python-backend stub shipped in "
                          f"nvidia-pytriton (Triton 2.51) misreads encoded-image (TYPE_STRING) inputs under numpy 2 "
                          f"and crashes; nvidia-pytriton requires numpy<2: pip install 'numpy<2' (or, to keep numpy 2 "
                          f"here, install numpy<2 into a folder of its own and name it in ${STUB_PYTHONPATH})")


def has_gpu() -> bool:
    """An NVIDIA driver is present (device nodes exist); without one, skip the pinned-memory pool and GPU metrics."""
    return Path("/dev/nvidiactl").exists()
