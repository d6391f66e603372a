"""Keep a local tritonserver serving: replace it when it, or one of its Python-backend stubs, dies.

Triton 2.51 has request-triggered crashes that no flag turns off (docs/serving.md, "Limits and security"): one HTTP or
gRPC request can kill the process. A restart budget counted over all deaths ("at most N restarts a minute") let a
client end the service by sending N+1 such requests, and a second one sent while the new server was loading ended it
at once. The rule here tells the two kinds of death apart by what the server had done before it died:

* a server that opened its HTTP or gRPC endpoint (`TritonServer.reachable`, from its log: clients could reach it)
  and then died, or lost a stub, may have been killed by a request: it is always replaced, after a backoff
  (`RestartPolicy.backoff_s`, doubling from `first_backoff_s` up to `max_backoff_s`, back to the first after
  `stable_s` of serving), so no sequence of requests ends the service, and a crash loop costs a bounded share of the
  host;
* a server that died, or failed to become ready, before it ever answered (a model that cannot load, a port taken, a
  broken install) was not killed by a client: `max_failed_starts` such starts in a row end `serve` with the reason.

Readiness is taken from the new server itself (`TritonServer.wait_ready`: its own id at `GET /v2`, every endpoint up).

With gates (`Front`: the HTTP and gRPC gates `hub-vit serve` puts before Triton, `hub_vit.server.front`), each gate
relays to each server once it is ready and answers "restarting" in between; a stop first drains the gates (new requests
refused at once, those in flight answered, pooled connections closed), then sends Triton its SIGTERM, so Triton's own
drain is not held open by clients' connections. `stop_on_signals` turns Ctrl-C / SIGTERM / SIGHUP into that drain (a
second one stops at once).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from hub_vit.server.runtime.launcher import PortTaken, ServerError, TritonServer


@dataclass(frozen=True)
class RestartPolicy:
    """When to replace a dead server. `max_failed_starts=0`: never restart, the first death is an error."""

    max_failed_starts: int = 3
    first_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    stable_s: float = 60.0  # serving this long since the last restart resets the backoff
    start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_failed_starts, int) or self.max_failed_starts < 0:
            raise ValueError(f"max_failed_starts must be an integer >= 0, got {self.max_failed_starts!r}")
        if not 0 < self.first_backoff_s <= self.max_backoff_s:
            raise ValueError(f"backoff must satisfy 0 < first_backoff_s <= max_backoff_s, got {self.first_backoff_s} "
                             f"and {self.max_backoff_s}")

    def backoff_s(self, restarts_in_a_row: int) -> float:
        """The wait before restart number `restarts_in_a_row` (1, 2, ...) since the server last served stably."""
        return min(self.first_backoff_s * 2 ** max(restarts_in_a_row - 1, 0), self.max_backoff_s)


class Front(Protocol):
    """A public port before the server (the HTTP and gRPC gates, `hub_vit.server.front`): it relays to the server's
    endpoint of its `protocol` ("http" or "grpc") once pointed there, and is drained before the server stops."""

    protocol: str

    def upstream(self, host: str | None, port: int | None = None) -> None: ...

    def drain(self) -> None: ...

    def drained(self, timeout_s: float) -> bool: ...


class GaveUp(ServerError):
    """The server died and the policy allows no further restart (`--max-restarts 0`, or starts that kept failing)."""


MAX_PORT_PICKS = 5  # new picks of private ports in one run, each after a picked one was taken (a rare collision)


class Supervisor:
    """Runs `new_server()`'s servers one after another until `stop` is set. `serving(server, restarted)` is called
    each time a server becomes ready; `event(line)` reports each death and restart. A signal handler calls `terminate`
    or `kill`: they reach whichever server is current, also one still starting."""

    def __init__(self, new_server: Callable[[], TritonServer], policy: RestartPolicy, stop: threading.Event, *,
                 serving: Callable[[TritonServer, bool], None] = lambda server, restarted: None,
                 event: Callable[[str], None] = lambda line: None, gates: tuple[Front, ...] = ()) -> None:
        self.new_server, self.policy, self.stop, self.gates = new_server, policy, stop, gates
        self.serving, self.event = serving, event
        self.server = new_server()  # raises ServerError for a bad repository or a taken port, before anything runs
        self.restarts = 0  # servers replaced since `run` began
        self.failure: str | None = None  # the last death, None once a server stopped because `stop` was set
        self.served = False  # whether a server became ready since `run` began
        # whether the server `run` returned was serving when `stop` was set: only then is its exit status its drain's
        # (one stopped while loading or restarting dies of the signal)
        self.stopped_serving = False
        self.answered_all = True  # whether, at the stop, the gates answered every request they took within the timeout

    def terminate(self) -> None:
        """Stop gracefully: returns at once (a signal handler calls it); the drain runs in a thread."""
        self.stop.set()
        if not self.gates:
            self.server.terminate()
            return
        for gate in self.gates:
            gate.drain()
        threading.Thread(target=self._drain_then_terminate, name="hub-vit-drain", daemon=True).start()

    def _drain_then_terminate(self) -> None:
        deadline = time.monotonic() + self.server.exit_timeout_s
        answered = [gate.drained(max(deadline - time.monotonic(), 0.0)) for gate in self.gates]  # every gate waited for
        self.answered_all = all(answered)
        self.server.terminate()

    def kill(self) -> None:
        self.stop.set()
        self.server.kill()

    def run(self) -> TritonServer:
        """Serve until `stop` is set; returns the last server, stopped. A first start that fails before the server
        answered is raised as is (a model that cannot load); a later death the policy does not cover raises `GaveUp`.
        A start that finds a port taken which the server's caller picked itself (`picked_ports`) is no failure: the
        next server from `new_server` has other ports."""
        restarted = False
        in_a_row, failed_starts, picks = 0, 0, 0
        while True:
            try:
                self.server.start(self.policy.start_timeout_s)
            except ServerError as err:
                if self.stop.is_set():
                    return self.server
                if isinstance(err, PortTaken) and err.setting in self.server.picked_ports and picks < MAX_PORT_PICKS:
                    picks += 1  # a port picked free was taken before Triton bound it: not the server's failure
                    self.event(f"tritonserver's private {err.setting} {err.port} was taken by another process before "
                               "tritonserver bound it; starting it on other free ports")
                    self.server = self.new_server()  # `terminate` reaches it from here on
                    if self.stop.is_set():
                        return self.server
                    continue
                if not restarted and not self.server.reachable:
                    raise
                if isinstance(err, PortTaken) and restarted:  # a port the user chose: its flag, and why it was free
                    flag = "--" + err.setting.replace("_", "-")
                    err = ServerError(f"{flag} {err.port} was taken by another process while tritonserver restarted "
                                      f"(the port is tritonserver's own, free between its runs); free it, or start "
                                      f"serve with another {flag}")
                self.failure = str(err).split("\n")[0]
                if not self.server.reachable and self.policy.max_failed_starts:  # never answered: not a client's doing
                    failed_starts += 1
                    if failed_starts >= self.policy.max_failed_starts:
                        raise self._give_up(f"{err}\nnot restarting: {failed_starts} starts in a row failed before the "
                                            f"server answered (--max-restarts {self.policy.max_failed_starts})") \
                            from None
            else:
                failed_starts = 0
                self.served = True
                served_since = time.monotonic()
                self._point_gates(self.server)
                self.serving(self.server, restarted)
                self.failure = self.server.watch(self.stop)
                if self.failure is None or self.policy.max_failed_starts:  # else `_give_up` below says so
                    self._point_gates(None)
                if self.failure is None:
                    self.stopped_serving = True
                    return self.server
                if time.monotonic() - served_since >= self.policy.stable_s:
                    in_a_row = 0
            if not self.policy.max_failed_starts:
                raise self._give_up(f"{self.failure}; not restarting (--max-restarts 0); log tail:\n"
                                    f"{self.server.tail()}")
            in_a_row += 1
            wait_s = self.policy.backoff_s(in_a_row)
            self.event(f"{self.failure}; restarting tritonserver in {wait_s:.1f} s (restart {self.restarts + 1}); "
                       "requests in flight are lost")
            self._replace(wait_s)
            restarted = True
            if self.stop.is_set():
                return self.server

    def _give_up(self, message: str) -> GaveUp:
        """The end of serving for good: the gates answer "shutting down" from now on (told "restarting", clients
        waited for a server that was not coming back) while serve exits."""
        for gate in self.gates:
            gate.drain()
        return GaveUp(message)

    def _point_gates(self, server: TritonServer | None) -> None:
        """Each gate relays to `server`'s endpoint of its protocol; None: to no server ("restarting")."""
        for gate in self.gates:
            gate.upstream(*(server.endpoint(gate.protocol) if server is not None else (None,)))

    def _replace(self, wait_s: float) -> None:
        """Stop the dead server (and what is left of it), wait `wait_s` unless stopped, make the next one current."""
        self.server.kill()
        self.server.stop()
        if self.stop.wait(wait_s):
            return
        self.restarts += 1
        self.server = self.new_server()  # `terminate` reaches it from here on, even before it has a process


