"""hub-vit's processes do not send ONNX Runtime's usage telemetry: ONNX Runtime 1.29+ on Linux starts its 1DS
telemetry (a device id and an event cache in ~/.cache/Microsoft, uploads to Microsoft) when it is imported, unless
ORT_DISABLE_TELEMETRY is set before. Checked on the real onnxruntime, in fresh interpreters with a home folder of
their own: whether ~/.cache/Microsoft appears is what ONNX Runtime itself does, not what hub-vit says. Each check has
its control (the user's ORT_DISABLE_TELEMETRY=0 kept), so it would fail if ONNX Runtime wrote nothing anyway."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_vit.resolve import resolve_model
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository

TELEMETRY_FOLDER = Path(".cache") / "Microsoft"  # ONNX Runtime's device id and offline event cache, under $HOME
# ONNX Runtime stays silent where one of these is set (its CI detection, read from its library's strings): the
# interpreters below run as on a user's machine, or the controls would see nothing in this project's own CI run
CI_VARIABLES = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
                "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "SYSTEM_TEAMFOUNDATIONCOLLECTIONURI")


def _run(code: str, home: Path, setting: str | None, path: list[Path] = ()) -> Path:
    """Run `code` in a fresh interpreter whose $HOME is `home`, with ORT_DISABLE_TELEMETRY `setting` (None: unset);
    returns where ONNX Runtime would keep its telemetry."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("ORT_DISABLE_TELEMETRY", "PYTHONPATH", *CI_VARIABLES)}
    env |= {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    if setting is not None:
        env["ORT_DISABLE_TELEMETRY"] = setting
    if path:
        env["PYTHONPATH"] = os.pathsep.join(map(str, path))
    home.mkdir()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return home / TELEMETRY_FOLDER


@pytest.mark.parametrize("setting, telemetry", [(None, False), ("0", True)], ids=["default", "user_keeps_it_on"])
def test_importing_hub_vit_turns_onnx_runtime_telemetry_off(tmp_path: Path, setting: str | None,
                                                           telemetry: bool) -> None:
    folder = _run("import hub_vit, onnxruntime, os; print(os.environ['ORT_DISABLE_TELEMETRY'])", tmp_path / "home",
                  setting)
    assert folder.exists() == telemetry


@pytest.mark.parametrize("setting, telemetry", [(None, False), ("0", True)], ids=["default", "deployment_keeps_it_on"])
def test_the_served_cpu_step_turns_it_off_in_any_triton(tmp_path: Path, setting: str | None, telemetry: bool) -> None:
    """The CPU classifier as a Triton stub imports it (`hub-vit repository`'s output also runs in Triton containers
    that hub-vit did not start): its model.py imported as the stub does, with a stand-in for Triton's own module."""
    repo = write_repository(resolve_model(None), tmp_path / "repo", ServingOptions(cpu_variant="fp32"))
    stand_in = tmp_path / "triton"
    stand_in.mkdir()
    (stand_in / "triton_python_backend_utils.py").write_text("")
    folder = _run("import model", tmp_path / "home", setting, [repo / "vit_classifier" / "1", stand_in])
    assert folder.exists() == telemetry
