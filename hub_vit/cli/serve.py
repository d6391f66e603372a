"""`hub-vit serve | repository | classify | loadtest`: Triton serving of hub-vit classifiers.

Heavy imports (torch export, tritonclient, onnx) happen inside the commands so `hub-vit --help` stays fast.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hub_vit.cli.app import app, as_flags, console, err_console, fail
from hub_vit.server.options import CUDA_DEFAULTS, DEVICES, ServingOptions

MODEL_HELP = "Registered name, hub-vit model folder, or exported .onnx/.plan file (default: the shipped model)."
DEFAULTS = ServingOptions()  # every repository default below comes from here (a test compares the configs)
DUPLICATE_SIGNAL_S = 1.0  # a repeat of the stopping signal within this is the same request (see `serve`)

# Options `repository` and `serve` share, declared once.
Name = Annotated[str, typer.Option(help="Name clients call (the ensemble).")]
MaxBatchSize = Annotated[int, typer.Option(help="Largest batch one execution runs.")]
MaxQueueDelayUs = Annotated[int, typer.Option(help="How long the dynamic batcher waits to fill a batch.")]
MaxQueueSize = Annotated[int, typer.Option(help="Queued requests per step beyond which new ones are rejected.")]
QueueTimeoutUs = Annotated[int, typer.Option(help="Longest a request may wait in a step's queue before it is rejected "
                                                  "(0: no limit; a client may ask for less per request).")]
# `classify` and `loadtest`: the client's side of the same limit, per request.
RequestQueueTimeoutMs = Annotated[float, typer.Option(
    show_default=False, help="Ask the server to reject each request that waits longer than this many ms in its queue "
                             "(\"Request timeout expired\") instead of computing it late (default: the server's own "
                             "limit).")]
TopK = Annotated[int, typer.Option(help="Labels and scores returned per image.")]
MaxPixels = Annotated[int, typer.Option(help="Most pixels an image may declare (larger ones are refused before "
                                             "decoding; 48 MP phone photos need more than the default).")]
# `serve --repository` refuses these when they differ from the defaults: they would not change the repository.
_SERVE_DEFAULTS = {key: getattr(DEFAULTS, key)
                   for key in ("max_batch_size", "max_queue_delay_us", "max_queue_size", "queue_timeout_us", "top_k",
                               "max_pixels")}


# The torch flavour's options, shared by `repository` and `serve`.
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs",
                                          help="Torch flavour on cuda: one CUDA graph per batch bucket, captured "
                                               "before the server reports ready.")]
TorchCompile = Annotated[bool, typer.Option("--torch-compile/--no-torch-compile",
                                            help="Torch flavour on cuda: torch.compile the model before capturing "
                                                 "(compiles every bucket while loading: minutes).")]
DecodeThreads = Annotated[int, typer.Option(help="Torch flavour: images decoded in parallel per instance (0: the "
                                                 "cores shared among the instances).")]
_CUDA_SIZED = ("max_batch_size", "max_queue_delay_us", "max_queue_size")


def _device_fields(ctx: typer.Context, device: str, max_batch_size: int) -> dict[str, Any]:
    """The ServingOptions fields that depend on the device: on cuda, the GPU-sized CUDA_DEFAULTS for each of
    max_batch_size / max_queue_delay_us / max_queue_size left at its default on the command line, and preferred
    batch sizes to match; on cpu, the preferred sizes of today."""
    if device != "cuda":
        return {"preferred_batch_sizes": _preferred(max_batch_size)}
    fields = {key: CUDA_DEFAULTS[key] for key in _CUDA_SIZED if not _given(ctx, key)}
    largest = int(fields.get("max_batch_size", max_batch_size))
    sizes = tuple(s for s in CUDA_DEFAULTS["preferred_batch_sizes"] if s <= largest)  # type: ignore[union-attr]
    return fields | {"preferred_batch_sizes": sizes or (largest,)}


def _given(ctx: typer.Context, key: str) -> bool:
    """Option `key` was set on the command line (or by an environment variable), not left at its default. By name:
    typer vendors its own click, whose ParameterSource is not click's."""
    source = ctx.get_parameter_source(key)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


# ServingOptions fields as the CLI spells them, so a validation error names the flag the user typed.
_FLAGS = {"classifier_instances": "--instances", "ort_spinning": "--spinning"}


def _options(**kwargs: Any) -> ServingOptions:
    try:
        return ServingOptions(**kwargs)
    except ValueError as err:
        # the user's own values are quoted (`!r`) in the message: only the words between quotes are rewritten
        parts = re.split(r"""('[^']*'|"[^"]*")""", str(err))
        for field in sorted(kwargs, key=len, reverse=True):  # longest first: max_queue_size before queue_size
            flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
            parts[::2] = [re.sub(rf"(?<![\w-]){field}\b", flag, part) for part in parts[::2]]
        raise fail("".join(parts)) from None


def _source(model: str | None) -> Any:
    from hub_vit.server.source import resolve

    try:
        return resolve(model)
    except (ValueError, KeyError, ImportError) as err:
        raise fail(str(err)) from None
    except (OSError, RuntimeError) as err:  # e.g. a registered name whose checkpoint cannot be downloaded
        raise fail(f"cannot load model {model!r}: {err}", code=1) from None


