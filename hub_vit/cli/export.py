"""`hub-vit export onnx|tensorrt`: verified ONNX variants and TensorRT engines (docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from hub_vit.atomic import cannot_create, file_in_the_way
from hub_vit.cli.app import (
    CANNOT_NOW,
    DISK_REFUSED_ERRNOS,
    app,
    console,
    download_failed,
    err_console,
    fail,
    given,
    in_flag_words,
)
from hub_vit.cli.path_option import given_path
from hub_vit.cli.tables import print_table
from hub_vit.export import registry
from hub_vit.export.plan import ALL

COUNT_FLAGS = {"n_random": "--random-inputs", "n_photos": "--photos", "n_calibration": "--calibration"}
export_app = typer.Typer(help="Export a model to ONNX (verified variants) or TensorRT.", no_args_is_help=True)
app.add_typer(export_app, name="export")


def _print_variants(report: object) -> None:
    """One row per variant tried: written or not, size, the verification's worst numbers, fused ops, verdict."""
    from hub_vit.export.criterion import top1_text

    rows = []
    for o in report.variants:  # type: ignore[attr-defined]
        v = o.verification or {}
        fused = " ".join(f"{k.replace('Normalization', 'Norm')}:{n}" for k, n in o.fused_ops.items() if n) or "-"
        rows.append((o.variant, "yes" if o.written else "no", f"{o.size_bytes / 2**20:.1f}" if o.size_bytes else "-",
                     f"{v['max_abs_diff']:.2e}" if v else "-", _min_cosine(v), top1_text(v) if v else "-", fused,
                     "passed" if o.written else "not built" if o.error.startswith("not built") else "refused"))
    title = f"hub-vit export -> {report.out_dir}"  # type: ignore[attr-defined]
    print_table(("variant", "written", "MiB", "max |diff|", "min cos", "top-1", "fused ops", "note"), rows,
                title=title, right=("MiB", "max |diff|", "min cos"),
                styles={"written": {"yes": "green", "no": "red"}}, wrap=("variant", "top-1", "fused ops", "note"))


def _min_cosine(verification: dict) -> str:
    """The worst image's cosine similarity with fp32, logits or pre-logits features, whichever is lower."""
    worst = [value for key, value in (verification.get("worst") or {}).items() if key.endswith("_min_cosine")]
    return f"{min(worst):.4f}" if worst else "-"


def _warn_random_weights(name: str, pretrained: bool | None) -> None:
    """Say plainly that the export holds random weights, and how to get published ones."""
    why = "--random was given" if pretrained is False else "a bare name without a pretrained tag"
    err_console.print(f"[yellow]note:[/] exporting {escape(name)} with RANDOM weights ({why}); for published "
                      f"weights name a tag (`hub-vit models` lists them, e.g. simplevit_s16.i1k_300ep) or pass "
                      "--pretrained", soft_wrap=True)


def _print_replaced(report: object) -> None:
    """Name what this export did to the earlier one in the folder: graphs it removed, engines now out of date."""
    removed = report.removed  # type: ignore[attr-defined]
    if removed:
        console.print(f"removed from the earlier export in this folder (not part of this one): {', '.join(removed)}",
                      markup=False, soft_wrap=True)
    for engine in report.stale_engines:  # type: ignore[attr-defined]
        err_console.print(f"[yellow]note:[/] {escape(engine)} was built from the earlier export's graph; rebuild it "
                          "with `hub-vit export tensorrt` before serving it", soft_wrap=True)


