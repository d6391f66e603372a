"""What `hub-vit serve` needs on a lent GPU host is there: each distribution serve requires (hub-vit's own
requirements, the serve extra, and tritonclient's http and grpc extras) is either in the hosts' environment
(scripts/gpu_host_packages.txt) or carried in the pack (scripts/pack_gpu_check.sh's CLIENT_WHEELS). The hosts have
no network: a requirement in neither stops serve there (as httptools, the HTTP front's parser, once would have)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
# serve's requirements a GPU host gets otherwise, or does not need there, and why
NOT_FROM_THE_HOST = {
    "nvidia-pytriton": "its server, the Python 3.12 stub and the libraries they link travel as triton-cp312.tar.xz",
    "openvino": "the CPU flavour's OpenVINO candidates only; the GPU check's CPU reference serves --cpu-variant fp32",
    "nncf": "the CPU flavour's int8 candidates only (with openvino)",
}


def host_packages() -> set[str]:
    lines = (REPO / "scripts" / "gpu_host_packages.txt").read_text().splitlines()
    return {canonicalize_name(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def packed_wheels() -> set[str]:
    script = (REPO / "scripts" / "pack_gpu_check.sh").read_text()
    found = re.search(r"^CLIENT_WHEELS=\((.*?)\)", script, flags=re.MULTILINE | re.DOTALL)
    assert found, "scripts/pack_gpu_check.sh no longer sets CLIENT_WHEELS=(...)"
    return {canonicalize_name(item.split("==")[0]) for item in found[1].split()}


def serve_requirements() -> dict[str, str]:
    """{distribution: who requires it} for hub-vit's requirements and its serve extra, with tritonclient's http and
    grpc extras (those serve's clients import) read from the installed tritonclient's metadata."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {}
    for text in project["dependencies"] + project["optional-dependencies"]["serve"]:
        requirement = Requirement(text)
        wanted[canonicalize_name(requirement.name)] = "hub-vit"
    for text in importlib.metadata.requires("tritonclient") or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("http", "grpc")):
            wanted.setdefault(canonicalize_name(requirement.name), "tritonclient")
    return wanted


def test_the_host_list_and_the_pack_cover_what_serve_needs():
    host, packed = host_packages(), packed_wheels()
    assert {"torch", "numpy", "grpcio", "onnxruntime"} <= host  # the list is read as distribution names
    missing = {name: by for name, by in serve_requirements().items()
               if name not in host and name not in packed and name not in NOT_FROM_THE_HOST}
    assert not missing, (f"required, but neither on the GPU hosts (scripts/gpu_host_packages.txt) nor packed "
                         f"(CLIENT_WHEELS in scripts/pack_gpu_check.sh): {missing}")


def test_the_reasons_name_real_requirements():
    """A reason for a requirement serve no longer has would hide a new one of the same name: each must be live."""
    stale = set(NOT_FROM_THE_HOST) - set(serve_requirements())
    assert not stale, f"NOT_FROM_THE_HOST names what serve no longer requires: {sorted(stale)}"
