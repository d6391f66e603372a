"""bench/perf_analyzer.py: Triton's perf_analyzer as the serving benchmark's second load generator. The binary itself
is assembled from the package registries on first use, so it is not run here (tests use no network); what is tested
is what it is fed, how its report is read, and that a failed or impossible assembly says why and leaves nothing."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import serialize_byte_tensor

from tests.bench_modules import load_bench_script


@pytest.fixture(scope="module")
def pa():
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield load_bench_script("perf_analyzer", monkeypatch)


# A report written by perf_analyzer 2.51.0 (`-f`) against `hub-vit serve`'s digits model, HTTP, concurrency 16,
# session 19: copied verbatim, header and row.
REPORT = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "16,889.686,87,4159,1,148,12371,1131,0,17488,28781,31197,34531\n"
)


def test_input_data_is_the_serialised_bytes_tensor_triton_expects(pa) -> None:
    """perf_analyzer copies a "b64" value into a BYTES tensor as is: it must be Triton's serialised form, which
    tritonclient's own serialiser produces (plain base64 of a PNG made the server read a 1.2 GB length)."""
    payloads = [b"\x89PNG\r\n\x1a\n" + bytes(range(40)), b"\xff\xd8\xff" + b"x" * 300]
    data = pa.input_data(payloads)
    assert [list(entry) for entry in data["data"]] == [["image"], ["image"]]  # one request per entry, in order
    for entry, payload in zip(data["data"], payloads, strict=True):
        expected = serialize_byte_tensor(np.array([payload], dtype=np.object_)).item()
        assert base64.b64decode(entry["image"]["b64"]) == expected
    assert pa.input_data([b"abc"], input_name="pixels")["data"][0].keys() == {"pixels"}


def test_input_data_refuses_no_images(pa) -> None:
    with pytest.raises(ValueError, match="at least one encoded image"):
        pa.input_data([])


def test_write_input_data_is_json_perf_analyzer_reads(pa, tmp_path: Path) -> None:
    path = pa.write_input_data([b"abc"], tmp_path / "in.json")
    assert json.loads(path.read_text()) == {"data": [{"image": {"b64": base64.b64encode(b"\x03\0\0\0abc").decode()}}]}


def test_read_report_turns_microseconds_into_milliseconds(pa, tmp_path: Path) -> None:
    path = tmp_path / "report.csv"
    path.write_text(REPORT)
    report = pa.read_report(path)
    assert report["images_per_s"] == pytest.approx(889.686)
    assert report["latency_ms"] == pytest.approx({"p50": 17.488, "p90": 28.781, "p99": 34.531})
    assert report["server_queue_ms"] == pytest.approx(0.001)
    assert report["server_compute_infer_ms"] == pytest.approx(12.371)


def test_read_report_wants_exactly_one_row(pa, tmp_path: Path) -> None:
    path = tmp_path / "report.csv"
    header, row = REPORT.splitlines()
    path.write_text(f"{header}\n{row}\n{row}\n")
    with pytest.raises(ValueError, match="expected one result row, found 2"):
        pa.read_report(path)


def test_command_measures_the_requested_span_in_three_windows_kept_whatever_they_hold(pa, tmp_path: Path) -> None:
    analyzer = pa.PerfAnalyzer(Path("/opt/pa/perf_analyzer"))
    cmd = pa.command(analyzer, url="127.0.0.1:8001", protocol="grpc", model="vit", data=tmp_path / "d.json",
                     concurrency=16, batch=8, seconds=8 / 3, report=tmp_path / "r.csv")
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert cmd[0] == "/opt/pa/perf_analyzer"
    assert flags == {"-m": "vit", "-u": "127.0.0.1:8001", "-i": "grpc", "--input-data": str(tmp_path / "d.json"),
                     "-b": "8", "--concurrency-range": "16", "--measurement-mode": "time_windows",
                     "-p": "741", "-s": "10000", "-r": "10", "-f": str(tmp_path / "r.csv")}
    # three windows of 741 ms, each stretched by perf_analyzer to 889 ms: the 8/3 s asked for
    with pytest.raises(ValueError, match="'http' or 'grpc', got 'https'"):
        pa.command(analyzer, url="x", protocol="https", model="vit", data=tmp_path, concurrency=1, batch=1,
                   seconds=1, report=tmp_path)


