"""Which device `hub-vit serve` runs the model on: a CUDA device when the interpreter sees one, else the CPU.

Kept apart from `options` (no torch import there, so the CLI starts fast); torch is imported only when asked.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hub_vit.child_python import python_command
from hub_vit.server.repository.manifest import read_manifest
from hub_vit.server.repository.options import DEVICES, FLAVOURS


class NoCudaDevice(ValueError):
    """cuda asked for (by a flag, or by a repository's manifest) where torch sees no CUDA device: nothing asked is
    wrong, this host cannot run it (`hub-vit serve` exits 3, as for other hardware or network it lacks)."""


@dataclass(frozen=True)
class DeviceChoice:
    device: str  # "cpu" or "cuda"
    flavour: str  # the repository flavour that serves it here: "torch" on cuda, "cpu" (ONNX Runtime) or "torch"
    description: str  # what it runs on, for the user: "cuda:0 (NVIDIA H100 80GB HBM3)" / "the CPU"


# Run by the interpreter serve runs in: torch's own answer, in a process that ends right after it.
_CUDA_PROBE = ("import torch\n"
               "print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
CUDA_PROBE_TIMEOUT_S = 300  # importing torch and initialising CUDA; a driver that hangs is named, not waited for


def cuda_device_name() -> str | None:
    """`NVIDIA H100 80GB HBM3` for the first CUDA device torch sees, None without one (or without a CUDA torch).

    Asked in a child process: `hub-vit serve` never imports torch itself (the repository is built in a child too), so
    the process that supervises for days does not hold torch's libraries and CUDA's state. Without an NVIDIA driver's
    device nodes nothing is started. NoCudaDevice when the check itself fails (a crash in the driver, a hang)."""
    from hub_vit.server.runtime.triton_install import has_gpu

    if not has_gpu():
        return None
    if "torch" in sys.modules:  # imported already (`hub-vit repository`, the demo): no second import to avoid
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        probe = subprocess.run(python_command("-c", _CUDA_PROBE), capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=CUDA_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NoCudaDevice(f"asking torch for a CUDA device did not finish within {CUDA_PROBE_TIMEOUT_S} s (a hung "
                           "NVIDIA driver?); check `nvidia-smi`, or serve with --device cpu") from None
    if probe.returncode != 0:
        from hub_vit.server.runtime.processes import exit_description

        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise NoCudaDevice(f"asking torch for a CUDA device failed: its process {exit_description(probe.returncode)} "
                           f"({last}); check `nvidia-smi`, or serve with --device cpu")
    said = probe.stdout.strip().splitlines()  # the name is the last line (a start-up hook may print before it)
    return (said[-1].strip() or None) if said else None


def choose_device(device: str | None, flavour: str | None = None) -> DeviceChoice:
    """`device` None: cuda when torch sees a CUDA device, else cpu. `flavour` None: "torch" on cuda, "cpu" (ONNX
    Runtime, the faster one on a CPU) on cpu. ValueError, naming the valid values, for an unknown device or flavour,
    cuda without a CUDA device (`NoCudaDevice`), and a flavour that cannot run on the device."""
    if device is not None and device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    local = ("cpu", "torch")  # the flavours the local tritonserver (Python backend only) can serve
    if flavour is not None and flavour not in local:
        why = "runs in the official Triton container (Dockerfile)" if flavour == "gpu" else "is unknown"
        raise ValueError(f"flavour {flavour!r} {why}; valid flavours to serve here: {', '.join(local)} "
                         f"(all flavours: {', '.join(FLAVOURS)})")
    name = cuda_device_name() if device in (None, "cuda") else None
    if device == "cuda" and name is None:
        raise NoCudaDevice("device 'cuda' asked for, but torch sees no CUDA GPU here (torch.cuda.is_available() is "
                         "False: no GPU, no driver, or a CPU-only torch); valid here: cpu")
    if device is None:
        device = "cuda" if name is not None and flavour != "cpu" else "cpu"
    if device == "cuda":
        if flavour == "cpu":
            raise ValueError("flavour 'cpu' runs ONNX Runtime on the CPU; device 'cuda' is served by flavour 'torch'")
        return DeviceChoice("cuda", "torch", f"cuda:0 ({name})")
    return DeviceChoice("cpu", flavour or "cpu", "the CPU")


def recorded_device(folder: Path) -> DeviceChoice:
    """The device and flavour a repository's manifest records (an unreadable one: the CPU flavour); `NoCudaDevice` for
    a cuda one where torch sees no CUDA device (its KIND_GPU instances would fail to load)."""
    try:
        options = (read_manifest(folder) or {}).get("options", {})
    except (OSError, ValueError, AttributeError):
        options = {}
    flavour, device = str(options.get("flavour", "cpu")), str(options.get("device", "cpu"))
    if device != "cuda":
        return DeviceChoice("cpu", flavour, "the CPU")
    name = cuda_device_name()
    if name is None:
        raise NoCudaDevice(f"{str(folder)!r} is a torch-flavour repository for device cuda, but torch sees no CUDA "
                         "device here; rebuild it with --device cpu, or serve it on a GPU host")
    return DeviceChoice("cuda", flavour, f"cuda:0 ({name})")
