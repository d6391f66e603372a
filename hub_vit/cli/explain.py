"""`hub-vit rollout IMAGE... -o out/` (overlay PNGs + top-5 labels) and `hub-vit demo` (the Gradio app)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from hub_vit.atomic import cannot_write_in, file_in_the_way, missing_folders, remove_empty_folders
from hub_vit.cli.app import app, console, err_console, fail, write_failed
from hub_vit.cli.path_option import given_path
from hub_vit.host import install_extra
from hub_vit.image_formats import NAMES, OTHER_SUFFIXES, SUFFIXES
from hub_vit.ports import DEMO_PORT
from hub_vit.rollout_settings import DEFAULT_DISCARD_RATIO, DEFAULT_HEAD_FUSION, HEAD_FUSIONS, check_discard_ratio
from hub_vit.server.protocol import DOMAIN_SENTENCES, OUT_OF_DOMAIN, UNKNOWN_DOMAIN

if TYPE_CHECKING:
    import numpy as np

# `hub-vit demo --root-path`, `hub-vit serve --demo-root-path`
ROOT_PATH_HELP = ("The URL path a reverse proxy serves the demo under (/vit for https://example.com/vit/), or that "
                  "whole URL; default: $GRADIO_ROOT_PATH, else none.")
BATCH = 8  # images per forward pass: bounded memory, still batched
# decoded pixels that rollout's first pass over the images keeps for writing (about 0.75 GB as RGB); the images past
# it are decoded a second time, a batch at a time
HELD_PIXELS = 1 << 28


def output_stems(paths: list[Path]) -> list[str]:
    """One output name per image, in argument order: the file's stem, and for the 2nd, 3rd, ... image with the same
    stem `<stem>-2`, `<stem>-3`, ... (photo.jpg and photo.png, or a/x.png and b/x.png, must not overwrite each other).

    Names are compared case-insensitively, so the files stay apart on case-insensitive file systems too; a counter
    name that is itself an argument's stem (x-2.png) is skipped.
    """
    taken = {path.stem.casefold() for path in paths}
    used: set[str] = set()
    counters: dict[str, int] = {}
    stems = []
    for path in paths:
        stem = path.stem
        if stem.casefold() in used:
            key = stem.casefold()
            n = counters.get(key, 1)
            while True:
                n += 1
                candidate = f"{stem}-{n}"
                if candidate.casefold() not in used and candidate.casefold() not in taken:
                    break
            counters[key] = n
            stem = candidate
        used.add(stem.casefold())
        stems.append(stem)
    return stems


def listed_images(images: list[Path], leave_out: Path | None) -> list[Path]:
    """The images a command reads: the files given and the JPEG, PNG and WebP files of the folders given (`leave_out`,
    its output folder, left out); a note names a folder's images of other formats, which are left out, and a folder
    without images is exit 2."""
    from hub_vit.paths import left_out_note, with_folders_listed

    try:
        listed = with_folders_listed(images, SUFFIXES, leave_out=leave_out, others=OTHER_SUFFIXES)
    except ValueError as exc:  # a folder without images
        raise fail(str(exc)) from None
    if listed.other_formats:
        err_console.print(f"note: {left_out_note(listed.other_formats, OTHER_SUFFIXES, NAMES)}", soft_wrap=True,
                          markup=False, highlight=False)
    return listed.files


def make_out(out: Path) -> list[Path]:
    """Create the --out folder for overlays (exit 2 naming the OS's reason when it cannot be made); returns the folders
    made, deepest first, to be removed again if no overlay gets written there (`remove_empty_folders`)."""
    created = missing_folders(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # no permission, read-only file system, a parent that cannot hold folders (/proc)
        remove_empty_folders(created)
        raise fail(f"cannot create --out {str(out)!r}: {exc.strerror or exc}") from None
    why = cannot_write_in(out)  # an existing read-only folder: found after every request was answered
    if why is not None:
        remove_empty_folders(created)
        raise fail(f"cannot write in --out {str(out)!r}: {why}")
    return created


def _folder_in_the_way(path: Path, where: str = "the overlay is written") -> typer.Exit:
    """exit 2: `path`, where an overlay goes, is a folder. Neither rollout nor classify takes a file name, so the way
    out is the folder's or --out's (atomic_path's own "give a file name such as model.png" is no help here)."""
    return fail(f"{str(path)!r} is a folder where {where}: remove or rename it, or choose another --out")


def overlays_in_the_way(out: Path, stems: list[str], class_maps: bool = False) -> None:
    """exit 2 naming the first overlay path in `out` that is a folder: `<stem>_rollout.png` for each of `stems`
    (`output_stems`), and with `class_maps` any `<stem>_class_<n>.png` (its class is known only once the model has
    run). Checked before the model runs: found while writing, the error came after earlier overlays were written."""
    if not out.is_dir():  # nothing in it yet (a file --out is refused by `file_in_the_way`)
        return
    for stem in stems:
        target = out / f"{stem}_rollout.png"
        if target.is_dir():  # asked of the file system itself: a case-insensitive one finds Cat_rollout.png too
            raise _folder_in_the_way(target)
    if not class_maps:
        return
    import re

    try:
        folders = sorted(entry.name for entry in out.iterdir() if entry.is_dir())  # one listing, not a look-up a class
    except OSError:  # an --out that cannot be listed (no read permission): a folder in the way is named when written
        return
    for stem in stems:
        name = re.compile(rf"{re.escape(stem)}_class_([0-9]+)\.png", re.IGNORECASE)
        for found in filter(None, map(name.fullmatch, folders)):
            index = int(found[1])
            target = out / f"{stem}_class_{index}.png"  # the name written, asked of the file system (its case)
            if target.is_dir():
                raise _folder_in_the_way(target, f"--class-map writes the image's map when class {index} is its top-1")


def _save_overlay(array: np.ndarray, target: Path, created: list[Path]) -> None:
    """`save_png`, with a read-only or full disk as one error line (exit 1) naming the file; a folder at `target`
    (made since `overlays_in_the_way` looked) is its exit 2, in its words.

    Each PNG is written atomically, so a failure leaves no half file. Overlays already written (and printed) stay;
    the folders this run created (`created`, deepest first) are removed if none of them was written there.
    """
    from hub_vit.explain.overlay import save_png

    try:
        save_png(array, str(target))
    except OSError as exc:
        remove_empty_folders(created)
        if isinstance(exc, IsADirectoryError) and target.is_dir():
            raise _folder_in_the_way(target) from None
        raise write_failed(target, exc) from None


def _prepare(explainer: Any, path: Path) -> Any:
    """`path` read and prepared (a PreparedImage); its errors, naming the file, as the command's error."""
    from hub_vit.explain.image import ImageReadError, load_image

    try:
        image = load_image(path, large=True)  # the user's own files; its errors name the file
    except ImageReadError as exc:
        raise fail(str(exc)) from exc
    try:
        return explainer.prepare(image)
    except ImageReadError as exc:  # an aspect ratio too extreme to resize
        raise fail(f"{str(path)!r}: {exc}") from exc


def _prepared(explainer: Any, images: list[Path]) -> list[Any]:
    """Every image read and prepared before anything is written, so one bad file does not leave a partial output
    folder. A PreparedImage per image while their pixels stay within HELD_PIXELS, None past it (read again when its
    turn comes): a folder of photos, decoded, does not fit in memory."""
    kept: list[Any] = []
    held = 0
    for path in images:
        prepared = _prepare(explainer, path)
        pixels = prepared.image.width * prepared.image.height
        if held + pixels <= HELD_PIXELS:
            held += pixels
            kept.append(prepared)
        else:
            kept.append(None)
    return kept


# why an image is marked out of domain, as rollout and classify say it (each adds what it means for its labels)
OUTSIDE_NOTE = f"{DOMAIN_SENTENCES[OUT_OF_DOMAIN]} (out-of-domain score above its threshold)"


def verdict_cell(verdict: str, score: float | None) -> str:
    """`out-of-domain (14.2)`: an out-of-domain verdict and the score it was judged by (none: unknown)."""
    return verdict + ("" if score is None else f" ({score:.3g})")


def _print_labels(path: Path, target: Path, top: list[tuple[str, float]], verdict: str,
                  score: float | None) -> None:
    from hub_vit.cli.tables import print_table

    # soft-wrapped: a script reading `-> (.*)` from a pipe (80 columns) must get the whole path on one line
    console.print(f"[bold]{escape(str(path))}[/] -> {escape(str(target))}", soft_wrap=True)
    print_table(("label", "probability"), [(label, f"{prob:.4f}") for label, prob in top], right=("probability",),
                wrap=("label",))
    # the verdict `hub-vit classify` and the demo give, in classify's words
    shown = f"domain: {verdict_cell(verdict, score)}"
    if verdict == OUT_OF_DOMAIN:
        shown += f": {OUTSIDE_NOTE}: the labels are guesses"
    elif verdict == UNKNOWN_DOMAIN:
        shown += " (no out-of-domain score is calibrated for this model: hub-vit calibrate-domain FOLDER --images DIR)"
    console.print(shown, soft_wrap=True, markup=False, highlight=False)


@app.command()
def rollout(
    images: list[Path] = typer.Argument(..., help=f"Image files ({NAMES}), or folders of them (subfolders too; "
                                        "hidden files and the --out folder left out).", parser=given_path),
    out: Path = typer.Option(Path("out"), "--out", "-o", help="Folder for the overlay PNGs (created if needed).",
                             parser=given_path),
    model: str = typer.Option(None, "--model", "-m",
                              help="Model folder (hf-hub:ORG/NAME: one on the Hugging Face Hub, fetched into its "
                                   "cache), or a registered name.tag with a cached checkpoint. Default: the shipped "
                                   "default model."),
    head_fusion: str = typer.Option(DEFAULT_HEAD_FUSION, help=f"How to fuse the heads: {', '.join(HEAD_FUSIONS)}."),
    discard_ratio: float = typer.Option(DEFAULT_DISCARD_RATIO,
                                        help="Share of the lowest attentions to drop per row, in [0, 1)."),
    class_map: bool = typer.Option(False, "--class-map", help="Also write the top-1 class-specific map."),
    alpha: float = typer.Option(0.5, help="Heat-map opacity in [0, 1]."),
    colormap: str = typer.Option("jet", help="Colour map: jet, inferno or gray."),
) -> None:
    """Write `<image>_rollout.png` (same size as the image) per image and print its top-5 labels."""
    from hub_vit.demo.models import in_process_verdicts, load_explainer, model_domain, resolve_choice
    from hub_vit.explain.overlay import COLORMAPS

    if head_fusion not in HEAD_FUSIONS:
        raise fail(f"unknown --head-fusion {head_fusion!r}; valid choices: {', '.join(HEAD_FUSIONS)}")
    if colormap not in COLORMAPS:
        raise fail(f"unknown --colormap {colormap!r}; valid choices: {', '.join(COLORMAPS)}")
    if not 0 <= alpha <= 1:
        raise fail(f"--alpha must be in [0, 1], got {alpha}")
    try:
        check_discard_ratio(discard_ratio, "--discard-ratio")
    except ValueError as exc:
        raise fail(str(exc)) from None  # in classify's words
    images = listed_images(images, out)
    # where the overlays go, before the model is loaded and every image decoded (minutes for a folder of photos)
    blocker = file_in_the_way(out)
    if blocker is not None:
        raise fail(f"--out {str(out)!r} cannot be a folder: {str(blocker)!r} is a file")
    stems = output_stems(images)
    overlays_in_the_way(out, stems, class_map)  # found while writing, it came after the earlier overlays were written
    try:
        explainer = load_explainer(resolve_choice(model))
        domain = model_domain(explainer)  # what the model knows, its calibration; a damaged record is exit 2 too
    except ValueError as exc:
        raise fail(str(exc)) from exc
    ready = _prepared(explainer, images)
    created = make_out(out)

    def write(paths: list[Path], kept: list[Any], names: list[str]) -> None:
        """One forward pass's images: overlays written, labels printed (`kept`: `_prepared`'s, None where an image is
        read again). A function of its own so that the batch's images are let go when it returns."""
        chunk = [prepared if prepared is not None else _prepare(explainer, path)
                 for path, prepared in zip(paths, kept, strict=True)]
        result = explainer.rollout(chunk, head_fusion, discard_ratio)
        verdicts = in_process_verdicts(explainer, [prep.image for prep in chunk], domain)
        for path, prep, stem, logits, heat, verdict in zip(paths, chunk, names, result.logits, result.maps, verdicts,
                                                           strict=True):
            target = out / f"{stem}_rollout.png"
            _save_overlay(explainer.overlay(prep, heat, alpha, colormap), target, created)
            top = explainer.top_k(logits, 5)
            _print_labels(path, target, top, *verdict)
            if class_map:
                label_index = explainer.label_index(top[0][0])
                cam = explainer.class_map(prep, label_index).maps[0]
                class_target = out / f"{stem}_class_{label_index}.png"
                _save_overlay(explainer.overlay(prep, cam, alpha, colormap), class_target, created)
                console.print(f"class-specific map for {top[0][0]!r}: {class_target}", markup=False,
                              soft_wrap=True)

    for start in range(0, len(images), BATCH):
        batch = slice(start, start + BATCH)
        write(images[batch], ready[batch], stems[batch])
        ready[batch] = [None] * len(ready[batch])  # written: the pixels kept for them are let go


@app.command()
def demo(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 exposes the demo to the network)."),
    port: int = typer.Option(DEMO_PORT, help="Port to listen on."),
    model_folder: list[Path] = typer.Option([], "--model-folder",
                                            help="Extra model folder(s) to offer (hf-hub:ORG/NAME: one on the Hugging "
                                                 "Face Hub); repeatable.",
                                            parser=given_path),
    triton_url: str = typer.Option(None, help="host:port of a running `hub-vit serve` (HTTP) to take labels from."),
    triton_model: str = typer.Option("vit", help="Model name on the Triton server."),
    max_queue: int = typer.Option(16, min=1, help="Requests allowed to wait; more get a 'queue full' message."),
    concurrency: int = typer.Option(2, min=1, help="Requests computed at the same time."),
    root_path: str = typer.Option(None, help=ROOT_PATH_HELP),
) -> None:
    """Start the Gradio attention-rollout demo (blocks until Ctrl-C)."""
    from hub_vit.ports import PortError, check_ports

    try:
        from hub_vit.demo.app import Demo, launch
        from hub_vit.demo.backends import TritonLabels
        from hub_vit.demo.models import ModelCache, discover_choices
        from hub_vit.server.client.addresses import check_model_name
    except ImportError as exc:
        raise fail(f"the demo needs gradio ({exc}); install it with: {install_extra('demo')}") from exc
    try:
        check_model_name(triton_model, name="--triton-model")
        choices = discover_choices(model_folder)
        triton = TritonLabels(triton_url, triton_model) if triton_url is not None else None  # '' is a bad address
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if not choices:
        raise fail("no model to show: this build ships no default model; pass --model-folder DIR "
                   "(from `hub-vit convert` or `hub-vit train`)")
    if ":" in host:  # Gradio writes its own URL as http://HOST:PORT, which an IPv6 address breaks ("Invalid port")
        raise fail(f"--host {host!r}: IPv6 addresses are not supported by the demo; use an IPv4 address such as "
                   "127.0.0.1 (loopback) or 0.0.0.0 (every interface)")
    try:
        root_path = proxy_root_path(root_path)
        check_ports(host, {"--port": port})
    except (ValueError, PortError) as exc:
        raise fail(str(exc)) from exc
    console.print(f"models: {', '.join(c.key for c in choices)}")
    console.print(f"demo on http://{host}:{port}{behind_proxy(root_path)} (Ctrl-C to stop)", markup=False,
                  soft_wrap=True)
    launch(Demo(cache=ModelCache(choices), triton=triton), host=host, port=port, max_size=max_queue,
           concurrency=concurrency, root_path=root_path)


def behind_proxy(root_path: str | None) -> str:
    """What follows the demo's own address where a reverse proxy serves it under `root_path`."""
    return f", for a reverse proxy that serves it under {root_path}/; open it through the proxy" if root_path else ""


def proxy_root_path(given: str | None, flag: str = "--root-path") -> str | None:
    """--root-path (`flag`) checked, without a trailing '/' ('/vit/' -> '/vit'); None: Gradio's own default
    ($GRADIO_ROOT_PATH). Behind a proxy that serves the demo under a path, the page's files and its queue are asked
    for under that path: without it the page loads without its styles and never answers an upload."""
    if given is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(given)
    if given.startswith(("http://", "https://")):
        ok = bool(parts.netloc) and not parts.query and not parts.fragment
    else:
        ok = given.startswith("/") and not parts.netloc and not parts.query and not parts.fragment
    if not ok or any(c.isspace() for c in given):
        raise ValueError(f"{flag} {given!r} is not a URL path such as /vit (where a reverse proxy serves the "
                         "demo) nor a whole URL such as https://example.com/vit")
    return given.rstrip("/")