DUPLICATE_SIGNAL_S = 1.0  # a repeat of the stopping signal within this is the same request (see `stop_on_signals`)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal closed or ssh dropped


@contextmanager
def stop_on_signals(supervisor: Supervisor, say: Callable[[str], None]) -> Iterator[threading.Event]:
    """While inside: the first Ctrl-C / SIGTERM / SIGHUP drains (`Supervisor.terminate`), a second one kills
    (`Supervisor.kill`); `say(line)` tells the user which. Yields the event set once a stop was forced. The previous
    handlers are restored on leaving. Must be entered in the main thread (Python delivers signals there)."""
    forced = threading.Event()
    first: list[tuple[int, float]] = []  # (signal, monotonic time) of the signal that started the drain

    def on_signal(signum: int, _frame: object) -> None:
        now = time.monotonic()
        if first and first[0][0] == signum and now - first[0][1] < DUPLICATE_SIGNAL_S:
            # the same signal twice at once is one stop request: `kill -TERM -- -PGID` (systemd's default too) reaches
            # us, and GNU make (`make serve`) forwards the SIGTERM it got to its child, so serve sees it twice
            return
        name = signal.Signals(signum).name
        if supervisor.stop.is_set():  # a second Ctrl-C / SIGTERM: the user will not wait for the drain
            say(f"{name} again: stopping now, in-flight requests are dropped")
            forced.set()
            supervisor.kill()
            return
        # the way to stop at once is told to whoever pressed Ctrl-C; a SIGTERM or SIGHUP comes from a program (make,
        # systemd, a closed terminal), where "press Ctrl-C" means nothing
        hint = "; press Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
        say(f"{name}: draining in-flight requests (up to {supervisor.server.exit_timeout_s} s), then exiting{hint}")
        first.append((signum, now))
        supervisor.terminate()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield forced
    finally:
        for sig, handler in previous.items():  # None: installed from C, not restorable; the default is closest
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
