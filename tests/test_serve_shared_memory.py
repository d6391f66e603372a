"""`hub-vit serve` on a small /dev/shm, as Docker gives a container (64 MB) unless told `--shm-size`.

Triton's Python backend passes every batch through a pool per stub in /dev/shm; a batch its pool cannot grow to hold
fails with Triton's "Failed to increase the shared memory pool size ..." (a key, and a hint cut off by the client).
serve warns at its start, with the numbers, when /dev/shm cannot hold what the largest requests make the pools grow
to, and refuses to start when it cannot hold even their first pools; a client names the cause. Each test runs serve
in a mount namespace of its own with a small tmpfs on /dev/shm (skipped where this machine may not make one), so the
real server meets a real full /dev/shm.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.catalog import default_model_folder
from hub_vit.server.runtime.launcher import free_port
from hub_vit.server.runtime.triton_install import ServerError
from hub_vit.server.serving import log_path

pytestmark = [pytest.mark.triton, pytest.mark.slow]

CLI = [sys.executable, "-c", "from hub_vit.cli import main; main()"]
SAMPLE = sorted((default_model_folder() / "samples").glob("*.png"))[0]


def _namespaces_allowed() -> str | None:
    """Why this machine cannot give a process its own /dev/shm, or None when it can."""
    tried = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    return None if tried.returncode == 0 else f"cannot mount a tmpfs in a mount namespace: {tried.stderr.strip()}"


@pytest.fixture(scope="module")
def own_shm() -> None:
    why = _namespaces_allowed()
    if why:
        pytest.skip(why)


class ServeOnSmallShm:
    """`hub-vit serve` (the default model) on free ports, in its own mount namespace whose /dev/shm is a tmpfs of
    `size` (a mount size: 4m, 1m)."""

    def __init__(self, size: str) -> None:
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        serve = [*CLI, "serve", "--quiet", "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                 "--metrics-port", str(self.metrics), "--exit-timeout", "5"]
        script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {shlex.join(serve)}"
        self.process = subprocess.Popen(["unshare", "-m", "sh", "-c", script], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.output = ""

    def wait_for(self, text: str, timeout_s: float = 180) -> str:
        """Everything printed until a line holding `text` (AssertionError with the output if it never comes)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        for line in self.process.stdout:
            self.output += line
            if text in line or time.monotonic() > deadline:
                break
        assert text in self.output, f"{text!r} never printed; output:\n{self.output}"
        return self.output

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # serve, its tritonserver and stubs: one session
        except ProcessLookupError:
            pass
        self.process.wait(30)
        log_path(self.http).unlink(missing_ok=True)


@pytest.fixture
def serve_4m(own_shm: None) -> Iterator[ServeOnSmallShm]:
    serve = ServeOnSmallShm("4m")
    yield serve
    serve.stop()


def _noise_jpeg(path: Path, size_bytes: int) -> Path:
    """A JPEG of random pixels (incompressible: about a byte per pixel at quality 95) of at least `size_bytes`."""
    side = int((size_bytes / 0.9) ** 0.5) + 64
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    assert len(buffer.getvalue()) >= size_bytes
    path.write_bytes(buffer.getvalue())
    return path


def _classify(serve: ServeOnSmallShm, image: Path, *, grpc: bool = False) -> subprocess.CompletedProcess[str]:
    url = ["--grpc", "--url", f"127.0.0.1:{serve.grpc}"] if grpc else ["--url", f"127.0.0.1:{serve.http}"]
    return subprocess.run([*CLI, "classify", *url, str(image)], capture_output=True, text=True, timeout=120)


def test_on_a_small_dev_shm_serve_warns_and_a_batch_without_room_is_named_while_the_rest_is_served(
        serve_4m: ServeOnSmallShm, tmp_path: Path) -> None:
    started = serve_4m.wait_for("serving model")
    # 4 MiB free before the two stubs start; each will want 1 MiB + twice a 64 MiB request
    assert "warning: /dev/shm has 4 MiB free, and the 2 Python-backend model instances may need up to 258 MiB" in \
        " ".join(started.split())
    assert "docker run --shm-size=512m" in started
    big = _noise_jpeg(tmp_path / "photo.jpg", 3 << 20)  # its pool must grow by 3 MiB; 2 MiB are left
    for grpc in (False, True):
        refused = _classify(serve_4m, big, grpc=grpc)
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "Failed to increase the shared memory pool size" in said  # Triton's own words, then what they mean
        assert "the server's shared memory (/dev/shm) had no room for this batch of images" in said
        assert "docker run --shm-size=1g" in said
        served = _classify(serve_4m, SAMPLE, grpc=grpc)  # the server serves on
        assert served.returncode == 0, served.stdout + served.stderr
    # the demo's page says so too, and shows its in-process labels instead
    from hub_vit.demo.backends import TritonLabels

    url = f"127.0.0.1:{serve_4m.http}"
    labels, status = TritonLabels(url).top_k(Image.open(big), 3, source=big)
    assert labels is None and status.startswith(f"Triton server at {url} had no shared memory (/dev/shm) left for "
                                                "this image: restart it with more"), status


def test_a_dev_shm_too_small_for_the_first_pools_is_refused_before_triton_starts(own_shm: None) -> None:
    serve = ServeOnSmallShm("1m")
    try:
        assert serve.process.wait(180) == 3  # this machine cannot serve now, though nothing asked is wrong
        serve.wait_for("error:")
    finally:
        serve.stop()
    said = " ".join(serve.output.split())
    assert re.search(r"error: /dev/shm has [\d,]+ KiB free, less than the 2 MiB the 2 Python-backend model "
                     r"instances take at their start \(1 MiB each\): the models would not load", said), serve.output
    assert "tritonserver" not in said and "Traceback" not in said


def test_no_dev_shm_is_named(tmp_path: Path) -> None:
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.writer import write_repository
    from hub_vit.server.runtime.shared_memory import shared_memory_room

    repository = write_repository(resolve_model(default_model_folder()), tmp_path / "models")
    with pytest.raises(ServerError, match=r"cannot use .*missing: No such file or directory; Triton's Python "
                                          r"backend exchanges every batch through shared memory there"):
        shared_memory_room(repository, 64 << 20, shm=tmp_path / "missing")
    room = shared_memory_room(repository, 64 << 20, shm=tmp_path)  # a disk with room: nothing to say
    assert room.instances == 2 and room.enough
