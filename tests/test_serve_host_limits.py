"""`hub-vit serve` on hosts that limit it as real ones do, each met for real: a small /dev/shm (Docker gives a container
64 MB unless told `--shm-size`), temporary folders mounted `noexec` (a common hardening of /tmp and /var/tmp), a low
limit on open files (a shell's soft limit is often 1,024), and serve as a container's PID 1.

* /dev/shm: Triton's Python backend passes every batch through a pool per stub there; a batch its pool cannot grow to
  hold fails with Triton's "Failed to increase the shared memory pool size ..." (a key, and a hint the client cuts
  off). serve warns at its start, with the numbers, when /dev/shm cannot hold what the largest requests make the
  pools grow to, and refuses to start when it cannot hold even their first pools; a client names the cause.
* noexec: tritonserver runs its backends from a temporary folder; on a noexec one every model failed to load ("failed
  to map segment from shared object"). serve passes such a folder over, and names them all when none will do.
* open files: each front process raises its soft limit as far as the hard one allows before it takes a connection;
  serve warns when the hard limit itself is short. Was: with a soft limit of 1,024, 1,500 idle connections left every
  health probe reset, far below the cap (4,096) under which probes are promised an answer.
* PID 1: as a container's command serve is its PID namespace's init, to which the kernel hands every orphan: the stubs
  of each server that died stayed zombies until the container's pid limit stopped the next start. serve now waits for
  them when it replaces the server.

/dev/shm and /tmp are replaced in a mount namespace of serve's own, PID 1 is a PID namespace's (each skipped where this
machine may not make one).
"""

from __future__ import annotations

import http.client
import io
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.atomic import owner_tag
from hub_vit.catalog import default_model_folder
from hub_vit.server.runtime.triton_install import ServerError
from tests.programs import HUB_VIT, SAMPLES, Serve, expected_digits

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SAMPLE = SAMPLES[0]


def _skip_unless_it_runs(command: list[str], what: str) -> None:
    """Skip the test where this machine refuses `command` (namespaces need privileges a container may not have)."""
    tried = subprocess.run(command, capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"cannot {what}: {tried.stderr.strip()}")


@pytest.fixture(scope="module")
def own_mounts() -> None:
    _skip_unless_it_runs(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                         "mount a tmpfs in a mount namespace")


def serve_mounted(mounts: dict[str, str], env: dict[str, str] | None = None) -> Serve:
    """`hub-vit serve` (the default model) on free ports, in its own mount namespace where each of `mounts` (folder ->
    tmpfs mount options: `size=4m`, `noexec`) is a fresh tmpfs; `env`: added to this process's environment."""
    mount = " && ".join(f"mount -t tmpfs -o {options} tmpfs {folder}" for folder, options in mounts.items())
    # sh mounts, then execs serve with the arguments after "sh" (its $0)
    return Serve(wrapper=("unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh"), new_session=True,
                 env={**os.environ, **(env or {})})


@pytest.fixture
def serve_4m(own_mounts: None) -> Iterator[Serve]:
    serve = serve_mounted({"/dev/shm": "size=4m"})
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


def _classify(serve: Serve, image: Path, *, grpc: bool = False) -> subprocess.CompletedProcess[str]:
    url = ["--grpc", "--url", f"127.0.0.1:{serve.grpc_port}"] if grpc else ["--url", f"127.0.0.1:{serve.http_port}"]
    return subprocess.run([*HUB_VIT, "classify", *url, str(image)], capture_output=True, text=True, timeout=120)


def test_on_a_small_dev_shm_serve_warns_and_a_batch_without_room_is_named_while_the_rest_is_served(
        serve_4m: Serve, tmp_path: Path) -> None:
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

    url = f"127.0.0.1:{serve_4m.http_port}"
    labels, status = TritonLabels(url).top_k(Image.open(big), 3, source=big)
    assert labels is None and status.startswith(f"Triton server at {url} had no shared memory (/dev/shm) left for "
                                                "this image: restart it with more"), status


def test_a_dev_shm_too_small_for_the_first_pools_is_refused_before_triton_starts(own_mounts: None) -> None:
    serve = serve_mounted({"/dev/shm": "size=1m"})
    try:
        assert serve.finish(180) == 3  # this machine cannot serve now, though nothing asked is wrong
    finally:
        serve.stop()
    said = " ".join(serve.text.split())
    assert re.search(r"error: /dev/shm has [\d,]+ [KM]iB free, less than the 2 MiB the 2 Python-backend model "
                     r"instances take at their start \(1 MiB each\): the models would not load", said), serve.text
    assert "tritonserver" not in said and "Traceback" not in said


