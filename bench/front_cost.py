"""`bench_serve.py --front-cost`: what `hub-vit serve`'s front costs, with a model that costs almost nothing.

One run, written to one JSON file:
* **parsers**: CPU per request of the two HTTP/1.1 parsers the front could use, h11 (pure Python) and httptools
  (llhttp, C), each parsing a tritonclient-shaped inference request and Triton's answer, in this process;
* **throughput**: a trivial model on Triton (`identity`, Python backend: copies one float per image; written by this
  benchmark into a temporary repository) served by `hub-vit serve --repository` with 1, 2, 4 ... front processes. For
  each process count and protocol (HTTP, gRPC), batch-1 requests at concurrency 64 alternate between the public ports
  (through the front) and Triton's own private ports (read from its command line), `rounds` pairs in alternating order;
  reported: the medians of requests/s on each side and of the paired ratios, p50 latency, the front processes' CPU per
  request (their CPU during the public rounds, less their idle CPU, per request answered) and Triton's (tritonserver +
  its stub) for scale;
* **the byte pipes** (with the first process count's Triton), one per protocol: the cheapest relay Python can be,
  passing bytes on without parsing them, against Triton's own port the same way: what any Python front pays on these
  cores before its own work; for gRPC also the pipe reading every client frame with hpack (**the frame watcher**),
  what a front that watches HTTP/2 go by pays before its checks, and grpcio's empty server (**grpcio floor**), what a
  relay that ends each call in grpcio pays;
* **the native floor**, where nginx is installed (with the same Triton): nginx relaying both protocols (proxy_pass,
  grpc_pass; one process, nothing checked) against Triton's own ports the same way: what a relay outside Python's
  per-request cost reaches on these cores.

The load generator runs in this process (asyncio: raw HTTP/1.1 connections parsed by httptools; grpc.aio with a
pre-serialized ModelInferRequest), on the same cores unless the host has more. Targets (docs/serving.md, "The front's
cost"): public >= 80 % of Triton's own ports on both protocols; front CPU <= 0.1 ms per request.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from serve_process import children, ready, triton_ports

from hub_vit.ports import port_in_use
from hub_vit.server.runtime.launcher import free_port

CONCURRENCY = 64
MODEL = "identity"
TARGET_RATIO = 0.8
TARGET_CPU_MS = 0.1

CONFIG = """name: "identity"
backend: "python"
max_batch_size: 64
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [{ count: 1, kind: KIND_CPU }]
"""
MODEL_PY = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
'''


def write_identity_repository(folder: Path) -> Path:
    (folder / MODEL / "1").mkdir(parents=True)
    (folder / MODEL / "config.pbtxt").write_text(CONFIG)
    (folder / MODEL / "1" / "model.py").write_text(MODEL_PY)
    return folder


# -- the parsers ---------------------------------------------------------------------------------------------------
HTTP_REQUEST = (b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: Python-urllib3\r\n"
                b"Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\n"
                b"Inference-Header-Content-Length: 150\r\nContent-Length: 300\r\n"
                b"Content-Type: application/octet-stream\r\n\r\n" + b"x" * 300)
HTTP_ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nInference-Header-Content-Length: 200\r\n"
               b"Content-Length: 260\r\n\r\n" + b"y" * 260)


def parser_cost(requests: int) -> dict[str, dict[str, float]]:
    """CPU microseconds per request for each parser: the request read as a server, the answer read as a client."""
    import h11
    import httptools

    def h11_request() -> None:
        connection = h11.Connection(h11.SERVER)
        for _ in range(requests):
            connection.receive_data(HTTP_REQUEST)
            while not isinstance(connection.next_event(), h11.EndOfMessage):
                pass
            connection.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
            connection.send(h11.EndOfMessage())
            connection.start_next_cycle()

    def h11_answer() -> None:
        connection = h11.Connection(h11.CLIENT)
        for _ in range(requests):
            connection.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
            connection.send(h11.EndOfMessage())
            connection.receive_data(HTTP_ANSWER)
            while not isinstance(connection.next_event(), h11.EndOfMessage):
                pass
            connection.start_next_cycle()

    class Sink:
        def on_header(self, name: bytes, value: bytes) -> None:
            pass

        def on_body(self, body: bytes) -> None:
            pass

    def httptools_request() -> None:
        parser = httptools.HttpRequestParser(Sink())
        for _ in range(requests):
            parser.feed_data(HTTP_REQUEST)

    def httptools_answer() -> None:
        parser = httptools.HttpResponseParser(Sink())
        for _ in range(requests):
            parser.feed_data(HTTP_ANSWER)

    def us(run: Any) -> float:
        start = time.process_time()
        run()
        return (time.process_time() - start) * 1e6 / requests

    found = {}
    for name, (read_request, read_answer) in {"h11": (h11_request, h11_answer),
                                              "httptools": (httptools_request, httptools_answer)}.items():
        request_us, answer_us = us(read_request), us(read_answer)
        found[name] = {"request_us": request_us, "answer_us": answer_us, "per_request_us": request_us + answer_us}
        print(f"parser {name}: {request_us:.1f} us per request read + {answer_us:.1f} us per answer read", flush=True)
    return found


# -- the HTTP front's own code ---------------------------------------------------------------------------------------
class _Transport:
    """Where the front's writes go when no socket is there: kept until read, nothing sent."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        raise RuntimeError("the front closed a connection in the code benchmark")


