"""Finding a runnable tritonserver: the nvidia-pytriton wheel's binary and its Python-backend stub for this
interpreter (or a system install), and whether the host has an NVIDIA driver. The stubs' Python environment is
`stub_env.py`'s."""

from __future__ import annotations

import importlib.metadata
import importlib.util
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
            libs = package.parent / "nvidia_pytriton.libs"
            return TritonInstall(binary, root / "backends" / "python", stub, (libs,))
    system = Path("/opt/tritonserver")
    binary = Path(shutil.which("tritonserver") or system / "bin" / "tritonserver")
    if binary.is_file():
        return TritonInstall(binary, system / "backends" / "python", None, (system / "lib",))
    raise ServerError("tritonserver not found: install the serve extra (pip install 'hub-vit[serve]', which brings "
                      "nvidia-pytriton) or run inside an nvcr.io/nvidia/tritonserver container")


def has_gpu() -> bool:
    """An NVIDIA driver is present (device nodes exist); without one, skip the pinned-memory pool and GPU metrics."""
    return Path("/dev/nvidiactl").exists()
