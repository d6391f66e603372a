"""The Triton stubs' Python environment (server/runtime/stub_env.py) on a host whose own numpy is 2.x, as every lent GPU
host's is: the stubs import a numpy<2 and nothing that needs numpy 2, and the torch flavour is served.

On such a host the stub's numpy had been chosen by $HUB_VIT_STUB_PYTHONPATH, which never reached the stub (its
embedded Python ignores PYTHONPATH and takes its environment from the `python3` on PATH), so the torch flavour died
on its warm-up image ("unpack_from requires a buffer of at least 1701143913 bytes"). The last test serves from such a
main environment, emulated on this CPU host (tests/host_emulation.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hub_vit.server.runtime import stub_env
from hub_vit.server.runtime.stub_env import STUB_PYTHONPATH, build_view, stub_environment
from hub_vit.server.runtime.triton_install import NEWEST_SERVING_PYTHON, ServerError, unservable_python
from tests.host_emulation import emulated_host, numpy1_folder, site_packages


def _dist(folder: Path, name: str, version: str, files: list[str], requires: tuple[str, ...] = ()) -> None:
    """A distribution as pip installs it: its files, and a .dist-info with METADATA and RECORD."""
    for file in files:
        path = folder / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"__version__ = {version!r}\n" if file.endswith("__init__.py") else "")
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {requirement}\n" for requirement in requires)
    (info / "METADATA").write_text(metadata)
    (info / "RECORD").write_text("".join(f"{file},,\n" for file in [*files, f"{info.name}/METADATA",
                                                                     f"{info.name}/RECORD"]))


@pytest.fixture
def gpu_host_paths(tmp_path, monkeypatch) -> dict[str, Path]:
    """A host import path as a GPU host has it: numpy 2.5.2, scipy needing numpy 2, scikit-learn happy with either numpy
    but needing scipy, sentence-transformers needing scikit-learn, scikit-image wanting scipy only for an extra, hub-vit
    (requiring scikit-learn), a namespace folder (`nvidia/`) spread over two folders, an editable install's .pth; and
    the stubs' numpy 1.26.4."""
    stubs, host, more = tmp_path / "stub-site", tmp_path / "site-packages", tmp_path / "pythonpath"
    _dist(stubs, "numpy", "1.26.4", ["numpy/__init__.py", "numpy.libs/libopenblas.so"])
    _dist(host, "numpy", "2.5.2", ["numpy/__init__.py", "numpy.libs/libscipy_openblas.so"])
    _dist(host, "scipy", "1.18.1", ["scipy/__init__.py", "scipy.libs/libgfortran.so"],
          ("numpy<2.8,>=2.0.0",))
    _dist(host, "scikit-learn", "1.8.0", ["sklearn/__init__.py"], ("numpy>=1.22.0", "scipy>=1.8.0"))
    _dist(host, "sentence-transformers", "6.0.1", ["sentence_transformers/__init__.py"], ("scikit-learn",))
    _dist(host, "scikit-image", "0.26.0", ["skimage/__init__.py"], ("numpy>=1.24", 'scipy>=1.11; extra == "data"'))
    _dist(more, "hub-vit", "0.1.0", ["hub_vit/__init__.py"], ("numpy>=1.24", "scikit-learn>=1.3"))
    _dist(host, "nvidia-cublas", "13.0", ["nvidia/cublas/lib/libcublas.so"])
    _dist(more, "nvidia-cudnn", "9.0", ["nvidia/cudnn/lib/libcudnn.so"])
    (host / "__editable__.demo.pth").write_text(f"{more}\nimport os; os.environ.setdefault('PTH_RAN', '1')\n")
    monkeypatch.setattr(stub_env, "import_path", lambda: [host, more])
    return {"stubs": stubs, "host": host, "more": more}