def test_a_noexec_tmpdir_is_passed_over_for_the_servers_backends(own_mounts: None, tmp_path: Path) -> None:
    # was: "model 'vit_classifier' failed to load: ... libtriton_python.so: failed to map segment from shared object"
    noexec = tmp_path / "noexec"
    noexec.mkdir()
    serve = serve_mounted({str(noexec): "noexec"}, env={"TMPDIR": str(noexec)})
    try:
        serve.wait_for("serving model")
        served = _classify(serve, SAMPLE)
    finally:
        serve.stop()
    assert served.returncode == 0, served.stdout + served.stderr


def test_with_every_temporary_folder_noexec_serve_names_them_before_building(own_mounts: None) -> None:
    needed = (Path(sys.prefix).resolve(), Path(__file__).resolve())  # the environment, and the checkout
    hidden = [path for path in needed for base in ("/tmp", "/var/tmp") if path.is_relative_to(base)]
    if hidden:  # a fresh tmpfs there would hide it from serve
        pytest.skip(f"{hidden[0]} lies under /tmp or /var/tmp, which the test mounts over")
    serve = serve_mounted({"/tmp": "noexec", "/var/tmp": "noexec"}, env={"TMPDIR": "/tmp"})
    try:
        assert serve.finish(180) == 3
    finally:
        serve.stop()
    said = " ".join(serve.text.split())
    assert ("error: no temporary folder Triton's Python backend can use ('/tmp': mounted noexec: programs cannot run "
            "from it; '/var/tmp': mounted noexec: programs cannot run from it); point TMPDIR at a folder that is "
            "writable, allowing programs to run (not mounted noexec)") in said, said
    assert "building" not in said  # refused before the model was exported


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


LOW = 256  # the soft limit serve starts with


def _open_files(pid: int) -> tuple[int, int]:
    """(soft, hard) open-file limits of process `pid`, from /proc."""
    line = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if "open files" in line)
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


def test_the_front_raises_its_soft_limit_and_a_flood_past_it_leaves_probes_answered() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * LOW:
        pytest.skip(f"this machine's hard limit on open files ({hard}) leaves no room to raise a soft one of {LOW}")
    flood_size = 2 * LOW  # idle connections, well under the cap of 4,096: each is to be accepted
    if soft != resource.RLIM_INFINITY and soft < flood_size + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(flood_size + 64, hard), hard))  # this test's own sockets
    serve = Serve(open_files=(LOW, hard))
    flood = []
    try:
        serve.wait_for("metrics")
        fronts = serve.front_pids()
        assert fronts and all(_open_files(pid)[0] > flood_size for pid in fronts), [_open_files(p) for p in fronts]
        for _ in range(flood_size):
            flood.append(socket.create_connection(("127.0.0.1", serve.ports[0]), timeout=30))
        connection = http.client.HTTPConnection("127.0.0.1", serve.ports[0], timeout=10)
        connection.request("GET", "/v2/health/ready")
        assert connection.getresponse().status == 200
        connection.close()
        assert serve.classify() == expected_digits()
    finally:
        for sock in flood:
            sock.close()
        serve.stop()
    assert "warning: a process may open" not in serve.text  # the hard limit had room


def test_a_short_hard_limit_is_warned_about_with_a_cap_that_fits_it() -> None:
    serve = Serve(open_files=(LOW, LOW))
    try:
        said = " ".join(serve.wait_for("the OS may refuse").split())
    finally:
        serve.stop()
    warned = re.search(r"warning: a process may open 256 files here \(the hard limit, ulimit -Hn\), and each front "
                       r"process needs \d+ to hold --max-connections 4096: the OS may refuse new connections, health "
                       r"probes included, before that cap is reached\. Raise the hard limit \(systemd: LimitNOFILE=; "
                       r"docker run --ulimit nofile=65536\) or lower --max-connections to (?P<fits>\d+)", said)
    assert warned is not None, said
    fits = Serve("--max-connections", warned["fits"], open_files=(LOW, LOW))  # the cap it names: no warning
    try:
        started = fits.wait_for("metrics")
    finally:
        fits.stop()
    assert int(warned["fits"]) > 0 and "warning" not in started, started


def _write(path: Path, value: object) -> None:
    path.write_text(str(value))


