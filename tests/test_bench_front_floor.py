"""bench/front_cost.py's native floor: skipped in words where nginx is missing, and a configuration nginx accepts where
it is installed (its run needs Triton and minutes: `bench/bench_serve.py --front-cost`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_modules import load_bench_script


@pytest.fixture
def front_cost(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_bench_script("front_cost", monkeypatch)


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


def test_without_hpack_the_frame_watcher_is_skipped_and_says_how_to_get_it(front_cost: ModuleType,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "hpack" else real(name, *rest))
    monkeypatch.setattr(front_cost, "load", lambda *args: pytest.fail("nothing is to be loaded without hpack"))
    found = front_cost.pipe_floor("grpc", 1, rounds=1, seconds=0.1, watch=True)
    assert found == {"skipped": "hpack is not installed (pip install '.[serve]')"}


@pytest.mark.parametrize("watch", [False, True], ids=["pipe", "watcher"])
def test_the_pipes_relay_grpc_calls_whole(front_cost: ModuleType, watch: bool) -> None:
    # the relay under measurement must pass every call (a frame the watcher misread would end the connection): an
    # empty grpc.aio server behind it, each call's answer through it
    import sys

    import grpc

    from hub_vit.server.runtime.launcher import free_port

    server_port, pipe_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-c", front_cost.EMPTY_GRPC_SERVER, str(server_port)],
                              stdout=subprocess.PIPE, text=True)
    pipe = subprocess.Popen([sys.executable, "-c", front_cost.BYTE_PIPE, str(pipe_port), str(server_port),
                             *(["watch"] if watch else [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready" and pipe.stdout.readline().strip() == "ready"
        with grpc.insecure_channel(f"127.0.0.1:{pipe_port}") as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            answers = [call(b"\0" * size, timeout=10) for size in (0, 5, 70_000, 300)]  # one over a frame's 16 KiB
        assert answers == [b"answer"] * 4
        assert pipe.poll() is None, pipe.stderr.read()
    finally:
        for process in (pipe, server):
            process.terminate()
            process.wait()


def test_the_http_front_code_cost_relays_every_request_of_both_kinds(front_cost: ModuleType) -> None:
    found = front_cost.front_code_cost(40, rounds=2)  # it asserts each of the 40 requests got Triton's 200 back
    assert set(found) == {"repeated", "fresh"} and all(0 < us < 10_000 for us in found.values()), found


def test_the_idle_cpu_is_the_quietest_window_not_the_start_up(front_cost: ModuleType,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # CPU seconds read at each window's start and end: 0.9 s of start-up work in the first window, then 5 ms/s
    readings = iter([0.0, 0.9, 0.9, 0.905, 0.905, 0.91, 0.91, 0.915])
    monkeypatch.setattr(front_cost, "_cpu_s", lambda pids: next(readings))
    rate = front_cost.idle_cpu_per_s([1], windows=4, window_s=0.01)
    assert 0 < rate <= 0.005 / 0.01, rate  # a window lasts at least its 10 ms: the quiet ones are at most 0.5 s/s
