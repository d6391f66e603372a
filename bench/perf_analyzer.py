"""Triton's own load generator, `perf_analyzer` (C++), as the benchmark's second load generator.

`bench_serve.py` measures the server with two clients side by side: hub-vit's Python load test and this one. On a
2-core host the load generator shares the server's cores, so a client's own CPU per request is part of what the
benchmark sees; perf_analyzer spends less of it than a Python client.

Where it comes from: `perf_analyzer` on PATH (e.g. Triton's SDK container), else a copy assembled once from the
package registries under ~/.cache/hub-vit/perf_analyzer-<version>/:
* `bin/perf_analyzer` from the manylinux wheel of `tritonclient` 2.51.0, the release of the Triton server that
  `hub-vit serve` runs (PyTriton 0.7.0 embeds 2.51.0); later wheels ship it too (2.53.0 does), but hub-vit's own
  environment keeps its newer tritonclient, so only the binary is taken from this one;
* `lib/libcudart.so.12` from `nvidia-cuda-runtime-cu12`: the binary links the CUDA runtime even when it uses no GPU
  (the library loads without one);
* `lib/libb64.so.0d` from Debian's `libb64-0d` (`apt-get download`, no install, no root).
"""

from __future__ import annotations

import base64
import csv
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "2.51.0"
WHEEL = f"tritonclient=={VERSION}"
WHEEL_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
CUDART = "nvidia-cuda-runtime-cu12==12.9.79"
CUDART_MEMBER = "nvidia/cuda_runtime/lib/libcudart.so.12"
LIBB64_DEB = "libb64-0d"
LIBB64 = "libb64.so.0d"
WINDOWS = 3  # measurement windows per run: perf_analyzer's fewest for its stability check
WINDOW_STRETCH = 1.2  # perf_analyzer 2.51 sleeps 1.2 x -p per time window (InferenceProfiler::Measure)
MAX_WINDOWS = 10  # a window with no answer is never "stable": more windows, up to this many, until WINDOWS in a row


class PerfAnalyzerUnavailable(RuntimeError):
    """perf_analyzer is not on PATH and could not be assembled here; the message says which step failed."""


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    env: dict[str, str] = field(default_factory=dict)  # extra environment: the library path of a cached copy

    @classmethod
    def copy_in(cls, folder: Path) -> PerfAnalyzer:
        """The copy assembled in `folder`: its bin/perf_analyzer, with its lib/ first on the library path."""
        library_path = os.pathsep.join(p for p in (str(folder / "lib"), os.environ.get("LD_LIBRARY_PATH", "")) if p)
        return cls(folder / "bin" / "perf_analyzer", {"LD_LIBRARY_PATH": library_path})

    def version(self) -> str:
        """'Perf Analyzer Version 2.51.0 (commit unknown)'; also proves that the binary and its libraries load."""
        try:
            done = subprocess.run([str(self.binary), "--version"], env={**os.environ, **self.env},
                                  capture_output=True, text=True, timeout=30)
        except OSError as err:
            raise PerfAnalyzerUnavailable(f"{self.binary} does not run: {err}") from err
        text = (done.stdout + done.stderr).strip()
        if done.returncode != 0 or "Version" not in text:
            raise PerfAnalyzerUnavailable(f"{self.binary} does not run (exit {done.returncode}): {text[-500:]}")
        return text.splitlines()[0]


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hub-vit" / f"perf_analyzer-{VERSION}"


def locate(cache: Path | None = None) -> PerfAnalyzer:
    """perf_analyzer on PATH, else the cached copy, assembled on first use. Raises PerfAnalyzerUnavailable."""
    on_path = shutil.which("perf_analyzer")
    if on_path:
        return PerfAnalyzer(Path(on_path))
    home = cache or cache_root()
    if not PerfAnalyzer.copy_in(home).binary.is_file():
        assemble(home)
    return PerfAnalyzer.copy_in(home)


def _step(command: list[str], what: str, cwd: Path) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise PerfAnalyzerUnavailable(f"{what} failed: {err}") from err
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PerfAnalyzerUnavailable(f"{what} failed (`{' '.join(command)}`, exit {done.returncode}): "
                                      + " | ".join(tail))