def test_the_view_holds_the_stub_numpy_and_leaves_out_what_needs_numpy_2(gpu_host_paths, tmp_path):
    view = build_view(tmp_path / "env", gpu_host_paths["stubs"], "1.26.4")
    site = site_packages(tmp_path / "env")
    # scipy needs numpy 2; scikit-learn needs scipy (transformers 5.17 imports sklearn when it finds it, and that
    # import then fails on scipy); sentence-transformers needs scikit-learn; scikit-image needs scipy only for an extra
    assert view.left_out == ("scikit-learn 1.8.0", "scipy 1.18.1", "sentence-transformers 6.0.1")
    assert (site / "numpy").resolve() == (gpu_host_paths["stubs"] / "numpy").resolve()
    assert (site / "numpy.libs").resolve() == (gpu_host_paths["stubs"] / "numpy.libs").resolve()
    assert not (site / "numpy-2.5.2.dist-info").exists() and (site / "numpy-1.26.4.dist-info").exists()
    assert not any(site.glob("scipy*")), "scipy needs numpy 2: the stubs must not see it"
    assert not (site / "sklearn").exists() and not (site / "sentence_transformers").exists()
    assert (site / "skimage").exists()
    assert (site / "hub_vit").exists(), "hub-vit's steps never import scikit-learn: the view keeps it"
    assert sorted(p.name for p in (site / "nvidia").iterdir()) == ["cublas", "cudnn"]  # the namespace, merged
    # the .pth file's import line runs; its folder line is left out (the view holds that folder already)
    assert (site / "__editable__.demo.pth").read_text() == "import os; os.environ.setdefault('PTH_RAN', '1')\n"

    script = ("import importlib.metadata as md, importlib.util as u, os, numpy; "
              "print(numpy.__version__, md.version('numpy'), u.find_spec('scipy'), u.find_spec('sklearn'), "
              "os.environ.get('PTH_RAN'))")
    out = subprocess.run([str(view.bin_dir / "python3"), "-c", script], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, check=True)
    assert out.stdout.split() == ["1.26.4", "1.26.4", "None", "None", "1"], out.stderr


