"""`hub-vit serve` builds its repository in a child process and never imports torch itself (`hub_vit.cli.serve_build`):
the process that supervises for days held the exported model's torch, onnx and ONNX Runtime (800 MB resident for the
shipped 2-layer model). Checked against the real serve: what it has mapped while serving, and what a stop while it
builds leaves behind (a real build that takes minutes, real signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hub_vit.server.runtime import device as device_module
from hub_vit.server.runtime import triton_install
from tests.polling import wait_until
from tests.programs import Serve, expected_digits

# Shared libraries only model loading and export map: none may be in the serving process.
BUILD_LIBRARIES = ("libtorch", "onnxruntime", "onnx_cpp2py_export", "libopenvino")


def _mapped(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/" in line}


def _alive(pid: int) -> bool:
    """`pid` runs (a zombie, or a process reparented after serve's death, counts as not running only once reaped or
    dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.triton
@pytest.mark.slow
def test_the_serving_process_never_loads_the_model() -> None:
    serve = Serve()
    try:
        serve.wait_for("serving model vit")
        assert serve.classify() == expected_digits()  # it serves what the child built
        mapped = _mapped(serve.process.pid)
        assert not [path for path in mapped if any(name in path for name in BUILD_LIBRARIES)], sorted(mapped)
        assert not [cmd for cmd in serve.children().values() if "serve_build" in cmd]  # the child is gone
    finally:
        serve.stop()


@pytest.mark.triton
@pytest.mark.slow
def test_children_import_the_package_serve_runs_not_a_folder_of_its_name_in_the_working_folder(tmp_path: Path) -> None:
    # was: `python -m` put the working folder first on the children's sys.path, so serve started from a folder
    # holding a `hub_vit` (a clone beside an installed hub-vit) built and relayed with that copy, or not at all
    for package in ("hub_vit", "torch"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise ImportError('the working folder\\'s {package}')\n")
    serve = Serve("--front-processes", "2", cwd=tmp_path)
    try:
        serve.wait_for("metrics")
        assert serve.classify() == expected_digits()  # built by the child, relayed by the front's workers
        assert len(serve.front_pids()) == 2
    finally:
        serve.stop()


@pytest.fixture(scope="module")
def slow_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ViT-Ti/16 folder with a trained-looking (non-zero) head: serve's default `auto` builds, verifies and times
    its CPU variants, minutes on 2 cores, so a signal sent once the repository folder appears lands mid-build."""
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.folder import save_model_folder

    model = VisionTransformer(ViTSpec.from_variant("Ti/16", num_classes=3))
    torch.manual_seed(0)
    torch.nn.init.normal_(model.head.weight, std=0.02)  # big_vision's zero head makes serve skip the variants
    return save_model_folder(model, tmp_path_factory.mktemp("ti16") / "ti16", labels=["a", "b", "c"])


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "terminal-closed", "terminal-closed-under-nohup", "sigterm-to-serve",
                                  "sigkill-to-serve", "sigkill-to-the-child"])
def test_a_stop_while_building_leaves_nothing_behind(slow_build: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, stop: str) -> None:
    """Ctrl-C and a closed terminal's SIGHUP reach the whole process group (under `nohup` neither stops); `docker stop`
    and systemd send SIGTERM to serve alone; the OOM killer or kill -9 ends serve outright, or the child (exporting is
    the likeliest to reach a memory limit). After each the child is gone and so is the temporary folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    hangup = signal.SIG_IGN if stop.endswith("nohup") else signal.SIG_DFL  # not this test run's own (CI's nohup)
    serve = Serve(str(slow_build), new_session=True, preexec=lambda: signal.signal(signal.SIGHUP, hangup))
    try:
        serve.wait_for("building the Triton repository for ti16")  # the child loaded the model and writes
        [workdir] = tmp_path.glob("hub-vit-serve-*")
        [child] = [pid for pid, cmd in serve.children().items() if "hub_vit.cli.serve_build" in cmd]
        time.sleep(3)  # into the export
        assert any(workdir.rglob("*")), "nothing written yet"
        assert "CPU variant:" not in serve.text  # still building
        if stop == "ctrl-c":
            os.killpg(serve.process.pid, signal.SIGINT)
        elif stop.startswith("terminal-closed"):
            os.killpg(serve.process.pid, signal.SIGHUP)
            if stop.endswith("nohup"):  # both go on building, until a stop they do not ignore
                time.sleep(3)
                assert serve.process.poll() is None and _alive(child), serve.text
                serve.process.send_signal(signal.SIGTERM)
        elif stop == "sigkill-to-the-child":
            os.kill(child, signal.SIGKILL)
        else:
            serve.process.send_signal(signal.SIGTERM if stop == "sigterm-to-serve" else signal.SIGKILL)
        code = serve.finish(timeout_s=60)
        assert wait_until(lambda: child not in serve.children() and not _alive(child), timeout_s=40)
        assert wait_until(lambda: not workdir.exists(), timeout_s=10), sorted(workdir.rglob("*"))
        if stop in ("sigkill-to-serve", "terminal-closed"):  # serve catches SIGHUP only once it serves
            assert code == (-signal.SIGKILL if stop == "sigkill-to-serve" else -signal.SIGHUP)
        elif stop == "sigkill-to-the-child":
            assert code == 1 and "error: building the repository failed: the process building it was killed by " \
                "SIGKILL (the OOM killer, or kill -9)" in serve.text, serve.text
        else:
            assert code == 128 + (signal.SIGINT if stop == "ctrl-c" else signal.SIGTERM), serve.text
            assert "stopped while building the repository" in serve.text, serve.text
            assert "Traceback" not in serve.text, serve.text
    finally:
        serve.stop()


def _emulated_torch(folder: Path, body: str) -> dict[str, str]:
    """An environment whose interpreters run `body` at start-up (sitecustomize): the probe's torch as a GPU host's."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(body)
    return {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])}


@pytest.mark.parametrize("torch_says, expected", [
    ("", None),  # this host's torch: no CUDA device
    ("import torch\ntorch.cuda.is_available = lambda: True\n"
     "torch.cuda.get_device_name = lambda index=0: 'NVIDIA H200'\n", "NVIDIA H200"),
])
def test_the_cuda_device_is_asked_of_torch_in_a_child_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             torch_says: str, expected: str | None) -> None:
    """On a host with NVIDIA device nodes (emulated here) serve asks a child interpreter: the program it runs is
    checked against this host's torch and against one that sees an H200."""
    monkeypatch.setattr(triton_install, "has_gpu", lambda: True)
    for key, value in _emulated_torch(tmp_path / "site", torch_says).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delitem(sys.modules, "torch")  # as in serve: not imported in this process, so the child is asked
    assert device_module.cuda_device_name() == expected
    assert device_module.choose_device(None).device == ("cuda" if expected else "cpu")


def test_a_cuda_check_that_crashes_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_install, "has_gpu", lambda: True)
    crash = "import os, signal, sys\nif sys.argv[0] == '-c':\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    for key, value in _emulated_torch(tmp_path / "site", crash).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delitem(sys.modules, "torch")
    with pytest.raises(device_module.NoCudaDevice, match="asking torch for a CUDA device failed: its process was "
                                                         "killed by SIGSEGV .*or serve with --device cpu"):
        device_module.cuda_device_name()
    result = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True)
    assert result.returncode == -signal.SIGSEGV  # the emulation is what crashed it


def test_a_cuda_check_that_hangs_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_install, "has_gpu", lambda: True)
    monkeypatch.setattr(device_module, "CUDA_PROBE_TIMEOUT_S", 2)
    hang = "import sys, time\nif sys.argv[0] == '-c':\n    time.sleep(60)\n"  # a driver call that never returns
    for key, value in _emulated_torch(tmp_path / "site", hang).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delitem(sys.modules, "torch")
    with pytest.raises(device_module.NoCudaDevice, match=r"asking torch for a CUDA device did not finish within 2 s "
                                                         r"\(a hung NVIDIA driver\?\); check `nvidia-smi`, or serve "
                                                         "with --device cpu"):
        device_module.cuda_device_name()


def test_a_stop_that_a_library_wrapped_is_still_the_stop() -> None:
    # was: Ctrl-C landing inside torch.export came back as torch's "Attempted to unset ProxyTorchDispatchMode", wrapped
    # in torch.onnx's ConversionError, and the build printed it as a bug's traceback under "stopped while building"
    import signal

    from hub_vit.cli.serve_build import _stop_behind
    from hub_vit.cli.stop_signals import StopRequested

    def wrapped(stop: BaseException) -> Exception:
        try:
            try:
                raise stop
            except BaseException:
                raise RuntimeError("Attempted to unset ProxyTorchDispatchMode, but there wasn't one active.") from None
        except RuntimeError as err:
            try:
                raise ValueError("Failed to decompose the FX graph for ONNX compatibility.") from err
            except ValueError as conversion:
                return conversion

    assert _stop_behind(wrapped(KeyboardInterrupt())) == 128 + signal.SIGINT
    assert _stop_behind(wrapped(StopRequested(128 + signal.SIGTERM))) == 128 + signal.SIGTERM
    assert _stop_behind(ValueError("a bug")) is None
