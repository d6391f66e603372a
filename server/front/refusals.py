"""What a front process answered itself instead of Triton, counted by code for serve's log.

The front answers a request itself when it refuses it (a body over the limit, broken framing, a request that would
crash Triton, the connection cap) or when Triton is not there to answer (restarting, shutting down, lost). Each
client is told why; Triton never sees these requests, so its log and metrics hold none of them. These counts are how
the operator sees them: serve asks every front process for them (`{"op": "refusals"}`, worker.py), keeps their running
totals (`FrontProcesses.answered`), logs a line (`hub-vit serve --refusal-report-s`) and puts them on its metrics port
(`hub_vit_front_answers_total`, metrics_front.py).

Codes: an HTTP status (`"413"`); a gRPC status by name (`"RESOURCE_EXHAUSTED"`), `"GOAWAY"` for a connection
ended because its client broke HTTP/2, or `"OVER_CAP"` for a gRPC connection reset at the connection cap (it has no
call to answer: a status cannot be sent before HTTP/2's handshake).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

# the gRPC status codes the front answers with, by name (grpc's own names: what clients print)
GRPC_CODES = {1: "CANCELLED", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 8: "RESOURCE_EXHAUSTED",
              12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE"}
GOAWAY = "GOAWAY"
OVER_CAP = "OVER_CAP"  # a gRPC connection reset as it opened: the front's connections were at --max-connections
PROTOCOLS = ("http", "grpc")


class Refusals:
    """One front's counts since they were last taken."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def count(self, code: int | str) -> None:
        self.counts[str(code)] += 1

    def count_grpc(self, code: int) -> None:
        self.counts[GRPC_CODES.get(code, str(code))] += 1

    def take(self) -> dict[str, int]:
        """The counts since the last take (code -> requests), and counting starts again."""
        taken, self.counts = dict(self.counts), Counter()
        return taken


def since(now: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """What running totals `now` added to the earlier totals `before` (`merged`'s shape, codes without any left out)."""
    added = {protocol: {code: count - before.get(protocol, {}).get(code, 0) for code, count in counts.items()}
             for protocol, counts in now.items()}
    return {protocol: {code: count for code, count in counts.items() if count > 0}
            for protocol, counts in added.items() if any(count > 0 for count in counts.values())}


def merged(reports: Iterable[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """Several processes' `{protocol: {code: count}}` summed, each protocol's codes in order, protocols without any
    left out."""
    total: dict[str, Counter[str]] = {protocol: Counter() for protocol in PROTOCOLS}
    for report in reports:
        for protocol, counts in report.items():
            total.setdefault(protocol, Counter()).update(counts)
    return {protocol: dict(sorted(counts.items())) for protocol, counts in total.items() if counts}
