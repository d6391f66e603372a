"""hub_vit.network's offline switches read as huggingface_hub reads its own (asked in a fresh interpreter), plus
hub-vit's own HUB_VIT_OFFLINE, named in the errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hub_vit.network import offline_switch

SWITCHES = ("HUB_VIT_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _huggingface_hub_offline(env: dict[str, str]) -> bool:
    code = "from huggingface_hub import constants; print(constants.HF_HUB_OFFLINE)"
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


@pytest.mark.parametrize("env", [{}, {"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "Yes"}, {"HF_HUB_OFFLINE": "0"},
                                 {"TRANSFORMERS_OFFLINE": "on"}, {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "1"},
                                 {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"},
                                 {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "0"}])
def test_the_switches_huggingface_hub_reads_are_read_as_it_reads_them(env: dict[str, str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    switch = offline_switch()
    assert (switch is not None) == _huggingface_hub_offline(env), env
    assert switch is None or env.get(switch, "").upper() in {"1", "YES", "ON", "TRUE"}  # the one that is on


def test_hub_vit_offline_is_hub_vit_s_own_and_named_first(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HUB_VIT_OFFLINE", "true")
    assert not _huggingface_hub_offline({"HUB_VIT_OFFLINE": "true"})
    assert offline_switch() == "HUB_VIT_OFFLINE"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert offline_switch() == "HUB_VIT_OFFLINE"