@export_app.command("onnx")
def onnx_cmd(
    ctx: typer.Context,
    source: str = typer.Argument(..., help="Registered name (vit_s16, simplevit_s16.i1k_300ep), a hub-vit model "
                                           "folder (hf-hub:ORG/NAME: one on the Hugging Face Hub), or a weights file "
                                           "(.safetensors/.npz/.pt) with --model."),
    out: Path = typer.Option(Path("exports"), "-o", "--out", help="Output folder.", parser=given_path),
    model_name: str = typer.Option(None, "--model", help="Architecture for a weights file, e.g. vit_s16."),
    variant: list[str] = typer.Option(
        list(registry.names(default=True)), "-v", "--variant",
        help=f"Variant(s) to write: {registry.help_text()}; or '{ALL}': every variant this host can build and gains "
             "from (the others are listed as not built; a refusal of one of them is reported, and fails the command "
             "only for fp32, which every other variant is built from, or a variant also named). Repeatable."),
    attentions: bool = typer.Option(False, "--attentions", help="Also write <stem>.attentions.onnx (attention maps)."),
    dynamic_size: bool = typer.Option(False, help="Symbolic height/width (a learned position embedding is "
                                      "resampled in the graph; dynamo exporter)."),
    dynamic_batch: bool = typer.Option(True, help="Symbolic batch axis (default), or a graph fixed to batch 1."),
    opset: int = typer.Option(17, help="ONNX opset (>= 17)."),
    exporter: str = typer.Option("dynamo", help="torch.onnx exporter: dynamo (fuses fully) or torchscript."),
    pretrained: bool = typer.Option(None, "--pretrained/--random",
                                    help="Registered names: load published weights (download) or keep random "
                                         "weights. Default: a name.tag loads that tag's weights; a bare name loads "
                                         "bundled weights if the package ships them, else random."),
    random_inputs: int = typer.Option(16, help="Fresh random images in the verification set."),
    photos: int = typer.Option(32, help="Real photo crops (scikit-image) in the verification set."),
    calibration: int = typer.Option(32, help="Calibration images (noise + photo crops) for int8-static."),
    images: Path = typer.Option(None, help="Folder of in-domain images, prepared by the model's own transform: half "
                                           "join the verification set (top-1 is judged on them), half the int8 "
                                           "calibration. Default: the held-out images the model folder names "
                                           "(training.json), if any.", parser=given_path),
    images_limit: int = typer.Option(512, help="Use at most this many files from --images (0: all of them)."),
    seed: int = typer.Option(None, help="Seed of the verification set (default: fresh)."),
    provider: list[str] = typer.Option(None, help="onnxruntime execution provider(s) for verification."),
    stem: str = typer.Option("model", help="File name stem: <stem>.onnx, <stem>.<variant>.onnx, ..."),
) -> None:
    """Export to ONNX, verify every variant against PyTorch, write only the ones that pass (+ a JSON report)."""
    from hub_vit.conversion.download import DownloadError
    from hub_vit.export import load_source
    from hub_vit.export.metadata import model_metadata
    from hub_vit.export.own_images import verification_set
    from hub_vit.export.plan import VerificationSet
    from hub_vit.export.variants import export_variants

    counts = dict(n_random=random_inputs, n_photos=photos, n_calibration=calibration, seed=seed)
    if images_limit < 0:
        raise fail(f"--images-limit must be >= 0 (0: all of them), got {images_limit}")
    try:  # validate everything cheap before building a model
        plan = _checked_flags(variant, given(ctx, "variant"), stem, opset, exporter, out, provider,
                              dynamic_batch=dynamic_batch, dynamic_size=dynamic_size, attentions=attentions)
        try:  # the counts' own check, before the model is built
            VerificationSet(**counts)
        except ValueError as exc:
            raise ValueError(in_flag_words(str(exc), COUNT_FLAGS, COUNT_FLAGS)) from None
        src = load_source(source, model_name=model_name, pretrained=pretrained)
        check = verification_set(src, images=images, limit=images_limit, **counts)
        console.print(f"exporting [bold]{escape(src.name)}[/] ({src.kind}, weights: {escape(src.weights)}) -> "
                      f"{escape(str(out))}", soft_wrap=True)
        if src.random_weights:
            _warn_random_weights(src.name, pretrained)
        if check.note:
            err_console.print(f"[yellow]note:[/] {escape(check.note)}", soft_wrap=True)
        report = export_variants(src.module, out, plan, check, source=src.describe(),
                                 metadata=model_metadata(src.module, src.labels, src.pretrained_cfg))
    except OSError as exc:
        # the disk refused the files after the work began: exit 1, as for a write that fails (not bad input), named
        # by the folder asked for, not by the hidden staging file inside it
        if exc.errno in DISK_REFUSED_ERRNOS:
            raise fail(f"cannot write the export to {str(out)!r}: {exc.strerror or exc}", code=1) from None
        if isinstance(exc, (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError)):
            raise fail(str(exc)) from None
        raise
    except DownloadError as exc:  # a registered name's checkpoint, offline: exit CANNOT_NOW
        raise download_failed(exc) from None
    except (ValueError, TypeError, RuntimeError) as exc:
        raise fail(str(exc)) from None
    _print_outcomes(report)
    refused = [o.variant for o in report.refused()]
    passed_by = [o.variant for o in report.variants if not o.written and not o.required]
    if passed_by:
        chose = f"'{ALL}'" if ALL in variant else "default"
        err_console.print(f"[yellow]not written:[/] {', '.join(passed_by)} (tried or left out as {chose} variants, "
                          "not named; reasons in the table and the report)", soft_wrap=True)
    if refused:
        err_console.print(f"[red]not written:[/] {', '.join(refused)} (reasons in the table and the report)",
                          soft_wrap=True)
        raise typer.Exit(1)