@app.command()
def repository(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="Folder to write the Triton model repository to."),
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    flavour: str = typer.Option(DEFAULTS.flavour,
                                help="'cpu' (Python backend + ONNX Runtime), 'gpu' (ORT+TensorRT / plan, official "
                                     "container) or 'torch' (the hub-vit model in PyTorch, on --device)."),
    device: str = typer.Option(DEFAULTS.device, help=f"Torch flavour: where the model runs ({', '.join(DEVICES)}; "
                                                     "cuda: GPU-sized batching unless given)."),
    cuda_graphs: CudaGraphs = DEFAULTS.cuda_graphs,
    torch_compile: TorchCompile = DEFAULTS.torch_compile,
    decode_threads: DecodeThreads = DEFAULTS.decode_threads,
    gpu_backend: str = typer.Option(DEFAULTS.gpu_backend,
                                    help="GPU flavour: 'onnxruntime' (TensorRT EP) or 'tensorrt'."),
    precision: str = typer.Option(None, show_default=False,
                                  help=f"GPU flavour, TensorRT accelerator precision: FP16 or FP32 (default "
                                       f"{DEFAULTS.precision}). Not for --gpu-backend tensorrt: an engine's precision "
                                       "is fixed when it is built."),
    name: Name = DEFAULTS.name,
    max_batch_size: MaxBatchSize = DEFAULTS.max_batch_size,
    max_queue_delay_us: MaxQueueDelayUs = DEFAULTS.max_queue_delay_us,
    max_queue_size: MaxQueueSize = DEFAULTS.max_queue_size,
    queue_timeout_us: QueueTimeoutUs = DEFAULTS.queue_timeout_us,
    top_k: TopK = DEFAULTS.top_k,
    instances: int = typer.Option(DEFAULTS.classifier_instances,
                                  help="Classifier instances (CPU: each decodes and runs ORT; two keep Triton's "
                                       "batcher from stalling)."),
    preprocess_instances: int = typer.Option(None, show_default=False,
                                             help=f"GPU flavour: image-decoding and top-k instances (CPU processes; "
                                                  f"raise it so decoding keeps up with the GPU; default "
                                                  f"{DEFAULTS.preprocess_instances}). The CPU flavour decodes in its "
                                                  f"--instances."),
    spinning: bool = typer.Option(DEFAULTS.ort_spinning, "--spinning/--no-spinning", show_default=False,
                                  help="CPU flavour: ORT threads spin between ops (lower latency; several instances "
                                       "then take turns on the cores). Default: on for a compute-bound model, off "
                                       "for a tiny one."),
    max_pixels: MaxPixels = DEFAULTS.max_pixels,
    overwrite: bool = typer.Option(False, help="Replace an existing folder."),
) -> None:
    """Write a Triton model repository (config.pbtxt files generated from the model's metadata)."""
    from hub_vit.server.launcher import unservable_path_message
    from hub_vit.server.repository import write_repository

    if preprocess_instances is not None and flavour == "cpu":
        raise fail("--preprocess-instances sets the GPU flavour's decoding and top-k steps; the CPU flavour decodes in "
                   "each classifier instance: use --instances")
    if spinning is not None and flavour == "gpu":
        raise fail("--spinning/--no-spinning sets the CPU flavour's ONNX Runtime threads; the GPU flavour runs "
                   "Triton's own ONNX Runtime / TensorRT backends")
    if precision is not None and gpu_backend == "tensorrt":
        raise fail("--precision sets the TensorRT accelerator of --gpu-backend onnxruntime; a TensorRT engine's "
                   "precision is fixed when it is built (hub-vit export tensorrt --fp16/--fp32)")
    torch_given = [flag for flag, key in (("--cuda-graphs", "cuda_graphs"), ("--torch-compile", "torch_compile"),
                                          ("--decode-threads", "decode_threads")) if _given(ctx, key)]
    if torch_given and flavour != "torch":
        raise fail(f"{', '.join(torch_given)} set{'s' if len(torch_given) == 1 else ''} the torch flavour; pass "
                   "--flavour torch (the cpu and gpu flavours run ONNX Runtime / TensorRT)")
    opts = _options(**{"name": name, "flavour": flavour, "gpu_backend": gpu_backend,
                       "precision": precision or DEFAULTS.precision, "max_batch_size": max_batch_size,
                       "max_queue_delay_us": max_queue_delay_us, "max_queue_size": max_queue_size,
                       "queue_timeout_us": queue_timeout_us, "top_k": top_k, "classifier_instances": instances,
                       "preprocess_instances": (DEFAULTS.preprocess_instances if preprocess_instances is None
                                                else preprocess_instances),
                       "ort_spinning": spinning, "max_pixels": max_pixels, "device": device,
                       "cuda_graphs": cuda_graphs, "torch_compile": torch_compile, "decode_threads": decode_threads,
                       **_device_fields(ctx, device if device in DEVICES else "cpu", max_batch_size)})
    try:
        path = write_repository(_source(model), out, opts, overwrite=overwrite)
    except (ValueError, FileExistsError, NotADirectoryError) as err:
        raise fail(as_flags(str(err))) from None
    where = f", device {opts.device}" if opts.flavour == "torch" else ""
    console.print(f"wrote Triton repository [bold]{escape(str(path))}[/] (model [bold]{name}[/], flavour {flavour}"
                  f"{where})", soft_wrap=True)
    unservable = unservable_path_message(path)
    if unservable:  # a GPU host mounts it elsewhere (docker -v ...:/models); `hub-vit serve --repository` here cannot
        err_console.print(f"[yellow]note:[/] {escape(unservable)} (`hub-vit serve --repository` refuses it; a "
                          "container that mounts it at another path is fine)", soft_wrap=True)


def _preferred(max_batch_size: int) -> tuple[int, ...]:
    return tuple(s for s in (4, 8, 16, 32, 64) if s <= max_batch_size) or (max_batch_size,)


