"""`convert_to_folder`: source -> converted, strictly loaded, parity-checked model -> a hub-vit model folder.

Everything that can fail (download, layout, shapes, strict load, parity) happens before the first byte is written;
the folder itself is written by `hub_vit.folder.save_model_folder` into a temporary directory and renamed at the end,
so an interrupted or failed run leaves no output folder.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hub_vit.atomic import missing_folders, remove_empty_folders
from hub_vit.class_names import default_labels
from hub_vit.data_config import GOOGLE_EVAL
from hub_vit.model import VisionTransformer, count_parameters
from hub_vit.variants import ViTSpec, parse_variant
from hub_vit.weights import HEAD_KEYS, adapt_state_dict, load_strict
from hub_vit.weights_check import check_values
from hub_vit.weights_digest import state_dict_digest

from .convert import Conversion, convert_file
from .download import DEFAULT_TIMEOUT_S, Source, catalog_weight, resolve_source
from .infer import ArchitectureMismatchError, check_compatible, check_variant, match_architecture
from .verify import (
    ParityReport,
    ReferenceFileError,
    check_reference_file,
    compare_to_reference,
    find_reference,
    self_consistency,
)


class ParityError(RuntimeError):
    """The converted model does not reproduce the reference outputs."""


class OutputWriteError(RuntimeError):
    """The output folder could not be written (read-only file system, disk full, no permission); nothing was left
    behind. The message names the folder and the operating system's reason."""

    def __init__(self, out: Path, reason: str) -> None:
        super().__init__(f"cannot write output folder {str(out)!r}: {reason}; nothing was written")
        self.path, self.reason = out, reason


def os_reason(exc: BaseException) -> str:
    """The operating system's words for a write failure ('Read-only file system'), looking through wrappers such as
    `atomic_path`'s PermissionError; else the exception's own message."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__
    return str(exc)


@dataclass
class FolderResult:
    path: Path
    conversion: Conversion
    parity: ParityReport
    source: Source
    architecture: str
    info: dict[str, Any]


def class_names(num_classes: int) -> list[str] | None:
    """`hub_vit.class_names.default_labels` (ImageNet names where the class count says so, else `class_i`); None for
    a head-less model."""
    return default_labels(num_classes, unique=True) if num_classes else None


def pretrained_cfg_for(source: Source, spec: ViTSpec) -> dict[str, Any]:
    """timm data config: the catalog's when the source is a known published file, else big_vision's evaluation
    evaluation defaults (`hub_vit.data_config.GOOGLE_EVAL`); input size and classes are the model's."""
    from hub_vit.catalog import weights_at_url

    found = weights_at_url(source.url)
    if found is not None:
        cfg = dict(found[1].pretrained_cfg())
    else:
        cfg = dict(GOOGLE_EVAL.pretrained_cfg(), license="apache-2.0")
        if source.url:
            cfg["origin_url"] = source.url
    cfg.update(input_size=(spec.in_chans, *spec.img_size), num_classes=spec.num_classes)
    return cfg


def source_record(src: Source) -> dict[str, Any]:
    """conversion.json `source`. `downloaded_sha256` is what hub-vit's downloader recorded while fetching `url`
    (None for a local path or a file placed in the cache by hand); `content_verified` names the published file the
    content is shown to be and why, or is None. Model cards claim published results only with that evidence."""
    from hub_vit.model_cards.facts import verified_catalog_weights

    record: dict[str, Any] = {"origin": src.origin, "url": src.url, "path": str(src.path), "sha256": src.sha256,
                              "bytes": src.path.stat().st_size, "catalog_name": src.catalog_name,
                              "downloaded_sha256": src.downloaded_sha256}
    verified = verified_catalog_weights(record)
    record["content_verified"] = None if verified is None else {"catalog_name": verified[0], "evidence": verified[1]}
    return record


