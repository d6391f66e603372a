"""`import hub_vit` stays light (no torch, timm or transformers) yet still registers with both libraries, whichever
is imported first; the `hub-vit` command line loads torch only for the commands that build a model."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "timm", "transformers")


def _fresh(code: str) -> str:
    """Run `code` in a fresh interpreter (nothing imported yet) and return its last line of output."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_import_hub_vit_loads_no_heavy_library() -> None:
    loaded = _fresh(f"import sys, hub_vit; print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert loaded == "[]", f"`import hub_vit` imported {loaded}"


@pytest.mark.parametrize("order", ["hub_vit first", "libraries first"])
def test_registration_with_timm_and_transformers_in_either_import_order(order: str) -> None:
    imports = "import hub_vit; import timm, transformers" if order == "hub_vit first" else (
        "import timm, transformers; import hub_vit")
    out = _fresh(
        f"{imports}\n"
        "from transformers import AutoConfig, AutoModelForImageClassification\n"
        "config = AutoConfig.for_model('hub_vit')\n"
        "model = timm.create_model('simplevit_ti16', num_classes=3)\n"
        "print(timm.is_model('vit_b16'), timm.is_model('simplevit_so400m14'), type(config).__name__,"
        " type(model).__name__, hub_vit.VisionTransformer is type(model),"
        " AutoModelForImageClassification._model_mapping[type(config)].__name__)"
    )
    assert out == "True True HubViTConfig VisionTransformer True HubViTForImageClassification"


def test_lazy_names_resolve_and_unknown_names_fail() -> None:
    out = _fresh("import hub_vit; from hub_vit import load_model_folder, count_parameters, ViTOutput; "
                 "print(load_model_folder.__module__, count_parameters.__module__, ViTOutput.__module__)")
    assert out == "hub_vit.folder hub_vit.model hub_vit.model"
    proc = subprocess.run([sys.executable, "-c", "import hub_vit; hub_vit.no_such_name"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "has no attribute 'no_such_name'" in proc.stderr


@pytest.mark.parametrize("args", [["--help"], ["classify", "--help"], ["loadtest", "--help"], ["serve", "--help"]])
def test_client_commands_start_without_torch(args: list[str]) -> None:
    out = _fresh(
        "import sys\n"
        f"sys.argv = ['hub-vit', *{args!r}]\n"
        "from hub_vit.cli import main\n"
        "try:\n    main()\nexcept SystemExit as stop:\n    assert stop.code in (0, None), stop.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert out == "[]", f"`hub-vit {' '.join(args)}` imported {out}"
