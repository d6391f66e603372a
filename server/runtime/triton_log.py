"""Reading tritonserver's own log lines: when its endpoints opened, which port was taken, which model failed to load,
and which lines are harmless on a host without a GPU."""

from __future__ import annotations

import re

# Triton logs one line per model version that fails to load; the reason's traceback follows as escaped newlines:
#   E1123 06:09:28.412527 4209 model_lifecycle.cc:642] "failed to load 'vit_classifier' version 1: Internal:
#   InvalidProtobuf: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from ... failed:Protobuf parsing failed.
#   \n\nAt:\n  .../onnxruntime_inference_collection.py(753): _create_inference_session\n ..."
# Triton's words when a port was taken between our check and its bind (HTTP, gRPC and metrics alike):
#   E1123 ... grpc_server.cc] "failed to start GRPC service: Unavailable - Socket '127.0.0.1:8001' already in use "
# Triton's words once a client can reach it (models loaded):
#   I1127 05:11:33.007673 11532 grpc_server.cc:2558] "Started GRPCInferenceService at 127.0.0.1:34373"
#   I1127 05:11:33.008040 11532 http_server.cc:4713] "Started HTTPService at 127.0.0.1:49259"
ENDPOINT_STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService) at ")
# The options table Triton prints once every model loaded, right before it opens its endpoints:
#   | server_id                        | hub-vit-25818-n4026531836-17a8382c |
# A request can reach an endpoint, and crash the server, before the endpoint's "Started ..." line is read: a server
# killed by a signal after this table had opened its endpoints as far as anyone can tell.
ENDPOINTS_NEXT = re.compile(r"^\|\s*server_id\s*\|")
PORT_IN_USE = re.compile(r"Socket '[^']*:(?P<port>\d+)' already in use")
LOAD_FAILURE = re.compile(r"failed to load '(?P<model>[^']+)' version (?P<version>\d+): (?P<reason>.*)")


def load_failure(line: str) -> str | None:
    """A one-line summary of a model that failed to load, from one line of Triton's log; None for other lines."""
    match = LOAD_FAILURE.search(line)
    if match is None:
        return None
    reason = match["reason"].split("\\n")[0].rstrip('"').strip()  # up to the traceback
    return f"model {match['model']!r} (version {match['version']}) failed to load: {reason}"


# Lines Triton 2.51 (nvidia-pytriton's CUDA-enabled build) logs as errors on any host without a GPU or CUDA driver,
# although serving on the CPU is unaffected (seen on every CPU start):
#   E1127 08:29:02.797449 11916 server.cc:241] "CudaDriverHelper has not been initialized."
#   E1127 08:29:10.918970 11916 ensemble_scheduler.cc:1468] "unable to create stream for vit: CUDA driver version is
#   insufficient for CUDA runtime version"
# and, on hosts with the CUDA runtime but no device, cudaGetDeviceCount / pinned-memory allocation failures.
HARMLESS_ON_CPU = re.compile(
    r"CudaDriverHelper has not been initialized|CUDA driver version is insufficient|cudaGetDeviceCount"
    r"|no CUDA-capable device|pinned (?:system )?memory", re.IGNORECASE)


# The start of each line Triton logs: severity (I, W, E), date, time, thread id: `E1127 08:29:02.797449 11916 `
LINE_PREFIX = re.compile(r"^(?P<severity>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")


def harmless_on_cpu(line: str) -> bool:
    """An error or warning of Triton's that means only "no GPU here" (`HARMLESS_ON_CPU`); never a load failure or
    a taken port, which stay errors."""
    prefix = LINE_PREFIX.match(line)
    return (prefix is not None and prefix["severity"] in "EW" and HARMLESS_ON_CPU.search(line) is not None
            and LOAD_FAILURE.search(line) is None and PORT_IN_USE.search(line) is None)


def message_of(line: str) -> str:
    """A log line without its severity, time and thread: `server.cc:241] "CudaDriverHelper ..."`."""
    return LINE_PREFIX.sub("", line, count=1)
