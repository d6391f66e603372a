"""serve's metrics port on its own (server/front/metrics_front.py, exposition.py), without Triton: what a scrape
says when Triton's metrics are missing, the text format, and a client that trickles its request."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from hub_vit.server.front.exposition import Family, render
from hub_vit.server.front.metrics_front import MetricsFront
from hub_vit.server.runtime.launcher import free_port

FAMILIES = [Family("hub_vit_server_ready", "gauge", "ready", [({}, 0)])]


@pytest.fixture
def front() -> Iterator[MetricsFront]:
    metrics = MetricsFront("127.0.0.1", free_port(), 8000, lambda: FAMILIES, head_timeout_s=1.0).start()
    try:
        yield metrics
    finally:
        metrics.close()


def scrape(port: int) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        connection.request("GET", "/metrics")
        reply = connection.getresponse()
        return reply.status, reply.read().decode()
    finally:
        connection.close()


def test_without_a_server_a_scrape_says_why_tritons_metrics_are_missing(front: MetricsFront) -> None:
    status, text = scrape(front.port)
    assert status == 200
    assert text == ("# tritonserver's own metrics are missing: no tritonserver is serving (starting, restarting or "
                    "stopping)\n# HELP hub_vit_server_ready ready\n# TYPE hub_vit_server_ready gauge\n"
                    "hub_vit_server_ready 0\n"), text


def test_a_server_whose_metrics_fail_is_named_and_serves_families_still_come(front: MetricsFront) -> None:
    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_error(500)

        def log_message(self, *args: object) -> None:
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        front.upstream("127.0.0.1", upstream.server_address[1])
        status, text = scrape(front.port)
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert status == 200 and "# tritonserver's own metrics are missing: no answer from it (OSError: HTTP 500)" in text
    assert text.endswith("hub_vit_server_ready 0\n"), text


def test_a_client_trickling_its_request_is_cut_at_the_head_timeout(front: MetricsFront) -> None:
    # was: only each read had a timeout, so a byte every few seconds held one of the 16 connections for good
    request = b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as slow:
        sent = 0
        try:
            for byte in request:
                slow.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)  # far under the 1 s head timeout between bytes; the whole takes 6 s
                slow.setblocking(False)
                try:
                    if slow.recv(1) == b"":
                        break
                except BlockingIOError:
                    pass
                finally:
                    slow.setblocking(True)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert sent < len(request) * 0.6, f"{sent} of {len(request)} bytes sent before the cut"
    assert scrape(front.port)[0] == 200  # the port serves on


def test_label_values_are_escaped_as_prometheus_reads_them() -> None:
    # the text format's escapes in label values: backslash, double quote and line feed (prometheus.io, "Text-based
    # format"); HELP escapes backslash and line feed
    family = Family("x_total", "counter", "a\\b\nc", [({"path": 'C:\\DIR\\FILE.TXT', "quote": '"q"\n'}, 1.5),
                                                       ({}, 2)])
    assert render([family]) == ('# HELP x_total a\\\\b\\nc\n# TYPE x_total counter\n'
                                'x_total{path="C:\\\\DIR\\\\FILE.TXT",quote="\\"q\\"\\n"} 1.5\nx_total 2\n')
