"""Facts that help texts, error messages and the docs repeat say the same thing everywhere, each written once: the
server's log (`--quiet` / `--verbose`), gRPC's own port, the default ports, the image formats, the version, the
documented defaults of the serving commands."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hub_vit.cli import _load_commands, app
from hub_vit.image_formats import FORMATS, NAMES
from hub_vit.ports import DEMO_PORT, GRPC_PORT, HTTP_PORT, LOOPBACK, METRICS_PORT
from hub_vit.version import __version__

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WIDE = {"COLUMNS": "400"}  # help lines unwrapped, so a sentence is found whole


def _help(*command: str) -> str:
    _load_commands()
    result = CliRunner().invoke(app, [*command, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def _option_help(*command: str) -> dict[str, str]:
    """--option -> its help text (and shown default), from the command's rendered help."""
    rows = {}
    for line in _help(*command).splitlines():
        match = re.match(r"[│|]\s+(?:\*\s+)?(--[\w-]+)(.*?)[│|]?\s*$", line)
        if match:
            rows[match[1]] = " ".join(match[2].split())
    return rows


def test_the_servers_log_is_described_alike_in_each_flag_and_the_error() -> None:
    # was: `--quiet` showed "[default: no-quiet]" while the error said "--quiet (the default)"
    from hub_vit.cli.serve import LOG_SHOWN
    from hub_vit.server.runtime.launcher import free_port

    options = _option_help("serve")
    assert "no-quiet" not in _help("serve")
    assert LOG_SHOWN in options["--quiet"] and LOG_SHOWN in options["--verbose"], options
    result = CliRunner().invoke(app, ["serve", "--quiet", "--verbose", "--http-port", str(free_port()), "--grpc-port",
                                      str(free_port()), "--metrics-port", str(free_port())])
    assert result.exit_code == 2 and LOG_SHOWN in " ".join(result.output.split()), result.output
    assert "quiet is the default" in LOG_SHOWN


@pytest.mark.parametrize("command", ["serve", "repository"])
def test_help_names_the_gpu_sized_defaults_beside_the_cpu_ones(command: str) -> None:
    # was: `[default: 16]`, `[default: 2]` alone, though on --device cuda the batch is 256 and the instances 4
    from hub_vit.server.repository.options import CUDA_DEFAULTS

    options = _option_help(command)
    for flag, key in (("--max-batch-size", "max_batch_size"), ("--instances", "classifier_instances"),
                      ("--max-queue-size", "max_queue_size")):
        assert f"On --device cuda: {CUDA_DEFAULTS[key]}" in options[flag], (flag, options[flag])


@pytest.mark.parametrize("command", ["classify", "loadtest"])
def test_grpc_says_that_the_url_names_the_grpc_port(command: str) -> None:
    # was: "--grpc: Use gRPC instead of HTTP.", and the README's "add --grpc for :8001" beside `--url 127.0.0.1:8000`
    options = _option_help(command)
    assert f"{GRPC_PORT} by default, so a --url must name that port too" in options["--grpc"], options
    assert f"with --grpc {LOOPBACK}:{GRPC_PORT}" in options["--url"], options


def test_docs_give_grpc_its_own_port() -> None:
    for path in DOCS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.name}:{number}: {line}"
            assert "add --grpc" not in line, where
            for before, after in re.findall(r"(.*)--grpc(.*)", line):
                urls = re.findall(r"--url (?:\S+?):(\d+)", before + after)
                assert all(port == str(GRPC_PORT) for port in urls[-1:]), where


def test_the_default_ports_are_the_ones_the_readme_names() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"(HTTP :{HTTP_PORT}, gRPC :{GRPC_PORT}, metrics :{METRICS_PORT})" in readme
    assert f"http://{LOOPBACK}:{DEMO_PORT}" in readme
    defaults = {name: value for name, value in _serve_defaults().items() if name.endswith("-port")}
    assert defaults == {"--http-port": HTTP_PORT, "--grpc-port": GRPC_PORT, "--metrics-port": METRICS_PORT,
                        "--demo-port": DEMO_PORT}