def _checked_flags(variant: list[str], named: bool, stem: str, opset: int, exporter: str, out: Path,
                   provider: list[str] | None, **how: bool) -> Any:
    """The export plan (`named`: --variant was given; else its defaults, of which only fp32 is required); ValueError
    naming the first bad flag (all of them cheap to check)."""
    from hub_vit.export.onnx_export import MIN_OPSET
    from hub_vit.export.plan import ExportPlan, VariantChoiceError

    try:
        plan = ExportPlan.of(variant if named else None, stem=stem, opset=opset, exporter=exporter,
                             providers=provider or None, **how)
    except VariantChoiceError as exc:  # the CLI also takes "all" for --variant (only there: --exporter has no "all")
        raise ValueError(f"{exc}, or {ALL}") from None
    if opset < MIN_OPSET:
        raise ValueError(f"--opset must be >= {MIN_OPSET}, got {opset}")
    # named, so required: refused before the export, not reported after it with exit 1
    registry.check_buildable([name for name in plan.variants if plan.required(name)], plan.host)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a folder")
    if out.suffix.lower() == ".onnx" and not out.is_dir():  # torch.onnx.export's habit: -o names the file
        raise ValueError(f"--out {str(out)!r} names an .onnx file, but export onnx writes a folder ({stem}.onnx, its "
                         f"other variants and {stem}.export.json); give a folder, e.g. -o "
                         f"{str(out.with_suffix(''))!r}, and --stem {out.stem!r} to name the files {out.stem}.onnx ...")
    blocker = file_in_the_way(out)
    if blocker is not None:  # found before the export, not after it (minutes on a large model)
        raise ValueError(f"--out {str(out)!r} cannot be a folder: {str(blocker)!r} is a file")
    problem = cannot_create(out)
    if problem is not None:
        raise ValueError(f"cannot create --out {str(out)!r}: {problem}")  # as rollout, classify, repository say it
    if provider:
        from hub_vit.export.verify import check_providers

        check_providers(provider)  # a typo or missing GPU build must not cost a model build and leave a report
    return plan


def _print_outcomes(report: Any) -> None:
    _print_variants(report)
    for o in report.variants:
        passed = (o.verification or {}).get("extra", {}).get("summary", "")
        outcome = f"[red]not written[/] - {escape(o.error)}" if o.error else \
            escape(str(o.file)) + (f" ({escape(passed)})" if passed else "")
        console.print(f"  {o.variant}: {outcome}", soft_wrap=True)
    console.print(f"report: {report.report_file}", markup=False, soft_wrap=True)
    _print_replaced(report)


@export_app.command("tensorrt")
def tensorrt_cmd(
    onnx_file: Path = typer.Argument(..., help="fp32 ONNX graph from `hub-vit export onnx` (fixed image size).",
                                     parser=given_path),
    out: Path = typer.Option(None, "-o", "--out", help="Engine file (default: <onnx stem>.plan beside the ONNX).",
                             parser=given_path),
    fp16: bool = typer.Option(True, "--fp16/--fp32", help="fp16 engine (LayerNorm/Softmax kept fp32) or fp32."),
    min_batch: int = typer.Option(1, help="Optimization profile: smallest batch."),
    opt_batch: int = typer.Option(8, help="Optimization profile: batch TensorRT tunes for."),
    max_batch: int = typer.Option(32, help="Optimization profile: largest batch (>= Triton max_batch_size)."),
    workspace_gib: float = typer.Option(4.0, help="Builder workspace limit in GiB."),
    seed: int = typer.Option(None, help="Seed of the verification set (default: fresh)."),
) -> None:
    """Build a TensorRT engine, verify it against ONNX Runtime and record GPU / version / profile beside it."""
    from hub_vit.cli.serving_options import in_flag_words
    from hub_vit.export.tensorrt import BatchProfile, TensorRTUnavailable, export_tensorrt

    # export_tensorrt checks the file, the paths and the numbers before it looks for TensorRT and a GPU: a mistake
    # is named on any machine, and a machine that cannot build engines is told so at once, before any work
    try:
        profile = BatchProfile(min_batch, opt_batch, max_batch)
        engine = out or onnx_file.with_suffix(".plan")
        info = export_tensorrt(onnx_file, engine, fp16=fp16, profile=profile, workspace_gib=workspace_gib, seed=seed)
    except TensorRTUnavailable as exc:
        raise fail(str(exc), code=CANNOT_NOW) from None
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, RuntimeError) as exc:
        raise fail(in_flag_words(str(exc), ("workspace_gib",))) from None
    v = info["verification"]
    console.print(f"engine {engine} ({info['precision']}, TensorRT {info['tensorrt']}, {info['gpu']}): "
                  f"max |diff| vs ORT {v['max_abs_diff']:.2e}, top-1 agreement {v['top1_agreement']:.1%}",
                  markup=False, soft_wrap=True)  # a path with [brackets] is text, not markup