def _fake_binary(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / "perf_analyzer"
    binary.write_text(f"#!/bin/sh\n{body}\n")
    binary.chmod(0o755)
    return binary


def test_a_perf_analyzer_on_path_is_used_as_it_is(pa, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = _fake_binary(tmp_path / "bin", 'echo "Perf Analyzer Version 9.9.9 (commit x)"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    found = pa.locate(cache=tmp_path / "cache")
    assert (found.binary, found.env) == (binary, {})
    assert found.version() == "Perf Analyzer Version 9.9.9 (commit x)"
    assert not (tmp_path / "cache").exists()  # nothing assembled


def test_a_binary_that_does_not_load_is_refused_with_its_own_words(pa, tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, 'echo "error while loading shared libraries: libb64.so.0d" >&2; exit 127')
    with pytest.raises(pa.PerfAnalyzerUnavailable, match=r"exit 127\): error while loading shared libraries"):
        pa.PerfAnalyzer(binary).version()


def test_a_failed_assembly_says_which_step_and_leaves_nothing(pa, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pa.shutil, "which", lambda name: None)  # no perf_analyzer on PATH
    monkeypatch.setattr(pa.sys, "executable", str(_fake_binary(tmp_path / "py", 'echo "No matching distribution '
                                                                                 'found" >&2; exit 1')))
    cache = tmp_path / "cache" / "perf_analyzer-x"
    with pytest.raises(pa.PerfAnalyzerUnavailable, match=r"pip download tritonclient==.* exit 1\): No matching"):
        pa.locate(cache=cache)
    assert list((tmp_path / "cache").iterdir()) == []  # no half-made copy, no temp folder


def test_assembly_is_refused_off_linux_x86_64(pa, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pa.platform, "machine", lambda: "aarch64")
    with pytest.raises(pa.PerfAnalyzerUnavailable, match="Linux x86_64 only.*put a perf_analyzer on PATH"):
        pa.assemble(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def _offline_parts(pa):
    """A stand-in for `_step` that makes what each download and unpacking step would (the wheels hold a shell script
    in the binary's place), so the assembly runs without a network."""
    import zipfile

    def step(command: list[str], what: str, cwd: Path) -> None:
        if command[:2] == ["apt-get", "download"]:
            (cwd / "libb64-0d_1.2-5+b1_amd64.deb").write_bytes(b"deb")
        elif command[0] == "dpkg-deb":
            (cwd / "deb" / "usr" / "lib").mkdir(parents=True)
            (cwd / "deb" / "usr" / "lib" / pa.LIBB64).write_bytes(b"so")
        else:  # pip download ... -d FOLDER SPEC
            target = cwd / command[command.index("-d") + 1]
            target.mkdir()
            member = pa.WHEEL_MEMBER if command[-1] == pa.WHEEL else pa.CUDART_MEMBER
            with zipfile.ZipFile(target / "x.whl", "w") as wheel:
                wheel.writestr(member, "#!/bin/sh\necho 'Perf Analyzer Version 2.51.0 (commit unknown)'\n")

    return step


def test_assembly_puts_the_binary_and_its_two_libraries_in_place(pa, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pa.shutil, "which", lambda name: None)
    monkeypatch.setattr(pa, "_step", _offline_parts(pa))
    home = tmp_path / "cache" / "perf_analyzer-x"
    found = pa.locate(cache=home)
    assert found.binary == home / "bin" / "perf_analyzer"
    assert found.env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(home / "lib")
    assert sorted(p.name for p in (home / "lib").iterdir()) == ["libb64.so.0d", "libcudart.so.12"]
    assert sorted(p.name for p in home.iterdir()) == ["bin", "lib"]  # the downloads are not kept
    assert found.version() == "Perf Analyzer Version 2.51.0 (commit unknown)"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["perf_analyzer-x"]  # no temp folder left


def test_a_cache_folder_without_the_binary_is_named_not_a_bare_oserror(pa, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder left where the copy goes (emptied by hand, say) cannot be renamed over: say so and what to do."""
    home = tmp_path / "cache" / "perf_analyzer-x"
    (home / "leftover").mkdir(parents=True)
    monkeypatch.setattr(pa, "_step", _offline_parts(pa))
    with pytest.raises(pa.PerfAnalyzerUnavailable, match=r"perf_analyzer-x is in the way .* holds no "
                                                          r"bin/perf_analyzer: remove it"):
        pa.assemble(home)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["perf_analyzer-x"]  # no temp folder left
    assert [p.name for p in home.iterdir()] == ["leftover"]  # and the folder in the way untouched


def test_a_failed_run_is_raised_with_perf_analyzer_s_last_words(pa, tmp_path: Path) -> None:
    """A failed request makes perf_analyzer exit non-zero without a report: its own last lines say why."""
    binary = _fake_binary(tmp_path / "bin", 'echo "*** Measurement Settings ***"; echo "Thread [0] had error: in '
                                            "ensemble 'vit', incomplete string data\" >&2; exit 99")
    with pytest.raises(RuntimeError, match=r"perf_analyzer failed \(exit 99\): \*\*\* Measurement Settings \*\*\* \| "
                                           r"Thread \[0\] had error: in ensemble 'vit', incomplete string data"):
        pa.measure(pa.PerfAnalyzer(binary), url="127.0.0.1:1", protocol="http", model="vit", data=tmp_path / "d.json",
                   concurrency=1, batch=1, seconds=1)


def test_a_run_past_its_time_limit_says_so(pa, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def too_slow(cmd, **kwargs):
        raise pa.subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(pa.subprocess, "run", too_slow)
    with pytest.raises(RuntimeError, match=r"did not finish within 123 s \(stopped\): is the server answering at "
                                           r"127.0.0.1:8001\?"):
        pa.measure(pa.PerfAnalyzer(tmp_path / "perf_analyzer"), url="127.0.0.1:8001", protocol="grpc", model="vit",
                   data=tmp_path / "d.json", concurrency=1, batch=1, seconds=1)
