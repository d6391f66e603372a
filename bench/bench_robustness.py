"""Bounded robustness run against `hub-vit serve` (the default model, loopback): fuzz both protocols for a fixed count,
flood the HTTP port with half-sent connections, then stop the service under continuous traffic.

Each request ends one of four ways: answered (2xx), refused cleanly (an HTTP 4xx/5xx answer with a message, a gRPC
error status other than UNAVAILABLE from a dead server, or, during the drain, a refused connection once the service
has exited), lost (no answer: a reset, a timeout, a 502 from the gate because Triton died), or it crashed the server
(serve's "restarting tritonserver" lines, counted separately). Target (issue #32): 0 crashes, 0 lost, peak RSS of
serve + tritonserver + its stubs bounded. Both fuzzes send the requests that crash or mislead Triton 2.51 (the
classification extension on `labels`, dimensions of 0 and past int32, gzip bombs); serve's gates must refuse them. The
drain runs HTTP and gRPC clients at once.

    .venv/bin/python bench/bench_robustness.py                       # 200 cases per protocol
    .venv/bin/python bench/bench_robustness.py --cases 50 --flood 300
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import io
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from run_info import REPO, add_note_option, check_writable, run_info, write_json

from hub_vit.server.runtime.launcher import free_port

SAMPLES = sorted((REPO / "hub_vit/assets/digits/samples").glob("*.png"))
GRPC_BOMB_MIB = 100  # a gzip-compressed gRPC message inflating to this (serve's cap: 64 MiB)


class Service:
    """`hub-vit serve` in a subprocess; its output collected; RSS of it and its tritonserver group sampled."""

    def __init__(self, *args: str) -> None:
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        command = [sys.executable, "-c", "from hub_vit.cli import main; main()", "serve", "--quiet", "--http-port",
                   str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics),
                   "--exit-timeout", "10", *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.text = ""
        self.peak_rss_mib = 0.0
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.text += line
            if "metrics  http" in line:
                self._ready.set()

    def wait_ready(self, timeout_s: float = 300) -> None:
        if not self._ready.wait(timeout_s):
            raise SystemExit(f"hub-vit serve did not start:\n{self.text}")

    def crashes(self) -> int:
        return self.text.count("restarting tritonserver")

    def _sample(self) -> None:
        while self.process.poll() is None:
            pids = [self.process.pid] + [pid for pid, parent in _children().items() if parent == self.process.pid]
            groups = set(pids[1:])
            total = 0
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    stat = (entry / "stat").read_text()
                    pgrp = int(stat[stat.rindex(")") + 2:].split()[2])
                    if int(entry.name) in pids or pgrp in groups:
                        for line in (entry / "status").read_text().splitlines():
                            if line.startswith("VmRSS:"):
                                total += int(line.split()[1])
                except (OSError, ValueError):
                    continue
            self.peak_rss_mib = max(self.peak_rss_mib, total / 1024)
            time.sleep(0.2)


def _children() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                found[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                continue
    return found


class Tally:
    def __init__(self) -> None:
        self.counts = {"tried": 0, "answered": 0, "refused_cleanly": 0, "lost": 0}
        self.lost_examples: list[str] = []
        self.lock = threading.Lock()

    def add(self, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.counts["tried"] += 1
            self.counts[outcome] += 1
            if outcome == "lost" and len(self.lost_examples) < 10:
                self.lost_examples.append(detail)


# -- HTTP fuzz -------------------------------------------------------------------------------------------------------
def _image(rng: random.Random) -> bytes:
    data = SAMPLES[rng.randrange(len(SAMPLES))].read_bytes()
    kind = rng.randrange(6)
    if kind == 0:
        return data
    if kind == 1:
        return data[:rng.randrange(len(data))]  # truncated
    if kind == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))  # noise
    if kind == 3:
        flipped = bytearray(data)
        for _ in range(8):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    if kind == 4:
        from PIL import Image  # a JPEG whose header claims far more than its data holds

        buffer = io.BytesIO()
        Image.open(io.BytesIO(data)).convert("RGB").resize((64, 48)).save(buffer, "JPEG")
        short = bytearray(buffer.getvalue())
        frame = short.find(b"\xff\xc0")
        short[frame + 5:frame + 9] = struct.pack(">HH", 4000, 4000)
        return bytes(short)
    return b""


def http_case(rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    """(method, path, body, headers) of one hostile or ordinary request (one in four is a good one)."""
    if rng.random() < 0.25:
        image = SAMPLES[rng.randrange(len(SAMPLES))].read_bytes()
        raw = struct.pack("<I", len(image)) + image
        text = json.dumps({"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": len(raw)}}]}).encode()
        return "POST", "/v2/models/vit/infer", text + raw, {"Inference-Header-Content-Length": str(len(text))}
    images = [_image(rng) for _ in range(rng.randrange(1, 4))]
    raw = b"".join(struct.pack("<I", len(i)) + i for i in images)
    shape = rng.choice([[len(images), 1], [0, 1], [2**32 + 1, 1], [len(images)], [1, len(images)], [-1, 1],
                        [len(images) + 1, 1]])
    header: dict[str, Any] = {"inputs": [{"name": rng.choice(["image", "image", "pixel_values", "x"]), "shape": shape,
                                          "datatype": rng.choice(["BYTES", "BYTES", "FP32", "UINT8"]),
                                          "parameters": {"binary_data_size": len(raw)}}]}
    if rng.random() < 0.3:
        header["outputs"] = [{"name": rng.choice(["labels", "scores", "logits", "class_ids"]),
                              "parameters": rng.choice([{}, {"classification": 3}, {"binary_data": True}])}]
    text = json.dumps(header).encode()
    body, headers = text + raw, {"Inference-Header-Content-Length": str(len(text))}
    kind = rng.randrange(10)
    if kind == 0:
        body = gzip.compress(b"{" + b" " * rng.choice([1 << 20, 100 << 20, 300 << 20]) + b"}", 9)
        headers = {"Content-Encoding": "gzip"}
    elif kind == 1:
        body, headers = b"{not json", {}
    elif kind == 2:
        headers["Inference-Header-Content-Length"] = str(rng.choice([0, 10**9, -5]))
    elif kind == 3:
        body = body[:rng.randrange(len(body) + 1)]
    elif kind == 4:
        headers["Content-Encoding"] = rng.choice(["br", "deflate", "gzip"])
    path = rng.choice(["/v2/models/vit/infer"] * 6 + ["/v2/models/vit_classifier/infer", "/v2/models/nope/infer",
                                                      "/v2/logging", "/v2/systemsharedmemory/region/r/register"])
    return "POST", path, body, headers


def http_fuzz(service: Service, cases: int, seed: int) -> dict[str, Any]:
    rng, tally = random.Random(seed), Tally()
    for _ in range(cases):
        method, path, body, headers = http_case(rng)
        connection = http.client.HTTPConnection("127.0.0.1", service.http, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers)
            reply = connection.getresponse()
            text = reply.read()
            if reply.status < 300:
                tally.add("answered")
            elif reply.status == 502 or not text:
                tally.add("lost", f"HTTP {reply.status} {path}")
            else:
                tally.add("refused_cleanly")
        except (OSError, http.client.HTTPException) as err:
            tally.add("lost", f"{type(err).__name__}: {err} ({path})")
        finally:
            connection.close()
    return {**tally.counts, "lost_examples": tally.lost_examples}


# -- gRPC fuzz -------------------------------------------------------------------------------------------------------
def grpc_fuzz(service: Service, cases: int, seed: int) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    rng, tally = random.Random(seed + 1), Tally()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{service.grpc}")
    for _ in range(cases):
        good = rng.random() < 0.25  # one in four is a good request, as in the HTTP fuzz
        images = [SAMPLES[rng.randrange(len(SAMPLES))].read_bytes()] if good else \
            [_image(rng) for _ in range(rng.randrange(1, 4))]
        compression = rng.choice([None, None, "gzip"])
        if not good and rng.random() < 0.04:  # a gzip bomb: ~100 kB on the wire
            images, compression = [bytes(GRPC_BOMB_MIB << 20)], "gzip"
        shape = [1, 1] if good else rng.choice([[len(images), 1], [len(images) + 1, 1], [len(images)],
                                                [1, len(images)], [0, 1], [2**32 + 1, 1]])
        tensor = grpcclient.InferInput("image" if good else rng.choice(["image", "image", "x"]), shape,
                                       "BYTES" if good else rng.choice(["BYTES", "BYTES", "FP32"]))
        tensor._raw_content = b"".join(struct.pack("<I", len(i)) + i for i in images)
        outputs = None
        if not good and rng.random() < 0.3:  # the classification extension on `labels` included: the gate refuses it
            name = rng.choice(["labels", "scores", "logits", "class_ids"])
            outputs = [grpcclient.InferRequestedOutput(name, class_count=rng.choice([0, 3]))]
        try:
            client.infer("vit" if good else rng.choice(["vit", "vit", "nope"]), [tensor], outputs=outputs,
                         client_timeout=60, compression_algorithm=compression)
            tally.add("answered")
        except InferenceServerException as err:
            status = str(err.status())
            if "UNAVAILABLE" in status or "DEADLINE" in status:
                tally.add("lost", f"{status}: {str(err)[:120]}")
            else:
                tally.add("refused_cleanly")
    return {**tally.counts, "lost_examples": tally.lost_examples}


# -- connection flood ------------------------------------------------------------------------------------------------
def flood(service: Service, connections: int) -> dict[str, Any]:
    sockets, opened = [], 0
    health_answered = 0
    try:
        for _ in range(connections):
            try:
                sock = socket.create_connection(("127.0.0.1", service.http), timeout=10)
                sock.sendall(b"POST /v2/models/vit/infer HTTP/1.1\r\nHost: x\r\n")
                sockets.append(sock)
                opened += 1
            except OSError:
                break
        for _ in range(10):
            connection = http.client.HTTPConnection("127.0.0.1", service.http, timeout=10)
            try:
                connection.request("GET", "/v2/health/ready")
                health_answered += connection.getresponse().status == 200
            except (OSError, http.client.HTTPException):
                pass
            finally:
                connection.close()
    finally:
        for sock in sockets:
            sock.close()
    return {"half_sent_connections": opened, "health_probes": 10, "health_probes_answered_200": health_answered}


# -- drain -----------------------------------------------------------------------------------------------------------
def drain(service: Service, clients: int, grpc_clients: int, seconds_before: float) -> dict[str, Any]:
    tally, done = Tally(), threading.Event()
    image = SAMPLES[0].read_bytes()
    raw = struct.pack("<I", len(image)) + image
    text = json.dumps({"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(text))}

    def client() -> None:
        connection = None
        while not done.is_set():
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", service.http, timeout=60)
                connection.request("POST", "/v2/models/vit/infer", body=text + raw, headers=headers)
                reply = connection.getresponse()
                body = reply.read()
                if reply.status == 200:
                    tally.add("answered")
                elif reply.status == 503 and b"shutting down" in body:
                    tally.add("refused_cleanly")
                else:
                    tally.add("lost", f"HTTP {reply.status} {body[:80]!r}")
                if (reply.getheader("Connection") or "").lower() == "close":
                    connection.close()
                    connection = None
            except ConnectionRefusedError:  # the gate stopped listening (draining), or the service has exited
                connection = None
                tally.add("refused_cleanly")
                if service.process.poll() is not None:
                    return
                time.sleep(0.05)
            except (OSError, http.client.HTTPException) as err:
                tally.add("lost", f"{type(err).__name__}: {err}")
                connection = None

    def grpc_client() -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        tensor = grpcclient.InferInput("image", [1, 1], "BYTES")
        tensor._raw_content = raw
        connection = grpcclient.InferenceServerClient(f"127.0.0.1:{service.grpc}")
        while not done.is_set():
            try:
                connection.infer("vit", [tensor], client_timeout=60)
                tally.add("answered")
            except InferenceServerException as err:
                message = err.message() or ""
                if "shutting down" in message or "Connection refused" in message:  # the gate's 503, or gone
                    tally.add("refused_cleanly")
                    if service.process.poll() is not None:
                        return
                else:
                    tally.add("lost", f"gRPC {err.status()}: {message[:80]}")
                time.sleep(0.05)

    workers = [threading.Thread(target=client) for _ in range(clients)]
    workers += [threading.Thread(target=grpc_client) for _ in range(grpc_clients)]
    for worker in workers:
        worker.start()
    time.sleep(seconds_before)
    started = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    code = service.process.wait(120)
    stopped_s = time.monotonic() - started
    done.set()
    for worker in workers:
        worker.join(60)
    return {**tally.counts, "lost_examples": tally.lost_examples, "serve_exit_code": code,
            "stop_seconds": round(stopped_s, 2), "sigsegv_in_log": "SIGSEGV" in service.text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="fuzz cases per protocol")
    parser.add_argument("--flood", type=int, default=600, help="half-sent connections opened at once")
    parser.add_argument("--max-connections", type=int, default=256, help="serve's --max-connections for the run")
    parser.add_argument("--drain-clients", type=int, default=4, help="HTTP clients during the drain")
    parser.add_argument("--drain-grpc-clients", type=int, default=2, help="gRPC clients during the drain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/serve_robustness_cpu.json")
    add_note_option(parser)
    args = parser.parse_args()
    check_writable(args.out.parent)
    result: dict[str, Any] = {"run": run_info(args, packages=("tritonclient", "nvidia-pytriton")),
                              "load_avg_at_start": os.getloadavg()}
    service = Service("--max-connections", str(args.max_connections))
    try:
        service.wait_ready()
        phases = {}
        for name, run in (("http_fuzz", lambda: http_fuzz(service, args.cases, args.seed)),
                          ("grpc_fuzz", lambda: grpc_fuzz(service, args.cases, args.seed)),
                          ("flood", lambda: flood(service, args.flood))):
            before = service.crashes()
            started = time.monotonic()
            phases[name] = run()
            phases[name]["crashes"] = service.crashes() - before
            phases[name]["seconds"] = round(time.monotonic() - started, 1)
            phases[name]["peak_rss_mib_so_far"] = round(service.peak_rss_mib)
            print(name, json.dumps({k: v for k, v in phases[name].items() if k != "lost_examples"}), flush=True)
        before = service.crashes()
        phases["drain"] = drain(service, args.drain_clients, args.drain_grpc_clients, seconds_before=3)
        phases["drain"]["crashes"] = service.crashes() - before
        print("drain", json.dumps({k: v for k, v in phases["drain"].items() if k != "lost_examples"}), flush=True)
    finally:
        if service.process.poll() is None:
            service.process.kill()
    totals = {key: sum(p.get(key, 0) for p in phases.values())
              for key in ("tried", "answered", "refused_cleanly", "crashes", "lost")}
    result.update(phases=phases, totals=totals, peak_rss_mib=round(service.peak_rss_mib))
    print(f"tried {totals['tried']}  answered {totals['answered']}  refused cleanly {totals['refused_cleanly']}  "
          f"crashes {totals['crashes']}  lost {totals['lost']}  peak RSS {result['peak_rss_mib']} MiB")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