def test_a_numpy_2_host_without_a_numpy_for_the_stubs_is_refused_with_the_way_out(gpu_host_paths, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.delenv(STUB_PYTHONPATH, raising=False)
    with pytest.raises(ServerError, match=r"numpy 2\.5\.2 is installed here.*pip install --target DIR 'numpy<2', "
                                          r"then export HUB_VIT_STUB_PYTHONPATH=DIR \(now: not set"):
        stub_environment(tmp_path / "workspace")
    monkeypatch.setenv(STUB_PYTHONPATH, str(gpu_host_paths["host"]))  # a folder whose numpy is 2.x: no help
    with pytest.raises(ServerError, match=r"no numpy<2 found there"):
        stub_environment(tmp_path / "workspace")
    monkeypatch.setenv(STUB_PYTHONPATH, f"{tmp_path / 'missing'}{os.pathsep}{gpu_host_paths['stubs']}")
    environment = stub_environment(tmp_path / "workspace")
    assert environment.numpy == "1.26.4" and environment.bin_dir == tmp_path / "workspace" / "stub-env" / "bin"


def test_on_a_python_too_new_for_any_numpy_1_the_refusal_says_so(gpu_host_paths, tmp_path, monkeypatch):
    # numpy<2 has no release for Python 3.13+: the way out is another Python, not `pip install 'numpy<2'`
    newest = NEWEST_SERVING_PYTHON
    too_new = (newest[0], newest[1] + 1)
    monkeypatch.delenv(STUB_PYTHONPATH, raising=False)
    with pytest.raises(ServerError) as refused:
        stub_environment(tmp_path / "workspace", python=too_new)
    assert str(refused.value) == unservable_python(too_new)
    monkeypatch.setenv(STUB_PYTHONPATH, str(gpu_host_paths["stubs"]))  # had one been found, it would be used
    assert stub_environment(tmp_path / "workspace", python=too_new).numpy == "1.26.4"


def test_a_numpy_1_host_serves_the_stubs_from_its_own_environment(tmp_path):
    environment = stub_environment(tmp_path)
    assert environment.bin_dir == Path(sys.executable).parent and environment.numpy == np.__version__
    assert not any(tmp_path.iterdir()), "nothing to build where this environment's numpy already suits the stubs"


@pytest.mark.slow
@pytest.mark.triton
def test_the_torch_flavour_is_served_from_a_numpy_2_host(tmp_path):
    """`hub-vit serve` run by a main environment whose numpy is 2.x, the stubs given numpy<2 as a GPU host's pack
    gives it: the answer equals the model's, and the stubs imported the numpy<2 (their memory maps say which)."""
    from hub_vit.catalog import default_model_folder
    from hub_vit.resolve import resolve_model
    from hub_vit.server.client.classifier import Classifier
    from hub_vit.server.repository.options import ServingOptions
    from hub_vit.server.repository.writer import write_repository
    from hub_vit.server.runtime.launcher import free_port
    from hub_vit.server.runtime.processes import is_stub, live_processes

    python = emulated_host(tmp_path / "host")
    found = subprocess.run([str(python), "-c", "import numpy, hub_vit; print(numpy.__version__)"], check=True,
                           capture_output=True, text=True).stdout.strip()
    assert int(found.split(".")[0]) >= 2, f"the emulated host's numpy is {found}"
    stubs_numpy = numpy1_folder(tmp_path / "stub-site")
    source = resolve_model(default_model_folder())
    repository = write_repository(source, tmp_path / "repository", ServingOptions(flavour="torch", device="cpu",
                                                                                 classifier_instances=1))
    ports = [free_port() for _ in range(3)]
    env = {**os.environ, STUB_PYTHONPATH: str(stubs_numpy)}
    env.pop("PYTHONPATH", None)
    serve = subprocess.Popen([str(python), "-c", "from hub_vit.cli import main; main()", "serve", "--repository",
                              str(repository), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
                              "--metrics-port", str(ports[2])], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sample = default_model_folder() / "samples" / "3_0.png"
        with Classifier(f"127.0.0.1:{ports[0]}", timeout_s=5) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if client.ready():
                        break
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                assert serve.poll() is None, serve.stdout.read().decode(errors="replace")
                assert time.monotonic() < deadline, "not ready within 120 s"
                time.sleep(0.5)
            [served] = client.classify(sample, with_logits=True)
        mapped = {pid: Path(f"/proc/{pid}/maps").read_text() for pid, cmd in live_processes().items()
                  if is_stub(cmd) and str(repository) in cmd}  # tritonserver runs in a session of its own
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(60)
    expected = _in_process_probabilities(default_model_folder(), sample.read_bytes())
    assert served.labels[0] == source.labels[int(expected.argmax())]
    np.testing.assert_allclose(served.scores[0], expected.max(), atol=1e-4)
    assert mapped, "no Python-backend stub was running"
    for pid, maps in mapped.items():
        numpy_core = {Path(line.split()[-1]) for line in maps.splitlines() if "_multiarray_umath" in line}
        assert numpy_core, f"stub {pid} has no numpy loaded"
        assert all(path.is_relative_to((stubs_numpy / "numpy").resolve()) for path in numpy_core), \
            f"stub {pid} imported numpy from {numpy_core}, not the stubs' numpy<2 in {stubs_numpy}"


def _in_process_probabilities(folder: Path, encoded: bytes) -> np.ndarray:
    """timm's eval transform and the PyTorch forward of the model folder: (C,) probabilities."""
    import io

    import torch
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from hub_vit.folder import load_model_folder

    model, info = load_model_folder(folder)
    transform = create_transform(**resolve_data_config(pretrained_cfg=dict(info.pretrained_cfg)), is_training=False)
    with torch.no_grad():
        return model(transform(Image.open(io.BytesIO(encoded)).convert("RGB"))[None]).softmax(-1)[0].numpy()