def front_code_cost(requests: int, rounds: int = 9, front: Any = None) -> dict[str, float]:
    """CPU microseconds per request of the HTTP front's own code (server/front/http_front.py, or the module `front`),
    in this process, no sockets: a client's inference request handed to the front as one read, relayed on a pooled
    connection, Triton's answer handed back as one read, relayed to the client. `repeated`: the same request and answer
    each time (what clients and Triton send: heads met before); `fresh`: each request and answer head a new one (every
    one parsed by llhttp and checked). `rounds` rounds of each, alternating, `requests` requests each; the medians.
    Free of the loopback's and the scheduler's noise: the cost the front adds per request where it has a core of its
    own (docs/serving.md, "The front's cost")."""
    from hub_vit.server.front import http_front
    from hub_vit.server.front.limits import FrontLimits

    front = front or http_front
    header = _infer_header()
    body = header + struct.pack("<f", 1.0)
    answer_header = json.dumps({"model_name": MODEL, "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 1], "parameters": {"binary_data_size": 4}}]}).encode()

    def request(tag: int) -> bytes:
        return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: %d\r\n"
                b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                % (MODEL.encode(), tag, len(header), len(body))) + body

    def answer(tag: int) -> bytes:
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Tag: %d\r\n"
                b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                % (tag, len(answer_header), len(answer_header) + 4)) + answer_header + struct.pack("<f", 1.0)

    fresh = [(request(i), answer(i)) for i in range(requests)]
    repeated = [fresh[0]] * requests

    async def us(pairs: list[tuple[bytes, bytes]]) -> float:
        relaying = front.HttpFront(FrontLimits())
        await relaying.upstream("127.0.0.1", 1)
        upstream, client = front.Upstream(relaying, relaying.generation), front.Client(relaying)
        upstream_transport, client_transport = _Transport(), _Transport()
        upstream.connection_made(upstream_transport)
        client.connection_made(client_transport)
        relaying.idle.append(upstream)
        relaying.upstreams = 1
        start = time.process_time()
        for sent, answered in pairs:
            client.data_received(sent)
            upstream.data_received(answered)
        elapsed = time.process_time() - start
        assert len(client_transport.written) == requests and client_transport.written[-1].startswith(b"HTTP/1.1 200")
        return elapsed * 1e6 / requests

    measured: dict[str, list[float]] = {"repeated": [], "fresh": []}
    for index in range(rounds):
        for kind in ("repeated", "fresh") if index % 2 == 0 else ("fresh", "repeated"):
            measured[kind].append(asyncio.run(us(repeated if kind == "repeated" else fresh)))
    found = {kind: float(np.median(values)) for kind, values in measured.items()}
    print(f"HTTP front's code: {found['repeated']:.1f} us per request repeated, {found['fresh']:.1f} us per fresh "
          "request", flush=True)
    return found


