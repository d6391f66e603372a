"""The front's processes, from the serve process: started, steered, ended.

`FrontProcesses.start()` binds nothing itself: it checks that both public ports are free (a bind without
SO_REUSEPORT, which fails while anything listens there) and claims each port (`PortLock`, held while serve runs), so a
second `hub-vit serve` on the same port fails instead of silently sharing it; then it starts `limits.processes` worker
processes (worker.py), each binding both ports with SO_REUSEPORT. `front("http")` and
`front("grpc")` are the two `runtime.supervisor.Front`s the supervisor points at each new tritonserver and drains.

A worker that dies (the OOM killer, a crash in a parser) is replaced within `WATCH_INTERVAL_S`: the new one is told
the current upstream of each protocol, and drains at once if the front is draining; meanwhile the kernel hands the
port's new connections to the workers still listening (those queued on the dead worker's listener, not yet accepted,
are reset: SO_REUSEPORT moves none of them). Only a replacement that cannot start ends the front.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import threading
import time
from dataclasses import asdict
from typing import Any

from hub_vit.child_python import python_command
from hub_vit.claim import Claim, Claimed
from hub_vit.server.front.limits import FrontLimits
from hub_vit.server.front.refusals import merged

START_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0
WATCH_INTERVAL_S = 0.5


class PortLock:
    """An exclusive claim on a public port among hub-vit serve processes (`hub_vit.claim`, `hub-vit-front-<port>`): it
    is per network namespace, as the port itself is. OSError naming the holder's pid when another serve holds it."""

    def __init__(self, host: str, port: int) -> None:
        try:
            self.claim: Claim | None = Claim(f"hub-vit-front-{port}")
        except Claimed as exc:
            raise OSError(f"{host}:{port} is already served by another hub-vit serve (pid {exc.holder}); choose "
                          "another port") from None

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()
            self.claim = None


