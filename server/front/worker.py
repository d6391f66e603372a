"""One front process (`python -m hub_vit.server.front.worker FD`): the HTTP and the gRPC front on one event loop,
bound to the public ports that all front processes share, steered by the serve process over the socket FD.

The serve process sends JSON lines; the worker answers those marked with a reply, and each reply to an op carries the
op's `"id"` (a late reply to an op whose asker stopped waiting is then told from the next one's):
* first the settings `{"host", "http_port", "grpc_port", "limits"}` -> `{"ready": true, "event_loop": "uvloop"}` (the
  loop's package) or `{"error": "..."}`;
* `{"op": "upstream", "protocol": "http"|"grpc", "host", "port"}` (host null: no server) -> `{"ok": true}`;
* `{"op": "drain", "protocol"}`, no reply (a signal handler sends it: it must not wait);
* `{"op": "drained", "protocol", "timeout_s"}` -> `{"answered": bool}`;
* `{"op": "refusals"}` -> `{"refusals": {"http": {code: count}, "grpc": {...}}}`: what each front answered itself
  since the last ask (refusals.py);
* `{"op": "close"}`, no reply: the worker stops.

The end of the socket (the serve process is gone, even killed with SIGKILL) ends the worker: no front outlives serve.
Ctrl-C, SIGTERM and SIGHUP, which reach a whole process group, are ignored here: serve drains its front itself.

The event loop is uvloop's (libuv): the front's CPU per relayed HTTP request is mostly the loop and its socket calls,
and uvloop's cost less than asyncio's own (CHANGELOG.md; docs/serving.md, "The front's cost").
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import socket
import sys
from typing import Any

import uvloop

from hub_vit.server.front.grpc_front import GrpcFront
from hub_vit.server.front.http_front import HttpFront
from hub_vit.server.front.limits import FrontLimits


async def serve(control: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=control)

    def reply(message: dict[str, Any], question: dict[str, Any] | None = None) -> None:
        """`message` as one line; the reply to a `question` names its number (workers.Worker.reply)."""
        if question is not None:
            message = {**message, "id": question.get("id")}
        writer.write(json.dumps(message).encode() + b"\n")

    settings = json.loads(await reader.readline() or b"{}")
    limits = FrontLimits(**settings["limits"])
    raise_descriptor_limit(limits.descriptors)  # before the first connection
    fronts = {"http": HttpFront(limits), "grpc": GrpcFront(limits, settings["http_port"])}
    try:
        await fronts["http"].listen(settings["host"], settings["http_port"])
        await fronts["grpc"].listen(settings["host"], settings["grpc_port"])
    except OSError as err:
        reply({"error": str(err)})
        await writer.drain()
        return
    reply({"ready": True, "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0]})
    try:
        while line := await reader.readline():
            command = json.loads(line)
            op, front = command["op"], fronts.get(command.get("protocol", ""))
            if op == "upstream":
                await front.upstream(command["host"], command["port"])
                reply({"ok": True}, command)
            elif op == "drain":
                front.drain()
            elif op == "drained":
                reply({"answered": await front.drained(command["timeout_s"])}, command)
            elif op == "refusals":
                reply({"refusals": {protocol: each.refusals.take() for protocol, each in fronts.items()}}, command)
            elif op == "close":
                break
    finally:
        for front in fronts.values():
            await front.close()


def raise_descriptor_limit(wanted: int) -> None:
    """Raise this process's soft limit on open files (RLIMIT_NOFILE) towards `wanted`, as far as its hard limit
    allows. A shell's soft limit is often 1,024: the OS would refuse the front's connections, health probes included,
    long before `max_connections`. (serve warns at its start when the hard limit is short.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main() -> None:
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_IGN)
    uvloop.run(serve(socket.socket(fileno=int(sys.argv[1]))))


if __name__ == "__main__":
    main()
