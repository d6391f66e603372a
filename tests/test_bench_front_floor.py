"""bench/front_cost.py's native floor: skipped in words where nginx is missing, and a configuration nginx accepts where
it is installed (its run needs Triton and minutes: `bench/bench_serve.py --front-cost`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def front_cost(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """bench/front_cost.py as `python bench/...` imports it (bench/ first on sys.path), a fresh module per test."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("front_cost", BENCH / "front_cost.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "front_cost", module)
    spec.loader.exec_module(module)
    return module


def test_without_nginx_the_native_floor_is_skipped_and_says_how_to_get_it(front_cost: ModuleType,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(front_cost, "find_nginx", lambda: None)
    monkeypatch.setattr(front_cost, "load", lambda *args: pytest.fail("nothing is to be loaded without nginx"))
    found = front_cost.native_floor({"http": 1, "grpc": 2}, rounds=1, seconds=0.1)
    assert found == {"skipped": "nginx is not installed (Debian: apt-get install nginx-core)"}
    assert "native relay floor: skipped, nginx is not installed" in capsys.readouterr().out


def test_nginx_accepts_the_native_floors_configuration(front_cost: ModuleType, tmp_path: Path) -> None:
    nginx = front_cost.find_nginx()
    if nginx is None:
        pytest.skip("nginx is not installed (Debian: nginx-core)")
    conf = tmp_path / "nginx.conf"
    conf.write_text(front_cost.NGINX_CONF.format(tmp=tmp_path, private_http=18000, private_grpc=18001, http=18010,
                                                 grpc=18011))
    checked = subprocess.run([nginx, "-t", "-c", str(conf), "-p", str(tmp_path), "-e", str(tmp_path / "error.log")],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    assert "syntax is ok" in checked.stderr