@app.command()
def serve(
    ctx: typer.Context,
    model: str = typer.Argument(None, help=MODEL_HELP),
    repository_dir: Path = typer.Option(None, "--repository", help="Serve this existing repository instead."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    http_port: int = typer.Option(8000, help="HTTP/REST port."),
    grpc_port: int = typer.Option(8001, help="gRPC port."),
    metrics_port: int = typer.Option(8002, help="Prometheus metrics port."),
    name: Name = DEFAULTS.name,
    max_batch_size: MaxBatchSize = DEFAULTS.max_batch_size,
    max_queue_delay_us: MaxQueueDelayUs = DEFAULTS.max_queue_delay_us,
    max_queue_size: MaxQueueSize = DEFAULTS.max_queue_size,
    queue_timeout_us: QueueTimeoutUs = DEFAULTS.queue_timeout_us,
    top_k: TopK = DEFAULTS.top_k,
    exit_timeout: int = typer.Option(30, help="Seconds in-flight requests get to finish on Ctrl-C / SIGTERM."),
    max_restarts: int = typer.Option(3, help="A server that died or lost a backend stub after it answered clients is "
                                             "always restarted, with backoff; serve exits after this many restarts "
                                             "in a row that failed before answering (0: never restart, exit with "
                                             "the error)."),
    quiet: bool = typer.Option(False, help="Do not stream the server log."),
    demo: bool = typer.Option(False, "--demo", help="Also run the Gradio rollout demo (it can take labels from "
                                                    "this server)."),
    demo_port: int = typer.Option(7860, help="Port of the demo (with --demo)."),
    max_pixels: MaxPixels = DEFAULTS.max_pixels,
    device: str = typer.Option(None, show_default=False,
                               help=f"Where the model runs ({', '.join(DEVICES)}). Default: cuda (the torch flavour, "
                                    "GPU-sized batching) when torch sees a CUDA device, else cpu."),
    flavour: str = typer.Option(None, show_default=False,
                                help="'cpu' (ONNX Runtime; the default on cpu) or 'torch' (the hub-vit model in "
                                     "PyTorch; the only one on cuda)."),
    cuda_graphs: CudaGraphs = DEFAULTS.cuda_graphs,
    torch_compile: TorchCompile = DEFAULTS.torch_compile,
    decode_threads: DecodeThreads = DEFAULTS.decode_threads,
    max_request_mb: int = typer.Option(64, help="Largest HTTP request body or gRPC message, also once inflated "
                                                "(gzip/deflate); larger ones are refused (HTTP 413, gRPC "
                                                "RESOURCE_EXHAUSTED) before they reach Triton."),
    max_connections: int = typer.Option(4096, help="Open HTTP connections beyond which only health requests are "
                                                   "answered (others get 503); also the most open gRPC "
                                                   "connections (more are refused)."),
) -> None:
    """Serve a classifier on the real tritonserver (HTTP + gRPC + metrics) until Ctrl-C / SIGTERM."""
    from hub_vit.ports import PortError, check_host, check_ports
    from hub_vit.server.gate import Gate, GateLimits
    from hub_vit.server.grpc_gate import GrpcGate
    from hub_vit.server.launcher import ServerError, TritonServer, exit_description, free_port, shell_safe_tempdir
    from hub_vit.server.launcher import exposure_warning as exposure
    from hub_vit.server.repository import write_repository
    from hub_vit.server.supervisor import GaveUp, RestartPolicy, Supervisor

    try:  # before building anything: a taken port is the likeliest reason a second `serve` fails
        check_host(host)
        check_ports(host, {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port,
                           **({"--demo-port": demo_port} if demo else {})})
    except PortError as err:
        raise fail(str(err)) from None
    exposed = exposure(host)
    if exposed:
        err_console.print(f"[bold red]WARNING:[/] {escape(exposed)}", soft_wrap=True)
    if exit_timeout < 0:
        raise fail(f"--exit-timeout must be >= 0 seconds, got {exit_timeout}")
    if max_restarts < 0:
        raise fail(f"--max-restarts must be >= 0, got {max_restarts}")
    for flag, value in (("--max-request-mb", max_request_mb), ("--max-connections", max_connections)):
        if value < 1:
            raise fail(f"{flag} must be a positive integer, got {value}")
    workdir = None
    example = "IMAGE..."
    where = _serve_device(ctx, repository_dir, device, flavour)
    if repository_dir is None:
        def options_for(where: Any) -> ServingOptions:
            return _options(name=name, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
                            max_queue_size=max_queue_size, queue_timeout_us=queue_timeout_us, top_k=top_k,
                            max_pixels=max_pixels, flavour=where.flavour, device=where.device,
                            **_torch_fields(where.flavour, cuda_graphs, torch_compile, decode_threads),
                            **_device_fields(ctx, where.device, max_batch_size))

        opts = options_for(where)  # checked before the model is loaded
        source = _source(model)
        if device is None and where.device == "cuda" and source.module is None:  # an exported file: ONNX Runtime
            from hub_vit.server.device import choose_device

            where = choose_device("cpu", flavour)
            opts = options_for(where)
            err_console.print(f"note: {escape(source.origin)} is an exported file, which the torch flavour cannot run; "
                              "serving it with ONNX Runtime on the CPU", soft_wrap=True)
        example = _example_image(source.origin)
        try:  # in $TMPDIR unless its path has spaces or shell characters the Python-backend stub cannot take
            workdir = shell_safe_tempdir("hub-vit-serve-")
        except ServerError as err:
            raise fail(str(err)) from None
        console.print(f"building the Triton repository for [bold]{escape(source.metadata.name)}[/] "
                      f"({escape(source.origin)})", soft_wrap=True)
        try:
            repository_dir = write_repository(source, workdir / "repository", opts)
        except BaseException as err:  # a bad model, or Ctrl-C while exporting: no temp folder is left behind
            shutil.rmtree(workdir, ignore_errors=True)
            if isinstance(err, ValueError):
                raise fail(str(err)) from None
            raise
    else:
        name = _existing_repository(repository_dir, model=model, name=name, max_batch_size=max_batch_size,
                                    max_queue_delay_us=max_queue_delay_us, max_queue_size=max_queue_size,
                                    queue_timeout_us=queue_timeout_us, top_k=top_k, max_pixels=max_pixels)
    # soft_wrap: one log line stays one line in a log file / journal (rich would cut it at 80 columns off a terminal)
    log = None if quiet else (lambda line: err_console.print(line, markup=False, highlight=False, soft_wrap=True,
                                                             emoji=False))
    def new_server() -> TritonServer:  # Triton's HTTP and gRPC on private loopback ports; the gates take the public
        private_http = free_port()
        private_grpc = next(port for port in iter(free_port, None) if port != private_http)
        return TritonServer(repository_dir, host=host, http_port=private_http, grpc_port=private_grpc,
                            metrics_port=metrics_port, exit_timeout_s=exit_timeout, log=log, http_host="127.0.0.1",
                            grpc_host="127.0.0.1")

    stop, forced = threading.Event(), threading.Event()
    demo_app: list[object] = []  # the demo, once the first server serves

    def serving(server: TritonServer, restarted: bool) -> None:
        if restarted:
            console.print(f"[bold green]serving again[/] model [bold]{name}[/] on the same ports")
            return
        missing = _not_served(server.http_url, name, server.control_headers)
        if missing:
            raise fail(missing, code=1)
        _print_endpoints(server, f"{host}:{http_port}", f"{host}:{grpc_port}", name, example, where)
        if demo:
            demo_app.append(_start_demo(model, workdir is None, host, demo_port, f"{host}:{http_port}", name))

    def event(line: str) -> None:  # a replaced server, not a half-working one: Triton keeps answering ready
        err_console.print(f"[red]error:[/] {escape(line)}", soft_wrap=True)

    gates: list[Gate | GrpcGate] = []  # the public HTTP and gRPC ports, each checking requests before Triton
    try:
        limits = GateLimits(max_body_bytes=max_request_mb << 20, max_connections=max_connections)
        gates.append(Gate(host, http_port, limits).start())
        gates.append(GrpcGate(host, grpc_port, limits).start())
        supervisor = Supervisor(new_server, RestartPolicy(max_failed_starts=max_restarts), stop, serving=serving,
                                event=event, gates=tuple(gates))
    except (ServerError, OSError, ValueError) as err:
        for gate in gates:
            gate.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise fail(str(err)) from None
    first: list[tuple[int, float]] = []  # (signal, monotonic time) of the signal that started the drain

    def _on_signal(signum: int, _frame: object) -> None:
        now = time.monotonic()
        if first and first[0][0] == signum and now - first[0][1] < DUPLICATE_SIGNAL_S:
            # the same signal twice at once is one stop request: `kill -TERM -- -PGID` (systemd's default too) reaches
            # us, and GNU make (`make serve`) forwards the SIGTERM it got to its child, so serve sees it twice
            return
        if stop.is_set():  # a second Ctrl-C / SIGTERM: the user will not wait for the drain
            err_console.print(f"[yellow]{signal.Signals(signum).name} again: stopping now, in-flight requests are "
                              "dropped[/]")
            forced.set()
            supervisor.kill()
            return
        err_console.print(f"[yellow]{signal.Signals(signum).name}: draining in-flight requests (up to "
                          f"{exit_timeout} s), then exiting; press Ctrl-C again to stop at once[/]")
        first.append((signum, now))
        supervisor.terminate()

    # SIGHUP: the terminal closed or ssh dropped; drain and remove the temp folders as for Ctrl-C
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        server = supervisor.run()
        code = server.process.returncode if server.process is not None else None
        if code and not forced.is_set() and supervisor.failure is None:
            # Triton's "Exit timeout expired": something held the drain open for --exit-timeout. That may be requests
            # still running (they got no answer) or only idle keep-alive connections (a load balancer's), which a
            # normal stop must not report as a failure: a warning, and the exit status of a requested stop.
            err_console.print(f"[yellow]warning:[/] tritonserver {exit_description(code)} while stopping: its drain "
                              f"did not finish within --exit-timeout {exit_timeout} s (requests still running got no "
                              "answer; idle keep-alive connections also hold it open)", soft_wrap=True)
        console.print("tritonserver stopped")
    except ServerError as err:
        if stop.is_set() and not isinstance(err, GaveUp):  # interrupted while still loading: a normal exit
            console.print("stopped before the server was ready")
            return
        raise fail(str(err), code=1) from None
    finally:
        for app_ in demo_app:
            app_.close()
        supervisor.server.stop()
        for gate in gates:
            gate.close()
        for sig, handler in previous.items():  # None: installed from C, not restorable; the default is closest
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _serve_device(ctx: typer.Context, repository_dir: Path | None, device: str | None,
                  flavour: str | None) -> Any:
    """`serve`'s device and flavour (server.device.choose_device), refused in the flags' words; with --repository,
    what its manifest records (the device flags would not change it)."""
    from hub_vit.server.device import DeviceChoice, choose_device

    torch_flags = [flag for flag, key in (("--cuda-graphs", "cuda_graphs"), ("--torch-compile", "torch_compile"),
                                          ("--decode-threads", "decode_threads")) if _given(ctx, key)]
    if repository_dir is not None:
        given = [flag for flag, value in (("--device", device), ("--flavour", flavour)) if value is not None]
        if given + torch_flags:
            flags = given + torch_flags
            raise fail(f"{', '.join(flags)} only appl{'ies' if len(flags) == 1 else 'y'} when serve builds the "
                       f"repository; --repository serves {str(repository_dir)!r} as written (rebuild it with "
                       "`hub-vit repository`)")
        return _recorded_device(repository_dir)
    try:
        choice = choose_device(device, flavour)
    except ValueError as err:  # the words outside quotes name the flags: "unknown --device 'tpu'; valid: ..."
        parts = re.split(r"""('[^']*')""", str(err))
        parts[::2] = [re.sub(r"(?<![\w-])(device|flavour)\b", r"--\1", part) for part in parts[::2]]
        raise fail("".join(parts)) from None
    if torch_flags and choice.flavour != "torch":
        raise fail(f"{', '.join(torch_flags)} set{'s' if len(torch_flags) == 1 else ''} the torch flavour, but the "
                   f"{choice.flavour} flavour serves on {choice.device}; add --flavour torch")
    assert isinstance(choice, DeviceChoice)
    return choice


def _recorded_device(folder: Path) -> Any:
    """The device and flavour a repository's manifest records; a cuda one refused where torch sees no CUDA device
    (its KIND_GPU instances would fail to load)."""
    from hub_vit.server.device import DeviceChoice, cuda_device_name
    from hub_vit.server.repository import MANIFEST

    try:
        options = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("options", {})
    except (OSError, ValueError, AttributeError):
        options = {}
    flavour, device = str(options.get("flavour", "cpu")), str(options.get("device", "cpu"))
    if device != "cuda":
        return DeviceChoice("cpu", flavour, "the CPU")
    name = cuda_device_name()
    if name is None:
        raise fail(f"{str(folder)!r} is a torch-flavour repository for device cuda, but torch sees no CUDA device "
                   "here; rebuild it with --device cpu, or serve it on a GPU host")
    return DeviceChoice("cuda", flavour, f"cuda:0 ({name})")


def _torch_fields(flavour: str, cuda_graphs: bool, torch_compile: bool, decode_threads: int) -> dict[str, Any]:
    return {"cuda_graphs": cuda_graphs, "torch_compile": torch_compile, "decode_threads": decode_threads} \
        if flavour == "torch" else {}


def _print_endpoints(server: Any, http_url: str, grpc_url: str, name: str, example: str, where: Any) -> None:
    console.print(f"[bold green]serving[/] model [bold]{name}[/]\n"
                  f"  device   {escape(where.description)} ({where.flavour} flavour)\n"
                  f"  HTTP     http://{http_url}/v2/models/{name}/infer\n"
                  f"  gRPC     {grpc_url}\n"
                  f"  metrics  {server.metrics_url}")
    # plain text on one line however narrow the terminal: it is pasted as a command (a path may hold [brackets])
    console.print(f"  try:     hub-vit classify --url {http_url} --model {name} {example}",
                  markup=False, highlight=False, soft_wrap=True)


def _example_image(origin: str) -> str:
    """A sample image of the served model folder for the `try:` line (the shipped model has some, wherever pip put
    it), else a placeholder."""
    samples = _samples_of(Path(origin))
    return shlex.quote(str(samples[0])) if samples else "IMAGE..."


def _samples_of(folder: Path) -> list[Path]:
    """A model folder's sample images (`samples/*.png`, as the shipped model has), sorted; none for anything else."""
    return sorted(folder.glob("samples/*.png")) if folder.is_dir() else []


def _not_served(http_url: str, name: str, headers: dict[str, str]) -> str | None:
    """Why `name` cannot be called on a server that reports ready (Triton is ready with no model at all: an empty or
    foreign `--repository`), or None when it can."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/models/{name}/ready", timeout=10):
            return None
    except urllib.error.HTTPError:
        pass
    try:
        request = urllib.request.Request(f"http://{http_url}/v2/repository/index", data=b"{}", method="POST",
                                         headers=headers)  # a restricted API: the server's control key opens it
        with urllib.request.urlopen(request, timeout=10) as reply:
            models = sorted({m["name"] for m in json.loads(reply.read()) if m.get("state") == "READY"})
    except (urllib.error.URLError, ValueError, KeyError, TypeError):
        models = []
    return (f"the server is up but serves no model {name!r}; models it serves: {', '.join(models) or 'none'} "
            "(an empty or foreign --repository? pass --name, or build one with hub-vit repository)")


def _existing_repository(folder: Path, *, model: str | None, **given: Any) -> str:
    """`serve --repository`: the repository is served as written, so options that would change it are refused
    (they used to be dropped without a word); returns the ensemble's name (from the manifest, else `--name`)."""
    from hub_vit.server.repository import MANIFEST

    if not folder.is_dir():
        raise fail(f"--repository {str(folder)!r} is {'a file' if folder.exists() else 'missing'}; give the folder "
                   "`hub-vit repository` wrote")
    changed = [f"--{key.replace('_', '-')}" for key, value in given.items()
               if key != "name" and value != _SERVE_DEFAULTS[key]]
    if model is not None:
        changed.insert(0, "MODEL")
    if changed:
        verb = "applies" if len(changed) == 1 else "apply"
        raise fail(f"{', '.join(changed)} only {verb} when serve builds the repository; --repository serves "
                   f"{str(folder)!r} as written (rebuild it with `hub-vit repository` to change it)")
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return given["name"]
    written = json.loads(manifest.read_text(encoding="utf-8"))
    if given["name"] != DEFAULTS.name and given["name"] != written["model"]:
        raise fail(f"--name {given['name']!r}: the repository serves {written['model']!r} (its manifest says so)")
    if written.get("options", {}).get("flavour") == "gpu":
        raise fail(f"{str(folder)!r} is a GPU-flavour repository (ONNX Runtime / TensorRT backends, KIND_GPU); the "
                   "local tritonserver has only the Python backend: regenerate it with --flavour cpu, or serve it "
                   "with the Dockerfile's image on a GPU host")
    _warn_if_outdated(folder, written)
    return str(written["model"])


def _warn_if_outdated(folder: Path, manifest: dict[str, Any]) -> None:
    """`serve --repository` serves what the folder holds: say so when that is not what this hub-vit would write for
    the same model and options (a repository written by an earlier version lacks its later fixes)."""
    from hub_vit import __version__
    from hub_vit.server.repository import MANIFEST, outdated_files

    outdated = outdated_files(folder)
    if not outdated:
        return
    shown = ", ".join(outdated[:3]) + (f" and {len(outdated) - 3} more" if len(outdated) > 3 else "")
    writer = f"hub-vit {manifest['hub_vit_version']}" if "hub_vit_version" in manifest else "an earlier hub-vit"
    err_console.print(f"[yellow]warning:[/] {escape(str(folder))} is not what this hub-vit ({__version__}) writes for "
                      f"its model and options (written by {escape(writer)}, or edited since): {escape(shown)} "
                      f"{'differs' if len(outdated) == 1 else 'differ'}. It is served as it is; rebuild it with "
                      f"`hub-vit repository` (its {MANIFEST} records the model and options) to serve this version's "
                      "configs and server code", soft_wrap=True)


def _start_demo(model: str | None, repository: bool, host: str, port: int, triton_url: str,
                triton_model: str) -> object:
    """The Gradio demo in a background thread, its labels taken from the server just started. It opens on the served
    model when it can run that model in-process (the default model, a folder, a registered name); an exported .onnx
    / .plan runs only on the server, so the page opens on the default model and says so next to Triton's labels.
    With --repository the demo cannot tell what is served."""
    try:
        from hub_vit.demo.app import start_in_background
    except ImportError as exc:
        raise fail(f"--demo needs gradio ({exc}); install it with: pip install 'hub-vit[demo]'") from exc
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
                                       served_name=served_name, host=host, port=port)
    except ValueError as exc:  # no model to show in-process
        raise fail(f"--demo: {exc}", code=1) from exc
    if served is not None:
        shown = f"shows {served.key}, the served model"
    elif served_name is not None:
        shown = (f"shows in-process models only: {served_name} runs on the server alone, so Triton's labels are not "
                 "those of the maps")
    else:
        shown = "shows in-process models; pick the one the repository serves"
    console.print(f"[bold green]demo[/]     http://{host}:{port}  (attention rollout; {escape(shown)}; its 'Labels "
                  "from' choice offers this server)", soft_wrap=True)
    return demo_app


