"""One `hub-vit serve` run as the command line sees it: the model's repository built (or the given one taken), the
server run by `hub_vit.server.serving`, and each phase shown on the first screen (`serve_screen.py`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from hub_vit.cli.app import CANNOT_NOW, console, err_console, fail
from hub_vit.cli.serve_screen import EXAMPLE_PLACEHOLDER, Screen, start_demo
from hub_vit.cli.serving_options import model_reference, print_cpu_variant

BUILD_STATUS = "exporting the model and writing the repository"
VARIANTS_NOTE = (" (a compute-heavy model's first start on this host also builds, verifies and times its CPU variants: "
                 "minutes for a ViT-S; later starts reuse them)")


def build_status(builds_variants: bool) -> str:
    """What serve shows while it writes the repository: the one long wait a first start can have says why, so that
    minutes of it do not look like a hang (the CPU flavour's variants of a compute-bound model, `cpu_variant.place`)."""
    return BUILD_STATUS + (VARIANTS_NOTE if builds_variants else "")


def refusal_line(counts: dict[str, dict[str, int]], seconds: float) -> str:
    """serve's line for what the front answered itself (`{protocol: {code: count}}`, server/front/refusals.py)."""
    total = sum(sum(codes.values()) for codes in counts.values())
    parts = "; ".join(f"{'HTTP' if protocol == 'http' else 'gRPC'} "
                      + ", ".join(f"{code} x{count:,}" for code, count in codes.items())
                      for protocol, codes in counts.items())
    return (f"the front answered {total:,} request{'s' if total != 1 else ''} itself in the last {seconds:.0f} s "
            f"({parts}): refused, or no server to relay them to; each client was told why")


def stop_note(code: int, answered_all: bool, exit_timeout: int) -> tuple[bool, str]:
    """(whether it is a warning, the line) for a tritonserver that ended with `code` (not 0) after a requested stop;
    `answered_all`: the front had every request it took answered before Triton got its SIGTERM."""
    from hub_vit.server.runtime.processes import exit_description

    ended = f"tritonserver {exit_description(code)} while stopping"
    if not answered_all:
        return True, (f"{ended}: requests still running when --exit-timeout {exit_timeout} s ran out got no answer")
    if code < 0:  # a signal after the last answer: Triton's own teardown crashed, not its timeout
        return False, f"{ended}, after every request had been answered (a crash in its own teardown; nothing was lost)"
    return False, (f"{ended}: it did not unload its models within --exit-timeout {exit_timeout} s (every request had "
                   "been answered; a longer --exit-timeout lets it finish)")


class ServeRun:
    """What is served where, and how the run is shown. `demo_port` None: no demo; `demo_root_path`: where a reverse
    proxy serves the demo (--demo-root-path)."""

    def __init__(self, endpoints: Any, name: str, model: str | None, where: Any, demo_port: int | None,
                 exit_timeout: int, max_restarts: int, verbose: bool, limits: Any,
                 demo_root_path: str | None = None, refusal_report_s: int = 60) -> None:
        self.endpoints, self.name, self.model, self.where = endpoints, name, model, where
        self.demo_port, self.demo_root_path = demo_port, demo_root_path
        self.exit_timeout, self.max_restarts = exit_timeout, max_restarts
        self.verbose, self.limits, self.refusal_report_s = verbose, limits, refusal_report_s
        self.example = EXAMPLE_PLACEHOLDER

    def build_and_serve(self, options_for: Callable[[Any], Any], device_defaulted: bool, flavour: str | None) -> None:
        """Build the model's repository in a temporary folder (removed at the end) by a child process, then serve it.
        This process never loads the model (`serve_build`)."""
        from hub_vit.server.runtime.launcher import ServerError
        from hub_vit.server.serving import remove_workdir, temporary_workdir

        opts = options_for(self.where)  # checked before the model is looked at
        ref = model_reference(self.model)
        origin = ref.target  # an exported file's resolved path
        if ref.kind == "engine":  # the local tritonserver has the Python backend only
            raise fail(f"{escape(origin)} is a TensorRT engine, which the tritonserver `hub-vit serve` runs (Python "
                       "backend only) cannot load; serve it from the GPU container: hub-vit repository OUT --model "
                       f"{escape(origin)} --flavour gpu --gpu-backend tensorrt, then the Dockerfile's image "
                       "(docs/serving.md, 'Dockerfile')")
        if device_defaulted and self.where.device == "cuda" and ref.kind == "onnx":  # an exported file: ORT
            from hub_vit.server.runtime.device import choose_device

            self.where = choose_device("cpu", flavour)
            opts = options_for(self.where)
            err_console.print(f"note: {escape(origin)} is an exported file, which the torch flavour cannot run; "
                              "serving it with ONNX Runtime on the CPU", soft_wrap=True)
        try:
            workdir = temporary_workdir()
        except ServerError as err:  # no usable temporary folder
            raise fail(str(err)) from None
        try:
            repository = self._build(opts, workdir, ref)
            print_cpu_variant(repository)
            self.serve(repository, built=True)
        finally:
            remove_workdir(workdir)

    def _build(self, opts: Any, workdir: Path, ref: Any) -> Path:
        """The repository written into `workdir` by the child from the located model `ref`, each phase shown here."""
        from hub_vit.cli.serve_build import BuildFailed, BuildRequest, Refused, repository_build

        try:
            with repository_build(BuildRequest(self.model, opts, workdir, ref)) as child:
                loaded = child.loaded()  # no spinner here: the child's own download bar may be drawn meanwhile
                if isinstance(loaded, Refused):
                    raise fail(loaded.message, code=loaded.code)
                self.example = loaded.example
                console.print(f"building the Triton repository for [bold]{escape(loaded.name)}[/] "
                              f"({escape(loaded.origin)})", soft_wrap=True)
                with console.status(build_status(loaded.builds_variants)):
                    built = child.result()
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM: the child has removed what it wrote
            console.print("stopped while building the repository")
            raise
        except BuildFailed as err:
            raise fail(f"building the repository failed: the process building it {err}", code=1) from None
        if isinstance(built, Refused):
            raise fail(built.message, code=built.code)
        return built.repository

    def serve(self, repository: Path, *, built: bool) -> None:
        """Serve `repository` until stopped; `built`: serve built it from MODEL (the demo can show that model)."""
        from hub_vit.server.runtime.launcher import ServerError
        from hub_vit.server.serving import CannotStart, LogFile, ServeHooks, serve_repository

        self._check_shared_memory(repository)
        self._check_descriptors()
        log_file = LogFile(self.endpoints.http_port)
        screen = Screen(log_file, verbose=self.verbose)
        demo_apps: list[Any] = []  # the demo, once the first server serves
        replaced: list[str] = []  # why each server that died was replaced

        def event(line: str) -> None:  # also marked in Triton's log, between the dead server's lines and the next's
            replaced.append(line)
            log_file.write(f"hub-vit serve: {line}")
            self._event(line)

        hooks = ServeHooks(serving=lambda server, restarted: self._serving(screen, server, restarted, built,
                                                                            demo_apps),
                           event=event, say=self._say, log=screen.log, refused=self._refused)
        screen.progress("starting tritonserver: loading the models and warming them up")
        keep_log = True  # after a failure its log may explain: Triton's, or an unforeseen one
        try:
            report = serve_repository(repository, self.endpoints, hooks, exit_timeout_s=self.exit_timeout,
                                      max_restarts=self.max_restarts, limits=self.limits,
                                      refusal_report_s=self.refusal_report_s)
            keep_log = bool(replaced)  # the log of a server that died explains why, after a clean stop too
        except CannotStart as err:
            keep_log = False  # nothing ran
            raise fail(str(err)) from None
        except ServerError as err:
            raise fail(f"{err}\ntritonserver's whole log: {log_file.path}", code=1) from None
        except typer.Exit:  # serve's own refusal once Triton ran (the named model is not served): its message is whole
            keep_log = False
            raise
        finally:
            screen.done()
            for app_ in demo_apps:
                app_.close()
            log_file.close(remove=not keep_log)
        if replaced:
            count = f"{len(replaced)} server{'s' if len(replaced) > 1 else ''}"
            console.print(f"tritonserver's log, with the {count} that died and were replaced, is kept: {log_file.path}",
                          markup=False, highlight=False, soft_wrap=True)
        if not report.ready:  # interrupted while still loading: a normal exit
            console.print("stopped before the server was ready")
            return
        if report.drain_code:
            warns, line = stop_note(report.drain_code, report.answered_all, self.exit_timeout)
            err_console.print(f"[yellow]warning:[/] {escape(line)}" if warns else f"note: {escape(line)}",
                              soft_wrap=True)
        console.print("tritonserver stopped")

    def _serving(self, screen: Screen, server: Any, restarted: bool, built: bool, demo_apps: list[Any]) -> None:
        from hub_vit.server.serving import not_served

        screen.done()
        if restarted:
            console.print(f"[bold green]serving again[/] model [bold]{self.name}[/] on the same ports")
            return
        missing = not_served(server.http_url, self.name, server.control_headers)
        if missing:
            raise fail(missing, code=1)
        http_url = self.endpoints.http_url
        screen.summary(server, http_url, self.endpoints.grpc_url, self.endpoints.metrics_url, self.name, self.example,
                       self.where)
        if self.demo_port is not None:
            demo_apps.append(start_demo(self.model, not built, self.endpoints.host, self.demo_port, http_url,
                                        self.name, self.demo_root_path))

    def _check_shared_memory(self, repository: Path) -> None:
        """Refused when /dev/shm cannot hold the stubs' first pools; a warning when it cannot hold what the largest
        requests make them grow to (server.runtime.shared_memory)."""
        from hub_vit.server.runtime.shared_memory import shared_memory_room
        from hub_vit.server.runtime.triton_install import ServerError

        try:
            room = shared_memory_room(repository, self.limits.max_body_bytes)
        except ServerError as err:  # no /dev/shm, or too little for the first pools: this machine, not the request
            raise fail(str(err), code=CANNOT_NOW) from None
        except ValueError as err:  # an unreadable config (--repository was checked before: not expected)
            raise fail(str(err), code=1) from None
        if not room.enough:
            mb = self.limits.max_body_bytes >> 20
            err_console.print(f"[yellow]warning:[/] {escape(room.warning(f'--max-request-mb {mb}'))}", soft_wrap=True)

    def _check_descriptors(self) -> None:
        """A warning when the front's processes may not open the files their connection cap needs: each raises its
        soft limit (RLIMIT_NOFILE) as far as the hard one, which only the service's manager can raise."""
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard == resource.RLIM_INFINITY or hard >= self.limits.descriptors:
            return
        within = self.limits.connections_within(hard)
        err_console.print(
            f"[yellow]warning:[/] a process may open {hard} files here (the hard limit, ulimit -Hn), and each front "
            f"process needs {self.limits.descriptors} to hold --max-connections {self.limits.max_connections}: the "
            "OS may refuse new connections, health probes included, before that cap is reached. Raise the hard limit "
            f"(systemd: LimitNOFILE=; docker run --ulimit nofile=65536) or lower --max-connections to {within}",
            soft_wrap=True)

    @staticmethod
    def _say(line: str) -> None:  # a stop signal arrived; one line in a log file or journal
        err_console.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)

    @staticmethod
    def _refused(counts: dict[str, dict[str, int]], seconds: float) -> None:  # --refusal-report-s
        err_console.print(f"note: {refusal_line(counts, seconds)}", soft_wrap=True, markup=False, highlight=False)

    @staticmethod
    def _event(line: str) -> None:  # a replaced server, not a half-working one: Triton keeps answering ready
        err_console.print(f"[red]error:[/] {escape(line)}", soft_wrap=True)
