"""The public front of `hub-vit serve`: processes on the public HTTP and gRPC ports (SO_REUSEPORT) that refuse what
Triton 2.51 cannot take safely and relay the rest to Triton's private loopback ports.

`limits` (the bounds), `checks` (what both protocols refuse), `http_front` (HTTP/1.1 by llhttp), `grpc_front` (gRPC's
HTTP/2 passed through and watched frame by frame) with `grpc_calls` (one client connection's frames, calls and
messages, hpack) and `h2` (the frames they read and write), `worker` (one front process), `workers` (the processes,
from the serve process).
"""
