"""serve's metrics port (server/front/metrics_front.py) against the real `hub-vit serve`: Triton's own metrics relayed
with serve's families after them, the port held through a restart, and what is not a scrape told where to go."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import time

import pytest

from hub_vit.server import protocol
from tests.programs import SAMPLES, Serve

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$", re.MULTILINE)


def get(port: int, path: str = "/metrics", method: str = "GET", body: bytes | None = None) -> tuple[int, dict, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body)
        reply = connection.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read().decode()
    finally:
        connection.close()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(name, labels) -> value of every sample line of Prometheus text (labels as a frozenset of key=value)."""
    found = {}
    for line in SAMPLE.finditer(text):
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line["labels"] or ""))
        found[(line["name"], labels)] = float(line["value"])
    return found


def own(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


@pytest.fixture(scope="module")
def serve() -> Serve:
    served = Serve("--max-request-mb", "1", "--front-processes", "2", "--refusal-report-s", "1")
    try:
        served.wait_for("metrics")
        yield served
    finally:
        served.stop()


def test_a_scrape_holds_tritons_metrics_and_serves_own(serve: Serve) -> None:
    assert serve.classify()
    status, headers, text = get(serve.ports[2])
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4"), (status, headers)
    # Triton's own families, relayed (the inference just made is counted there)
    counted = [value for (name, labels), value in samples(text).items()
               if name == "nv_inference_count" and ("model", "vit") in labels]
    assert counted and sum(counted) >= 1, text
    assert own(text, "hub_vit_server_ready") == 1, text
    assert own(text, "hub_vit_server_restarts_total") == 0, text
    assert "# TYPE hub_vit_front_answers_total counter" in text, text
    status, headers, head = get(serve.ports[2], method="HEAD")
    assert status == 200 and head == "" and int(headers["Content-Length"]) > 0


def test_the_fronts_own_answers_are_running_totals_beside_the_log_report(serve: Serve) -> None:
    # the log's report takes what was counted since its last line; a scrape must still see every answer since start
    before = get(serve.ports[2])[2]
    connection = http.client.HTTPConnection("127.0.0.1", serve.http_port, timeout=30)
    connection.request("PUT", "/v2/models/vit/infer")
    assert connection.getresponse().status == 405
    connection.close()
    with socket.create_connection(("127.0.0.1", serve.http_port), timeout=30) as sock:  # refused from its head
        sock.sendall(b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
        assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
    serve.wait_for("the front answered", timeout_s=30)  # the log's report took these counts
    time.sleep(1.5)  # and a report interval more
    after = get(serve.ports[2])[2]
    for code in ("405", "413"):
        was = own(before, "hub_vit_front_answers_total", protocol="http", code=code) or 0
        assert own(after, "hub_vit_front_answers_total", protocol="http", code=code) == was + 1, (code, after)
    assert get(serve.ports[2])[2].count('code="413"') == 1  # one sample per code, still there at the next scrape


def test_what_is_not_a_scrape_is_told_where_to_go(serve: Serve) -> None:
    metrics_port = serve.ports[2]
    # was: Triton's metrics port answered 200 with an empty body to every path
    status, _, body = get(metrics_port, "/v2/health/ready")
    error = json.loads(body)["error"]
    assert status == 404 and protocol.read_port_speaks(error) == protocol.PortSpeaks(
        "metrics", {"http_port": serve.http_port}), error
    status, _, body = get(metrics_port, "/v2/models/vit/infer", "POST", SAMPLES[0].read_bytes())  # its body read
    assert status == 404 and protocol.read_port_speaks(json.loads(body)["error"]).speaks == "metrics"
    status, headers, body = get(metrics_port, "/metrics", "POST", b"{}")
    assert status == 405 and headers["Allow"] == "GET, HEAD", (status, headers, body)

    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    url = f"127.0.0.1:{metrics_port}"
    result = CliRunner().invoke(app, ["health", "--url", url])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and (f"answered that this is hub-vit serve's metrics port: give the server's HTTP "
                                      f"port ({serve.http_port})") in output, output
    result = CliRunner().invoke(app, ["classify", "--url", url, str(SAMPLES[0])])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and (f"hub-vit serve answered that this is its metrics port give the server's HTTP "
                                      f"port ({serve.http_port})") in output, output


def test_connections_past_the_cap_are_closed_and_scrapes_go_on(serve: Serve) -> None:
    from hub_vit.server.front.metrics_front import MAX_CONNECTIONS

    idle = [socket.create_connection(("127.0.0.1", serve.ports[2]), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)  # each taken by its thread
        with socket.create_connection(("127.0.0.1", serve.ports[2]), timeout=10) as over:
            over.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            try:  # closed unanswered: a FIN, or a reset when the request had arrived unread
                assert over.recv(4096) == b""
            except ConnectionResetError:
                pass
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.5)
    assert get(serve.ports[2])[0] == 200


def test_the_metrics_port_stays_through_a_restart_and_counts_it(serve: Serve) -> None:
    # was: the metrics port was Triton's own, so a scrape while serve replaced a dead server was refused
    os.kill(serve.tritonserver_pid(), signal.SIGKILL)
    deadline, between = time.monotonic() + 60, None
    while time.monotonic() < deadline and between is None:
        status, _, text = get(serve.ports[2])
        assert status == 200, text
        if own(text, "hub_vit_server_ready") == 0:
            between = text
        time.sleep(0.05)
    assert between is not None and "nv_inference_count" not in between, between
    assert "# tritonserver's own metrics are missing" in between, between
    serve.wait_for("serving again", timeout_s=120)
    text = get(serve.ports[2])[2]
    assert own(text, "hub_vit_server_ready") == 1 and own(text, "hub_vit_server_restarts_total") == 1, text
    assert "nv_inference_count" in text, text