# -- grpcio's own floor ---------------------------------------------------------------------------------------------
EMPTY_GRPC_SERVER = """
import sys
import grpc
import uvloop
from grpc import aio

async def answer(message, context):
    return b"answer"

class Any(grpc.GenericRpcHandler):
    def service(self, details):
        return grpc.unary_unary_rpc_method_handler(answer)

async def main():
    server = aio.server()
    server.add_generic_rpc_handlers((Any(),))
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

uvloop.run(main())
"""


def grpcio_floor(seconds: float) -> dict[str, float]:
    """What grpcio's Python API costs per unary call, whatever the handler does: an empty grpc.aio server (a generic
    handler answering every call with 6 bytes) in a process of its own, on the front's event loop (uvloop), loaded
    like the gRPC rounds (batch-1 ModelInfer messages at concurrency 64, grpc.aio raw bytes). Its CPU per call is what
    the gRPC front pays to receive and answer a call; the load generator's is what it pays to relay the call to
    Triton. A Python relay pays both."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", EMPTY_GRPC_SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        server_start, client_start = _cpu_s([server.pid]), time.process_time()
        served = load("grpc", port, seconds)
        server_cpu, client_cpu = _cpu_s([server.pid]) - server_start, time.process_time() - client_start
    finally:
        server.terminate()
        server.wait()
    calls = max(served["requests"], 1)
    found = {"calls_per_s": served["requests_per_s"], "server_cpu_ms_per_call": server_cpu * 1000 / calls,
             "client_cpu_ms_per_call": client_cpu * 1000 / calls}
    found["relay_cpu_ms_per_call"] = found["server_cpu_ms_per_call"] + found["client_cpu_ms_per_call"]
    print(f"grpcio floor: {found['calls_per_s']:.0f} calls/s on an empty server; {found['server_cpu_ms_per_call']:.3f} "
          f"ms server + {found['client_cpu_ms_per_call']:.3f} ms client CPU per call", flush=True)
    return found


# -- the cheapest relay Python can be, and one that reads every gRPC frame -------------------------------------------
# argv: its port, Triton's private port, and "watch" for the frame reader: each client->server HTTP/2 frame's header
# read, header blocks decoded with hpack (the HPACK state kept per connection, :path of each call noted), DATA lengths
# summed per stream and each call's gRPC message prefix read; bytes passed on as they come either way. The frame reader
# costs what a gRPC front that watches HTTP/2 go by (rather than ending each call in grpcio) pays before its checks.
BYTE_PIPE = """
import asyncio, struct, sys
import uvloop

PREFACE = b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n"
DATA, HEADERS, PADDED, PRIORITY, END_STREAM = 0x0, 0x1, 0x8, 0x20, 0x1

class FrameReader:
    def __init__(self):
        from hpack import Decoder
        self.buffer, self.preface, self.decoder, self.paths, self.received = bytearray(), False, Decoder(), {}, {}

    def read(self, data):
        buffer = self.buffer
        buffer += data
        at = 0
        if not self.preface:
            if len(buffer) < len(PREFACE):
                return
            at, self.preface = len(PREFACE), True
        while len(buffer) - at >= 9:
            high, low, kind, flags, stream = struct.unpack_from(">HBBBL", buffer, at)
            length, stream = (high << 8) | low, stream & 0x7FFFFFFF
            if len(buffer) - at - 9 < length:
                break
            payload = bytes(buffer[at + 9:at + 9 + length])
            if kind == HEADERS:
                pad = payload[0] if flags & PADDED else 0
                start = (1 if flags & PADDED else 0) + (5 if flags & PRIORITY else 0)
                for name, value in self.decoder.decode(payload[start:len(payload) - pad]):
                    if name == ":path":
                        self.paths[stream] = value
            elif kind == DATA:
                if stream not in self.received and len(payload) >= 5:
                    compressed, size = struct.unpack_from(">BL", payload)
                self.received[stream] = self.received.get(stream, 0) + length
                if flags & END_STREAM:
                    self.received.pop(stream, None)
                    self.paths.pop(stream, None)
            at += 9 + length
        del buffer[:at]

class Upstream(asyncio.Protocol):
    def __init__(self, client):
        self.client = client

    def data_received(self, data):
        self.client.write(data)

    def connection_lost(self, exc):
        self.client.close()

