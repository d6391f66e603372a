"""`hub-vit convert`: a Google JAX checkpoint (vit_jax or big_vision `.npz`) -> a hub-vit model folder."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from hub_vit.cli.app import app, as_flags, console, download_failed, fail
from hub_vit.cli.path_option import given_path


def parse_img_size(text: str | None) -> int | tuple[int, int] | None:
    """`224` -> 224; `48x64` -> (48, 64) (height x width)."""
    if text is None:
        return None
    parts = text.lower().split("x")
    if len(parts) in (1, 2) and all(p.strip().isdigit() and int(p) > 0 for p in parts):
        sizes = [int(p) for p in parts]
        return sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])
    raise ValueError(f"--img-size must be N or HEIGHTxWIDTH (e.g. 384 or 48x64), got {text!r}")


@app.command()
def convert(
    source: str = typer.Argument(..., help="Local .npz, gs:// or https:// URL, big_vision vanity name "
                                           "(i1k-s16-300ep) or hub-vit catalog name (vit_b16.augreg_in21k_ft_in1k)."),
    out: Path = typer.Option(..., "-o", "--out", help="Output model folder (must not exist unless --overwrite).",
                             parser=given_path),
    variant: str = typer.Option(None, help="Expected big_vision variant, e.g. S/16; an error if the file differs."),
    img_size: str = typer.Option(None, help="Image size N or HxW; learned position embeddings are resampled."),
    num_classes: int = typer.Option(None, help="Class count: a count other than the checkpoint's drops its head for "
                                    "a new zero-initialised one (0: no head); the checkpoint's own count keeps it, as "
                                    "timm does."),
    pre_logits: bool = typer.Option(True, "--keep-pre-logits/--drop-pre-logits",
                                    help="Keep the checkpoint's tanh pre-logits layer (default) or drop it."),
    verify: bool = typer.Option(False, help="Without reference outputs, run the self-consistency check and print its "
                                "report. When reference outputs are found, the comparison always runs (also with "
                                "--no-verify), is printed, and stops a conversion that fails it."),
    reference: Path = typer.Option(None, help="Reference outputs (*.io.npz); default: <name>.io.npz beside SRC.",
                                   parser=given_path),
    overwrite: bool = typer.Option(False, help="Replace an existing output folder."),
    timeout: float = typer.Option(15.0, help="Network timeout in seconds for downloads."),
) -> None:
    """Convert a vit_jax / big_vision checkpoint to a folder that timm and transformers both load."""
    from hub_vit.cli.serving_options import in_flag_words
    from hub_vit.conversion.download import DownloadError, check_timeout
    from hub_vit.conversion.npz_reader import CheckpointFormatError
    from hub_vit.conversion.verify import format_report
    from hub_vit.conversion.writer import OutputWriteError, ParityError, convert_to_folder

    try:
        size = parse_img_size(img_size)
        if num_classes is not None and num_classes < 0:
            raise ValueError(f"--num-classes must be >= 0 (0 = no head), got {num_classes}")
        try:
            check_timeout(timeout)
        except ValueError as exc:
            raise ValueError(in_flag_words(str(exc), ("timeout",))) from None
        result = convert_to_folder(source, out, variant=variant, img_size=size, num_classes=num_classes,
                                   drop_pre_logits=not pre_logits, reference=reference, verify=verify,
                                   overwrite=overwrite, timeout=timeout)
    except OutputWriteError as exc:  # read-only or full disk: the work was done, writing it failed (exit 1, not 2)
        raise fail(str(exc), code=1) from None
    except DownloadError as exc:
        raise download_failed(exc) from None
    except (ValueError, KeyError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError,
            CheckpointFormatError, ParityError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise fail(as_flags(message)) from None
    conv = result.conversion
    # escaped: the layout names the checkpoint's own key prefix, which may hold [brackets]
    console.print(f"[bold]layout[/]: {escape(conv.layout.describe())}", soft_wrap=True)
    spec = conv.spec
    console.print(f"[bold]model[/]: {escape(result.architecture)} ({escape(spec.variant or 'custom size')}, posemb "
                  f"{spec.posemb}, pool {spec.pool_type}, pre-logits {spec.rep_size or 'none'}, {spec.num_classes} "
                  f"classes, {spec.img_size[0]}x{spec.img_size[1]})", soft_wrap=True)
    for note in conv.notes:
        console.print(f"  note: {note}", soft_wrap=True, markup=False)
    if verify or result.parity.mode == "reference":
        console.print(format_report(result.parity), highlight=False, markup=False, soft_wrap=True)
    # soft-wrapped: a script reading `wrote (.*)` from a pipe (80 columns) must get the whole path on one line
    console.print(f"[green]wrote[/] {escape(str(result.path))}", soft_wrap=True)
