"""bench/run_info.py: what every bench script records about the run. `dirty` must mean "the code differs from
HEAD", not "a bench ran before": the benches rewrite their tracked results under bench/results."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.bench_modules import load_bench_script


@pytest.fixture
def run_info(monkeypatch: pytest.MonkeyPatch):
    return load_bench_script("run_info", monkeypatch)


def test_bench_results_do_not_make_the_checkout_dirty(run_info, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "bench" / "results").mkdir(parents=True)
    (repo / "bench" / "results" / "x.json").write_text("{}")
    (repo / "model.py").write_text("a = 1\n")

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    assert run_info.git_state(repo)["dirty"] is False
    (repo / "bench" / "results" / "x.json").write_text('{"rate": 2}')  # a bench rewrote its tracked result
    (repo / "bench" / "results" / "new.json").write_text("{}")  # or saved a new one
    assert run_info.git_state(repo)["dirty"] is False
    (repo / "model.py").write_text("a = 2\n")  # the code changed
    assert run_info.git_state(repo)["dirty"] is True


def test_file_at_reads_a_previous_version_and_names_a_missing_commit(run_info, tmp_path: Path) -> None:
    # the A/B scripts (ab_layouts, ab_load_generator) run a file as it was at an older commit next to today's
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (repo / "loadtest.py").write_text("version = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = git("rev-parse", "HEAD").strip()
    (repo / "loadtest.py").write_text("version = 2\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    assert run_info.file_at(first, "loadtest.py", repo) == "version = 1\n"
    with pytest.raises(SystemExit, match="needs git and the commit 0123abc"):
        run_info.file_at("0123abc", "loadtest.py", repo)


def test_settings_record_paths_inside_the_repository_relative_to_it(run_info, tmp_path: Path) -> None:
    """A result says where in the tree it was written (`bench/results/x.json`), not where the checkout lay on the
    machine that ran it; a path outside the repository is kept as given."""
    import argparse

    args = argparse.Namespace(out=run_info.REPO / "bench" / "results" / "x.json", workdir=tmp_path, seconds=3.0,
                              models=["digits"])
    recorded = run_info.settings(args)
    assert recorded == {"out": "bench/results/x.json", "workdir": str(tmp_path), "seconds": 3.0, "models": ["digits"]}


def test_the_cpu_is_named_by_its_generation_where_the_model_name_is_generic(run_info) -> None:
    # a VM shows "Intel(R) Xeon(R) Processor" for every generation: two AMX hosts measured 1.17x and 1.43x apart
    block = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
             "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 2\n\nprocessor\t: 1\nmodel\t\t: 143\n")
    assert run_info.cpu_identity(block) == {"vendor": "GenuineIntel", "family": 6, "model_number": 207,
                                            "stepping": 2, "generation": "Emerald Rapids"}
    assert run_info.cpu_identity(block.replace("207", "143"))["generation"] == "Sapphire Rapids"
    amd = "vendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nstepping\t: 0\n"
    assert run_info.cpu_identity(amd)["generation"] == "Zen 5"
    assert run_info.cpu_identity(amd.replace("26", "99"))["generation"] is None  # unknown: numbers only
    assert run_info.cpu_identity("garbage") == {}