@app.command()
def classify(
    images: list[Path] = typer.Argument(..., help="Image files (JPEG, PNG, WebP).", exists=True, dir_okay=False),
    url: str = typer.Option(None, help="host:port (default 127.0.0.1:8000, or :8001 with --grpc)."),
    grpc: bool = typer.Option(False, "--grpc", help="Use gRPC instead of HTTP."),
    model: str = typer.Option("vit", help="Served model name."),
    top: int = typer.Option(3, help="How many of the returned labels to print."),
    queue_timeout_ms: RequestQueueTimeoutMs = None,
    explain: bool = typer.Option(False, "--explain", help="Also ask the server for each image's attention-rollout "
                                 "map and write it as hub-vit rollout does: <image>_rollout.png in --out."),
    out: Path = typer.Option(Path("out"), "--out", "-o", help="Folder for the --explain overlay PNGs."),
    head_fusion: str = typer.Option(None, help="--explain: how the server fuses the heads: mean (default), max, "
                                    "min."),
    discard_ratio: float = typer.Option(None, help="--explain: share of the lowest attentions the server drops per "
                                        "row, in [0, 1) (default 0)."),
) -> None:
    """Classify images with a running server and print a table."""
    from hub_vit.atomic import file_in_the_way
    from hub_vit.paths import distinct_names
    from hub_vit.server.client import Classifier, explain_parameters

    if top < 1:  # checked before any request: 0 printed an empty table, a negative value sliced from the end
        raise fail(f"--top must be at least 1 (labels printed per image), got {top}")
    try:
        explain_parameters(explain, head_fusion, discard_ratio)
    except ValueError:
        raise fail("--head-fusion and --discard-ratio set the server's rollout map: add --explain") from None
    if explain:  # the server's rule, checked before any request (the overlays import torch anyway)
        from hub_vit.explain.rollout import HEAD_FUSIONS, check_discard_ratio

        if head_fusion is not None and head_fusion not in HEAD_FUSIONS:
            raise fail(f"unknown --head-fusion {head_fusion!r}; valid choices: {', '.join(HEAD_FUSIONS)}")
        try:
            check_discard_ratio(0.0 if discard_ratio is None else discard_ratio)
        except ValueError as exc:
            raise fail(f"--discard-ratio: {exc}") from None
    if explain and file_in_the_way(out) is not None:  # before any request
        raise fail(f"--out {str(out)!r} cannot be a folder: {str(file_in_the_way(out))!r} is a file")
    queue_timeout_s = _queue_timeout_s(queue_timeout_ms)
    url, protocol = _endpoint(url, grpc)
    request = {"explain": True, "head_fusion": head_fusion, "discard_ratio": discard_ratio} if explain else {}
    try:
        with Classifier(url, protocol=protocol, model=model) as client:
            predictions, errors = _classify_files(client, list(images), queue_timeout_s, **request)
    except ValueError as err:
        if not _empty_reply(err):  # a bad URL, ...
            raise fail(f"{protocol} {url}: {err}", code=1) from None
        raise fail(_request_failed(protocol, url, err), code=1) from None
    except Exception as err:  # refused, not Triton, the other protocol's port (HTTPParseError), unknown model, ...
        raise fail(_request_failed(protocol, url, err), code=1) from None
    if predictions:
        returned = min(len(prediction.labels) for prediction in predictions.values())
        if top > returned:  # said once, not per image; the server's top-k is fixed when its repository is built
            err_console.print(f"note: --top {top}, but the server returns {returned} labels per image (hub-vit serve "
                              "--top-k)", soft_wrap=True, emoji=False, markup=False, highlight=False)
        table = Table(title=f"{model} @ {url} ({protocol})")
        for column in ("image", "rank", "label", "score"):
            table.add_column(column, justify="right" if column in ("rank", "score") else "left")
        # a/x.png and b/x.png, not x.png twice; absolute, not resolved: a symlink keeps its own name (an HF snapshot
        # links three.png to a blob named by its hash)
        shown = distinct_names([image.absolute() for image in images])
        for index, prediction in sorted(predictions.items()):
            ranked = zip(prediction.labels[:top], prediction.scores[:top], strict=True)
            for rank, (label, score) in enumerate(ranked, 1):
                table.add_row(escape(shown[index]) if rank == 1 else "", str(rank), escape(label), f"{score:.4f}")
        console.print(table)
        if explain:
            _write_explained(list(images), predictions, out)
    for index, message in sorted(errors.items()):
        err_console.print(f"[bold red]error:[/] {escape(str(images[index]))}: {escape(message)}", soft_wrap=True,
                          emoji=False)
    if errors:
        raise typer.Exit(1)


