"""Who may reach a local tritonserver: the control APIs restricted to a key only hub-vit's own calls carry, and the
warning for serving beyond loopback with the wheel's Triton 2.51."""

from __future__ import annotations

import ipaddress

from hub_vit.ports import ipv4_address

# Control APIs any client could otherwise call. Triton 2.51 crashed (SIGSEGV) when a client registered a stub's own
# /dev/shm region through the system shared-memory API and asked for an output into it; the logging API lets anyone
# raise the verbosity (heap addresses in the log) or switch error logging off; trace writes files; the repository API
# lists (and, outside --model-control-mode=none, loads) models. Health, metadata, model config, inference and
# statistics stay open: clients, probes, `hub-vit loadtest` and perf_analyzer need them, and none changes the server.
RESTRICTED_APIS = ("shared-memory", "logging", "trace", "model-repository")
CONTROL_HEADER = "hub-vit-control-key"


def restricted_api_args(header: str, key: str) -> tuple[str, str]:
    """Triton's flags restricting `RESTRICTED_APIS` to requests carrying `header: key`, on HTTP and gRPC (gRPC
    metadata keys are lower case, as `header` is). The Dockerfile passes the same two flags."""
    apis = ",".join(RESTRICTED_APIS)
    return f"--http-restricted-api={apis}:{header}={key}", f"--grpc-restricted-protocol={apis}:{header}={key}"


def exposure_warning(host: str) -> str | None:
    """Why serving on `host` reaches beyond this machine is unsafe with the local Triton 2.51, or None for loopback."""
    if ipaddress.ip_address(ipv4_address(host)).is_loopback:
        return None
    return (f"--host {host} serves beyond this machine. serve's front caps HTTP and gRPC bodies (also inflated), "
            "refuses the requests known to crash Triton and restricts its control APIs, but the tritonserver behind it "
            "is 2.51 (from nvidia-pytriton): it predates the fixes for CVE-2025-23310/23311 (chunked HTTP) and "
            "CVE-2025-23319/23320/23334 (Python-backend shared memory), a crashing request the front does not know "
            "still kills it (serve restarts it). Serve other "
            "machines from the Dockerfile's container (Triton 25.07+, body caps set) behind a proxy; keep this server "
            "on 127.0.0.1")
