"""An extra that is not installed (a wheel installed without [serve]): the command says which, and how to install it,
in one line (exit 3: this machine cannot do it now), not a traceback. The modules are made unimportable the way
Python itself refuses them (None in sys.modules), in a `hub-vit` process of its own."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hub_vit.host import EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "hub_vit" / "assets" / "digits" / "samples" / "3_0.png"


def _hub_vit_without(modules: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in modules)
    program = f"import sys; {blocked}; sys.argv = ['hub-vit', *sys.argv[1:]]; from hub_vit.cli import run; run()"
    return subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "300", "HOME": str(Path.home())})


@pytest.mark.parametrize(("blocked", "args", "module"), [
    # was: ModuleNotFoundError: No module named 'tritonclient', a 40-line traceback
    (["tritonclient"], ["classify", "--url", "127.0.0.1:9", str(SAMPLE)], "tritonclient"),
    # tritonclient[grpc] alone (the Dockerfile's): "no HTTP answer ... is a server running there?" (exit 1)
    (["geventhttpclient"], ["classify", "--url", "127.0.0.1:9", str(SAMPLE)], "geventhttpclient"),
    (["geventhttpclient"], ["loadtest", "--url", "127.0.0.1:9", "--requests", "1"], "geventhttpclient"),
    # protobuf, which the repository's configs are written with: a traceback from `import google.protobuf`
    (["google"], ["repository", "OUT_FOLDER"], "google"),
], ids=["no-tritonclient", "no-http-classify", "no-http-loadtest", "no-protobuf-repository"])
def test_a_missing_extra_is_named_with_how_to_install_it(blocked, args, module, tmp_path) -> None:
    args = [str(tmp_path / "repo") if arg == "OUT_FOLDER" else arg for arg in args]
    result = _hub_vit_without(blocked, *args)
    text = " ".join(result.stderr.split())
    assert result.returncode == 3, result.stderr[-3000:]
    assert (f"error: hub-vit {args[0]} needs hub-vit's serve extra, which is not installed here (no module "
            f"{module!r}): pip install '.[serve]'") in text, text
    assert "Traceback" not in result.stderr and "is a server running there" not in text, text
    assert not (tmp_path / "repo").exists()


def _requirements(distribution: str, extras: set[str]) -> list[Requirement]:
    """What `distribution` installed with `extras` requires on this Python (markers evaluated here)."""
    found = []
    for text in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""}):
            found.append(requirement)
    return found


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


@pytest.mark.parametrize(("module", "extra"), sorted(EXTRA_MODULES.items()))
def test_each_module_named_is_brought_by_its_extra(module, extra) -> None:
    # the table the message comes from, against pyproject's extras: a module of the extra's requirements or of theirs
    # (geventhttpclient comes with tritonclient[all])
    brought = set()
    for requirement in _requirements("hub-vit", {extra}):
        brought.add(_name(requirement.name))
        try:
            brought |= {_name(r.name) for r in _requirements(requirement.name, set(requirement.extras))}
        except importlib.metadata.PackageNotFoundError:  # a requirement for another Python
            continue
    providers = {_name(dist) for dist in importlib.metadata.packages_distributions().get(module, [])}
    assert providers & brought, (module, extra, providers)
