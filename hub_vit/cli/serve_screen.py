"""`hub-vit serve`'s first screen: one line per phase with a spinner while the repository is built and the models
load and warm up, then a short summary (what is served, where, how to try it, where Triton's own log is).

Triton's log goes to a file (`serving.LogFile`); `--verbose` also shows it here, with the CUDA complaints a host
without a GPU always gets (`triton_log.harmless_on_cpu`) shown as what they are, not as errors.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from hub_vit.cli.app import console, err_console, fail
from hub_vit.cli.client_options import samples_of
from hub_vit.cli.explain import behind_proxy
from hub_vit.host import install_extra

if TYPE_CHECKING:
    from rich.status import Status

    from hub_vit.server.serving import LogFile


class Screen:
    """What `serve` shows while it builds, starts and serves. `verbose`: stream Triton's log here too."""

    def __init__(self, log_file: LogFile, *, verbose: bool) -> None:
        from hub_vit.server.runtime.triton_install import has_gpu

        self.log_file, self.verbose = log_file, verbose
        self.cpu_host = not has_gpu()  # CUDA complaints mean nothing only where there is no GPU
        self._status: Status | None = None

    def progress(self, message: str) -> None:
        """A spinner with `message` until `done` (none with --verbose: the log lines are the progress)."""
        self.done()
        if not self.verbose:
            self._status = console.status(message)
            self._status.start()

    def done(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def log(self, line: str) -> None:
        """One line of Triton's log (from the server's reader thread)."""
        from hub_vit.server.runtime.triton_log import harmless_on_cpu, message_of

        self.log_file.write(line)
        if not self.verbose:
            return
        if self.cpu_host and harmless_on_cpu(line):
            line = f"note (no GPU here, harmless): {message_of(line)}"
        # soft_wrap: one log line stays one line in a log file / journal (rich would cut it at 80 columns off a tty)
        err_console.print(line, markup=False, highlight=False, soft_wrap=True, emoji=False)

    def summary(self, server: Any, http_url: str, grpc_url: str, metrics_url: str, name: str, example: str,
                where: Any) -> None:
        self.done()
        console.print(f"[bold green]serving[/] model [bold]{name}[/]\n"
                      f"  device   {escape(where.description)} ({where.flavour} flavour)\n"
                      f"  HTTP     http://{http_url}/v2/models/{name}/infer\n"
                      f"  gRPC     {grpc_url}\n"
                      f"  metrics  {metrics_url}")
        # plain text on one line however narrow the terminal: pasted as a command (a path may hold [brackets])
        console.print(f"  try:     hub-vit classify --url {http_url} --model {name} {example}",
                      markup=False, highlight=False, soft_wrap=True)
        # the probe that also sees a dead stub needs the repository, which for `serve MODEL` is a temporary folder
        console.print(f"  health:  hub-vit health --url {http_url} --repository {shlex.quote(str(server.repository))}",
                      markup=False, highlight=False, soft_wrap=True)
        shown = "also shown above" if self.verbose else "--verbose shows it here"
        console.print(f"  log      {self.log_file.path} (tritonserver's own, kept if serve fails or a server dies; "
                      f"{shown})",
                      markup=False, highlight=False, soft_wrap=True)

    def stopped(self, message: str) -> None:
        self.done()
        console.print(message)


EXAMPLE_PLACEHOLDER = "IMAGE..."  # the `try:` line's image where no sample of the served model is known


def example_image(origin: str) -> str:
    """A sample image of the served model folder for the `try:` line (the shipped model has some, wherever pip put
    it), else a placeholder."""
    samples = samples_of(Path(origin))
    return shlex.quote(str(samples[0])) if samples else EXAMPLE_PLACEHOLDER


def start_demo(model: str | None, repository: bool, host: str, port: int, triton_url: str,
                triton_model: str, root_path: str | None = None) -> object:
    """The Gradio demo in a background thread, its labels taken from the server just started. It opens on the served
    model when it can run that model in-process (the default model, a folder, a registered name); an exported .onnx
    / .plan runs only on the server, so the page opens on the default model and says so next to Triton's labels.
    With --repository the demo cannot tell what is served. `root_path`: where a reverse proxy serves it
    (--demo-root-path)."""
    try:
        from hub_vit.demo.app import start_in_background
    except ImportError as exc:
        raise fail(f"--demo needs gradio ({exc}); install it with: {install_extra('demo')}") from exc
    from hub_vit.demo.models import served_choice

    served, served_name = None, None
    if not repository:
        try:
            served = served_choice(model)
        except ValueError:  # not loadable in-process after all: the page says the labels are another model's
            served = None
        if served is None:
            served_name = f"{Path(model).name!r}" if model else "the default model"
    try:
        demo_app = start_in_background(served, triton_url=triton_url, triton_model=triton_model,
                                       served_name=served_name, host=host, port=port, root_path=root_path)
    except ValueError as exc:  # no model to show in-process
        raise fail(f"--demo: {exc}", code=1) from exc
    if served is not None:
        shown = f"shows {served.key}, the served model"
    elif served_name is not None:
        shown = (f"shows in-process models only: {served_name} runs on the server alone, so Triton's labels are not "
                 "those of the maps")
    else:
        shown = "shows in-process models; pick the one the repository serves"
    console.print(f"[bold green]demo[/]     http://{host}:{port}{escape(behind_proxy(root_path))}  (attention rollout; "
                  f"{escape(shown)}; its 'Labels from' choice offers this server)", soft_wrap=True)
    return demo_app

