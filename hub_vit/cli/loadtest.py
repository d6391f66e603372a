"""`hub-vit loadtest`: a closed-loop load test of a running server (throughput, latency percentiles, the server's
batching), reported and optionally saved as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from hub_vit.cli import client_options as flags
from hub_vit.cli.app import app, console, err_console, fail
from hub_vit.cli.client_options import client_settings, request_failure, sample_images
from hub_vit.cli.explain import listed_images
from hub_vit.cli.path_option import given_path
from hub_vit.host import missing_extra
from hub_vit.image_formats import NAMES


@app.command()
def loadtest(
    images: list[Path] = typer.Argument(None, help=f"Image files ({NAMES}), or folders of them (subfolders too; "
                                        "hidden files left out), to cycle through (default: the shipped samples).",
                                        exists=True),
    url: flags.Url = None,
    grpc: flags.Grpc = False,
    model: str = typer.Option("vit", help="Served model name."),
    concurrency: int = typer.Option(4, help="Requests in flight at once."),
    duration: float = typer.Option(10.0, help="Seconds to run (ignored with --requests)."),
    requests: int = typer.Option(None, help="Stop after this many requests."),
    batch: int = typer.Option(1, help="Images per request."),
    json_out: Path = typer.Option(None, "--json", help="Also write the result as JSON here.", parser=given_path),
    allow_errors: bool = typer.Option(False, "--allow-errors",
                                      help="Exit 0 even when requests failed (e.g. an overload test that expects "
                                           "rejections); by default any failed request makes the exit code 1."),
    queue_timeout_ms: flags.RequestQueueTimeoutMs = None,
    timeout: flags.ClientTimeout = flags.DEFAULT_CLIENT_TIMEOUT_S,
) -> None:
    """Closed-loop load test: throughput, p50/p90/p99 latency and server-side batching efficiency."""
    from hub_vit.server.client.errors import empty_reply, unknown_model
    from hub_vit.server.client.loadtest import load_test

    payloads = listed_images(images, leave_out=None) if images else sample_images()
    url, protocol, timeout_s, wait_s = client_settings(url, grpc, queue_timeout_ms, timeout, model)
    if json_out is not None:  # checked first: the run's numbers must not be lost at the end
        _check_writable(json_out)
    try:
        result = load_test(url, payloads, protocol=protocol, model=model, concurrency=concurrency,
                           duration_s=duration, requests=requests, batch=batch, queue_timeout_s=timeout_s,
                           timeout_s=wait_s)
    except ValueError as err:  # a bad setting (--batch above the model's limit, ...), unless the server's reply
        if not empty_reply(err):
            raise fail(str(err)) from None
        raise fail(request_failure(protocol, url, model, err), code=1) from None
    except Exception as err:  # connection refused, unknown model, ...
        if missing_extra(err) is not None:  # tritonclient without this protocol: the install, not the server
            raise
        raise fail(request_failure(protocol, url, model, err), code=2 if unknown_model(err) else 1) from None
    if not result.interrupted and not result.requests and not result.errors:  # nothing was sent: no numbers to show
        raise fail(f"no request was sent: the --duration of {duration:g} s ended before the first one; give a "
                   "longer --duration", code=1)
    _report(result, protocol)
    if json_out is not None:
        try:
            json_out.write_text(result.to_json() + "\n")
        except OSError as err:
            raise fail(f"cannot write --json {str(json_out)!r}: {err}", code=1) from None
    if result.interrupted:  # reported and saved, but not a completed run: the shell's code for Ctrl-C
        raise typer.Exit(130)
    if result.errors and not allow_errors:  # a CI job must see a broken run (--allow-errors for overload tests)
        raise fail(f"{result.errors} of {result.errors + result.requests} requests failed (reasons above; "
                   "--allow-errors exits 0 anyway)", code=1)


def _report(result: Any, protocol: str) -> None:
    """The run's numbers: requests, throughput, latency, the load generator's own cost, the server's batching."""
    lat = result.latency_ms
    if result.interrupted:
        err_console.print("[yellow]interrupted (Ctrl-C):[/] the numbers cover the run until then")
    # the throughput counts the answered requests; the failed ones are named below, by reason
    unreached = (f" ({result.unreached} of them reached no server, each worker trying again every 50 ms)"
                 if result.unreached else "")
    console.print(f"{result.requests + result.errors} requests: [bold]{result.requests}[/] answered, {result.errors} "
                  f"failed{unreached}, in {result.seconds:.1f} s, "
                  f"concurrency {result.concurrency}, {protocol}: [bold]{result.throughput_rps:.1f} req/s[/], "
                  f"{result.images_per_s:.1f} images/s")
    console.print(f"latency ms  p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  p99 {lat['p99']:.2f}  "
                  f"max {lat['max']:.2f}")
    console.print(f"load generator (this process): {result.load_generator_cpu_ms_per_request:.3f} ms CPU per "
                  f"request, {result.load_generator_cores:.2f} cores busy")
    if result.load_generator_saturated:
        err_console.print("[yellow]the load generator kept about a whole core busy:[/] these numbers may be its "
                          "limit, not the server's; run several load generators, or run it on another host",
                          soft_wrap=True)
    table = Table(title="server batching (Triton statistics over the run)")
    for column in ("model", "inferences", "executions", "images / execution"):
        # fold, never '…': a narrow terminal wraps a step's name or a header instead of cutting it
        table.add_column(column, justify="left" if column == "model" else "right", overflow="fold")
    for step, numbers in result.batching.items():
        table.add_row(step, str(numbers["inferences"]), str(numbers["executions"]),
                      f"{numbers['images_per_execution']:.2f}")
    if result.statistics_error is None:
        console.print(table)
    else:  # e.g. the server went away during the run: the answers it gave are still reported
        err_console.print(f"[yellow]no server batching statistics:[/] {escape(result.statistics_error)}",
                          soft_wrap=True)
    for message, count in result.error_messages.items():
        err_console.print(f"[red]{count} x[/] {escape(message)}", soft_wrap=True, emoji=False)


def _check_writable(path: Path) -> None:
    """`loadtest --json`: a file that can be written, found out before the run, not after it. Its folder must exist
    (a typo in a path should not create folders), and the file is opened for appending, without changing it."""
    if path.is_dir():
        raise fail(f"--json {str(path)!r} is a folder; give a file name, e.g. {str(path / 'loadtest.json')!r}")
    if not path.parent.is_dir():
        what = "is a file" if path.parent.exists() else "does not exist"
        raise fail(f"--json {str(path)!r}: its folder {str(path.parent)!r} {what}")
    target = path.resolve()  # a symbolic link is probed at its target, and left in place
    existed = target.exists()
    try:
        with target.open("a", encoding="utf-8"):
            pass
    except OSError as err:
        raise fail(f"cannot write --json {str(path)!r}: {err.strerror or err}") from None
    if not existed:
        target.unlink()  # only the run's result is ever left there