def _queue_timeout_s(ms: float | None) -> float | None:
    """`--queue-timeout-ms` -> seconds for the client, checked by the client's own rule (`client.queue_timeout`) and
    refused in the flag's words."""
    from hub_vit.server.client import LONGEST_QUEUE_TIMEOUT_S, queue_timeout

    seconds = None if ms is None else ms / 1000
    try:
        queue_timeout(seconds)
    except ValueError:
        raise fail(f"--queue-timeout-ms must be a positive number of milliseconds, at most one day "
                   f"({LONGEST_QUEUE_TIMEOUT_S * 1000}), got {ms}") from None
    return seconds


def _write_explained(images: list[Path], predictions: dict[int, Any], out: Path) -> None:
    """`classify --explain`: the server's map of each classified image drawn on it, as `hub-vit rollout` draws its
    own (the same names, `<stem>_rollout.png`, colours and crop placement), one line per file written."""
    from hub_vit.atomic import missing_folders, remove_empty_folders
    from hub_vit.cli.explain import _save_overlay, output_stems
    from hub_vit.explain.image import ImageReadError, load_image
    from hub_vit.explain.overlay import blend

    stems = output_stems(images)
    created = missing_folders(out)  # removed again if no overlay gets written
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        remove_empty_folders(created)
        raise fail(f"cannot create --out {str(out)!r}: {exc.strerror or exc}") from None
    for index, prediction in sorted(predictions.items()):
        try:
            image = load_image(images[index], large=True)  # the server decoded it; a format only it reads is named
        except ImageReadError as exc:
            err_console.print(f"note: no overlay for {images[index]}: {exc}", soft_wrap=True, markup=False)
            continue
        target = out / f"{stems[index]}_rollout.png"
        _save_overlay(blend(image, prediction.rollout, prediction.rollout_box), target, created)
        console.print(f"{images[index]} -> {target}", markup=False, soft_wrap=True, highlight=False)


