"""`hub-vit serve` as the benchmarks run it: a subprocess on free ports, its public (gated) and private (Triton's own)
addresses, and Triton's per-model statistics (bench/gpu_check.py, bench/request_path.py, bench/bench_serve.py).

Started as part of a bench script (`python bench/<script>.py` puts bench/ on sys.path).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    from hub_vit.server.runtime.launcher import free_port as free

    return free()


def ready(port: int, path: str = "/v2/health/ready") -> bool:
    """Whether the HTTP server on 127.0.0.1:`port` answers `path` (a readiness URL) with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def children(parent: int) -> dict[int, list[str]]:
    """The processes whose parent is `parent`: pid -> its command line (from /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[1]) != parent:
                continue
            found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue
    return found


def triton_ports(args: list[str]) -> dict[str, int]:
    """The HTTP and gRPC ports on a tritonserver command line: {"http": port, "grpc": port}."""
    return {key[2:-5]: int(value) for key, _, value in (a.partition("=") for a in args)
            if key in ("--http-port", "--grpc-port")}


def private_ports(serve_pid: int) -> dict[str, int]:
    """The HTTP and gRPC ports of the tritonserver a `hub-vit serve` process runs (behind its front), from its command
    line; {} while it has none."""
    for args in children(serve_pid).values():
        if args and args[0].endswith("tritonserver"):
            return triton_ports(args)
    return {}


def model_statistics(http_port: int) -> dict[str, dict[str, int]]:
    """Triton's cumulative statistics per model, from its HTTP port (private or public): {model: {inference_count,
    execution_count, success, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns}}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/stats", timeout=30) as reply:
        stats = json.loads(reply.read())
    out = {}
    for entry in stats.get("model_stats", []):
        infer = entry.get("inference_stats", {})
        out[entry["name"]] = {"inference_count": int(entry.get("inference_count", 0)),
                              "execution_count": int(entry.get("execution_count", 0)),
                              "success": int(infer.get("success", {}).get("count", 0)),
                              **{f"{phase}_ns": int(infer.get(phase, {}).get("ns", 0))
                                 for phase in ("queue", "compute_input", "compute_infer", "compute_output")}}
    return out


class Served:
    """`hub-vit serve [MODEL] EXTRA...` in a subprocess on free ports, until `stop()`. `env`: added to this
    process's environment for it (and so for its tritonserver and stubs)."""

    def __init__(self, model: Path | None, extra: list[str], timeout_s: float,
                 env: dict[str, str] | None = None) -> None:
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        command = [sys.executable, "-c", "from hub_vit.cli import main; main()", "serve",
                   *([str(model)] if model else []), "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                   "--metrics-port", str(self.metrics), "--quiet", *extra]
        self.command = command[3:]
        started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, **(env or {})})
        lines: list[str] = []
        while time.monotonic() - started < timeout_s and self.process.poll() is None:
            line = self.process.stdout.readline()
            lines.append(line)
            if line.strip().startswith("metrics"):
                break
        self.banner = "".join(lines)
        if "metrics" not in self.banner:
            exited = self.process.poll()
            errors = self.stop()
            why = f"exited with code {exited}" if exited is not None else f"did not start within {timeout_s:.0f} s"
            raise RuntimeError(f"hub-vit {' '.join(self.command)} {why}:\n{self.banner}\n{errors[-4000:]}")
        self.ready_s = time.monotonic() - started
        device = re.search(r"device\s+(.+)", self.banner)
        self.device = device[1].strip() if device else "?"
        self.private = private_ports(self.process.pid)  # Triton's own ports, behind the gates

    def url(self, protocol: str, private: bool = False) -> str:
        ports = self.private if private else {"http": self.http, "grpc": self.grpc}
        return f"127.0.0.1:{ports[protocol]}"

    def statistics(self) -> dict[str, dict[str, int]]:
        return model_statistics(self.private["http"])

    def describe(self) -> dict[str, Any]:
        return {"command": self.command, "device": self.device, "ready_s": self.ready_s,
                "private_ports": self.private}

    def stop(self) -> str:
        """SIGTERM (a drain), SIGKILL after 60 s; returns what the command wrote to stderr (also when it had exited
        by itself: then what it said is why)."""
        if self.process.poll() is not None:
            if self.process.stderr is None or self.process.stderr.closed:
                return ""  # read by an earlier stop()
            return self.process.communicate()[1] or ""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.communicate(timeout=60)[1] or ""
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.communicate()[1] or ""