def _serve_defaults() -> dict[str, object]:
    return _defaults("serve")


def _defaults(name: str) -> dict[str, object]:
    """--option -> its default, from the command's own declaration."""
    _load_commands()
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt: param.default for param in command.params for opt in param.opts if opt.startswith("--")}


# docs/serving.md's option tables: the text before each, the command it documents
TABLES = {"| `classify` option |": "classify", "## `hub-vit serve`": "serve",
          "## The generated repository": "repository", "## Load test": "loadtest"}


def _documented(title: str) -> dict[str, object]:
    """--option -> the default the option table after `title` gives, where it is a value ('16', '`vit`', 'off'):
    `a / b` (or `a, b`) split over the options the row names; words ('the shipped model') are left out."""
    text = (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    start = text.index(title)
    table = re.search(r"^\|.*\| default \|.*\n\|[- |]+\n((?:\|.*\n)+)", text[start:], re.MULTILINE)
    assert table is not None, title
    documented: dict[str, object] = {}
    for row in table[1].splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        names = re.findall(r"`(--[\w-]+)", cells[0])
        for separator in (" / ", ", "):
            values = cells[1].split(separator)
            if len(values) == len(names):
                break
        else:
            continue
        for name, value in zip(names, values, strict=True):
            literal = re.fullmatch(r"`([^`]+)`|(\d+)(?: \(.*\))?|(on|off)", value)
            if literal:
                documented[name] = (literal[1] if literal[1] is not None else int(literal[2]) if literal[2]
                                    else literal[3] == "on")
    return documented


@pytest.mark.parametrize(("title", "command"), TABLES.items(), ids=TABLES.values())
def test_the_serving_docs_give_each_commands_own_defaults(title: str, command: str) -> None:
    defaults = {name: str(value) if isinstance(value, Path) else value for name, value in _defaults(command).items()}
    # a flag left None takes its default elsewhere (the server's, the flavour's): the docs give that one
    documented = {name: value for name, value in _documented(title).items() if defaults[name] is not None}
    assert len(documented) >= 2, documented  # the table was read
    assert documented == {name: defaults[name] for name in documented}


def test_one_set_of_image_formats_is_named_everywhere(imageprep) -> None:
    # was: `classify` took "JPEG, PNG, WebP", `rollout` "PNG, JPEG, WEBP, BMP, GIF", the demo read BMP and GIF too
    assert tuple(imageprep.FORMATS) == FORMATS  # the served decoder's whitelist
    from hub_vit.explain.image import IMAGE_FORMATS

    assert IMAGE_FORMATS == FORMATS
    for command in ("classify", "rollout"):
        assert f"Image files ({NAMES}), or folders of them" in _help(command)
    for path in DOCS:
        text = " ".join(path.read_text(encoding="utf-8").split())
        for listed in re.findall(r"\b(?:JPEG|PNG|WebP|WEBP|BMP|GIF)(?:(?:,| and| or|,? or|/) (?:JPEG|PNG|WebP|WEBP|BMP|"
                                 r"GIF))+", text):
            assert sorted(re.findall(r"\w+", listed.upper().replace(" AND ", " ").replace(" OR ", " "))) == \
                ["JPEG", "PNG", "WEBP"], f"{path.name}: {listed}"


def test_version_is_the_packages_one() -> None:
    # was: no --version, and the version written twice (pyproject.toml and hub_vit/version.py)
    result = subprocess.run([str(Path(sys.executable).with_name("hub-vit")), "--version"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == f"hub-vit {__version__}\n", result
    assert importlib.metadata.version("hub-vit") == __version__
    project = (REPO / "pyproject.toml").read_text().split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert re.search(r"^dynamic = \[\"version\"\]", project, re.MULTILINE), project
    assert not re.search(r"^version\s*=", project, re.MULTILINE), project
