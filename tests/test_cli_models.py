"""`hub-vit models` and the CLI entry point, run as a user runs them (the installed console script)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def _hub_vit(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("hub-vit", path=str(Path(sys.executable).parent)) or "hub-vit"
    return subprocess.run([exe, *args], capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_models_lists_names_tags_and_published_counts() -> None:
    out = _hub_vit("models")
    assert out.returncode == 0, out.stderr
    assert "simplevit_s16" in out.stdout and "22,122,472" in out.stdout and "i1k_300ep" in out.stdout
    assert "vit_h14" in out.stdout and "632,045,800" in out.stdout


def test_models_bad_family_names_the_choices() -> None:
    out = _hub_vit("models", "--family", "resnet")
    assert out.returncode == 2
    assert "unknown family 'resnet'; valid choices: simplevit, vit" in out.stderr


def test_help_lists_the_command_groups() -> None:
    out = _hub_vit("--help")
    assert out.returncode == 0 and "models" in out.stdout


def test_models_piped_is_one_uncut_line_per_model() -> None:
    # a pipe gets rich's 80 columns: names and counts were cut to 'simplevi…' / '305,173,4…', so grep found nothing
    exe = shutil.which("hub-vit", path=str(Path(sys.executable).parent)) or "hub-vit"
    out = subprocess.run([exe, "models"], capture_output=True, text=True,
                         env={"COLUMNS": "60", "PATH": "/usr/bin:/bin"})
    lines = {line.split("\t")[0]: line.split("\t") for line in out.stdout.splitlines()}
    assert lines["name"] == ["name", "variant", "posemb", "pool", "pre-logits", "params", "pretrained tags"]
    assert lines["simplevit_l16"][5] == "305,173,480" and "i1k_300ep" in lines["simplevit_s16"][6]


def test_models_on_a_narrow_terminal_cuts_nothing(monkeypatch) -> None:
    # at 40 columns every name read 'simplevit_…' and two columns were dropped to zero width
    import io

    from rich.console import Console
    from typer.testing import CliRunner

    import hub_vit.cli.models as models_cli
    from hub_vit.cli import _load_commands, app

    _load_commands()
    for width, table in ((40, False), (200, True)):
        screen = io.StringIO()
        monkeypatch.setattr(models_cli, "console", Console(file=screen, force_terminal=True, width=width,
                                                           color_system=None))
        result = CliRunner().invoke(app, ["models", "--family", "simplevit"])
        text = screen.getvalue()
        assert result.exit_code == 0 and "…" not in text, text
        assert "simplevit_so400m14" in text and "414,628,696" in text and "i1k_300ep" in text, text
        assert ("┃" in text) == table and all(len(line) <= width for line in text.splitlines()), text


def test_models_marks_the_tags_that_need_no_download(tmp_path, monkeypatch) -> None:
    # nothing told a user offline which tags would load: the shipped one and those already downloaded are marked
    from hub_vit.resolve import checkpoint_path

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path))
    cached = checkpoint_path("simplevit_s16", "i1k_150ep")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"npz")
    exe = shutil.which("hub-vit", path=str(Path(sys.executable).parent)) or "hub-vit"
    out = subprocess.run([exe, "models"], capture_output=True, text=True,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HUB_VIT_CACHE": str(tmp_path)})
    lines = {line.split("\t")[0]: line.split("\t") for line in out.stdout.splitlines()}
    assert lines["simplevit_s16"][6] == "i1k_90ep, i1k_150ep (cached), i1k_300ep", out.stdout
    assert lines["simplevit_digits"][6] == "sklearn_digits (shipped)", out.stdout
    assert "(cached)" not in lines["vit_s16"][6]


def test_models_counts_parameters_without_importing_torch_s_compiler() -> None:
    # initialising a meta-device model's weights ran torch's `normal_` reference, which imports torch._dynamo: 1 s of
    # `hub-vit models`' 3 s; a meta model has no values to set. Then, moved to a real device, it initialises as ever.
    code = ("import sys, torch; from hub_vit.model import VisionTransformer; from hub_vit.variants import ViTSpec\n"
            "spec = ViTSpec.from_variant('Ti/16', num_classes=10)\n"
            "with torch.device('meta'): model = VisionTransformer(spec)\n"
            "print('torch._dynamo' in sys.modules)\n"
            "model = model.to_empty(device='cpu'); model.init_weights()\n"
            "print(round(model.blocks[0].mlp.fc1.weight.std().item(), 2), model.head.weight.abs().max().item())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    dynamo_imported, stds = out.stdout.splitlines()
    assert dynamo_imported == "False"
    assert stds.split()[0] not in ("0.0", "nan") and stds.split()[1] == "0.0"  # xavier-initialised MLP, zero head
