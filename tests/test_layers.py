"""The import graph points down: the import-linter contracts in pyproject.toml (`[tool.importlinter]`), run on the
package as it installs (`conversion/`, `server/`, `model_cards/` become `hub_vit.conversion`, `.server`,
`.model_cards`), so a wrong-way import or an import cycle fails the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# pyproject's package-dir: these top-level folders install inside hub_vit
MAPPED = {"conversion": "conversion", "server": "server", "model_cards": "model_cards"}


def _copy_packages(src: Path, dst: Path) -> None:
    """The Python packages under `src` (folders with an __init__.py): their .py files only, as Python imports them
    (data folders such as the remote-code copies and Triton templates are not imported by the package)."""
    for folder, dirs, files in os.walk(src):
        here = Path(folder)
        dirs[:] = [d for d in dirs if (here / d / "__init__.py").is_file()]
        out = dst / here.relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.endswith(".py"):
                shutil.copyfile(here / name, out / name)


@pytest.fixture(scope="module")
def installed_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package tree as installed, built from the working tree (the editable install keeps the repository's own
    layout, which import-linter, reading files by package path, would not see)."""
    root = tmp_path_factory.mktemp("layout")
    _copy_packages(ROOT / "hub_vit", root / "hub_vit")
    for folder, name in MAPPED.items():
        _copy_packages(ROOT / folder, root / "hub_vit" / name)
    return root


def _lint(layout: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(layout)}
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", script, str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=layout, env=env, capture_output=True, text=True, timeout=300)


def test_contracts_are_kept(installed_layout: Path) -> None:
    result = _lint(installed_layout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("module", "wrong_import", "named"), [
    # the model core reading a model folder: points up three layers
    ("hub_vit/model.py", "from hub_vit.folder import load_model_folder", "hub_vit.model -> hub_vit.folder"),
    # a type-only import counts: the core must not even name a higher layer's types
    ("hub_vit/variants.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hub_vit.model import X",
     "hub_vit.variants -> hub_vit.model"),
    # two independent siblings (Hub upload and training) importing each other
    ("hub_vit/train/models.py", "from hub_vit import publish", "hub_vit.train.models -> hub_vit.publish"),
    # inside the server: a client that needs the process or the gates beside it
    ("hub_vit/server/client/classifier.py", "from hub_vit.server.runtime import launcher",
     "hub_vit.server.client.classifier -> hub_vit.server.runtime.launcher"),
    ("hub_vit/server/client/errors.py", "from hub_vit.server.front import checks",
     "hub_vit.server.client.errors -> hub_vit.server.front.checks"),
    # the front's processes reaching down into a client (allowed by the layers, not by the front's own contract)
    ("hub_vit/server/front/checks.py", "from hub_vit.server.client import errors",
     "hub_vit.server.front.checks -> hub_vit.server.client.errors"),
    # ... a client reading the repository writer's options (its sibling): the facts they share are the protocol's
    ("hub_vit/server/client/messages.py", "from hub_vit.server.repository import options",
     "hub_vit.server.client.messages -> hub_vit.server.repository.options"),
    # the supervisor naming the gates' classes (its sibling): it points any `Front` at the server
    ("hub_vit/server/runtime/supervisor.py", "from hub_vit.server.front.workers import FrontProcesses",
     "hub_vit.server.runtime.supervisor -> hub_vit.server.front.workers"),
    # the repository reading the device of this host (the runtime's), and the protocol importing anything
    ("hub_vit/server/repository/manifest.py", "from hub_vit.server.runtime import device",
     "hub_vit.server.repository.manifest -> hub_vit.server.runtime.device"),
    ("hub_vit/server/protocol.py", "from hub_vit.server.client import errors",
     "hub_vit.server.protocol -> hub_vit.server.client.errors"),
])
def test_a_wrong_way_import_breaks_the_contract(installed_layout: Path, tmp_path: Path, module: str,
                                                wrong_import: str, named: str) -> None:
    layout = tmp_path / "layout"
    shutil.copytree(installed_layout, layout)
    target = layout / module
    target.write_text(target.read_text(encoding="utf-8") + "\n" + wrong_import + "\n", encoding="utf-8")
    result = _lint(layout)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout and named in result.stdout, result.stdout


def test_a_new_module_must_be_placed(installed_layout: Path, tmp_path: Path) -> None:
    """exhaustive: a module the contract does not place fails, naming it (so every new module gets a layer)."""
    layout = tmp_path / "layout"
    shutil.copytree(installed_layout, layout)
    (layout / "hub_vit" / "unplaced.py").write_text("X = 1\n", encoding="utf-8")
    result = _lint(layout)
    assert result.returncode == 1 and "unplaced" in result.stdout, result.stdout
