"""`hub-vit serve` under a low limit on open files (RLIMIT_NOFILE): a shell's soft limit is often 1,024, far below
what the front's connection cap (`--max-connections`, 4,096 by default) needs. Each front process raises its soft
limit as far as the hard one allows before it takes a connection; serve warns when the hard limit itself is short.

Was: with a soft limit of 1,024, 1,500 idle connections left every health probe reset (the OS refused the front's
`accept`), far below the cap under which probes are promised an answer.
"""

from __future__ import annotations

import http.client
import re
import resource
import socket
from pathlib import Path

import pytest

from tests.test_serve_supervision import Serve, expected_digits

pytestmark = [pytest.mark.triton, pytest.mark.slow]

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
