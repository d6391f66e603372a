"""Flags `hub-vit repository` and `hub-vit serve` share, declared once, and the checks that turn them into
`ServingOptions` in the flags' own words."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from hub_vit.cli.app import CANNOT_NOW, console, download_status, fail, given
from hub_vit.cli.app import in_flag_words as flag_words
from hub_vit.export import registry
from hub_vit.server.repository.options import CUDA_DEFAULTS, DEVICES, QUEUE_POLICY_FIELDS, ServingOptions

MODEL_HELP = ("Registered name, hub-vit model folder (hf-hub:ORG/NAME: one on the Hugging Face Hub), or exported "
              ".onnx/.plan file (default: the shipped model).")
SERVE_MODEL_HELP = ("Registered name, hub-vit model folder (hf-hub:ORG/NAME: one on the Hugging Face Hub), or exported "
                    ".onnx file (default: the shipped model). A "
                    "TensorRT engine is served by the GPU container: hub-vit repository --flavour gpu.")
DEFAULTS = ServingOptions()  # every repository default below comes from here (a test compares the configs)



def _on_cuda(key: str) -> str:
    """The help's word on an option whose default is GPU-sized on cuda (CUDA_DEFAULTS, `device_fields`): the [default]
    typer shows is the CPU's."""
    return f" On --device cuda: {CUDA_DEFAULTS[key]} unless given."


# Options `repository` and `serve` share, declared once.
Name = Annotated[str, typer.Option(help="Name clients call (the ensemble).")]
MaxBatchSize = Annotated[int, typer.Option(help="Largest batch one execution runs." + _on_cuda("max_batch_size"))]
MaxQueueDelayUs = Annotated[int, typer.Option(help="How long the dynamic batcher waits to fill a batch.")]
MaxQueueSize = Annotated[int, typer.Option(help="Queued requests per step beyond which new ones are rejected. On "
                                                f"--device cuda: {CUDA_DEFAULTS['max_queue_size']} with "
                                                "--queue-policy.")]
QueueTimeoutUs = Annotated[int, typer.Option(help="Longest a request may wait in a step's queue before it is rejected "
                                                  "(0: no limit; a client may ask for less per request).")]
QueuePolicy = Annotated[bool, typer.Option("--queue-policy/--no-queue-policy",
                                           show_default=False,
                                           help="Triton's queue policy: the queue bound (--max-queue-size) and queue "
                                                "timeouts (--queue-timeout-us, clients' per-request ones). Without "
                                                "it Triton's batcher prefetches batches, and no free instance waits "
                                                "up to 500 ms for work; the queue is then bounded by the front's "
                                                "connections, and requests that carry a queue timeout are refused. "
                                                "Default: on, except on cuda unless --max-queue-size or "
                                                "--queue-timeout-us is given.")]
TopK = Annotated[int, typer.Option(help="Labels and scores returned per image.")]
CpuVariant = Annotated[str, typer.Option(help="CPU flavour: the graph served: 'auto' (the fastest variant on this "
                                               "host that passes verification, measured at build time) or one of "
                                               f"{registry.help_text(cpu=True)} (still verified).")]
MaxPixels = Annotated[int, typer.Option(help="Most pixels an image may declare (larger ones are refused before "
                                             "decoding; 48 MP phone photos need more than the default).")]
# `serve --repository` refuses these when they differ from the defaults: they would not change the repository.
SERVE_DEFAULTS = {key: getattr(DEFAULTS, key)
                   for key in ("max_batch_size", "max_queue_delay_us", "max_queue_size", "queue_timeout_us",
                               "queue_policy", "top_k", "max_pixels")}


# The torch flavour's options, shared by `repository` and `serve`.
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs",
                                          help="Torch flavour on cuda: one CUDA graph per batch bucket, captured "
                                               "before the server reports ready.")]
TorchCompile = Annotated[bool, typer.Option("--torch-compile/--no-torch-compile",
                                            help="Torch flavour on cuda: torch.compile the model before capturing "
                                                 "(compiles every bucket while loading: minutes).")]
DecodeThreads = Annotated[int, typer.Option(help="Torch flavour: threads per instance for the CPU's share of the "
                                                 "images (the JPEG scan checks; PNG, WebP and JPEGs the device does "
                                                 "not decode) (0: the cores shared among the instances).")]
Instances = Annotated[int, typer.Option(help="Classifier instances, each decoding its batch while another computes "
                                             "(CPU flavour: each runs ONNX Runtime; torch flavour: each holds the "
                                             "model and its CUDA graphs); two keep Triton's batcher from stalling."
                                             + _on_cuda("classifier_instances"))]
_CUDA_SIZED = ("max_batch_size", "max_queue_delay_us", "max_queue_size")


def device_fields(ctx: typer.Context, device: str, max_batch_size: int) -> dict[str, Any]:
    """The ServingOptions fields that depend on the device: on cuda, the GPU-sized CUDA_DEFAULTS for each of
    max_batch_size / max_queue_delay_us / max_queue_size / --instances left at its default on the command line, and
    preferred batch sizes to match, and no queue policy unless --queue-policy or an option only the policy applies
    (--max-queue-size, --queue-timeout-us) is given; on cpu, the preferred sizes of today."""
    if device != "cuda":
        return {"preferred_batch_sizes": preferred(max_batch_size)}
    fields = {key: CUDA_DEFAULTS[key] for key in _CUDA_SIZED if not given(ctx, key)}
    if not any(given(ctx, key) for key in ("queue_policy", *QUEUE_POLICY_FIELDS)):
        fields["queue_policy"] = CUDA_DEFAULTS["queue_policy"]
    if not given(ctx, "instances"):  # the flag's name for classifier_instances
        fields["classifier_instances"] = CUDA_DEFAULTS["classifier_instances"]
    largest = int(fields.get("max_batch_size", max_batch_size))
    sizes = tuple(s for s in CUDA_DEFAULTS["preferred_batch_sizes"] if s <= largest)  # type: ignore[union-attr]
    return fields | {"preferred_batch_sizes": sizes or (largest,)}


