"""serve tells its operator what the front answered itself (`--refusal-report-s`, server/front/refusals.py): Triton
never sees a refused request, so without these lines the log and the metrics hold none of them."""

from __future__ import annotations

import http.client
import re
import signal
import socket
import subprocess
from collections import Counter

import pytest

from tests.programs import HUB_VIT, SAMPLES, Serve

pytestmark = [pytest.mark.triton, pytest.mark.slow]

REPORT = re.compile(r"the front answered [\d,]+ requests? itself in the last \d+ s \((?P<counts>[^)]*)\)")


def reported(text: str) -> dict[str, Counter[str]]:
    """Every report line's counts summed: {"HTTP": {code: n}, "gRPC": {...}}."""
    total: dict[str, Counter[str]] = {"HTTP": Counter(), "gRPC": Counter()}
    for line in REPORT.finditer(" ".join(text.split())):
        for part in line["counts"].split("; "):
            protocol, codes = part.split(" ", 1)
            for item in codes.split(", "):
                code, count = item.rsplit(" x", 1)
                total[protocol][code] += int(count.replace(",", ""))
    return total


def refused_http(port: int, method: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, "/v2/models/vit/infer")
        reply = connection.getresponse()
        reply.read()
        return reply.status
    finally:
        connection.close()


def test_what_the_front_refused_is_counted_in_serves_log_by_status() -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    serve = Serve("--refusal-report-s", "2", "--max-request-mb", "1", "--front-processes", "2")
    try:
        serve.wait_for("metrics")
        assert serve.classify()  # answered requests are not counted
        assert [refused_http(serve.http_port, "PUT") for _ in range(3)] == [405] * 3
        # a report comes while serving, not only at the end (2 front processes: their counts summed)
        text = serve.wait_for(REPORT, timeout_s=30)
        with socket.create_connection(("127.0.0.1", serve.http_port), timeout=30) as sock:  # refused from the head
            sock.sendall(b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
            assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
        channel = grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}", options=[("grpc.max_send_message_length", -1)])
        request = service_pb2.ModelInferRequest(model_name="vit")
        request.inputs.add(name="image", datatype="BYTES", shape=[1, 1])
        request.raw_input_contents.append(SAMPLES[0].read_bytes() + b"\0" * (2 << 20))
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        channel.close()
        with socket.create_connection(("127.0.0.1", serve.grpc_port), timeout=10) as broken:  # HTTP/1.1 on gRPC
            broken.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            while broken.recv(4096):
                pass
        serve.process.send_signal(signal.SIGTERM)  # what is left since the last report is reported at the exit
        assert serve.finish() == 0, serve.text
        text = serve.text
        assert reported(text) == {"HTTP": Counter({"405": 3, "413": 1}),
                                  "gRPC": Counter({"RESOURCE_EXHAUSTED": 1, "GOAWAY": 1})}, text
        assert "refused, or no server to relay them to; each client was told why" in " ".join(text.split()), text
    finally:
        serve.stop()


def test_what_is_left_since_the_last_report_is_reported_at_the_exit() -> None:
    serve = Serve("--refusal-report-s", "3600")
    try:
        serve.wait_for("metrics")
        assert refused_http(serve.http_port, "PUT") == 405
        serve.process.send_signal(signal.SIGTERM)
        assert serve.finish() == 0, serve.text
        assert len(REPORT.findall(" ".join(serve.text.split()))) == 1, serve.text
        assert reported(serve.text) == {"HTTP": Counter({"405": 1}), "gRPC": Counter()}, serve.text
    finally:
        serve.stop()


def test_refusal_reports_can_be_switched_off_and_not_set_below_zero() -> None:
    from hub_vit.server.serving import RefusalReporter

    class Front:  # a front that would report a refusal if asked (running totals: one more at each ask)
        asked = 0

        def answered(self) -> dict[str, dict[str, int]]:
            self.asked += 1
            return {"http": {"405": self.asked}}

    heard: list[object] = []
    front = Front()
    RefusalReporter(front, lambda *report: heard.append(report), 0).start().stop()  # type: ignore[arg-type]
    assert front.asked == 0 and heard == []
    RefusalReporter(front, lambda *report: heard.append(report), 3600).start().stop()  # type: ignore[arg-type]
    assert front.asked == 1 and heard[0][0] == {"http": {"405": 1}}, heard
    result = subprocess.run([*HUB_VIT, "serve", "--refusal-report-s", "-1"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "--refusal-report-s must be >= 0, got -1" in result.stderr + result.stdout
