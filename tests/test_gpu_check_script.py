"""scripts/gpu_check.sh refuses what it cannot run, before anything is unpacked; bench/gpu_check.py names its
result file after the GPU and judges its targets as ratios. The whole check runs on a GPU host; here its dry run
runs every step that needs no GPU as a lent GPU host would, from a main environment whose numpy is 2.x
(tests/host_emulation.py) with the stubs' numpy<2 named by $HUB_VIT_STUB_PYTHONPATH: hub-vit installed into a layer
of its own, the GPU tests (skipped here), and bench/gpu_check.py serving the torch flavour (on the CPU) against the CPU
flavour, bad input, load on the public and the private ports, the c1 request path, the targets."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench_modules import load_bench_script

REPO = Path(__file__).resolve().parents[1]


def _script(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout, cwd=REPO)


def test_a_missing_pack_names_the_script_that_makes_it(tmp_path):
    done = _script(f"--pack={tmp_path / 'nothing'}", GPU_CHECK_WORK=str(tmp_path / "work"), OUT=str(tmp_path))
    assert done.returncode == 2
    said = done.stdout + done.stderr  # the script's output goes to its log too (tee), stdout and stderr together
    assert "triton-cp312.tar.xz is missing: run scripts/pack_gpu_check.sh" in said, said
    assert not (tmp_path / "work" / "server").exists()


def test_an_unknown_argument_prints_the_usage(tmp_path):
    done = _script("--gpu", GPU_CHECK_WORK=str(tmp_path / "work"))
    assert done.returncode == 2, done.stderr
    assert "usage: scripts/gpu_check.sh [--dry-run | --unpack-only] [--pack=FOLDER]" in done.stderr


def test_dry_run_and_unpack_only_together_are_refused_by_name(tmp_path):
    done = _script("--dry-run", "--unpack-only", GPU_CHECK_WORK=str(tmp_path / "work"))
    assert done.returncode == 2 and "error: --dry-run and --unpack-only exclude each other" in done.stderr, done.stderr
    assert not (tmp_path / "work").exists()


def _tiny_pack(folder: Path) -> Path:
    """A pack shaped as scripts/pack_gpu_check.sh makes it, with stand-in files: the server's tar.xz (site/,
    libpython/, stub-site/), the setuptools wheel and one client wheel."""
    import tarfile
    import zipfile

    staged = folder / "stage"
    for name in ("site/pytriton/tritonserver/bin/tritonserver", "site/nvidia_pytriton.libs/libtritonserver.so",
                 "libpython/libpython3.12.so.1.0", "stub-site/numpy/__init__.py"):
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_text(name)
    pack = folder / "pack"
    (pack / "wheels").mkdir(parents=True)
    with tarfile.open(pack / "triton-cp312.tar.xz", "w:xz") as tar:
        for part in ("site", "libpython", "stub-site"):
            tar.add(staged / part, arcname=part)
    for wheel, package in (("setuptools-80.9.0-py3-none-any.whl", "setuptools"),
                           ("tritonclient-2.73.0-py3-none-any.whl", "tritonclient")):
        with zipfile.ZipFile(pack / "wheels" / wheel, "w") as zipped:
            zipped.writestr(f"{package}/__init__.py", f"# {package}")
    return pack


def test_the_pack_unpacks_where_the_later_steps_look(tmp_path):
    """Step 1 on its own (`--unpack-only`): the server under server/, its Python files and the client wheels in site/
    (put on PYTHONPATH), setuptools in build/ only (the editable install's, kept off the host's import path), the
    stubs' numpy<2 named."""
    work = tmp_path / "work"
    done = _script("--unpack-only", f"--pack={_tiny_pack(tmp_path)}", GPU_CHECK_WORK=str(work), OUT=str(tmp_path))
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert (work / "server" / "site" / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file()
    assert (work / "server" / "libpython" / "libpython3.12.so.1.0").is_file()
    assert (work / "site" / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file()
    assert (work / "site" / "tritonclient" / "__init__.py").is_file()
    assert (work / "build" / "setuptools" / "__init__.py").is_file() and not (work / "site" / "setuptools").exists()
    assert f"HUB_VIT_STUB_PYTHONPATH={work}/server/stub-site; PYTHONPATH={work}/site" in said, said
    assert not (work / "venv").exists()  # stopped after step 1


def test_a_python_other_than_3_12_is_refused_before_anything_is_unpacked(tmp_path):
    if sys.version_info[:2] == (3, 12):
        pytest.skip("this interpreter is 3.12, the one the check runs")
    work = tmp_path / "work"
    done = _script(f"--pack={_tiny_pack(tmp_path)}", PYTHON=sys.executable, GPU_CHECK_WORK=str(work),
                   OUT=str(tmp_path))
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert f"is Python {sys.version.split()[0]}; the carried stub is for Python 3.12" in said, said
    assert not (work / "server").exists()


@pytest.fixture
def gpu_check(monkeypatch):
    return load_bench_script("gpu_check", monkeypatch)  # it imports run_info as the bench scripts do


@pytest.mark.parametrize("name, tag", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("cpu", "cpu")])
def test_result_files_are_named_after_the_gpu(gpu_check, name, tag):
    assert gpu_check.file_tag(name) == tag


def test_targets_are_ratios_of_the_h200_numbers(gpu_check):
    """The first H200 run's numbers (../shared results of issue 39), put in today's shape: each target a ratio
    against what is wanted, >= 1 where met."""
    served = f"{gpu_check.SERVED_FORWARD_ROW} (bf16 weights, CUDA graphs, top-k on the device)"  # the cuda row's name
    rows = [{"path": gpu_check.TIMM_COMPILE_ROW, "batch": 256, "images_per_s": 28317.0, "latency_ms": 9.04},
            {"path": served, "batch": 256, "images_per_s": 9681.0, "latency_ms": 26.4},
            {"path": f"{gpu_check.SERVED_FORWARD_ROW} + torch.compile (bf16 weights, CUDA graphs, top-k on the "
                     "device)", "batch": 256, "images_per_s": 9000.0, "latency_ms": 28.4},  # slower: not taken
            {"path": gpu_check.DATA_PATH_ROW, "batch": 256, "images_per_s": 9681.0, "latency_ms": 26.4},
            {"path": gpu_check.DATA_PATH_ROW, "batch": 1, "images_per_s": 543.0, "latency_ms": 1.84}]
    load = [{"protocol": "http", "ports": "private", "concurrency": 256, "images_per_s": 475.0,
             "gpu_utilisation_percent": 4.9}]
    result = {"in_process": {"rows": rows}, "load": load,
              "request_path": {"http": {"breakdown_ms": {"served_p50": 22.03}}},
              "decode": {"device_decode_and_transform_images_per_s": 19800.0, "whole_data_path_images_per_s": 419.0},
              "digits": {"compare": {"passed": True}, "bad_input": {"passed": True}}}
    targets = gpu_check.targets(result, 256)
    assert targets["served_forward_vs_timm_compile"]["ratio"] == pytest.approx(9681 / 28317)
    assert targets["served_forward_vs_timm_compile"]["path"] == served
    assert targets["served_c256_private_http_vs_in_process"]["ratio"] == pytest.approx(475 / 9681 / 0.5)
    assert targets["gpu_busy_at_c256_http"]["ratio"] == pytest.approx(0.049 / 0.5)
    c1 = targets["c1_p50_over_in_process_b1_ms_http"]
    assert c1["value"] == pytest.approx(20.19) and c1["ratio"] == pytest.approx(3 / 20.19) and not c1["met"]
    assert targets["gpu_decode_preprocess_images_per_s"]["met"]
    assert targets["agrees_with_the_cpu_flavour"]["met"] and not targets["all_met"]


def test_gpu_utilisation_is_sampled_from_nvidia_smi(gpu_check, tmp_path, monkeypatch):
    """The load step's GPU busy figure: nvidia-smi's utilization.gpu lines, averaged; a line it cannot read is left
    out, and without nvidia-smi there is no figure (None), not an error. A stand-in nvidia-smi on PATH prints what
    `--query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200` prints, then waits to be stopped."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\n"
                   "case \"$*\" in *--query-gpu=utilization.gpu*--format=csv,noheader,nounits*-lms*) ;;\n"
                   "  *) exit 2 ;;\nesac\n"
                   "printf '40\\n60\\n[N/A]\\n80\\n'\nexec sleep 30\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    with gpu_check.GpuSampler() as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert sampler.samples == [40.0, 60.0, 80.0] and sampler.mean() == pytest.approx(60.0)
    assert sampler.process.poll() is not None  # stopped on leaving
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with gpu_check.GpuSampler() as sampler:
        pass
    assert sampler.mean() is None


@pytest.mark.slow
@pytest.mark.triton
def test_the_dry_run_serves_the_torch_flavour_from_a_numpy_2_host(tmp_path):
    """`scripts/gpu_check.sh --dry-run` without a pack, run by a main environment whose numpy is 2.x, as a lent GPU
    host's is, with the stubs' numpy<2 in a folder of its own: every step passes, the stubs mapped that numpy<2,
    and the JSON holds every measurement the GPU run fills."""
    import json

    from tests.host_emulation import emulated_host, numpy1_folder

    python = emulated_host(tmp_path / "host")
    stubs_numpy = numpy1_folder(tmp_path / "stub-site")
    out = tmp_path / "out"
    env = {"PYTHON": str(python), "HUB_VIT_STUB_PYTHONPATH": str(stubs_numpy), "GPU_CHECK_WORK": str(tmp_path / "w"),
           "OUT": str(out)}
    done = _script("--dry-run", f"--pack={tmp_path / 'no-pack'}", timeout=1200, **env)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-6000:]
    assert "numpy 2." in said and "(stubs: 1." in said, said[:3000]
    result = json.loads((out / "gpu_serving_cpu_dry_run.json").read_text())
    assert result["errors"] == {}, result["errors"]
    digits = result["digits"]
    assert digits["compare"]["passed"] and digits["bad_input"]["passed"], digits
    numpy1 = (stubs_numpy / "numpy").resolve()  # where the links of the stubs' numpy<2 lead
    assert digits["stubs_numpy"] and all(Path(path) == numpy1 for path in digits["stubs_numpy"]), digits
    assert "torch flavour" in digits["gpu_server"]["device"] and digits["gpu_server"]["private_ports"]
    assert {(p["protocol"], p["ports"]) for p in result["load"]} == {(protocol, ports) for protocol in ("http", "grpc")
                                                                     for ports in ("private", "public")}
    assert all(p["requests"] > 0 and p["errors"] == 0 for p in result["load"])
    assert all(p["step_phases"]["us_per_image"]["decode"] > 0 for p in result["load"])  # from the phase log
    assert all(p["step_phases"]["longest_gc_ms"] >= 0 for p in result["load"])
    more = result["load_more_instances"]  # more classifier instances (3 on a dry run), on the private ports
    assert more["instances"] == 3 and "--instances" in more["server"]["command"]
    assert {(p["protocol"], p["ports"]) for p in more["load"]} == {("http", "private"), ("grpc", "private")}
    assert all(p["requests"] > 0 and p["errors"] == 0 for p in more["load"])
    smaller = result["load_smaller_batches"]  # batches of a quarter of the concurrency, HTTP on the private port
    assert smaller["max_batch_size"] == 1 and "--max-batch-size" in smaller["server"]["command"]
    assert [(p["protocol"], p["ports"]) for p in smaller["load"]] == [("http", "private")]
    assert all(p["requests"] > 0 and p["errors"] == 0 and sum(p["step_phases"]["executing_at_once"]) == pytest.approx(1)
               for p in [*smaller["load"], *result["load"]])
    other = result["load_other_queue_policy"]  # on the CPU without a queue policy (the batcher prefetching)
    assert other["queue_policy"] is False and "--no-queue-policy" in other["server"]["command"]
    assert {(p["protocol"], p["ports"]) for p in other["load"]} == {("http", "private"), ("grpc", "private")}
    assert all(p["requests"] > 0 and p["errors"] == 0 for p in other["load"])
    for protocol in ("http", "grpc"):
        breakdown = result["request_path"][protocol]["breakdown_ms"]
        assert all(breakdown[key] is not None for key in ("served_p50", "gate", "queue", "stub_ipc", "decode",
                                                          "transform", "forward", "answer"))
    scaling = result["thread_scaling"]  # every thread count measured, from 1 up to the cores
    assert scaling["threads"][0] == 1 and scaling["threads"][-1] == os.cpu_count()
    assert all(len(scaling[key]) == len(scaling["threads"]) and min(scaling[key]) > 0
               for key in ("scan_checks_images_per_s", "sha256_mib_per_s", "scan_checks_images_speedup"))
    assert "cgroup_quota" in result["run"]["cpu"]
    assert set(result["step_gc_seconds"]) == set(result["step_seconds"])
    paths = {row["path"] for row in result["in_process"]["rows"]}
    assert {"timm eager fp32", "timm eager bf16 weights", "hub-vit served forward",
            "hub-vit data path + served forward (JPEG bytes in)"} <= paths
    assert {"served_c2_private_http_vs_in_process", "c1_p50_over_in_process_b1_ms_grpc",
            "gpu_decode_preprocess_images_per_s", "agrees_with_the_cpu_flavour"} <= set(result["targets"])


def test_executions_at_once_are_read_from_the_phase_log(gpu_check):
    """Two instances: 0-10 ms and 5-15 ms overlap for 5 ms, then nothing runs until 20-25 ms (the collection's time,
    `gc_ms`, happens inside its execution's phases and adds nothing): a fifth of the 25 ms span at each of 0 and 2,
    the rest at 1. Instances taking turns read as everything at 1."""
    lines = [{"start_ns": 0, "decode_ms": 4.0, "forward_ms": 6.0, "gc_ms": 3.0},
             {"start_ns": 5_000_000, "decode_ms": 10.0}, {"start_ns": 20_000_000, "forward_ms": 5.0}]
    assert gpu_check.executing_at_once(lines) == pytest.approx([0.2, 0.6, 0.2])
    turns = [{"start_ns": i * 10_000_000, "forward_ms": 10.0} for i in range(4)]
    assert gpu_check.executing_at_once(turns) == pytest.approx([0.0, 1.0])
    assert gpu_check.executing_at_once([]) == []