# ServingOptions fields as the CLI spells them, so a validation error names the flag the user typed.
_FLAGS = {"classifier_instances": "--instances", "ort_spinning": "--spinning", "cpu_variant": "--cpu-variant"}


def serving_options(ctx: typer.Context, **fields: Any) -> ServingOptions:
    """`ServingOptions` from the flags' values, with the device's fields (`device_fields`: on cuda, GPU-sized batching
    for every size left at its default) taking the place of the defaults; a bad value is refused in the flags' words.
    Both `repository` and `serve` build their options here, so a field cannot be passed twice."""
    if not fields.get("queue_policy", True):
        applied = [f"--{key.replace('_', '-')}" for key in QUEUE_POLICY_FIELDS if given(ctx, key)]
        if applied:
            raise fail(f"{' and '.join(applied)} {'is' if len(applied) == 1 else 'are'} applied by Triton's queue "
                       "policy, which --no-queue-policy leaves out: give one or the other")
    device = fields.get("device", DEFAULTS.device)
    flavour = fields.get("flavour", DEFAULTS.flavour)
    if given(ctx, "cpu_variant") and flavour != "cpu":  # was: recorded in the manifest of a repository that has none
        on = f" on {device}" if flavour == "torch" else ""
        raise fail(f"--cpu-variant chooses the CPU flavour's ONNX graph; the {flavour} flavour{on} has none: pass "
                   "--flavour cpu, or leave --cpu-variant out")
    on_cuda_only = [flag for flag, key in (("--cuda-graphs", "cuda_graphs"), ("--torch-compile", "torch_compile"))
                    if fields.get(key) and given(ctx, key)]
    if on_cuda_only and device != "cuda":  # the torch flavour on the CPU runs eagerly: they were accepted and ignored
        raise fail(f"{' and '.join(on_cuda_only)} appl{'ies' if len(on_cuda_only) == 1 else 'y'} on --device cuda; "
                   f"the torch flavour on {device} runs the model eagerly")
    fields |= device_fields(ctx, device if device in DEVICES else "cpu", fields.get("max_batch_size",
                                                                                   DEFAULTS.max_batch_size))
    try:
        return ServingOptions(**fields)
    except ValueError as err:
        raise fail(in_flag_words(str(err), fields)) from None


def in_flag_words(message: str, fields: Iterable[str]) -> str:
    """A library message about `fields` read on the command line: each field name outside the quoted values becomes
    its flag (`max_queue_size` -> `--max-queue-size`); the user's own values are quoted (`!r`) and kept as typed."""
    return flag_words(message, fields, _FLAGS)


def model_source(model: str | None) -> Any:
    from hub_vit.resolve import locate, resolve_model

    try:
        return resolve_model(locate(model, names_architecture=False))  # repository has no flag for one
    except Exception as err:
        refusal = load_refusal(err, model)
        if refusal is None:
            raise
        raise fail(*refusal) from None


def model_reference(model: str | None) -> Any:
    """What `model` names, checked without loading it (`resolve.locate`: torch is not imported)."""
    from hub_vit.resolve import locate

    try:
        return locate(model, names_architecture=False)  # serve and repository have no flag for one
    except (ValueError, KeyError, ImportError) as err:
        raise fail(str(err)) from None


def load_refusal(err: Exception, model: str | None) -> tuple[str, int] | None:
    """The message and exit status of a model that cannot be loaded (`resolve_model`'s error `err`); None for an
    error that is not the model's (a bug: its traceback stays)."""
    from hub_vit.conversion.download import DownloadError
    from hub_vit.network import HubUnreachableError

    if isinstance(err, DownloadError):  # a registered name whose checkpoint cannot be downloaded
        return f"cannot load model {model!r}: {err}", download_status(err)
    if isinstance(err, HubUnreachableError):  # names the model already; nothing is wrong with it: not now (exit 3)
        return str(err), CANNOT_NOW
    if isinstance(err, (ValueError, KeyError, ImportError)):
        return str(err), 2
    if isinstance(err, (OSError, RuntimeError)):  # e.g. weights that cannot be read
        return f"cannot load model {model!r}: {err}", 1
    return None


def preferred(max_batch_size: int) -> tuple[int, ...]:
    return tuple(s for s in (4, 8, 16, 32, 64) if s <= max_batch_size) or (max_batch_size,)


def torch_fields(flavour: str, cuda_graphs: bool, torch_compile: bool, decode_threads: int) -> dict[str, Any]:
    return {"cuda_graphs": cuda_graphs, "torch_compile": torch_compile, "decode_threads": decode_threads} \
        if flavour == "torch" else {}



def print_cpu_variant(repository_dir: Path) -> None:
    """One line: which graph the CPU flavour serves and why (from the repository manifest; nothing for others)."""
    from hub_vit.server.repository.manifest import cpu_variant_line

    line = cpu_variant_line(repository_dir)
    if line:
        console.print(escape(line), soft_wrap=True, highlight=False)