def _classify_files(client: Any, images: list[Path], queue_timeout_s: float | None = None,
                    **request: Any) -> tuple[dict[int, Any], dict[int, str]]:
    """`classify`: {position: prediction} for the files the server classified, {position: why not} for the others.
    Requests hold at most the model's max_batch_size files. The server refuses a request at its first bad file and
    names that file's index in the request: the file is set aside with the reason and the rest is sent again, so k
    bad files cost k more requests, the good files are still classified and each bad one is named by its path.
    A refusal that names no file (a file the client could not read) is resolved file by file. Other errors (no
    server, overload, unknown model) are raised: they are not about one file. `request`: more keywords for
    `Classifier.classify` (explain, head_fusion, discard_ratio)."""
    from hub_vit.server.client import split

    predictions: dict[int, Any] = {}
    errors: dict[int, str] = {}
    for offset, chunk in split(images, client.max_batch_size()):
        pending = list(enumerate(chunk, offset))  # (position in `images`, path) still to classify
        while pending:
            try:
                answers = client.classify([path for _, path in pending], queue_timeout_s=queue_timeout_s, **request)
                predictions.update(zip([position for position, _ in pending], answers, strict=True))
                break
            except Exception as err:
                failed = _failed_file(err, len(pending))
                if failed is not None:
                    index, message = failed
                    errors[pending.pop(index)[0]] = message
                    continue
                if _bad_file(err) is None:
                    raise
            for position, path in pending:  # a refusal that names no file
                try:
                    predictions[position] = client.classify([path], queue_timeout_s=queue_timeout_s, **request)[0]
                except Exception as err:
                    message = _bad_file(err)
                    if message is None:
                        raise
                    errors[position] = message
            break
    return predictions, errors