def fit_state_dict(model: VisionTransformer, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`adapt_state_dict` (prefix, posemb grid, head size) plus the model's fresh head when the conversion dropped
    the checkpoint's head (pre-logits removed), so that loading stays strict."""
    fitted = dict(state_dict)
    if isinstance(model.head, torch.nn.Linear) and not any(k in fitted for k in HEAD_KEYS):
        own = model.state_dict()
        fitted.update({key: own[key].detach().clone() for key in HEAD_KEYS})
    return adapt_state_dict(fitted, model)


def convert_to_folder(source: str | Path, out: str | Path, *, variant: str | None = None, img_size: Any = None,
                      num_classes: int | None = None, drop_pre_logits: bool = False,
                      reference: str | Path | None = None, verify: bool = False, overwrite: bool = False,
                      timeout: float = DEFAULT_TIMEOUT_S, progress: bool = True) -> FolderResult:
    """Convert `source` (path, URL, vanity or catalog name) into the hub-vit model folder `out`.

    Parity is always measured against a reference (`reference`, or `<name>.io.npz` beside a local checkpoint);
    with `verify=True` and no reference, fixed-input self-consistency is measured instead. A failed parity check
    raises `ParityError` and nothing is written.
    """
    from hub_vit.folder import check_output_folder, save_model_folder
    from hub_vit.hf.native_vit import native_vit_blockers
    from hub_vit.model_cards import write_card_or_remove
    from hub_vit.version import __version__

    out = Path(out)
    check_output_folder(out, overwrite)  # before a download or a conversion: a file in the way, an occupied folder
    # What the user typed is checked before a download of up to a few GB, too: the variant's size letter and patch,
    # and a reference file named by hand (resolve_source checks the timeout)
    if variant is not None:
        parse_variant(variant)
    _check_against_catalog(str(source), variant, img_size)
    if reference is not None and not Path(reference).is_file():
        what = "are a folder; give the .npz file of reference outputs" if Path(reference).is_dir() else "do not exist"
        raise FileNotFoundError(f"reference outputs {str(reference)!r} {what}")
    if reference is not None:
        check_reference_file(reference)  # a truncated download or a text file, too
    src = resolve_source(source, timeout=timeout, progress=progress)
    check_output_folder(out, overwrite, keep=[src.path, *([Path(reference)] if reference is not None else [])])
    ref = Path(reference) if reference is not None else find_reference(src.path)  # both checked to exist
    if reference is None and ref is not None:  # before the conversion's work, as a reference named by hand is
        try:
            check_reference_file(ref)
        except ReferenceFileError as exc:  # the user never named it: say why it is read at all
            raise ReferenceFileError(f"{exc}. It was used because it lies beside the checkpoint; move it away to "
                                     "convert without reference outputs") from None
    conv = convert_file(src.path, img_size=img_size, num_classes=num_classes, drop_pre_logits=drop_pre_logits,
                        variant=variant)
    if src.catalog_name:
        _check_catalog_architecture(src.catalog_name, conv.source_spec, src.path)
    check_values(conv.state_dict, repr(str(src.path)), "nothing written")  # NaN weights would serve NaN
    spec = conv.spec
    model = VisionTransformer(spec)
    load_strict(model, fit_state_dict(model, conv.state_dict))
    conv.state_dict.clear()  # the model holds the weights now; keep one copy in memory
    model.eval()

    resampled = spec.posemb == "learn" and spec.grid_size != conv.source_spec.grid_size
    if ref is not None:
        parity = compare_to_reference(
            model, ref, head_changed=spec.num_classes != conv.source_spec.num_classes,
            pre_logits_changed=spec.rep_size != conv.source_spec.rep_size,
            function_changed="position embedding resampled to a new grid" if resampled else None)
    elif verify:
        parity = self_consistency(model)
    else:
        parity = ParityReport(mode="not measured (no reference outputs; pass --verify for a self-consistency "
                                   "check)", reference=None)
    if parity.passed is False:  # None: not measured (no reference, no --verify), said so in conversion.json
        from .verify import format_report

        raise ParityError(f"converted model does not reproduce the reference; nothing written\n{format_report(parity)}")

    architecture = match_architecture(spec)
    info = {
        "source": source_record(src),
        "layout": {**conv.layout.to_dict(), "description": conv.layout.describe()},
        "checkpoint_spec": conv.source_spec.to_dict(),
        "spec": spec.to_dict(),
        "architecture": architecture,
        "variant": spec.variant,
        "num_parameters": count_parameters(model),
        # what the claims below (parity) and on the card (published results) are about: `model_cards` compares it with
        # the folder's model.safetensors and withholds them once the weights have changed
        "weights_digest": state_dict_digest(model.state_dict()),
        "options": {"variant": variant, "img_size": list(spec.img_size) if img_size is not None else None,
                    "num_classes": num_classes, "drop_pre_logits": drop_pre_logits},
        "notes": conv.notes,
        "parity": parity.to_dict(),
        "converter": {"hub_vit": __version__, "torch": torch.__version__,
                      "converted_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")},
    }
    created = missing_folders(out.parent)  # save_model_folder creates them; a failed write must not leave them
    try:
        path = save_model_folder(
            model, out, labels=class_names(spec.num_classes), pretrained_cfg=pretrained_cfg_for(src, spec),
            architecture=architecture, extra_files={"conversion.json": info},
            native_vit=not native_vit_blockers(spec), overwrite=overwrite,
        )
        write_card_or_remove(path)
    except Exception as exc:
        reason = _write_failure(exc)
        if reason is None:
            raise
        remove_empty_folders(created)
        raise OutputWriteError(out, reason) from exc
    return FolderResult(path=path, conversion=conv, parity=parity, source=src, architecture=architecture, info=info)


def _write_failure(exc: Exception) -> str | None:
    """The reason when `exc` is the file system refusing a write (read-only, full, no permission), else None.

    hub-vit's own message-only errors (an output folder that appeared meanwhile) keep their own words, and anything
    else stays a traceback: it is a bug, not the disk. (The weights' write reports a full disk as an OSError too:
    `hub_vit.atomic.disk_errors_as_os_errors`.)
    """
    if isinstance(exc, OSError):
        return os_reason(exc) if exc.errno is not None or isinstance(exc.__cause__, OSError) else None
    return None


def _check_against_catalog(source: str, variant: str | None, img_size: Any) -> None:
    """For a catalog weight (its name, URL or vanity name), the architecture is known before the download: a --variant
    of another size and an --img-size its patches do not divide are refused then, not after a few GB."""
    from hub_vit.catalog import MODELS

    name, _ = catalog_weight(source)
    if name is None:
        return
    spec = MODELS[name.partition(".")[0]].spec
    if variant is not None:
        check_variant(spec, variant)
    if img_size is not None:
        spec.replace(img_size=img_size)  # ValueError naming the patch size it must divide by


def _check_catalog_architecture(name: str, found: ViTSpec, path: Path) -> None:
    """A catalog name promises an architecture; a file that is another model (a wrong file dropped at the cache path
    the offline message names, say) must not be written under that name and its data config."""
    from hub_vit.catalog import MODELS

    entry = MODELS[name.partition(".")[0]]
    try:
        check_compatible(found, entry.spec)
    except ArchitectureMismatchError as exc:
        raise ArchitectureMismatchError(f"{str(path)!r} is not the catalog's {name} ({entry.spec.variant}): {exc}; "
                                        "delete the file and fetch it again") from None


__all__ = ["FolderResult", "OutputWriteError", "ParityError", "class_names", "convert_to_folder", "fit_state_dict",
           "os_reason", "pretrained_cfg_for", "source_record"]
