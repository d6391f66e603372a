"""`hub-vit repository`: write a Triton model repository for a model (configs generated from its metadata)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from hub_vit.cli.app import DISK_REFUSED_ERRNOS, app, as_flags, console, err_console, fail, given
from hub_vit.cli.path_option import given_path
from hub_vit.cli.serving_options import (
    DEFAULTS,
    MODEL_HELP,
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
    model_source,
    print_cpu_variant,
    serving_options,
)
from hub_vit.server.repository.options import DEVICES

Precision = Annotated[str, typer.Option(show_default=False,
                                        help=f"GPU flavour, TensorRT accelerator precision: FP16 or FP32 (default "
                                             f"{DEFAULTS.precision}). Not for --gpu-backend tensorrt: an engine's "
                                             "precision is fixed when it is built.")]
PreprocessInstances = Annotated[int, typer.Option(show_default=False,
                                                  help=f"GPU flavour: image-decoding and top-k instances (CPU "
                                                       f"processes; raise it so decoding keeps up with the GPU; "
                                                       f"default {DEFAULTS.preprocess_instances}). The CPU flavour "
                                                       "decodes in its --instances.")]
Spinning = Annotated[bool, typer.Option("--spinning/--no-spinning", show_default=False,
                                        help="CPU flavour: ORT threads spin between ops (lower latency; several "
                                             "instances then take turns on the cores). Default: on for a "
                                             "compute-bound model, off for a tiny one.")]

@app.command()
def repository(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="Folder to write the Triton model repository to.", parser=given_path),
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
    precision: Precision = None,
    name: Name = DEFAULTS.name,
    max_batch_size: MaxBatchSize = DEFAULTS.max_batch_size,
    max_queue_delay_us: MaxQueueDelayUs = DEFAULTS.max_queue_delay_us,
    max_queue_size: MaxQueueSize = DEFAULTS.max_queue_size,
    queue_timeout_us: QueueTimeoutUs = DEFAULTS.queue_timeout_us,
    queue_policy: QueuePolicy = DEFAULTS.queue_policy,
    top_k: TopK = DEFAULTS.top_k,
    instances: Instances = DEFAULTS.classifier_instances,
    preprocess_instances: PreprocessInstances = None,
    spinning: Spinning = DEFAULTS.ort_spinning,
    max_pixels: MaxPixels = DEFAULTS.max_pixels,
    cpu_variant: CpuVariant = "auto",
    overwrite: bool = typer.Option(False, help="Replace an existing folder."),
) -> None:
    """Write a Triton model repository (config.pbtxt files generated from the model's metadata)."""
    from hub_vit.server.repository.writer import write_repository
    from hub_vit.server.runtime.workspace import unservable_path_message

    _check_flavour_flags(ctx, flavour, gpu_backend, preprocess_instances, spinning, precision)
    opts = serving_options(ctx, **{"name": name, "flavour": flavour, "gpu_backend": gpu_backend,
                       "precision": precision or DEFAULTS.precision, "max_batch_size": max_batch_size,
                       "max_queue_delay_us": max_queue_delay_us, "max_queue_size": max_queue_size,
                       "queue_timeout_us": queue_timeout_us, "queue_policy": queue_policy, "top_k": top_k,
                       "classifier_instances": instances,
                       "preprocess_instances": (DEFAULTS.preprocess_instances if preprocess_instances is None
                                                else preprocess_instances),
                       "ort_spinning": spinning, "max_pixels": max_pixels, "device": device,
                       "cuda_graphs": cuda_graphs, "torch_compile": torch_compile, "decode_threads": decode_threads,
                       "cpu_variant": cpu_variant})
    try:
        path = write_repository(model_source(model), out, opts, overwrite=overwrite)
    except (ValueError, FileExistsError, NotADirectoryError) as err:
        raise fail(as_flags(str(err))) from None
    except OSError as err:
        if err.errno in DISK_REFUSED_ERRNOS:  # named by OUT, not by the hidden staging file the disk refused
            raise fail(f"cannot write the Triton repository to {str(out)!r}: {err.strerror or err}; nothing was "
                       "written", code=1) from None
        if err.filename is None or Path(err.filename) != out.expanduser().resolve():  # not OUT: main's safety net
            raise
        # the folder cannot be made where OUT says (forbidden, or a parent that cannot hold one, e.g. under /proc or
        # /sys), found before any work: the path typed
        raise fail(f"cannot create OUT {str(out)!r}: {err.strerror or err}; nothing was written") from None
    where = f", device {opts.device}" if opts.flavour == "torch" else ""
    console.print(f"wrote Triton repository [bold]{escape(str(path))}[/] (model [bold]{name}[/], flavour {flavour}"
                  f"{where})", soft_wrap=True)
    print_cpu_variant(path)
    unservable = unservable_path_message(path)
    if unservable:  # a GPU host mounts it elsewhere (docker -v ...:/models); `hub-vit serve --repository` here cannot
        err_console.print(f"[yellow]note:[/] {escape(unservable)} (`hub-vit serve --repository` refuses it; a "
                          "container that mounts it at another path is fine)", soft_wrap=True)


def _check_flavour_flags(ctx: typer.Context, flavour: str, gpu_backend: str, preprocess_instances: int | None,
                         spinning: bool | None, precision: str | None) -> None:
    """Flags that set another flavour's (or backend's) steps are refused, naming the flag that does apply."""
    if preprocess_instances is not None and flavour == "cpu":
        raise fail("--preprocess-instances sets the GPU flavour's decoding and top-k steps; the CPU flavour decodes in "
                   "each classifier instance: use --instances")
    if spinning is not None and flavour != "cpu":
        runs = "PyTorch" if flavour == "torch" else "Triton's own ONNX Runtime / TensorRT backends"
        raise fail(f"--spinning/--no-spinning sets the CPU flavour's ONNX Runtime threads; the {flavour} flavour "
                   f"runs {runs}")
    gpu_given = [flag for flag, key in (("--gpu-backend", "gpu_backend"), ("--precision", "precision"))
                 if given(ctx, key)]
    if gpu_given and flavour != "gpu":  # was: written into a CPU repository's manifest, and nothing else
        raise fail(f"{', '.join(gpu_given)} set{'s' if len(gpu_given) == 1 else ''} the GPU flavour's backend; pass "
                   f"--flavour gpu (the {flavour} flavour has none)")
    if precision is not None and gpu_backend == "tensorrt":
        raise fail("--precision sets the TensorRT accelerator of --gpu-backend onnxruntime; a TensorRT engine's "
                   "precision is fixed when it is built (hub-vit export tensorrt --fp16/--fp32)")
    torch_given = [flag for flag, key in (("--cuda-graphs", "cuda_graphs"), ("--torch-compile", "torch_compile"),
                                          ("--decode-threads", "decode_threads")) if given(ctx, key)]
    if torch_given and flavour != "torch":
        raise fail(f"{', '.join(torch_given)} set{'s' if len(torch_given) == 1 else ''} the torch flavour; pass "
                   "--flavour torch (the cpu and gpu flavours run ONNX Runtime / TensorRT)")