def _failed_file(err: Exception, count: int) -> tuple[int, str] | None:
    """(index in the request, reason) when the server refused one of the `count` files sent by naming it."""
    from hub_vit.server.client import failed_image

    failed = failed_image(err)
    return failed if failed is not None and failed[0] < count else None


def _bad_file(err: Exception) -> str | None:
    """The reason one file failed, when the error is about that file (sent alone, or read by the client); None when
    it is not about a file (no server, overload, ...)."""
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client import CLIENT_ERROR_STATUSES, failed_image

    if isinstance(err, InferenceServerException):
        if err.status() not in CLIENT_ERROR_STATUSES:
            return None
        failed = failed_image(err)  # "image 0: not an image: ...": the file's path replaces the prefix
        return failed[1] if failed is not None else " ".join((err.message() or str(err)).split())
    if isinstance(err, OSError) and err.filename is not None:  # unreadable (permissions, removed since the start);
        return f"cannot read the file: {err.strerror or err}"  # a socket error has no file name: not about a file
    if isinstance(err, ValueError):  # the client's own checks (e.g. not a regular file)
        return str(err)
    return None


@app.command()
def loadtest(
    images: list[Path] = typer.Argument(None, help="Images to cycle through (default: the shipped samples).",
                                        exists=True, dir_okay=False),
    url: str = typer.Option(None, help="host:port (default 127.0.0.1:8000, or :8001 with --grpc)."),
    grpc: bool = typer.Option(False, "--grpc", help="Use gRPC instead of HTTP."),
    model: str = typer.Option("vit", help="Served model name."),
    concurrency: int = typer.Option(4, help="Requests in flight at once."),
    duration: float = typer.Option(10.0, help="Seconds to run (ignored with --requests)."),
    requests: int = typer.Option(None, help="Stop after this many requests."),
    batch: int = typer.Option(1, help="Images per request."),
    json_out: Path = typer.Option(None, "--json", help="Also write the result as JSON here."),
    allow_errors: bool = typer.Option(False, "--allow-errors",
                                      help="Exit 0 even when requests failed (e.g. an overload test that expects "
                                           "rejections); by default any failed request makes the exit code 1."),
    queue_timeout_ms: RequestQueueTimeoutMs = None,
) -> None:
    """Closed-loop load test: throughput, p50/p90/p99 latency and server-side batching efficiency."""
    from hub_vit.server.loadtest import load_test

    queue_timeout_s = _queue_timeout_s(queue_timeout_ms)
    url, protocol = _endpoint(url, grpc)
    payloads = list(images) if images else _sample_images()
    if json_out is not None:  # checked first: the run's numbers must not be lost at the end
        _check_writable(json_out)
    try:
        result = load_test(url, payloads, protocol=protocol, model=model, concurrency=concurrency,
                           duration_s=duration, requests=requests, batch=batch, queue_timeout_s=queue_timeout_s)
    except ValueError as err:  # a bad setting (--batch above the model's limit, ...), unless the server's reply
        if not _empty_reply(err):
            raise fail(str(err)) from None
        raise fail(_request_failed(protocol, url, err), code=1) from None
    except Exception as err:  # connection refused, unknown model, ...
        raise fail(_request_failed(protocol, url, err), code=1) from None
    lat = result.latency_ms
    if result.interrupted:
        err_console.print("[yellow]interrupted (Ctrl-C):[/] the numbers cover the run until then")
    console.print(f"[bold]{result.requests}[/] requests ({result.errors} errors) in {result.seconds:.1f} s, "
                  f"concurrency {concurrency}, {protocol}: [bold]{result.throughput_rps:.1f} req/s[/], "
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
    if json_out is not None:
        try:
            json_out.write_text(result.to_json() + "\n")
        except OSError as err:
            raise fail(f"cannot write --json {str(json_out)!r}: {err}", code=1) from None
    if result.interrupted:  # reported and saved, but not a completed run: the shell's code for Ctrl-C
        raise typer.Exit(130)
    if not result.requests and not result.errors:  # nothing was sent: a number of 0 req/s would mean nothing
        raise fail(f"no request was sent: the --duration of {duration:g} s ended before the first one; give a "
                   "longer --duration", code=1)
    if result.errors and not allow_errors:  # a CI job must see a broken run (--allow-errors for overload tests)
        raise fail(f"{result.errors} of {result.errors + result.requests} requests failed (reasons above; "
                   "--allow-errors exits 0 anyway)", code=1)


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


def _endpoint(url: str | None, grpc: bool) -> tuple[str, str]:
    """`--url` / `--grpc` -> (url, protocol): a `grpc://` URL speaks gRPC without `--grpc`; an `http://` one with
    `--grpc` is refused (it names two protocols)."""
    from hub_vit.server.client import resolve_protocol

    if url is None:
        return ("127.0.0.1:8001", "grpc") if grpc else ("127.0.0.1:8000", "http")
    try:
        return url, resolve_protocol(url, "grpc" if grpc else None)
    except ValueError:  # the one contradiction left: http:// with --grpc
        raise fail(f"--url {url!r} is an HTTP address, but --grpc is given; give the gRPC address (host:port, "
                   f"default port 8001) or drop --grpc") from None


def _empty_reply(err: Exception) -> bool:
    """tritonclient's JSON parser failed on an empty reply: what Triton's metrics port (8002) answers to any path."""
    return "The document is empty" in str(err)


def _request_failed(protocol: str, url: str, err: Exception) -> str:
    """One readable line for a request that got no answer from the model: the error, shortened (aiohttp quotes the
    whole reply of a port that does not speak HTTP), and, unless Triton itself answered, where to look."""
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client import shed

    text = " ".join(str(err).split()).replace(" ssl:default ", " ")  # aiohttp says "ssl:default" for plain HTTP too
    if not text:  # aiohttp's timeout has no words of its own
        text = "no answer in time" if isinstance(err, TimeoutError) else type(err).__name__
    text = text if len(text) <= 240 else text[:240] + " ..."
    if shed(err):  # gRPC says UNAVAILABLE here too, as for no server at all: the hint below would mislead
        why = ("it waited in the server's queue longer than its queue timeout (--queue-timeout-ms, or the server's "
               "--queue-timeout-us)" if "Request timeout expired" in text
               else "the server's queue was full (its --max-queue-size)")
        return f"{protocol} {url}: {text}\nthe server is overloaded and shed this request: {why}; retry later"
    if isinstance(err, InferenceServerException) and err.status() not in (None, "StatusCode.UNAVAILABLE"):
        return f"{protocol} {url}: {text}"  # Triton answered (unknown model, bad input, ...): its words suffice
    names = {"http": "HTTP", "grpc": "gRPC"}
    this, other = names[protocol], names["http" if protocol == "grpc" else "grpc"]
    return (f"{protocol} {url}: {text}\nno {this} answer from {url}: is a server running there (hub-vit serve), and "
            f"is this its {this} port, not its {other} or metrics port? Defaults: HTTP 8000, gRPC 8001 (--grpc), "
            "metrics 8002.")


def _sample_images() -> list[Any]:
    """The shipped model's held-out samples if present, else a few synthetic PNGs."""
    from hub_vit.catalog import default_model_folder

    samples = _samples_of(default_model_folder())
    if samples:
        return samples
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)) for _ in range(4)]
