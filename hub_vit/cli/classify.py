"""`hub-vit classify`: classify image files with a running server and print a table, or JSON Lines (--explain: the
server's rollout maps drawn on the images, as `hub-vit rollout` draws its own)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from hub_vit.cli import client_options as flags
from hub_vit.cli.app import app, console, err_console, fail
from hub_vit.cli.client_options import client_settings, request_failure
from hub_vit.cli.explain import OUTSIDE_NOTE, listed_images, make_out, output_stems, overlays_in_the_way, verdict_cell
from hub_vit.cli.path_option import given_path
from hub_vit.host import missing_extra
from hub_vit.image_formats import NAMES


@app.command()
def classify(
    images: list[Path] = typer.Argument(..., help=f"Image files ({NAMES}), or folders of them (subfolders too; "
                                        "hidden files and, with --explain, the --out folder left out).", exists=True),
    url: flags.Url = None,
    grpc: flags.Grpc = False,
    model: str = typer.Option("vit", help="Served model name."),
    top: int = typer.Option(3, help="How many of the returned labels to print."),
    queue_timeout_ms: flags.RequestQueueTimeoutMs = None,
    timeout: flags.ClassifyTimeout = flags.DEFAULT_CLIENT_TIMEOUT_S,
    explain: bool = typer.Option(False, "--explain", help="Also ask the server for each image's attention-rollout "
                                 "map and write it as hub-vit rollout does: <image>_rollout.png in --out."),
    out: Path = typer.Option(Path("out"), "--out", "-o", help="Folder for the --explain overlay PNGs.",
                             parser=given_path),
    head_fusion: str = typer.Option(None, help="--explain: how the server fuses the heads: mean (default), max, "
                                    "min."),
    discard_ratio: float = typer.Option(None, help="--explain: share of the lowest attentions the server drops per "
                                        "row, in [0, 1) (default 0)."),
    concurrency: int = typer.Option(2, help="Requests in flight at once, each on its own connection (a server's "
                                    "instances compute them side by side)."),
    json_lines: bool = typer.Option(False, "--json", help="Instead of the table, one JSON object per image as its "
                                    "request is answered, in the order given (JSON Lines): file, labels, scores, "
                                    "class_ids, domain, domain_score (and rollout_png with --explain), or file and "
                                    "error."),
) -> None:
    """Classify images with a running server and print a table (--json: JSON Lines)."""
    from hub_vit.atomic import remove_empty_folders
    from hub_vit.cli.classify_files import MAX_CONCURRENCY, OutputFailed, classify_files
    from hub_vit.server.client.classifier import Classifier

    if top < 1:  # checked before any request: 0 printed an empty table, a negative value sliced from the end
        raise fail(f"--top must be at least 1 (labels printed per image), got {top}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise fail(f"--concurrency (requests in flight) must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")
    images = listed_images(images, out if explain else None)
    _check_files(images)
    _check_explain_flags(explain, head_fusion, discard_ratio, out)
    if explain:  # a folder where an overlay goes: refused before any request, not after the answers
        overlays_in_the_way(out, output_stems(images))
    url, protocol, timeout_s, wait_s = client_settings(url, grpc, queue_timeout_ms, timeout, model)
    request = {"explain": True, "head_fusion": head_fusion, "discard_ratio": discard_ratio} if explain else {}
    created = make_out(out) if explain else []  # before any request: an --out that cannot be made wastes none
    lines = JsonLines(images, top, out if explain else None, created) if json_lines else None

    def waiting() -> None:
        err_console.print(f"note: {url} says its server is starting or restarting; waiting up to {wait_s:g} s "
                          "(--timeout) for it",
                          soft_wrap=True, markup=False, highlight=False)

    try:
        try:
            with contextlib.ExitStack() as open_client:
                client = open_client.enter_context(Classifier(url, protocol=protocol, model=model, timeout_s=wait_s))
                done = classify_files(client, images, timeout_s, concurrency=concurrency, restart_wait_s=wait_s,
                                      on_restart=waiting, on_chunk=lines.write if lines is not None else None,
                                      **request)
                if done.interrupted:  # left open: the process ends once the answers are shown. Closing it destroys
                    open_client.pop_all()  # the gevent hubs of the workers Ctrl-C stopped, which crashed it (SIGSEGV)
        except OutputFailed as err:  # stdout's reader went away (`| head`: typer ends quietly), a full disk (one line)
            raise err.__cause__ from None
        except Exception as err:  # before any request: refused, not Triton, the other protocol's port, unknown model
            if missing_extra(err) is not None:  # tritonclient without this protocol: the install, not the server
                raise
            raise _refusal(protocol, url, model, err, lines) from None
        if done.stopped is not None and not done.predictions and not done.errors:
            raise _refusal(protocol, url, model, done.stopped, lines)  # nothing to show: the one line
        if lines is not None:
            # what the request that ended the run had resolved; and every file has its line: the ones never sent too
            why = ("interrupted (Ctrl-C)" if done.interrupted else
                   _failure(protocol, url, model, done.stopped, len(done.predictions)) if done.stopped else None)
            lines.write(done, unresolved=f"not classified: {why}" if why else None)
        elif done.predictions:
            try:
                _print_table(images, done.predictions, top, f"{model} @ {url} ({protocol})")
                if explain:
                    _write_explained(images, done.predictions, out, created)
            except KeyboardInterrupt:  # rich draws the whole table before printing it: 1.7 s for 1,800 files
                err_console.print(f"interrupted (Ctrl-C) while the answers were shown: {len(done.predictions):,} of "
                                  f"{len(images):,} files were classified (--json writes each file's line as it is "
                                  "answered)", soft_wrap=True, markup=False, highlight=False)
                raise typer.Exit(130) from None
    finally:
        remove_empty_folders(created)  # no overlay written (every request failed): no empty folder left behind
    if lines is None:  # JSON: each file's error is in its line
        for index, message in sorted(done.errors.items()):
            err_console.print(f"[bold red]error:[/] {escape(str(images[index]))}: {escape(message)}", soft_wrap=True,
                              emoji=False)
    unsent = [images[i] for i in done.unresolved(len(images))]
    if done.stopped is not None:
        err_console.print(f"[bold red]error:[/] "
                          f"{escape(_failure(protocol, url, model, done.stopped, len(done.predictions)))}\n"
                          f"{len(unsent):,} of {len(images):,} files were not classified (the first: "
                          f"{escape(str(unsent[0]))}); the answers above stand", soft_wrap=True, emoji=False)
    elif done.interrupted:
        err_console.print(f"interrupted (Ctrl-C): {len(done.predictions):,} of {len(images):,} files classified"
                          + (f", {len(unsent):,} not (the first: {escape(str(unsent[0]))})" if unsent else "")
                          + ("; the answers above stand" if done.predictions else ""), soft_wrap=True, emoji=False)
    if done.interrupted:  # the shell's code for Ctrl-C, after what was answered is shown
        raise typer.Exit(130)
    if done.errors or done.stopped is not None:
        raise typer.Exit(1)


def _failure(protocol: str, url: str, model: str, err: Exception, answered: int = 0) -> str:
    """The line for a request that failed for a reason not about one file (`answered`: images answered before)."""
    from hub_vit.server.client.errors import empty_reply

    if isinstance(err, ValueError) and not empty_reply(err):  # a reply that is not Triton's, ...
        return f"{protocol} {url}: {err}"
    return request_failure(protocol, url, model, err, answered)


def _refusal(protocol: str, url: str, model: str, err: Exception, lines: JsonLines | None = None) -> typer.Exit:
    """The run ended before any answer: a request this server cannot take (--queue-timeout-ms on a server without a
    queue policy, --explain on one that explains nothing, a --model it does not serve) is bad input (2, as in
    loadtest), anything else 1. With
    --json (`lines`) every file still gets its line, naming the same reason."""
    from hub_vit.server.client.errors import NoExplanation, NoQueueTimeouts, unknown_model

    cannot_take = isinstance(err, (NoExplanation, NoQueueTimeouts))  # their message is whole
    bad_input = cannot_take or unknown_model(err)  # --model names no model: _failure lists those served
    message = str(err) if cannot_take else _failure(protocol, url, model, err)
    if lines is not None:  # was: nothing on stdout, so `| jq` saw no file at all
        lines.unanswered(f"not classified: {message}")
    return fail(message, code=2 if bad_input else 1)


def _check_files(images: list[Path]) -> None:
    """Each file as the client checks it before sending (`check_images`: an empty file, one that went away), refused
    before any request (exit 2, in `hub-vit rollout`'s words): an empty file was sent, and where no server listened
    the run failed on the connection instead. Whether its bytes are an image the server decodes is the server's to
    say, per file, while the other files are still classified."""
    from hub_vit.server.client.images import check_images

    try:
        check_images(images)  # paths: each message names its file
    except ValueError as err:
        raise fail(str(err)) from None


def _check_explain_flags(explain: bool, head_fusion: str | None, discard_ratio: float | None, out: Path) -> None:
    """--explain's flags, refused before any request by the rules the client and the server apply
    (`hub_vit.rollout_settings`), in the flags' words."""
    from hub_vit.atomic import file_in_the_way
    from hub_vit.rollout_settings import HEAD_FUSIONS, check_discard_ratio
    from hub_vit.server.client.messages import explain_parameters

    if head_fusion is not None and head_fusion not in HEAD_FUSIONS:  # as `hub-vit rollout` says it
        raise fail(f"unknown --head-fusion {head_fusion!r}; valid choices: {', '.join(HEAD_FUSIONS)}")
    if discard_ratio is not None:
        try:
            check_discard_ratio(discard_ratio, "--discard-ratio")
        except ValueError as exc:
            raise fail(str(exc)) from None
    try:
        explain_parameters(explain, head_fusion, discard_ratio)  # the values are good: what is left is their --explain
    except ValueError:
        raise fail("--head-fusion and --discard-ratio set the server's rollout map: add --explain") from None
    if explain and file_in_the_way(out) is not None:  # before any request
        raise fail(f"--out {str(out)!r} cannot be a folder: {str(file_in_the_way(out))!r} is a file")


def _print_table(images: list[Path], predictions: dict[int, Any], top: int, title: str) -> None:
    from hub_vit.paths import distinct_names

    returned = min(len(prediction.labels) for prediction in predictions.values())
    if top > returned:  # said once, not per image; the server's top-k is fixed when its repository is built
        err_console.print(f"note: --top {top}, but the server returns {returned} labels per image (hub-vit serve "
                          "--top-k)", soft_wrap=True, emoji=False, markup=False, highlight=False)
    table = Table(title=title)
    for column in ("image", "rank", "label", "score", "domain (score)"):
        table.add_column(column, justify="right" if column in ("rank", "score") else "left")
    # a/x.png and b/x.png, not x.png twice; absolute, not resolved: a symlink keeps its own name (an HF snapshot
    # links three.png to a blob named by its hash)
    shown = distinct_names([image.absolute() for image in images])
    for index, prediction in sorted(predictions.items()):
        ranked = zip(prediction.labels[:top], prediction.scores[:top], strict=True)
        for rank, (label, score) in enumerate(ranked, 1):
            table.add_row(escape(shown[index]) if rank == 1 else "", str(rank), escape(label), f"{score:.4f}",
                          verdict_cell(prediction.domain, prediction.domain_score) if rank == 1 else "")
    console.print(table)
    _domain_notes([shown[index] for index in sorted(predictions)], [predictions[i] for i in sorted(predictions)])


def _domain_notes(names: list[str], predictions: list[Any]) -> None:
    """Below the table, in words: which images are not the kind the model knows, or that nobody can tell."""
    from hub_vit.paths import first_few
    from hub_vit.server.protocol import DOMAIN_SENTENCES, OUT_OF_DOMAIN, UNKNOWN_DOMAIN

    outside = [name for name, prediction in zip(names, predictions, strict=True) if prediction.domain == OUT_OF_DOMAIN]
    if outside:  # the table's domain column names each; a folder of thousands keeps this one readable line
        count = f"{len(outside):,} images: " if len(outside) > 3 else ""
        console.print(f"note: {count}{first_few(outside)}: {OUTSIDE_NOTE}: the labels above are guesses",
                      soft_wrap=True, markup=False, highlight=False)
    if any(prediction.domain == UNKNOWN_DOMAIN for prediction in predictions):
        # the server may run a model folder (calibrated by `calibrate-domain`) or an exported file (which has none)
        console.print(f"note: {DOMAIN_SENTENCES[UNKNOWN_DOMAIN]}: the served model carries no out-of-domain score "
                      "for its weights (a model folder gets one from hub-vit calibrate-domain FOLDER --images DIR, "
                      "then serve it again; an exported file has none)", soft_wrap=True, markup=False, highlight=False)


def _write_explained(images: list[Path], predictions: dict[int, Any], out: Path, created: list[Path],
                     say: bool = True, stems: list[str] | None = None) -> dict[int, Path]:
    """`classify --explain`: the server's map of each classified image drawn on it, as `hub-vit rollout` draws its
    own (the same names, `<stem>_rollout.png`, colours and crop placement), one line per file written (`say`);
    {position: file written}. `stems`: `output_stems(images)`, for a caller that writes a few at a time."""
    from hub_vit.cli.explain import _save_overlay, output_stems
    from hub_vit.explain.image import ImageReadError, load_image
    from hub_vit.explain.overlay import blend

    stems = stems if stems is not None else output_stems(images)
    written = {}
    for index, prediction in sorted(predictions.items()):
        try:
            image = load_image(images[index], large=True)  # the server decoded it; a format only it reads is named
        except ImageReadError as exc:
            err_console.print(f"note: no overlay for {images[index]}: {exc}", soft_wrap=True, markup=False)
            continue
        target = out / f"{stems[index]}_rollout.png"
        _save_overlay(blend(image, prediction.rollout, prediction.rollout_box), target, created)
        written[index] = target
        if say:
            console.print(f"{images[index]} -> {target}", markup=False, soft_wrap=True, highlight=False)
    return written


class JsonLines:
    """`classify --json`: one JSON object per file on stdout, written as each request's files are resolved, in the
    order given; each file once."""

    def __init__(self, images: list[Path], top: int, out: Path | None, created: list[Path]) -> None:
        from hub_vit.cli.explain import output_stems

        self.images, self.top, self.out, self.created = images, top, out, created
        self.stems = output_stems(images) if out is not None else None  # once: the overlays come a request at a time
        self.written: set[int] = set()

    def write(self, done: Any, unresolved: str | None = None) -> None:
        """The lines of the files `done` (a `Classified`) has resolved and that are not written yet; with
        `unresolved`, the run has ended (a stopped server, Ctrl-C), and each file it did not reach gets that error:
        a pipeline filtering on `error` misses none."""
        errors = done.errors | ({i: unresolved for i in done.unresolved(len(self.images))} if unresolved else {})
        fresh = sorted((set(done.predictions) | set(errors)) - self.written)
        self._emit(fresh, {i: done.predictions[i] for i in fresh if i in done.predictions}, errors)

    def unanswered(self, error: str) -> None:
        """The run ended before any answer: each file not written yet gets `error`."""
        fresh = sorted(set(range(len(self.images))) - self.written)
        self._emit(fresh, {}, dict.fromkeys(fresh, error))

    def _emit(self, fresh: list[int], found: dict[int, Any], errors: dict[int, str]) -> None:
        """The lines of the files `fresh` (indices into the images, in order): their prediction in `found`, else
        their error."""
        import json
        import sys

        overlays = (_write_explained(self.images, found, self.out, self.created, say=False, stems=self.stems)
                    if self.out is not None else {})
        for index in fresh:
            line: dict[str, Any] = {"file": str(self.images[index])}
            if index in found:
                prediction = found[index]
                line.update(labels=prediction.labels[:self.top], scores=prediction.scores[:self.top],
                            class_ids=prediction.class_ids[:self.top], domain=prediction.domain,
                            domain_score=prediction.domain_score)
                if index in overlays:
                    line["rollout_png"] = str(overlays[index])
            else:
                line["error"] = errors[index]
            text = json.dumps(line, ensure_ascii=False)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a file name that is not UTF-8 (its bytes as surrogates): escaped, so each
                text = json.dumps(line)  # line stays valid UTF-8 JSON, and json.loads + os.fsencode give the name back
            sys.stdout.write(text + "\n")
        sys.stdout.flush()  # a pipe (jq, a log) gets each request's lines as they come
        self.written.update(fresh)

