"""README.md runs as written: every fenced code block and every command in one, in a fresh copy of this checkout,
offline, with the `.venv` that `make setup` made (CI runs this right after it).

* Fresh copy: `git archive` of the checkout's tracked files as they are now (`git stash create`: committed or staged
  changes count, untracked files do not help), with `.venv` linked to this interpreter's environment. Commands run
  there, on its paths.
* Offline: every HTTP(S) proxy variable points at a closed port (loopback excepted) and the caches are an empty
  folder, so a download fails at once and nothing here depends on the network.
* `make serve` and `make test` cannot run inside the suite. `make -n` shows their recipes; the server the commands
  below talk to is started from `make serve`'s own recipe line (`make -n serve HTTP_PORT=... DEMO_PORT=...`, the
  ports moved to free ones as the README says they can be), checked ready, and stopped with SIGTERM.

How each command runs is decided here, per command (`DECISIONS`), from what it needs; a README command without a
decision, or a decision whose command is gone from the README, fails `test_every_command_has_a_decision`:
* `RUN`: as written; exit 0. Python blocks always run so.
* `SERVED`: against the server `make serve` started, with the README's default ports (8000, 8001, 8002, 7860) moved
  to that server's: the only change made to any command; exit 0.
* `LONG_RUNNING`: a server of its own (`hub-vit demo`): started on a free port, answering, stopped with SIGTERM.
* `DOWNLOADS`: offline it fails within a few seconds, saying what it could not download; its README comment says it
  downloads.
* `GPU`: on a host without CUDA (or TensorRT) it is refused at once, naming what it needs, as its README comment does.
* `NEEDS`: not run (your own data, 8 GPUs); its README comment states that need, which the decision quotes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hub_vit.export import registry
from hub_vit.ports import DEMO_PORT, GRPC_PORT, HTTP_PORT, LOOPBACK, METRICS_PORT
from hub_vit.server.runtime.launcher import free_port
from tests.tracked_copy import tracked_copy

pytestmark = [pytest.mark.slow, pytest.mark.triton]

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SERVING = REPO / "docs" / "serving.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMMENT = re.compile(r"\s+#(?:\s.*)?$")  # a shell comment after a command: `cmd  # why`

RUN, SERVED, LONG_RUNNING, DOWNLOADS, GPU, NEEDS, MAKE = (
    "run", "served", "long-running", "downloads", "gpu", "needs", "make")


@dataclass(frozen=True)
class Decision:
    kind: str
    said: str = ""  # what the command's README comment must state (DOWNLOADS, GPU, NEEDS)
    refusal: str = ""  # GPU: what the refusal on a host without it names
    then: Callable[[Path], None] | None = None  # RUN: what it must have written, checked in the checkout


def _every_variant_this_host_can_build(checkout: Path) -> None:
    """`hub-vit export onnx hub_vit/assets/digits ... --variant all --attentions` (it exited 1 before, three variants
    refused): the variants this host can build written when they pass, top-1 judged on the model's held-out digits
    (its folder names them), the static int8 ones written, and the ones left out listed with the reason. `all`
    builds the OpenVINO variants where OpenVINO is installed."""
    report = json.loads((checkout / "exports" / "digits" / "model.export.json").read_text())
    assert report["settings"]["top1_scope"] == "held-out images" and report["settings"]["n_own_images"] == 360
    by_name = {v["variant"]: v for v in report["variants"]}
    assert set(by_name) == {*registry.names(), "attentions"}
    for name in ("fp32", "optimized", "attentions"):
        assert by_name[name]["written"], (name, by_name[name]["error"])
    for name in ("int8-dynamic", "int8-static"):  # judged on held-out digits: their top-1 always agrees there
        check = by_name[name]["verification"]
        assert check["top1_scope"] == "held-out images" and check["top1_judged"] >= 0.99
    # the static int8 graphs are judged on the held-out digits alone (whatever the fresh seed draws as noise and
    # photos, reported beside them), and pass there
    assert report["settings"]["calibrated_bounds_scope"] == "held-out images"
    for name in ("int8-static", "openvino-int8"):
        # openvino-int8 without OpenVINO, or where it does not pay off (no VNNI / AMX-INT8)
        if by_name[name]["error"].startswith("not built"):
            continue
        assert by_name[name]["written"], (name, by_name[name]["error"])
        check = by_name[name]["verification"]
        assert check["bounds_scope"] == "held-out images" and check["extra"]["reported_only"]["images"] == 48
    for outcome in by_name.values():  # every refusal says why, and none of them was asked for by name
        assert outcome["written"] or (outcome["error"] and not outcome["required"])


DECISIONS: dict[str, Decision] = {
    "make serve": Decision(MAKE),
    "make test": Decision(MAKE),
    ".venv/bin/hub-vit classify --url 127.0.0.1:8000 hub_vit/assets/digits/samples/3_0.png": Decision(SERVED),
    ".venv/bin/hub-vit loadtest --url 127.0.0.1:8001 --grpc --concurrency 16 --duration 10": Decision(SERVED),
    "hub-vit convert i1k-s16-300ep -o simplevit-s16/": Decision(DOWNLOADS, said="downloads"),
    "hub-vit convert tests/fixtures/jax/big_vision/tiny_learn_tok.npz -o out/tiny/ --verify": Decision(RUN),
    "hub-vit export onnx hub_vit/assets/digits -o exports/digits --variant all --attentions":
        Decision(RUN, then=_every_variant_this_host_can_build),
    "hub-vit export tensorrt exports/digits/model.onnx --fp16 --max-batch 32":
        Decision(GPU, said="GPU hosts with `tensorrt`", refusal="tensorrt"),
    "hub-vit train DATA --out runs/s16": Decision(NEEDS, said="DATA: your image folder"),
    "torchrun --nproc_per_node 8 -m hub_vit.train DATA --out runs/s16": Decision(NEEDS, said="8 GPUs"),
    "hub-vit serve --device cuda": Decision(GPU, said="GPU hosts", refusal="cuda"),
    "hub-vit repository out/models --model hub_vit/assets/digits": Decision(RUN),
    "hub-vit health --url 127.0.0.1:8000": Decision(SERVED),
    "hub-vit rollout hub_vit/assets/digits/samples/3_0.png -o out/": Decision(RUN),
    "hub-vit classify --url 127.0.0.1:8000 --explain -o out/ hub_vit/assets/digits/samples/3_0.png": Decision(SERVED),
    "hub-vit demo --port 7860": Decision(LONG_RUNNING),
}
# Offline commands first, so they run while `make serve`'s server starts (it starts with the first, `make serve`)
ORDER = (MAKE, RUN, DOWNLOADS, GPU, NEEDS, LONG_RUNNING, SERVED)


@dataclass(frozen=True)
class Command:
    text: str  # as written, without its comment
    comment: str


def blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced code block."""
    return [(match[1], match[2]) for match in FENCE.finditer(markdown)]


