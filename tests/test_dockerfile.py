"""The GPU Dockerfile cannot be built here (no Docker engine), so what can drift from the code is checked instead:
the files it copies exist, the extras it installs are declared, its `hub-vit repository` step runs with today's CLI
and writes the GPU flavour it promises, and every flag of its CMD is one `tritonserver --help` lists (the real
binary from nvidia-pytriton: Triton 2.51, older than the image's, and these flags are older still), and its
HEALTHCHECK probes the repository and port the CMD serves."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from hub_vit.server.runtime.health import python_instances

REPO = Path(__file__).resolve().parents[1]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        logical.append(current)
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1].strip()) for text in logical]


def _args() -> dict[str, str]:
    """Build arguments with their defaults (`ARG NAME=value`; a FROM line's ARG included)."""
    out = {}
    for kind, text in _instructions():
        if kind == "ARG":
            name, _, value = text.partition("=")
            out[name] = value.strip('"')
    return out


def test_copied_paths_exist_and_installed_extras_are_declared():
    copied = [text.split()[:-1] for kind, text in _instructions() if kind == "COPY"]
    assert copied, "the Dockerfile copies nothing"
    for sources in copied:
        for source in sources:
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which the repository does not have"
    declared = set(importlib.metadata.metadata("hub-vit").get_all("Provides-Extra") or [])  # pyproject's extras
    runs = " ".join(text for kind, text in _instructions() if kind == "RUN")
    installs = re.findall(r'"\.\[([^\]]+)\]"', runs)
    assert installs, "the Dockerfile does not install hub-vit from its copy"
    for extras in installs:
        assert set(extras.split(",")) <= declared, f"extras {extras} not all in pyproject's {sorted(declared)}"


def test_build_context_keeps_the_package_and_drops_the_venv():
    """`COPY . ./` sends the build context: pip needs the package sources, the venv and git history must stay out."""
    patterns = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".git", ".venv"} <= patterns
    needed = {"pyproject.toml", "README.md", "hub_vit", "server", "conversion", "model_cards"}
    assert not needed & patterns, f"the build context leaves out {needed & patterns}, which pip install needs"


@pytest.mark.parametrize("model", ["", "hub_vit/assets/digits"], ids=["default", "folder-in-context"])
def test_repository_step_writes_the_gpu_flavour(tmp_path, model):
    """Run the Dockerfile's own `hub-vit repository` command line (ARG defaults, /models -> a temp folder), from
    the context's root as WORKDIR is: with no MODEL, and with MODEL naming a model folder inside the context."""
    step = next(text for kind, text in _instructions() if kind == "RUN" and text.startswith("hub-vit repository"))
    command = step.split("&&")[0].replace("/models", shlex.quote(str(tmp_path / "models")))
    env = dict(os.environ, **_args(), PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    env["MODEL"] = model
    result = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = json.loads((tmp_path / "models" / "hub_vit_repository.json").read_text())
    assert manifest["options"]["flavour"] == "gpu" and manifest["metadata"]["name"] == "digits"  # the shipped model
    assert manifest["options"]["preprocess_instances"] == int(_args()["PREPROCESS_INSTANCES"])
    classifier = text_format.Parse((tmp_path / "models/vit_classifier/config.pbtxt").read_text(), mc.ModelConfig())
    assert classifier.backend == "onnxruntime"
    assert classifier.max_batch_size == int(_args()["MAX_BATCH_SIZE"])
    assert [group.kind for group in classifier.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
    (accelerator,) = classifier.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    # what the HEALTHCHECK's `hub-vit health --repository` expects to find alive in the container
    count = int(_args()["PREPROCESS_INSTANCES"])
    assert python_instances(tmp_path / "models") == {
        f"{step}_0_{n}": step for step in ("vit_preprocess", "vit_postprocess") for n in range(count)}


def test_cmd_flags_are_tritonserver_flags():
    from hub_vit.server.runtime.triton_install import ServerError, find_triton

    try:
        install = find_triton()
    except ServerError as err:
        pytest.skip(f"no tritonserver binary to ask: {err}")
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(str(p) for p in install.libs))
    usage = subprocess.run([str(install.binary), "--help"], capture_output=True, text=True, env=env, timeout=60)
    known = set(re.findall(r"^\s+(--[a-z0-9-]+)", usage.stdout + usage.stderr, flags=re.MULTILINE))
    assert len(known) > 30, "tritonserver --help listed no flags"
    for flag in _cmd_flags():
        name = flag.split("=")[0]
        assert name in known or name in NEWER_FLAGS, f"{flag} is not a tritonserver flag"


# Flags the image's Triton (25.08 = 2.60) has and the wheel's 2.51 lacks, with the release that brought them.
NEWER_FLAGS = {"--http-max-input-size": "Triton 2.59.0 (server commit af8bb93, 'Update handling of large array sizes')"}


def _cmd_flags() -> list[str]:
    """tritonserver's arguments in the CMD: `sh -c "KEY=...; exec tritonserver ARGS"` (the shell makes the control
    key), with `$KEY` as written."""
    (cmd,) = [json.loads(text) for kind, text in _instructions() if kind == "CMD"]
    assert cmd[:2] == ["sh", "-c"], cmd
    args = shlex.split(cmd[2].split("exec ", 1)[1])
    assert args[0] == "tritonserver", args
    return args[1:]


def test_cmd_restricts_the_control_apis_the_local_server_restricts():
    from hub_vit.server.runtime.api_access import CONTROL_HEADER, RESTRICTED_APIS, restricted_api_args

    flags = [flag for flag in _cmd_flags() if "restricted" in flag]
    assert flags == list(restricted_api_args(CONTROL_HEADER, "$KEY")), flags
    assert set(flags[0].split("=", 1)[1].split(":")[0].split(",")) == set(RESTRICTED_APIS)
    assert "--http-max-input-size=67108864" in _cmd_flags()


def test_healthcheck_probes_the_served_repository_and_port():
    """The probe (`hub-vit health`, run for real in tests/test_health.py) must look at the repository the CMD serves
    and the RUN step writes, on the HTTP port the image exposes (the CMD keeps tritonserver's default, 8000)."""
    healthcheck = next(text for kind, text in _instructions() if kind == "HEALTHCHECK")
    probe = shlex.split(healthcheck.split(" CMD ", 1)[1])
    assert probe[:2] == ["hub-vit", "health"], probe
    repository = probe[probe.index("--repository") + 1]
    cmd = _cmd_flags()
    assert f"--model-repository={repository}" in cmd
    assert not any(flag.startswith("--http-port") for flag in cmd)
    step = next(text for kind, text in _instructions() if kind == "RUN" and text.startswith("hub-vit repository"))
    assert shlex.split(step)[2] == repository
    host, port = probe[probe.index("--url") + 1].rsplit(":", 1)
    assert host == "127.0.0.1" and port in next(text for kind, text in _instructions() if kind == "EXPOSE").split()
    timeout = float(probe[probe.index("--timeout") + 1])
    assert timeout < float(re.search(r"--timeout=(\d+)s", healthcheck)[1]), "the probe must answer within Docker's"
