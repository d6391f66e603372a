"""The load generator's own cost, side by side: `run_load` as it is against `run_load` as it was at commit PREVIOUS.

On a machine where the load generator shares the server's cores (this 2-core sandbox), every millisecond of CPU the
client spends per request is one the server does not get, so a cheaper load generator measures a faster server. The
current one builds each request body once (as perf_analyzer does) and asks for uncompressed answers; the previous one
built and parsed every request with `AsyncClassifier.classify`, over aiohttp's default "Accept-Encoding: gzip".

The previous `server/client.py` and `server/loadtest.py` are loaded from PREVIOUS (git show) under other module names,
so both versions run in this process against the same server (the default model's repository, one image per request,
concurrency 16), alternately, ROUNDS times per protocol. Printed and saved: images/s, the load generator's CPU per
request (this process) and the server's CPU per image (Triton with its stubs), and the median ratio current / previous.

    .venv/bin/python bench/ab_load_generator.py                 # 6 s per measurement, 3 rounds
    .venv/bin/python bench/ab_load_generator.py --reverse       # the current version first in each round
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from bench_serve import CASES, RESULTS, process_group_cpu_s
from run_info import check_writable, file_at, run_info, side_by_side_parser, write_json

from hub_vit.server.client import loadtest
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository
from hub_vit.server.runtime.launcher import TritonServer, free_port

PREVIOUS = "c6cae76"  # the last commit whose run_load built and parsed every request
CONCURRENCY = 16


def _module(name: str, source: str, folder: Path) -> ModuleType:
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


def previous_load_test(folder: Path) -> ModuleType:
    """PREVIOUS's loadtest module, importing PREVIOUS's client (not today's) under its own name."""
    _module("previous_client", file_at(PREVIOUS, "server/client.py"), folder)
    source = file_at(PREVIOUS, "server/loadtest.py").replace("from hub_vit.server.client import",
                                                          "from previous_client import")
    return _module("previous_loadtest", source, folder)


def measure(module: ModuleType, url: str, protocol: str, payloads: list[bytes], seconds: float,
            server_pgid: int) -> dict[str, float]:
    server_cpu, client_cpu = process_group_cpu_s(server_pgid), time.process_time()
    result = module.load_test(url, payloads, protocol=protocol, concurrency=CONCURRENCY, duration_s=seconds,
                              warmup=4)
    if result.errors:
        raise SystemExit(f"{module.__name__} {protocol}: {result.errors} errors: {result.error_messages}")
    return {"images_per_s": result.images_per_s,
            "client_cpu_ms_per_request": (time.process_time() - client_cpu) * 1000 / result.requests,
            "server_cpu_ms_per_image": (process_group_cpu_s(server_pgid) - server_cpu) * 1000 / result.requests}


def run(seconds: float, rounds: int, reverse: bool, folder: Path) -> dict[str, Any]:
    versions = [("previous", previous_load_test(folder)), ("current", loadtest)]
    if reverse:
        versions.reverse()
    source, payloads = CASES["digits"]()
    repository = write_repository(source, folder / "repository", ServingOptions())
    rows: dict[str, dict[str, list[dict[str, float]]]] = {}
    with TritonServer(repository, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()) as server:
        for _ in range(rounds):
            for protocol in ("http", "grpc"):
                url = server.http_url if protocol == "http" else server.grpc_url
                for name, module in versions:
                    rows.setdefault(protocol, {}).setdefault(name, []).append(
                        measure(module, url, protocol, payloads, seconds, server.process.pid))
    summary = {}
    for protocol, row in rows.items():
        rate = {name: np.array([m["images_per_s"] for m in row[name]]) for name in row}
        ratio = float(np.median(rate["current"] / rate["previous"]))
        med = {name: {key: float(np.median([m[key] for m in row[name]])) for key in row[name][0]} for name in row}
        summary[protocol] = {"current_over_previous_median": ratio, "medians": med, "measurements": row}
        print(f"{protocol} c{CONCURRENCY}: current {med['current']['images_per_s']:.0f} images/s (client "
              f"{med['current']['client_cpu_ms_per_request']:.3f} ms/request, server "
              f"{med['current']['server_cpu_ms_per_image']:.3f} ms/image), previous "
              f"{med['previous']['images_per_s']:.0f} ({med['previous']['client_cpu_ms_per_request']:.3f}, "
              f"{med['previous']['server_cpu_ms_per_image']:.3f}); current/previous per round median {ratio:.2f} "
              f"[{min(rate['current'] / rate['previous']):.2f}..{max(rate['current'] / rate['previous']):.2f}]",
              flush=True)
    return summary


def main() -> None:
    args = side_by_side_parser(__doc__, seconds=6.0, reverse_help="measure the current version first in each round",
                               out=RESULTS / "ab_load_generator.json").parse_args()
    check_writable(args.out.parent)
    file_at(PREVIOUS, "server/loadtest.py")  # before the run: git and the commit are there
    with tempfile.TemporaryDirectory(prefix="ab-load-generator-") as tmp:
        report = {"run": run_info(args, packages=("nvidia-pytriton", "tritonclient", "aiohttp", "grpcio")),
                  "previous_commit": PREVIOUS, "concurrency": CONCURRENCY, "model": "digits",
                  "protocols": run(args.seconds, args.rounds, args.reverse, Path(tmp))}
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