def check_free(host: str, port: int) -> None:
    """OSError when anything listens on host:port (a bind without SO_REUSEPORT fails then, whoever listens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError:
            raise OSError(f"{host}:{port} is already in use (another server?); choose another port") from None


class Worker:
    """One worker process and its control socket."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.control, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(python_command("-m", "hub_vit.server.front.worker", str(theirs.fileno())),
                                            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.buffer = b""
        self.event_loop = ""  # the worker's event loop's package, once ready
        self.asked = 0  # questions sent: each carries its number, and the worker's reply names it
        self.late_counts: list[dict[str, dict[str, int]]] = []  # counts in replies that came after their asker left
        self.send(settings)

    def send(self, message: dict[str, Any]) -> None:
        """One line, in one write (a signal handler may send while another thread waits for a reply)."""
        try:
            self.control.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the worker is gone: `reply` says so to whoever waits

    def question(self, message: dict[str, Any]) -> int:
        """Send `message` as a question (a reply comes): its number, for `reply`."""
        self.asked += 1
        self.send({**message, "id": self.asked})
        return self.asked

    def reply(self, deadline: float, question: int | None = None) -> dict[str, Any]:
        """The reply to `question` (None: the next line, as the reply to the settings). Replies to earlier questions
        are dropped: their asker stopped waiting (a worker whose loop was blocked past the deadline answers late), and
        read as this one's they would answer the wrong question."""
        while True:
            answer = self._line(deadline)
            if question is None or answer.get("id") == question:
                return answer
            if "refusals" in answer:  # the worker took these counts when it answered: kept for the next total
                self.late_counts.append(answer["refusals"])

    def _line(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.control], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                raise TimeoutError(f"front process {self.process.pid} did not answer")
            chunk = self.control.recv(65536)
            if not chunk:
                code = self.process.wait(5)
                raise OSError(f"front process {self.process.pid} ended (exit status {code})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def end(self) -> None:
        self.send({"op": "close"})
        self.control.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


class FrontProcesses:
    """The front: `limits.processes` worker processes on the public HTTP and gRPC ports."""

    def __init__(self, host: str, http_port: int, grpc_port: int, limits: FrontLimits = FrontLimits()) -> None:
        self.host, self.http_port, self.grpc_port, self.limits = host, http_port, grpc_port, limits
        self.workers: list[Worker] = []
        self.replaced = 0  # workers that died and were replaced
        self._locks: list[PortLock] = []
        self._lock = threading.Lock()  # one question at a time to the workers (replies come in order)
        # what a replacement worker is told: each protocol's last upstream command, and whether it drains
        self._upstreams: dict[str, dict[str, Any]] = {}
        self._draining: set[str] = set()
        self._answered: dict[str, dict[str, int]] = {}  # what the front answered itself since it started
        self._answered_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> FrontProcesses:
        """OSError naming the port when one is taken, or a worker could not start; nothing is left running then."""
        try:
            for port in (self.http_port, self.grpc_port):
                self._locks.append(PortLock(self.host, port))
                check_free(self.host, port)
            self.workers = [Worker(self._settings()) for _ in range(self.limits.processes)]
            deadline = time.monotonic() + START_TIMEOUT_S
            for worker in self.workers:
                _ready(worker, deadline)
        except BaseException:
            self.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="hub-vit-front-watch", daemon=True)
        self._watcher.start()
        return self

    def _settings(self) -> dict[str, Any]:
        return {"host": self.host, "http_port": self.http_port, "grpc_port": self.grpc_port,
                "limits": asdict(self.limits)}

    def _watch(self) -> None:
        """Replace each worker that died, until `close`."""
        while not self._stop.wait(WATCH_INTERVAL_S):
            with self._lock:
                for index, worker in enumerate(self.workers):
                    if worker.process.poll() is None or self._stop.is_set():
                        continue
                    worker.control.close()
                    try:
                        self.workers[index] = self._replacement()
                    except (OSError, TimeoutError):
                        continue  # tried again at the next look; the other workers keep serving
                    self.replaced += 1

    def _replacement(self) -> Worker:
        """A new worker, ready, told what the others were told."""
        worker = Worker(self._settings())
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            _ready(worker, deadline)
            for command in self._upstreams.values():
                worker.reply(deadline, worker.question(command))
            for protocol in self._draining:
                worker.send({"op": "drain", "protocol": protocol})
        except BaseException:
            worker.process.kill()
            worker.control.close()
            raise
        return worker

    def front(self, protocol: str) -> ProcessesFront:
        return ProcessesFront(self, protocol)

    def ask(self, message: dict[str, Any], timeout_s: float = REPLY_TIMEOUT_S) -> list[dict[str, Any]]:
        """`message` to every worker, and the replies of those that are alive (one that died meanwhile is replaced
        by the watcher, which tells the new one the current upstream)."""
        with self._lock:
            return self._ask(message, timeout_s)

    def _ask(self, message: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        """`ask`, under `_lock`."""
        if message.get("op") == "upstream":
            self._upstreams[message["protocol"]] = message
        questions = [(worker, worker.question(message)) for worker in self.workers]
        deadline = time.monotonic() + timeout_s
        replies = []
        for worker, question in questions:
            try:
                replies.append(worker.reply(deadline, question))
            except OSError:  # it ended, or did not answer in time (TimeoutError): not an answer
                continue
        return replies

    def tell(self, message: dict[str, Any]) -> None:
        """`message` to every worker, without waiting (no reply comes; a signal handler sends it, so no lock)."""
        if message.get("op") == "drain":
            self._draining.add(message["protocol"])
        for worker in list(self.workers):
            worker.send(message)

    def answered(self, timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, dict[str, int]]:
        """What the front answered itself since it started, summed over its processes: running totals `{protocol:
        {code: count}}` (refusals.py; what a worker had counted since it was last asked dies with it). Within
        `timeout_s` (a metrics scrape must not wait for a worker being replaced, which holds the workers for up to
        START_TIMEOUT_S): the workers that answered in time added, or, when the workers could not be asked at all,
        the totals as last known."""
        taken = []
        if self._lock.acquire(timeout=timeout_s):
            try:
                taken = [answer["refusals"] for answer in self._ask({"op": "refusals"}, timeout_s)
                         if "refusals" in answer]
                for worker in self.workers:  # and what came too late for the asks before
                    taken += worker.late_counts
                    worker.late_counts = []
            finally:
                self._lock.release()
        with self._answered_lock:
            self._answered = merged([self._answered, *taken])
            return {protocol: dict(counts) for protocol, counts in self._answered.items()}

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(START_TIMEOUT_S)
        workers, self.workers = self.workers, []
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.end()
        for lock in self._locks:
            lock.release()
        self._locks = []


def _ready(worker: Worker, deadline: float) -> None:
    answer = worker.reply(deadline)
    if "error" in answer:
        raise OSError(answer["error"])
    worker.event_loop = answer["event_loop"]


class ProcessesFront:
    """One protocol of the front (a `runtime.supervisor.Front`)."""

    def __init__(self, processes: FrontProcesses, protocol: str) -> None:
        self.processes, self.protocol = processes, protocol

    def upstream(self, host: str | None, port: int | None = None) -> None:
        """Relay to Triton's endpoint of this protocol at (host, port); None: refuse as restarting until set again."""
        self.processes.ask({"op": "upstream", "protocol": self.protocol, "host": host, "port": port})

    def drain(self) -> None:
        """New requests refused ("shutting down"), those taken still answered; returns at once (signal handlers)."""
        self.processes.tell({"op": "drain", "protocol": self.protocol})

    def drained(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until every request taken is answered; whether all were."""
        answers = self.processes.ask({"op": "drained", "protocol": self.protocol, "timeout_s": timeout_s},
                                     timeout_s + REPLY_TIMEOUT_S)
        return all(answer.get("answered") for answer in answers)
