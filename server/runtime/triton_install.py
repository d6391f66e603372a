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

from hub_vit.host import install_extra

# nvidia-pytriton's stubs (Triton 2.51's Python backend) need numpy<2 (stub_env.py), and numpy<2 has no release for
# Python 3.13 or later: the newest Python that can serve with the wheel. pyproject.toml's serve extra installs
# nvidia-pytriton only up to it, and the Makefile picks an interpreter within it; tests/test_serving_python.py checks
# that the three agree.
NEWEST_SERVING_PYTHON = (3, 12)


class ServerError(RuntimeError):
    """tritonserver could not be found, did not become ready, or died."""


def dotted(python: tuple[int, int]) -> str:
    """(3, 12) -> "3.12"."""
    return ".".join(str(part) for part in python)


def unservable_python(python: tuple[int, int] = sys.version_info[:2]) -> str | None:
    """Why the nvidia-pytriton wheel's tritonserver cannot serve from Python `python` (None where it can)."""
    if python <= NEWEST_SERVING_PYTHON:
        return None
    version, newest = dotted(python), dotted(NEWEST_SERVING_PYTHON)
    first_unservable = dotted((NEWEST_SERVING_PYTHON[0], NEWEST_SERVING_PYTHON[1] + 1))
    return (f"hub-vit serve cannot run Triton from Python {version}: the Python-backend stubs of nvidia-pytriton "
            f"(Triton 2.51) need numpy<2, which has no release for Python {first_unservable} or later, so the serve "
            f"extra installs nvidia-pytriton only up to Python {newest}. Serve from an environment of Python {newest} "
            f"or older (e.g. `uv venv --python {newest}`, or pyenv), or inside an nvcr.io/nvidia/tritonserver "
            f"container (the Dockerfile). The clients (hub-vit classify, loadtest, the Python classes), conversion, "
            f"export and the in-process demo run on Python {version}")


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    python_backend: Path  # folder with libtriton_python.so + triton_python_backend_utils.py
    stub: Path | None  # the stub for this interpreter (None: the backend folder already has one)
    libs: tuple[Path, ...]


def find_triton(python: tuple[int, int] = sys.version_info[:2]) -> TritonInstall:
    """Locate tritonserver for Python `python` (this interpreter's): the nvidia-pytriton wheel first, then a system
    install (`/opt/tritonserver`)."""
    version = dotted(python)
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
    if (too_new := unservable_python(python)) is not None:
        raise ServerError(too_new)
    raise ServerError(f"tritonserver not found: install the serve extra, which brings nvidia-pytriton "
                      f"({install_extra('serve')}), or run inside an nvcr.io/nvidia/tritonserver container")


def has_gpu() -> bool:
    """An NVIDIA driver is present (device nodes exist); without one, skip the pinned-memory pool and GPU metrics."""
    return Path("/dev/nvidiactl").exists()