def _unzip_one(wheel_dir: Path, member: str, target: Path) -> None:
    wheels = sorted(wheel_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise PerfAnalyzerUnavailable(f"expected one wheel in {wheel_dir}, found {[w.name for w in wheels]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        try:
            info = wheel.getinfo(member)
        except KeyError:
            raise PerfAnalyzerUnavailable(f"{wheels[0].name} has no {member}") from None
        target.write_bytes(wheel.read(info))


def assemble(home: Path) -> None:
    """Download the three parts into a temp folder beside `home`, then rename it into place: an interrupted or
    failed assembly leaves no half-made copy behind (and a concurrent one that finished first is kept)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise PerfAnalyzerUnavailable(f"the {WHEEL} wheel ships perf_analyzer for Linux x86_64 only, not "
                                      f"{sys.platform} {platform.machine()}: put a perf_analyzer on PATH")
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{home.name}-", dir=home.parent) as tmp:
        work = Path(tmp)
        copy = PerfAnalyzer.copy_in(work)
        copy.binary.parent.mkdir()
        (work / "lib").mkdir()
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
        _step([*pip, "--platform", "manylinux1_x86_64", "-d", "wheel", WHEEL], f"pip download {WHEEL}", work)
        _unzip_one(work / "wheel", WHEEL_MEMBER, copy.binary)
        copy.binary.chmod(0o755)
        _step([*pip, "--platform", "manylinux2014_x86_64", "-d", "cudart", CUDART], f"pip download {CUDART}", work)
        _unzip_one(work / "cudart", CUDART_MEMBER, work / "lib" / "libcudart.so.12")
        _step(["apt-get", "download", LIBB64_DEB], f"apt-get download {LIBB64_DEB} (Debian's libb64)", work)
        debs = sorted(work.glob(f"{LIBB64_DEB}_*.deb"))
        if not debs:
            raise PerfAnalyzerUnavailable(f"apt-get download {LIBB64_DEB} wrote no .deb file")
        _step(["dpkg-deb", "-x", debs[0].name, "deb"], f"dpkg-deb -x {debs[0].name}", work)
        found = sorted((work / "deb").rglob(LIBB64))
        if not found:
            raise PerfAnalyzerUnavailable(f"{debs[0].name} has no {LIBB64}")
        shutil.copyfile(found[0], work / "lib" / LIBB64)
        for scratch in ("wheel", "cudart", "deb", *[d.name for d in debs]):
            shutil.rmtree(work / scratch) if (work / scratch).is_dir() else (work / scratch).unlink()
        copy.version()  # it loads with the libraries beside it, as locate() will run it
        try:
            os.rename(work, home)
        except OSError as err:  # another run assembled it meanwhile: keep theirs
            if not PerfAnalyzer.copy_in(home).binary.is_file():
                raise PerfAnalyzerUnavailable(f"{home} is in the way ({err.strerror}) and holds no bin/perf_analyzer: "
                                              "remove it, and the next run assembles it again") from None
        else:
            os.mkdir(work)  # TemporaryDirectory removes its (now empty) folder on exit


def serialized_bytes(element: bytes) -> bytes:
    """One BYTES tensor element as Triton serialises it: its length (4 bytes, little-endian), then the bytes."""
    return len(element).to_bytes(4, "little") + element


def input_data(payloads: Sequence[bytes], input_name: str = "image") -> dict:
    """perf_analyzer's --input-data JSON, one entry per request it sends in turn. perf_analyzer copies a "b64" value
    into a BYTES tensor as it is, so it must be the serialised form: plain base64 of a PNG would be read as an element
    of 1,196,314,761 bytes (the PNG signature taken for a length), and the server refuses it."""
    if not payloads:
        raise ValueError("perf_analyzer needs at least one encoded image")
    return {"data": [{input_name: {"b64": base64.b64encode(serialized_bytes(p)).decode("ascii")}} for p in payloads]}


def write_input_data(payloads: Sequence[bytes], path: Path, input_name: str = "image") -> Path:
    path.write_text(json.dumps(input_data(payloads, input_name)), encoding="utf-8")
    return path


def read_report(path: Path) -> dict:
    """The one concurrency row of perf_analyzer's -f CSV -> images/s and client-side latency percentiles (ms).
    perf_analyzer's "Inferences/Second" counts batch elements, i.e. images; its latencies are in microseconds."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if len(rows) != 1:
        raise ValueError(f"{path}: expected one result row, found {len(rows)}")
    row = rows[0]
    return {
        "images_per_s": float(row["Inferences/Second"]),
        "latency_ms": {p: float(row[f"{p} latency"]) / 1000 for p in ("p50", "p90", "p99")},
        "server_queue_ms": float(row["Server Queue"]) / 1000,  # per request, as Triton's statistics report it
        "server_compute_infer_ms": float(row["Server Compute Infer"]) / 1000,
    }


def command(pa: PerfAnalyzer, *, url: str, protocol: str, model: str, data: Path, concurrency: int, batch: int,
            seconds: float, report: Path) -> list[str]:
    """A closed loop at one concurrency for about `seconds`, like the other load generator: WINDOWS time windows of
    `seconds / WINDOWS` each (-p is set so that, stretched by perf_analyzer, they come to that), every one of them
    kept. perf_analyzer calls WINDOWS windows in a row stable when their throughputs and their latencies each lie
    within a factor of 1 + s/100; its search for a stable load is not what is measured here (its default, 10%, or
    even 100% fails Ti/16 at c16 on a shared 2-core host), so -s 10000 accepts any windows that hold answers. A
    window without one (a model slower per request than a window) is never stable, and perf_analyzer measures
    another, up to MAX_WINDOWS."""
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
    window_ms = max(50, round(seconds * 1000 / (WINDOWS * WINDOW_STRETCH)))
    return [str(pa.binary), "-m", model, "-u", url, "-i", protocol, "--input-data", str(data), "-b", str(batch),
            "--concurrency-range", str(concurrency), "--measurement-mode", "time_windows", "-p", str(window_ms),
            "-s", "10000", "-r", str(MAX_WINDOWS), "-f", str(report)]


def measure(pa: PerfAnalyzer, *, url: str, protocol: str, model: str, data: Path, concurrency: int, batch: int,
            seconds: float) -> dict:
    """Run perf_analyzer once; its report plus `cpu_s`, the CPU time it used (user + system, start to exit).
    A failed request fails the run (perf_analyzer exits non-zero): raised with its own words."""
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as tmp:
        report = Path(tmp) / "report.csv"
        cmd = command(pa, url=url, protocol=protocol, model=model, data=data, concurrency=concurrency, batch=batch,
                      seconds=seconds, report=report)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        limit_s = seconds * 3 + 120  # its windows, up to MAX_WINDOWS of them, plus start-up
        try:
            done = subprocess.run(cmd, env={**os.environ, **pa.env}, capture_output=True, text=True, timeout=limit_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"perf_analyzer did not finish within {limit_s:.0f} s (stopped): is the server "
                               f"answering at {url}?") from None
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0 or not report.is_file():
            words = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
            raise RuntimeError(f"perf_analyzer failed (exit {done.returncode}): " + " | ".join(words[-4:]))
        result = read_report(report)
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result