def test_the_oom_killer_ends_the_server_not_serve_and_is_named_with_the_containers_limit(tmp_path: Path) -> None:
    # was: serve, the largest process (the exported model's torch), was the OOM killer's victim, and the whole service
    # ended; a stub's death read "killed, e.g. by the OOM killer, or crashed": a guess, without the limit reached
    group = Path("/sys/fs/cgroup/memory") / f"hub-vit-test-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot make a cgroup v1 memory group here: {err}")
    huge = tmp_path / "huge.png"  # 0.4 MB on the wire, 450 MB of pixels once decoded (150 MP, under --max-pixels)
    Image.new("RGB", (15000, 10000), (120, 30, 200)).save(huge)
    serve = Serve("--max-pixels", "160000000", preexec=lambda: _write(group / "cgroup.procs", os.getpid()))
    try:
        serve.wait_for("metrics")
        adjusted = {pid: int(Path(f"/proc/{pid}/oom_score_adj").read_text())
                    for pid in (serve.tritonserver_pid(), *serve.stubs())}
        # Room for the request, not the image. The OOM killer weighs a process by its RSS, plus the limit for
        # oom_score_adj 1000: the limit must pass serve's RSS, whose shared libraries' pages were charged to whichever
        # group first read them (in a container, to the container's: here, perhaps not to `group`).
        serve_rss = int(next(line.split()[1] for line in Path(f"/proc/{serve.process.pid}/status").read_text()
                             .splitlines() if line.startswith("VmRSS:"))) << 10
        limit = max(int((group / "memory.usage_in_bytes").read_text()) + (48 << 20), serve_rss + (64 << 20))
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):  # memsw: where swap is accounted
            if (group / name).exists():
                _write(group / name, limit)
        refused = _classify_at(serve.ports[0], huge)
        said = " ".join(serve.wait_for("OOM killer", timeout_s=60).split())
        for name in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes"):
            if (group / name).exists():
                _write(group / name, -1)  # the replacement server loads with room again
        serve.wait_for("serving again", timeout_s=120)
        assert serve.classify() == expected_digits()
    finally:
        serve.stop()
        for pid in (group / "cgroup.procs").read_text().split():  # what a killed serve could not stop
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(100):  # its processes leave the group as they are reaped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert set(adjusted.values()) == {1000}, adjusted  # the server and its stubs go before serve
    assert refused.returncode == 1, refused.stdout + refused.stderr
    gib = f"{limit / (1 << 30):.1f} GiB"
    assert re.search(rf"(stub of model instance .* died \(|tritonserver was ended: )the kernel's OOM killer ended it: "
                     rf"this container's memory limit \({re.escape(gib)}: docker run --memory, a Kubernetes memory "
                     r"limit\) was reached; give the server more memory, or serve with fewer instances "
                     r"\(--instances\) or smaller batches \(--max-batch-size\)", said), said


def _classify_at(http_port: int, image: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HUB_VIT, "classify", "--url", f"127.0.0.1:{http_port}", str(image)], capture_output=True,
                          text=True, timeout=120)


# serve as PID 1, as in a container whose command it is (`CMD ["hub-vit", "serve"]`, a Kubernetes pod without an
# init); --kill-child: a test killing the wrapper ends serve, and with it the namespace
INIT_OF_A_NEW_PID_NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


def test_as_a_containers_init_serve_waits_for_the_stubs_of_a_server_it_replaced() -> None:
    # was: the kernel hands orphans to a PID namespace's init, here serve: the stubs of every tritonserver that died
    # stayed zombies, a few more pids taken for each restart until a container's pid limit stopped the next start
    _skip_unless_it_runs([*INIT_OF_A_NEW_PID_NAMESPACE, "true"], "make a PID namespace")
    # what a live serve of this namespace holds (this test's pid, unseen from serve's namespace), sharing /tmp and
    # /dev/shm with serve as another container's can: was removed at serve's start, as if its process were gone
    other = owner_tag()
    live_folder = Path(tempfile.mkdtemp(prefix=f"hub-vit-serve-{other}"))
    live_region = Path(f"/dev/shm/hub-vit-{other}0123abcd_region")
    live_region.write_bytes(b"\0" * 16)
    serve = Serve(wrapper=INIT_OF_A_NEW_PID_NAMESPACE)
    try:
        serve.wait_for("metrics")
        assert live_folder.is_dir() and live_region.exists()
        ids = next(line for line in Path(f"/proc/{serve.pid}/status").read_text().splitlines()
                   if line.startswith("NSpid:"))
        assert ids.split()[-1] == "1", ids  # its id in the innermost namespace
        stubs = serve.stubs()
        assert len(stubs) == 2, stubs
        os.kill(serve.tritonserver_pid(), signal.SIGKILL)  # its stubs are orphaned: serve's to wait for
        serve.wait_for("serving again")
        assert serve.classify() == expected_digits()
        assert not set(stubs) & set(serve.zombies()), f"zombies {serve.zombies()} of the stubs {stubs}"
        os.kill(serve.pid, signal.SIGTERM)  # `docker stop`: a handled signal reaches a namespace's init
        assert serve.finish() == 0, serve.text
        assert "tritonserver stopped" in serve.text, serve.text
    finally:
        serve.stop()
        shutil.rmtree(live_folder, ignore_errors=True)
        live_region.unlink(missing_ok=True)