def commands(markdown: str) -> list[Command]:
    """Every command of the bash blocks, one per line, in order."""
    found = []
    for language, text in blocks(markdown):
        if language == "bash":
            for line in text.splitlines():
                comment = COMMENT.search(line)
                command = line[:comment.start()] if comment else line
                if command.strip():
                    found.append(Command(command.strip(), comment[0].strip() if comment else ""))
    return found


README_TEXT = README.read_text(encoding="utf-8")
COMMANDS = sorted(commands(README_TEXT), key=lambda c: ORDER.index(DECISIONS[c.text].kind) if c.text in DECISIONS
                  else -1)
PYTHON_BLOCKS = [text for language, text in blocks(README_TEXT) if language == "python"]


def moved(command: str, ports: dict[int, int]) -> str:
    """`command` with each default port (README's) replaced by the one this test serves on."""
    for default, port in ports.items():
        command = re.sub(rf"(?<=127\.0\.0\.1:){default}\b|(?<=--port ){default}\b", str(port), command)
    return command


# -- the fresh copy, offline ---------------------------------------------------------------------------------------
@dataclass
class Checkout:
    path: Path
    env: dict[str, str]

    def run(self, command: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=self.path, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Checkout:
    """The checkout's tracked files in a new folder, `.venv` linked, and an offline environment."""
    path = tracked_copy(tmp_path_factory.mktemp("checkout") / "hub-vit")
    (path / ".venv").symlink_to(Path(sys.prefix))
    closed = f"http://127.0.0.1:{free_port()}"  # bound and closed again: nothing listens there
    # a user's shell: not inside `make test` (whose MAKELEVEL makes a nested make print "Entering directory")
    env = {key: value for key, value in os.environ.items()
           if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUB_VIT_OFFLINE", "HUB_VIT_CACHE", "HF_HOME",
                          "MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    env |= {key: closed for key in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                                     "ALL_PROXY")}
    env |= {"no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost",
            "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("empty-cache")),
            "PATH": f"{path / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    return Checkout(path, env)


# -- make serve ----------------------------------------------------------------------------------------------------
class MakeServe:
    """`make serve`'s recipe line, run in the checkout on free ports (make's own port variables)."""

    def __init__(self, checkout: Checkout) -> None:
        self.ports = {HTTP_PORT: free_port(), GRPC_PORT: free_port(), METRICS_PORT: free_port(),
                      DEMO_PORT: free_port()}
        variables = [f"{name}={self.ports[default]}" for name, default in (
            ("HTTP_PORT", HTTP_PORT), ("GRPC_PORT", GRPC_PORT), ("METRICS_PORT", METRICS_PORT),
            ("DEMO_PORT", DEMO_PORT))]
        shown = checkout.run(f"make -n serve {' '.join(variables)}", timeout_s=60)
        assert shown.returncode == 0, shown.stderr
        lines = [line for line in shown.stdout.splitlines() if "hub-vit serve" in line]
        assert len(lines) == 1, shown.stdout
        self.recipe = lines[0]
        self.process = subprocess.Popen(shlex.split(self.recipe), cwd=checkout.path, env=checkout.env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.text = ""
        self.ready = False

    def wait_ready(self, timeout_s: float = 300) -> None:
        """Until the summary and the demo's line are printed (the server answers, the demo listens)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while not self.ready:
            line = self.process.stdout.readline()
            assert line, f"make serve's command ended before it was ready:\n{self.text}"
            self.text += line
            self.ready = line.startswith("demo ")
            assert time.monotonic() < deadline, f"not ready within {timeout_s} s:\n{self.text}"

    def stop(self) -> int:
        """SIGTERM, as systemd or `kill` sends it; the exit code, all output read."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            rest, _ = self.process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            rest, _ = self.process.communicate()
        self.text += rest
        return self.process.returncode


@pytest.fixture(scope="module")
def make_serve(checkout: Checkout):
    served = MakeServe(checkout)
    try:
        yield served
    finally:
        if served.process.poll() is None:
            served.stop()


# -- the README ----------------------------------------------------------------------------------------------------
def test_every_command_has_a_decision() -> None:
    written = {command.text for command in commands(README_TEXT)}
    assert written - DECISIONS.keys() == set(), "README commands without a decision in DECISIONS"
    assert DECISIONS.keys() - written == set(), "decisions for commands no longer in the README"
    assert {language for language, _ in blocks(README_TEXT)} <= {"bash", "python"}, "a block this test cannot run"
    for command in commands(README_TEXT):  # what a command needs is said where it is written
        assert DECISIONS[command.text].said in command.comment, (command.text, command.comment)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"python-{i}" for i in range(len(PYTHON_BLOCKS))])
def test_python_block_runs_as_pasted(checkout: Checkout, block: str) -> None:
    # was: the transformers block never imported hub_vit and stopped with "contains custom code which must be executed"
    result = checkout.run(f"python -c {shlex.quote(block)}", timeout_s=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trust_remote_code" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("command", COMMANDS, ids=[c.text[:60] for c in COMMANDS])
def test_command_runs_as_written(checkout: Checkout, command: Command, request: pytest.FixtureRequest) -> None:
    decision = DECISIONS[command.text]
    if decision.kind == MAKE:
        _check_make_target(checkout, command.text, request)
    elif decision.kind == RUN:
        result = checkout.run(command.text)
        assert result.returncode == 0, f"{command.text}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        if decision.then is not None:
            decision.then(checkout.path)
    elif decision.kind == SERVED:
        served = request.getfixturevalue("make_serve")
        served.wait_ready()
        result = checkout.run(moved(command.text, served.ports), timeout_s=120)
        assert result.returncode == 0, f"{command.text}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    elif decision.kind == LONG_RUNNING:
        _runs_until_sigterm(checkout, command.text)
    elif decision.kind == DOWNLOADS:
        start = time.monotonic()
        result = checkout.run(command.text, timeout_s=120)
        took = time.monotonic() - start
        # 3: this machine cannot do it now (README, "Exit codes"), not bad input
        assert result.returncode == 3 and "cannot download https://" in result.stderr, result.stderr[-3000:]
        assert took < 60, f"offline, it took {took:.0f} s to fail"
    elif decision.kind == GPU:
        _refused_without_the_hardware(checkout, command.text, decision)
    else:  # NEEDS: not run; test_every_command_has_a_decision checks the README says what
        assert decision.kind == NEEDS and decision.said


def _check_make_target(checkout: Checkout, text: str, request: pytest.FixtureRequest) -> None:
    if text == "make serve":  # its recipe line is the server SERVED commands use: started here, waited for there
        served = request.getfixturevalue("make_serve")
        flags = [f"--{name}-port {served.ports[default]}" for name, default in (
            ("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT), ("demo", DEMO_PORT))]
        assert served.recipe == f".venv/bin/hub-vit serve --demo {' '.join(flags)}", served.recipe
        default = checkout.run("make -n serve", timeout_s=60).stdout.splitlines()[-1]
        assert default.strip() == ".venv/bin/hub-vit serve --demo", default  # unset ports: serve's own defaults
        return
    shown = checkout.run("make -n test", timeout_s=60).stdout  # ruff, then pytest; what CI runs
    assert ".venv/bin/ruff check ." in shown and ".venv/bin/python -m pytest" in shown, shown
    assert "make test" in (checkout.path / ".ci" / "run").read_text()


def _runs_until_sigterm(checkout: Checkout, text: str) -> None:
    port = free_port()
    process = subprocess.Popen(shlex.split(moved(text, {DEMO_PORT: port})), cwd=checkout.path, env=checkout.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, status = time.monotonic() + 180, None
        while status != 200 and process.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/", timeout=5) as answer:
                    status = answer.status
            except OSError:
                time.sleep(0.5)
        assert status == 200, f"{text} did not answer on :{port}"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        assert "share=True" not in output, output  # Gradio's tip is not shown
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


def _refused_without_the_hardware(checkout: Checkout, text: str, decision: Decision) -> None:
    import torch

    if "tensorrt" in text:
        import importlib.util

        present = importlib.util.find_spec("tensorrt") is not None and torch.cuda.is_available()
    else:
        present = torch.cuda.is_available()
    if present:  # serving or building engines on a GPU is checked by scripts/gpu_check.sh, not here
        pytest.skip(f"{text!r} needs this host's GPU for minutes: scripts/gpu_check.sh runs it")
    start = time.monotonic()
    result = checkout.run(text, timeout_s=120)
    assert result.returncode == 3 and decision.refusal in result.stderr, result.stderr[-3000:]  # README, "Exit codes"
    assert time.monotonic() - start < 60


def test_the_grpc_variant_its_comment_gives(checkout: Checkout, make_serve: MakeServe) -> None:
    # was: "add --grpc for :8001", and --grpc with the HTTP --url spoke gRPC to the HTTP port
    [command] = [c for c in commands(README_TEXT) if "gRPC: " in c.comment]
    variant = command.comment.split("gRPC: ", 1)[1]
    assert "--grpc" in variant and f"--url {LOOPBACK}:{GRPC_PORT}" in variant, variant
    make_serve.wait_ready()
    result = checkout.run(moved(re.sub(r"--url \S+", variant, command.text), make_serve.ports), timeout_s=120)
    assert result.returncode == 0 and "(grpc)" in result.stdout, result.stderr[-3000:]


def test_the_raw_http_example_of_the_serving_docs_answers_as_shown(checkout: Checkout, make_serve: MakeServe) -> None:
    """docs/serving.md#raw-http: its bash block, run as one script, answers the JSON shown after it."""
    text = (checkout.path / "docs" / "serving.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Raw HTTP\n"):]
    section = section[:section.index("\n## ", 1)]
    script = next(body for language, body in blocks(section) if language == "bash")
    shown = json.loads(next(body for language, body in blocks(section) if language == "json"))
    make_serve.wait_ready()
    result = checkout.run(moved(script, make_serve.ports), timeout_s=60)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    outputs = {output["name"]: output for output in answer["outputs"]}
    expected = {output["name"]: output for output in shown["outputs"]}
    assert answer["model_name"] == shown["model_name"] and outputs.keys() == expected.keys()
    assert outputs["labels"]["data"] == expected["labels"]["data"]
    assert outputs["scores"]["data"] == pytest.approx(expected["scores"]["data"], abs=1e-4)  # any CPU's rounding


def test_make_serve_stops_calmly_on_sigterm(make_serve: MakeServe) -> None:
    """Last: SIGTERM ends `make serve`'s run cleanly, and its screen stays calm."""
    make_serve.wait_ready()
    assert make_serve.stop() == 0, make_serve.text
    assert "tritonserver stopped" in make_serve.text, make_serve.text
    assert "share=True" not in make_serve.text, make_serve.text  # was: Gradio's "set `share=True`" tip
    assert "Ctrl-C" not in make_serve.text, make_serve.text  # was: "SIGTERM: ...; press Ctrl-C again to stop at once"
