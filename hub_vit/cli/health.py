"""`hub-vit health`: a health probe for a running Triton server (the Dockerfile's HEALTHCHECK, a Kubernetes probe)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from hub_vit.cli.app import app, console, err_console, fail
from hub_vit.cli.path_option import given_path
from hub_vit.ports import HTTP_PORT, LOOPBACK


@app.command()
def health(
    url: str = typer.Option(f"{LOOPBACK}:{HTTP_PORT}", help="The server's HTTP address (host:port)."),
    repository: Path = typer.Option(None, help="The model repository the server was started with: also check that "
                                               "every Python-backend model instance has a live stub (run this on "
                                               "the server's host, inside its container).", parser=given_path),
    timeout: float = typer.Option(3.0, help="Seconds to wait for the server's answers (at most 3600)."),
    wait: float = typer.Option(0.0, help="Ask again every 0.5 s until healthy, for up to this many seconds (a script "
                                         "waiting for a server it has just started; at most 3600). 0: ask once."),
) -> None:
    """Exit 0 when the server is ready and (with --repository) none of its Python-backend stubs has died; else print
    what is wrong and exit 1. Triton keeps answering ready after a stub died, while failing every request routed to
    that model instance; this sees it. Sends no inference request, so a busy server is not reported unhealthy."""
    from hub_vit.server.runtime.health import check_timeout, check_wait, http_base, wait_until_healthy

    try:  # before anything is asked: nan, inf or 1e300 would otherwise end in a socket's error, not naming the flag
        check_timeout(timeout, name="--timeout")
        check_wait(wait, name="--wait")
    except ValueError as err:
        raise fail(str(err)) from None
    try:
        http_base(url)
    except ValueError as err:  # a mistyped or gRPC address: the user's mistake, named with its flag
        raise fail(f"--url: {err}") from None
    try:
        report = wait_until_healthy(url, repository, timeout_s=timeout, wait_s=wait)
    except ValueError as err:  # not a repository, an unreadable config, a gRPC address
        raise fail(str(err)) from None
    if not report.healthy:
        for problem in report.problems():
            err_console.print(f"[bold red]unhealthy:[/] {escape(problem)}", soft_wrap=True, emoji=False)
        raise typer.Exit(1)
    stubs = (f"; {len(report.alive)} of {len(report.expected)} Python-backend stubs alive "
             f"({', '.join(sorted(report.alive)) or 'none expected'})" if report.stubs_checked
             else "; stubs not checked (give --repository, on the server's host)")
    console.print(f"healthy: {escape(report.url)} is ready{escape(stubs)}", soft_wrap=True)