class Client(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.upstream, self.early = transport, None, []
        self.frames = FrameReader() if WATCH else None
        asyncio.ensure_future(self.connect())

    async def connect(self):
        loop = asyncio.get_running_loop()
        self.upstream, _ = await loop.create_connection(lambda: Upstream(self.transport), "127.0.0.1", UPSTREAM)
        self.upstream.write(b"".join(self.early))

    def data_received(self, data):
        if self.frames is not None:
            self.frames.read(data)
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc):
        if self.upstream is not None:
            self.upstream.close()

async def main():
    server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()

UPSTREAM, WATCH = int(sys.argv[2]), sys.argv[3:] == ["watch"]
uvloop.run(main())
"""


def pipe_floor(protocol: str, private_port: int, rounds: int, seconds: float, watch: bool = False) -> dict[str, Any]:
    """What any relay written in Python costs on this host, before parsing or checking anything: a byte pipe (one
    asyncio connection to Triton's private port of `protocol` per client connection, bytes passed on as they come, in
    a process of its own, on the front's event loop, uvloop) loaded like that protocol's rounds, `rounds` pairs against
    Triton's own port in alternating order. Its CPU per request is the event loop's and the loopback hop's (a recv and
    a send on each side); its ratio is the most a Python front can reach on these cores. For gRPC, HTTP/2 runs end to
    end through it. `watch` (gRPC): the pipe also reads every client frame (BYTE_PIPE's FrameReader, hpack); skipped,
    and said so, where hpack is not installed (the serve extra has it: the gRPC front decodes with it)."""
    name = "watcher" if watch else "pipe"
    if watch and importlib.util.find_spec("hpack") is None:
        why = "hpack is not installed (pip install '.[serve]')"
        print(f"{protocol} frame watcher: skipped, {why}", flush=True)
        return {"skipped": why}
    port = free_port()
    mode = ["watch"] if watch else []
    pipe = subprocess.Popen([sys.executable, "-c", BYTE_PIPE, str(port), str(private_port), *mode],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert pipe.stdout is not None and pipe.stdout.readline().strip() == "ready"
        found = _relay_vs_private(name, protocol, port, private_port, pipe.pid, rounds, seconds)
    finally:
        pipe.terminate()
        pipe.wait()
    print(f"{protocol} {'frame watcher' if watch else 'byte pipe'}: {found[f'{name}_vs_private']:.0%} of Triton's own "
          f"port, {found[f'{name}_cpu_ms_per_request']:.3f} ms of its CPU per request", flush=True)
    return found


# -- a native relay: nginx, where it is installed --------------------------------------------------------------------
# One process (no master), keep-alive connections to Triton's private ports; nothing checked, nothing logged
NGINX_CONF = """daemon off; master_process off; worker_processes 1; pid {tmp}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
    upstream triton_http {{ server 127.0.0.1:{private_http}; keepalive 64; }}
    upstream triton_grpc {{ server 127.0.0.1:{private_grpc}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{http};
        location / {{ proxy_pass http://triton_http; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}
    server {{
        listen 127.0.0.1:{grpc} http2;
        http2_max_concurrent_streams 1024;
        location / {{ grpc_pass grpc://triton_grpc; }}
    }}
}}
"""


def find_nginx() -> str | None:
    """nginx's executable: on PATH, else Debian's /usr/sbin (not on a non-root PATH)."""
    found = shutil.which("nginx")
    return found if found else "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def native_floor(private: dict[str, int], rounds: int, seconds: float) -> dict[str, Any]:
    """What a relay outside Python's per-request cost reaches on this host: nginx (one process; proxy_pass for HTTP,
    grpc_pass for gRPC; it parses both protocols and checks nothing) against Triton's own ports, `rounds` pairs per
    protocol in alternating order, as for the byte pipe. Skipped (and said so) where nginx is not installed: Debian's
    `nginx-core` package has both modules."""
    nginx = find_nginx()
    if nginx is None:
        why = "nginx is not installed (Debian: apt-get install nginx-core)"
        print(f"native relay floor: skipped, {why}", flush=True)
        return {"skipped": why}
    version = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip().rpartition("/")[2]
    ports = {"http": free_port(), "grpc": free_port()}
    found: dict[str, Any] = {"relay": f"nginx {version}, one process", "protocols": {}}
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as tmp:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, private_http=private["http"], private_grpc=private["grpc"],
                                          **ports))
        # -e: its error log from the first line on (the built-in path is root's /var/log/nginx)
        relay = subprocess.Popen([nginx, "-c", str(conf), "-p", tmp, "-e", f"{tmp}/error.log"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for_port(relay, ports["http"], ports["grpc"])
            for protocol in ("http", "grpc"):
                load(protocol, ports[protocol], min(seconds, 1.0))  # warm-up: its connections to Triton
                row = _relay_vs_private("nginx", protocol, ports[protocol], private[protocol], relay.pid, rounds,
                                        seconds)
                found["protocols"][protocol] = row
                print(f"native relay ({found['relay']}), {protocol}: {row['nginx_vs_private']:.0%} of Triton's own "
                      f"port, {row['nginx_cpu_ms_per_request']:.3f} ms of its CPU per request", flush=True)
        finally:
            relay.terminate()
            relay.wait()
    return found


def _wait_for_port(process: subprocess.Popen, *ports: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the relay exited with {process.returncode}: {process.stderr.read()[-2000:]}")
            if port_in_use("127.0.0.1", port):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the relay did not open port {port} within {timeout_s:g} s")
            time.sleep(0.05)


def _relay_vs_private(name: str, protocol: str, relay_port: int, private_port: int, relay_pid: int, rounds: int,
                      seconds: float) -> dict[str, Any]:
    """`rounds` pairs of `load` through a relay and straight to Triton's own port, in alternating order (drift hits
    both sides alike): the medians of the paired ratios (range) and of the relay's CPU per request, and the pairs.
    Keys are named after the relay (`{name}_vs_private`, `{name}_cpu_ms_per_request`)."""
    pairs = []
    for index in range(rounds):
        measured: dict[str, Any] = {}
        for side in (name, "private") if index % 2 == 0 else ("private", name):
            relay_cpu = _cpu_s([relay_pid])
            measured[side] = load(protocol, relay_port if side == name else private_port, seconds)
            if side == name:
                measured[side][f"{name}_cpu_ms_per_request"] = ((_cpu_s([relay_pid]) - relay_cpu) * 1000
                                                                / max(measured[side]["requests"], 1))
        measured[f"{name}_vs_private"] = measured[name]["requests_per_s"] / measured["private"]["requests_per_s"]
        pairs.append(measured)
    ratios = [pair[f"{name}_vs_private"] for pair in pairs]
    return {f"{name}_vs_private": float(np.median(ratios)), f"{name}_vs_private_range": [min(ratios), max(ratios)],
            f"{name}_cpu_ms_per_request": float(np.median([pair[name][f"{name}_cpu_ms_per_request"]
                                                           for pair in pairs])),
            "pairs": pairs}


# -- the load generator --------------------------------------------------------------------------------------------
def _infer_header() -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()


class _HttpLoad(asyncio.Protocol):
    """One keep-alive connection sending the same inference request again as soon as its answer is whole."""

    def __init__(self, request: bytes, until: float, latencies: list[float], errors: list[int]) -> None:
        import httptools

        self.request, self.until, self.latencies, self.errors = request, until, latencies, errors
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.sent = 0.0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._send()

    def _send(self) -> None:
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        now = time.perf_counter()
        if self.parser.get_status_code() == 200:
            self.latencies.append(now - self.sent)
        else:
            self.errors.append(1)
        if now < self.until:
            self._send()
        elif not self.done.done():
            self.done.set_result(None)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _http_load(port: int, seconds: float) -> tuple[list[float], int]:
    header = _infer_header()
    body = header + struct.pack("<f", 1.0)
    request = (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nInference-Header-Content-Length: %d\r\n"
               b"Content-Length: %d\r\n\r\n" % (MODEL.encode(), len(header), len(body))) + body
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors: list[int] = []
    until = time.perf_counter() + seconds
    connections = [(await loop.create_connection(lambda: _HttpLoad(request, until, latencies, errors),
                                                 "127.0.0.1", port))[1] for _ in range(CONCURRENCY)]
    await asyncio.gather(*(c.done for c in connections))
    return latencies, len(errors)


async def _grpc_load(port: int, seconds: float) -> tuple[list[float], int]:
    from grpc import aio
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(struct.pack("<f", 1.0))
    message = request.SerializeToString()
    latencies: list[float] = []
    errors = 0
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # raw bytes both ways
        until = time.perf_counter() + seconds

        async def one_client() -> None:
            nonlocal errors
            while (start := time.perf_counter()) < until:
                try:
                    await call(message, timeout=30)
                    latencies.append(time.perf_counter() - start)
                except aio.AioRpcError:
                    errors += 1

        await asyncio.gather(*(one_client() for _ in range(CONCURRENCY)))
    return latencies, errors


def load(protocol: str, port: int, seconds: float) -> dict[str, float]:
    """Batch-1 requests at concurrency 64 for `seconds`: requests/s, p50 ms, errors."""
    start = time.perf_counter()
    latencies, errors = asyncio.run((_http_load if protocol == "http" else _grpc_load)(port, seconds))
    elapsed = time.perf_counter() - start
    return {"requests": len(latencies), "requests_per_s": len(latencies) / elapsed,
            "p50_ms": float(np.median(latencies)) * 1000 if latencies else float("nan"), "errors": errors}


# -- the processes' CPU --------------------------------------------------------------------------------------------
def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()  # state, ppid, pgrp, ...


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = _stat(pid)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _served(serve_pid: int) -> tuple[list[int], list[int], dict[str, int]]:
    """(the front's worker pids, tritonserver's process group, Triton's private ports) of a `hub-vit serve`."""
    fronts, triton, ports = [], [], {}
    for pid, args in children(serve_pid).items():
        if "hub_vit.server.front.worker" in args:
            fronts.append(pid)
        elif args and args[0].endswith("tritonserver"):
            ports = triton_ports(args)
            triton = [pid, *children(pid)]
    return fronts, triton, ports


def idle_cpu_per_s(pids: list[int], windows: int = 4, window_s: float = 1.0) -> float:
    """The CPU seconds per second `pids` spend with no load: the least over `windows` windows of `window_s`. Right after
    serve is ready its front processes still finish starting (a second of CPU with 4 processes); activity only adds,
    so the quietest window is the idle rate, which the rounds then subtract."""
    rates = []
    for _ in range(windows):
        start, cpu = time.monotonic(), _cpu_s(pids)
        time.sleep(window_s)
        rates.append((_cpu_s(pids) - cpu) / (time.monotonic() - start))
    return min(rates)


def measure_processes(repository: Path, processes: int, rounds: int, seconds: float,
                      floors: bool = False) -> dict[str, Any]:
    """One `hub-vit serve` with `processes` front processes: both protocols, public vs private, `rounds` pairs; with
    `floors`, then the byte pipe of each protocol (`pipe_floor`) and nginx (`native_floor`) against the same Triton."""
    public = {"http": free_port(), "grpc": free_port()}
    serve = subprocess.Popen([sys.executable, "-c", "from hub_vit.cli import main; main()", "serve", "--quiet",
                              "--repository", str(repository), "--name", MODEL, "--front-processes", str(processes),
                              "--http-port", str(public["http"]), "--grpc-port", str(public["grpc"]),
                              "--metrics-port", str(free_port())],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        fronts, triton, private = [], [], {}
        model_ready = f"/v2/models/{MODEL}/ready"
        while time.monotonic() < deadline and (len(private) < 2 or not ready(public["http"], model_ready)):
            if serve.poll() is not None:
                raise SystemExit(f"hub-vit serve exited with {serve.returncode}: {serve.stderr.read()[-2000:]}")
            time.sleep(0.5)
            fronts, triton, private = _served(serve.pid)
        idle_per_s = idle_cpu_per_s(fronts)
        rows = {}
        for protocol in ("http", "grpc"):
            load(protocol, public[protocol], min(seconds, 1.0))  # warm-up: connections, Triton's batcher
            pairs = []
            for index in range(rounds):  # public, private, private, public, ...: drift hits both sides alike
                measured = {}
                for side in ("public", "private") if index % 2 == 0 else ("private", "public"):
                    front_cpu, triton_cpu, started = _cpu_s(fronts), _cpu_s(triton), time.monotonic()
                    result = load(protocol, public[protocol] if side == "public" else private[protocol], seconds)
                    elapsed = time.monotonic() - started
                    answered = max(result["requests"], 1)
                    result["triton_cpu_ms_per_request"] = (_cpu_s(triton) - triton_cpu) * 1000 / answered
                    if side == "public":
                        result["front_cpu_ms_per_request"] = ((_cpu_s(fronts) - front_cpu - idle_per_s * elapsed)
                                                              * 1000 / answered)
                    measured[side] = result
                measured["public_vs_private"] = (measured["public"]["requests_per_s"]
                                                 / measured["private"]["requests_per_s"])
                pairs.append(measured)
            rows[protocol] = row = summarize(pairs)
            print(f"{processes} front process(es), {protocol}: public {row['public_requests_per_s']:.0f} req/s, "
                  f"private {row['private_requests_per_s']:.0f} ({row['public_vs_private']:.0%} "
                  f"[{row['public_vs_private_range'][0]:.0%}..{row['public_vs_private_range'][1]:.0%}]); p50 "
                  f"{row['public_p50_ms']:.2f} vs {row['private_p50_ms']:.2f} ms; front CPU "
                  f"{row['front_cpu_ms_per_request']:.3f} ms/request, Triton's {row['triton_cpu_ms_per_request']:.3f}; "
                  f"errors {row['errors']}", flush=True)
        measured = {"front_idle_cpu_ms_per_s": idle_per_s * 1000, "rows": rows}
        if floors:
            measured["http_pipe_floor"] = pipe_floor("http", private["http"], rounds, seconds)
            measured["grpc_pipe_floor"] = pipe_floor("grpc", private["grpc"], rounds, seconds)
            measured["grpc_watch_floor"] = pipe_floor("grpc", private["grpc"], rounds, seconds, watch=True)
            measured["native_floor"] = native_floor(private, rounds, seconds)
        return measured
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()


def summarize(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(side: str, key: str) -> float:
        return float(np.median([pair[side][key] for pair in pairs]))

    ratios = [pair["public_vs_private"] for pair in pairs]
    return {"public_requests_per_s": median("public", "requests_per_s"),
            "private_requests_per_s": median("private", "requests_per_s"),
            "public_vs_private": float(np.median(ratios)), "public_vs_private_range": [min(ratios), max(ratios)],
            "public_p50_ms": median("public", "p50_ms"), "private_p50_ms": median("private", "p50_ms"),
            "front_cpu_ms_per_request": median("public", "front_cpu_ms_per_request"),
            "triton_cpu_ms_per_request": median("private", "triton_cpu_ms_per_request"),
            "errors": sum(pair[side]["errors"] for pair in pairs for side in ("public", "private")),
            "pairs": pairs}


def front_cost(process_counts: list[int], rounds: int, seconds: float, parser_requests: int) -> dict[str, Any]:
    """The whole run (see the module docstring)."""
    report: dict[str, Any] = {"concurrency": CONCURRENCY, "batch": 1, "rounds": rounds, "seconds": seconds,
                              "cores": len(os.sched_getaffinity(0)), "load_average_start": os.getloadavg(),
                              "parsers": parser_cost(parser_requests),
                              "http_front_code_us": front_code_cost(parser_requests // 10),
                              "grpcio_floor": grpcio_floor(seconds),
                              "processes": {}}
    with tempfile.TemporaryDirectory(prefix="bench-front-") as tmp:
        repository = write_identity_repository(Path(tmp) / "repository")
        for count in process_counts:
            measured = measure_processes(repository, count, rounds, seconds, floors=count == process_counts[0])
            for floor in ("http_pipe_floor", "grpc_pipe_floor", "grpc_watch_floor", "native_floor"):
                if floor in measured:
                    report[floor] = measured.pop(floor)
            report["processes"][str(count)] = measured
    report["load_average_end"] = os.getloadavg()
    report["targets"] = {
        f"{count}_{protocol}": {"public_vs_private": row["public_vs_private"],
                                "ratio_met": row["public_vs_private"] >= TARGET_RATIO,
                                "front_cpu_ms_per_request": row["front_cpu_ms_per_request"],
                                "cpu_met": row["front_cpu_ms_per_request"] <= TARGET_CPU_MS}
        for count, result in report["processes"].items() for protocol, row in result["rows"].items()}
    return report
