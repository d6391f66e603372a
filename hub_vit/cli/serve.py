"""`hub-vit serve`: a classifier on the real tritonserver (HTTP + gRPC + metrics) until Ctrl-C / SIGTERM.

The run itself (temporary repository, gate, supervision, drain) is `hub_vit.server.serving`; the first screen is
`serve_screen.py`. Heavy imports happen inside the command so `hub-vit --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from hub_vit.cli.app import CANNOT_NOW, app, err_console, fail, given
from hub_vit.cli.explain import ROOT_PATH_HELP, proxy_root_path
from hub_vit.cli.path_option import given_path
from hub_vit.cli.serve_run import ServeRun
from hub_vit.cli.serving_options import (
    DEFAULTS,
    SERVE_DEFAULTS,
    SERVE_MODEL_HELP,
    CpuVariant,
    CudaGraphs,
    DecodeThreads,
    Instances,
    MaxBatchSize,
    MaxPixels,
    MaxQueueDelayUs,
    MaxQueueSize,
    Name,
    QueuePolicy,
    QueueTimeoutUs,
    TopK,
    TorchCompile,
    in_flag_words,
    print_cpu_variant,
    serving_options,
    torch_fields,
)
from hub_vit.ports import DEMO_PORT, GRPC_PORT, HTTP_PORT, LOOPBACK, METRICS_PORT
from hub_vit.server.repository.options import DEVICES

ExitTimeout = Annotated[int, typer.Option(help="Seconds in-flight requests get to finish on Ctrl-C / SIGTERM.")]
MaxRestarts = Annotated[int, typer.Option(help="A server that died or lost a backend stub after it answered clients "
                                               "is always restarted, with backoff; serve exits after this many "
                                               "restarts in a row that failed before answering (0: never restart, "
                                               "exit with the error).")]
RefusalReportS = Annotated[int, typer.Option(
    help="Every this many seconds, one line counting the requests the front answered itself (refused, or no server to "
         "relay them to), by status, when there were any; also at exit. Triton never sees those requests, so its log "
         "and metrics hold none of them. 0: never.")]
Demo = Annotated[bool, typer.Option("--demo", help="Also run the Gradio rollout demo (it can take labels from this "
                                                   "server).")]
Device = Annotated[str, typer.Option(show_default=False,
                                     help=f"Where the model runs ({', '.join(DEVICES)}). Default: cuda (the torch "
                                          "flavour, GPU-sized batching) when torch sees a CUDA device, else cpu.")]
Flavour = Annotated[str, typer.Option(show_default=False,
                                      help="'cpu' (ONNX Runtime; the default on cpu) or 'torch' (the hub-vit model in "
                                           "PyTorch; the only one on cuda).")]
MaxRequestMb = Annotated[int, typer.Option(help="Largest HTTP request body or gRPC message, also once inflated "
                                                "(gzip/deflate); larger ones are refused (HTTP 413, gRPC "
                                                "RESOURCE_EXHAUSTED) before they reach Triton.")]
MaxConnections = Annotated[int, typer.Option(help="Open HTTP connections beyond which only health requests are "
                                                  "answered (others get 503); also the most open gRPC connections "
                                                  "(more are refused).")]
KeepAliveS = Annotated[int, typer.Option(
    help="Seconds an idle HTTP keep-alive connection is kept open after its last answer. Keep it above the idle "
         "timeout of a load balancer in front (AWS ALB: 60 s), so the balancer closes idle connections first.")]
FrontProcessCount = Annotated[int, typer.Option(
    "--front-processes", show_default=False,
    help="Processes that take the public HTTP and gRPC ports and relay to Triton (they share the ports; each relays "
         "some thousands of requests a second). Default: one per 4 cores, 1 to 4.")]
# Where tritonserver's log goes, said once for --verbose, --quiet and the error naming both (a --quiet flag, not a
# --quiet/--no-quiet pair whose help showed "[default: no-quiet]" while the error called --quiet the default)
LOG_SHOWN = ("tritonserver's log always goes to the file the start-up summary names (kept if serve fails or "
             "replaced a server that died) and shows here only with --verbose: quiet is the default")
Verbose = Annotated[bool, typer.Option("--verbose", help=f"Also show tritonserver's log here ({LOG_SHOWN}).")]
Quiet = Annotated[bool, typer.Option("--quiet", help=f"Do not show tritonserver's log here ({LOG_SHOWN}).")]


@app.command()
def serve(
    ctx: typer.Context,
    model: str = typer.Argument(None, help=SERVE_MODEL_HELP),
    repository_dir: Path = typer.Option(None, "--repository", help="Serve this existing repository instead.",
                                        parser=given_path),
    host: str = typer.Option(LOOPBACK, help="Address to bind (loopback by default)."),
    http_port: int = typer.Option(HTTP_PORT, help="HTTP/REST port."),
    grpc_port: int = typer.Option(GRPC_PORT, help="gRPC port."),
    metrics_port: int = typer.Option(METRICS_PORT, help="Prometheus metrics port."),
    name: Name = DEFAULTS.name,
    max_batch_size: MaxBatchSize = DEFAULTS.max_batch_size,
    max_queue_delay_us: MaxQueueDelayUs = DEFAULTS.max_queue_delay_us,
    max_queue_size: MaxQueueSize = DEFAULTS.max_queue_size,
    queue_timeout_us: QueueTimeoutUs = DEFAULTS.queue_timeout_us,
    queue_policy: QueuePolicy = DEFAULTS.queue_policy,
    top_k: TopK = DEFAULTS.top_k,
    instances: Instances = DEFAULTS.classifier_instances,
    exit_timeout: ExitTimeout = 30,
    max_restarts: MaxRestarts = 3,
    refusal_report_s: RefusalReportS = 60,
    quiet: Quiet = False,
    verbose: Verbose = False,
    demo: Demo = False,
    demo_port: int = typer.Option(DEMO_PORT, help="Port of the demo (with --demo)."),
    demo_root_path: str = typer.Option(None, help=f"With --demo: {ROOT_PATH_HELP}"),
    max_pixels: MaxPixels = DEFAULTS.max_pixels,
    device: Device = None,
    flavour: Flavour = None,
    cuda_graphs: CudaGraphs = DEFAULTS.cuda_graphs,
    torch_compile: TorchCompile = DEFAULTS.torch_compile,
    decode_threads: DecodeThreads = DEFAULTS.decode_threads,
    max_request_mb: MaxRequestMb = 64,
    max_connections: MaxConnections = 4096,
    keep_alive_s: KeepAliveS = 75,
    front_processes: FrontProcessCount = None,
    cpu_variant: CpuVariant = "auto",
) -> None:
    """Serve a classifier on the real tritonserver (HTTP + gRPC + metrics) until Ctrl-C / SIGTERM."""
    from hub_vit.server.front.limits import FrontLimits, default_processes
    from hub_vit.server.serving import Endpoints

    endpoints = Endpoints(host, http_port, grpc_port, metrics_port)
    for flag in ("demo_port", "demo_root_path"):
        if given(ctx, flag) and not demo:  # was dropped without a word
            raise fail(f"--{flag.replace('_', '-')} only applies with --demo (serve starts no demo without it)")
    try:
        demo_root_path = proxy_root_path(demo_root_path, "--demo-root-path")
    except ValueError as err:
        raise fail(str(err)) from None
    _check_flags(endpoints, demo_port if demo else None, exit_timeout=exit_timeout, max_restarts=max_restarts,
                 refusal_report_s=refusal_report_s, max_request_mb=max_request_mb, max_connections=max_connections,
                 keep_alive_s=keep_alive_s, front_processes=front_processes, quiet=quiet, verbose=verbose)
    where = _serve_device(ctx, repository_dir, device, flavour)
    run = ServeRun(endpoints, name, model, where, demo_port if demo else None, exit_timeout, max_restarts, verbose,
               FrontLimits(max_body_bytes=max_request_mb << 20, max_connections=max_connections,
                           keep_alive_s=keep_alive_s, processes=front_processes or default_processes()),
               demo_root_path, refusal_report_s)
    sizes = {"max_batch_size": max_batch_size, "max_queue_delay_us": max_queue_delay_us,
             "max_queue_size": max_queue_size, "queue_timeout_us": queue_timeout_us, "queue_policy": queue_policy,
             "top_k": top_k, "max_pixels": max_pixels}
    if repository_dir is not None:
        if given(ctx, "cpu_variant"):
            raise fail("--cpu-variant chooses the graph of the repository serve builds; --repository serves one as it "
                       "was written: rebuild it with `hub-vit repository --cpu-variant ...`")
        if given(ctx, "instances"):
            raise fail("--instances only applies when serve builds the repository; --repository serves "
                       f"{str(repository_dir)!r} as written (rebuild it with `hub-vit repository --instances N`)")
        run.name, run.example = _existing_repository(repository_dir, model=model, name=name, **sizes)
        _check_triton()
        print_cpu_variant(repository_dir)
        run.serve(repository_dir, built=False)
        return

    def options_for(where: Any) -> Any:
        return serving_options(ctx, name=name, **sizes, flavour=where.flavour, device=where.device,
                               cpu_variant=cpu_variant, classifier_instances=instances,
                               **torch_fields(where.flavour, cuda_graphs, torch_compile, decode_threads))

    options_for(where)  # every option is refused in the flags' words before the environment is looked at
    _check_triton()
    run.build_and_serve(options_for, device is None, flavour)


def _check_flags(endpoints: Any, demo_port: int | None, **values: Any) -> None:
    """Refused before anything is built: a taken port is the likeliest reason a second `serve` fails."""
    from hub_vit.ports import PortError, check_host, check_ports
    from hub_vit.server.front.limits import MAX_EXIT_TIMEOUT_S, MAX_PROCESSES, MAX_REQUEST_MB
    from hub_vit.server.runtime.api_access import exposure_warning

    try:
        check_host(endpoints.host)
        check_ports(endpoints.host, {"--http-port": endpoints.http_port, "--grpc-port": endpoints.grpc_port,
                                     "--metrics-port": endpoints.metrics_port,
                                     **({"--demo-port": demo_port} if demo_port is not None else {})})
    except PortError as err:
        raise fail(str(err)) from None
    exposed = exposure_warning(endpoints.host)
    if exposed:
        err_console.print(f"[bold red]WARNING:[/] {escape(exposed)}", soft_wrap=True)
    if not 0 <= values["exit_timeout"] <= MAX_EXIT_TIMEOUT_S:  # above: accepted, then tritonserver refused it
        raise fail(f"--exit-timeout must be from 0 to {MAX_EXIT_TIMEOUT_S} seconds, got {values['exit_timeout']}")
    for flag in ("--max-restarts", "--refusal-report-s"):
        value = values[flag[2:].replace("-", "_")]
        if value < 0:
            raise fail(f"{flag} must be >= 0, got {value}")
    for flag in ("--max-request-mb", "--max-connections", "--keep-alive-s"):
        value = values[flag[2:].replace("-", "_")]
        if value < 1:
            raise fail(f"{flag} must be a positive integer, got {value}")
    if values["max_request_mb"] > MAX_REQUEST_MB:  # a cap Triton's own gRPC limit would undercut
        raise fail(f"--max-request-mb must be from 1 to {MAX_REQUEST_MB} (Triton's gRPC server takes messages up to "
                   f"2 GiB), got {values['max_request_mb']}")
    if values["front_processes"] is not None and not 1 <= values["front_processes"] <= MAX_PROCESSES:
        raise fail(f"--front-processes must be between 1 and {MAX_PROCESSES}, got {values['front_processes']}")
    if values["quiet"] and values["verbose"]:
        raise fail(f"--quiet and --verbose contradict each other ({LOG_SHOWN}); give one of them")


def _check_triton() -> None:
    """A tritonserver this interpreter can run, and a temporary folder its backends can run from, found before
    anything is built (an export can take minutes), and after every flag was checked: a mistyped option is named
    first, whatever the environment lacks."""
    from hub_vit.server.runtime.triton_install import ServerError, find_triton
    from hub_vit.server.runtime.workspace import temp_base

    try:
        find_triton()
    except ServerError as err:  # none installed, no stub for this Python, or a Python too new for the stubs
        raise fail(str(err)) from None
    try:
        temp_base(runs_programs=True)  # where the server's backends will run from
    except ServerError as err:  # every temporary folder is mounted noexec (or unwritable): this machine, not a flag
        raise fail(str(err), code=CANNOT_NOW) from None


def _serve_device(ctx: typer.Context, repository_dir: Path | None, device: str | None,
                  flavour: str | None) -> Any:
    """`serve`'s device and flavour (server.device.choose_device), refused in the flags' words; with --repository,
    what its manifest records (the device flags would not change it)."""
    from hub_vit.server.runtime.device import DeviceChoice, NoCudaDevice, choose_device, recorded_device

    torch_flags = [flag for flag, key in (("--cuda-graphs", "cuda_graphs"), ("--torch-compile", "torch_compile"),
                                          ("--decode-threads", "decode_threads")) if given(ctx, key)]
    if repository_dir is not None:
        flags = [flag for flag, value in (("--device", device), ("--flavour", flavour)) if value is not None]
        if flags + torch_flags:
            flags += torch_flags
            raise fail(f"{', '.join(flags)} only appl{'ies' if len(flags) == 1 else 'y'} when serve builds the "
                       f"repository; --repository serves {str(repository_dir)!r} as written (rebuild it with "
                       "`hub-vit repository`)")
        try:
            return recorded_device(repository_dir)
        except ValueError as err:
            raise fail(str(err), code=CANNOT_NOW if isinstance(err, NoCudaDevice) else 2) from None
    try:
        choice = choose_device(device, flavour)
    except ValueError as err:  # the words outside quotes name the flags: "unknown --device 'tpu'; valid: ..."
        raise fail(in_flag_words(str(err), ("device", "flavour")),
                   code=CANNOT_NOW if isinstance(err, NoCudaDevice) else 2) from None
    if torch_flags and choice.flavour != "torch":
        raise fail(f"{', '.join(torch_flags)} set{'s' if len(torch_flags) == 1 else ''} the torch flavour, but the "
                   f"{choice.flavour} flavour serves on {choice.device}; add --flavour torch")
    assert isinstance(choice, DeviceChoice)
    return choice


def _existing_repository(folder: Path, *, model: str | None, name: str, **sizes: Any) -> tuple[str, str]:
    """`serve --repository`: the repository is served as written, so options that would change it are refused
    (they used to be dropped without a word); returns the ensemble's name (from the manifest, else `--name`) and the
    `try:` line's image (a sample of the model folder the manifest names, else a placeholder)."""
    from hub_vit.cli.serve_screen import EXAMPLE_PLACEHOLDER, example_image
    from hub_vit.server.repository.manifest import model_configs, outdated_warning, served_name

    if not folder.is_dir():
        raise fail(f"--repository {str(folder)!r} is {'a file' if folder.exists() else 'missing'}; give the folder "
                   "`hub-vit repository` wrote")
    changed = [f"--{key.replace('_', '-')}" for key, value in sizes.items() if value != SERVE_DEFAULTS[key]]
    if model is not None:
        changed.insert(0, "MODEL")
    if changed:
        verb = "applies" if len(changed) == 1 else "apply"
        raise fail(f"{', '.join(changed)} only {verb} when serve builds the repository; --repository serves "
                   f"{str(folder)!r} as written (rebuild it with `hub-vit repository` to change it)")
    from hub_vit.server.runtime.health import python_instances

    try:
        model_configs(folder)
        python_instances(folder)  # every config parsed: one Triton cannot read is named here, not after a warning
    except ValueError as err:
        raise fail(f"--repository: {err}; give the folder `hub-vit repository` wrote") from None
    try:
        name, manifest = served_name(folder, name, DEFAULTS.name)
    except ValueError as err:
        raise fail(str(err)) from None
    warning = None if manifest is None else outdated_warning(folder, manifest)
    if warning:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    origin = manifest.get("origin") if manifest is not None else None
    return name, example_image(origin) if isinstance(origin, str) else EXAMPLE_PLACEHOLDER
