"""Google JAX checkpoint -> hub-vit state dict: layout detection, architecture inference, the key table, options.

Pure functions: no files are written here. Memory stays bounded: shapes are validated from the npz headers before
any array is read, then the table is walked one tensor at a time (`torch.from_numpy` on the transformed copy; the
source array is dropped as soon as its tensor exists).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hub_vit.layers import resample_posemb
from hub_vit.variants import ViTSpec
from hub_vit.weights import load_weights_file
from hub_vit.weights_check import CheckpointMismatchError, check_sizes, mismatch_message

from .infer import check_compatible, check_variant, infer_from_view
from .keymap import planned
from .layouts import CanonicalView, Layout, canonicalize
from .npz_reader import NpzArchive


@dataclass
class Conversion:
    """A converted checkpoint. `state_dict` fits `spec` except, when they differ, the head's class count
    (`source_spec.num_classes`; `adapt_state_dict` swaps in a fresh head)."""

    state_dict: dict[str, torch.Tensor]
    spec: ViTSpec
    source_spec: ViTSpec
    layout: Layout
    notes: list[str] = field(default_factory=list)


def _mismatch(missing: list[str], unexpected: list[str], shapes: list[str], layout: Layout) -> None:
    if not (missing or unexpected or shapes):
        return
    spelled = " (Linen names, as after flax's convert_pre_linen)" if layout.naming == "pre-linen" else ""
    header = f"checkpoint does not match the inferred architecture ({layout.describe()}):"
    raise CheckpointMismatchError(mismatch_message(header, missing, unexpected, shapes, missing_note=spelled))


def _file_key(view: CanonicalView, key: str) -> str:
    """The key as it is spelled in the file (for error messages)."""
    ref = view.refs.get(key)
    if ref is None:
        return f"{view.layout.prefix}{key}"
    return ref.key if ref.index is None else f"{ref.key}[{ref.index}]"


def _source_name(view: CanonicalView) -> str:
    path = getattr(view.source, "path", None)
    return repr(str(path)) if path is not None else "the checkpoint"


def _source_dtype(view: CanonicalView, key: str) -> np.dtype | None:
    """The stored dtype of canonical `key` from the npz header when the source is an archive (nothing read); None for
    an in-memory mapping, whose arrays are checked as they are read (each array is read once)."""
    dtypes = getattr(view.source, "dtypes", None)
    if dtypes is None:
        return None
    ref = view.refs.get(key)
    return dtypes[ref.key if ref is not None else f"{view.layout.prefix}{key}"]


def _check_float(reads: dict[str, tuple[tuple[int, ...], np.dtype | None]], view: CanonicalView) -> None:
    """Google's weights are float32 or bfloat16 (stored as 2-byte void); integers would be cast into a wrong model."""
    wrong = [f"{key} ({dtype})" for key, (_, dtype) in reads.items()
             if dtype is not None and dtype.kind != "f" and not (dtype.kind == "V" and dtype.itemsize == 2)]
    if wrong:
        raise CheckpointMismatchError(f"{_source_name(view)}: {len(wrong)} weight array(s) are not floating point: "
                                      f"{', '.join(wrong[:5])}; a checkpoint holds float32 or bfloat16 weights "
                                      "(converting would cast them silently into a wrong model)")


def _posemb_tensors(view: CanonicalView, src_grid: tuple[int, int] | None, table: ViTSpec,
                    notes: list[str]) -> dict[str, torch.Tensor]:
    """`pos_embed` and `cls_token` for the target convention and grid.

    The two conventions are the same function: vit_jax adds slot 0 to the class token after the concat, big_vision
    folds it into `cls` (fix_old_checkpoints). Moving between them is exact. Grid resampling uses hub-vit's
    `resample_posemb` (scipy `zoom(order=1)` semantics, as vit_jax and big_vision resample).
    """
    out: dict[str, torch.Tensor] = {}
    src_on_cls = view.layout.posemb_on_cls
    slot = None
    if src_grid is not None:
        pos = torch.from_numpy(np.array(view["pos_embedding"], dtype=np.float32))  # (1, [1+] n, D)
        slot, grid = (pos[:, :1], pos[:, 1:]) if src_on_cls else (None, pos)
        if tuple(src_grid) != table.grid_size:
            notes.append(f"position embedding resampled from grid {src_grid[0]}x{src_grid[1]} to "
                         f"{table.grid_size[0]}x{table.grid_size[1]} (bilinear, corners aligned = scipy zoom order 1)")
        grid = resample_posemb(grid, tuple(src_grid), table.grid_size)
        if table.posemb_on_cls:
            slot = slot if slot is not None else torch.zeros(1, 1, table.width)
            out["pos_embed"] = torch.cat([slot, grid], dim=1).contiguous()
            slot = None  # stays in the table
        else:
            out["pos_embed"] = grid.contiguous()
    if table.class_token:
        cls = torch.from_numpy(np.array(view["cls"], dtype=np.float32))
        if slot is not None:  # vit_jax file into a patches-only spec: fold the slot into cls
            cls = cls + slot
            notes.append("class-token position embedding folded into cls_token (exact)")
        out["cls_token"] = cls
    return out


def convert_view(view: CanonicalView, spec: ViTSpec | None = None, *, img_size: Any = None,
                 num_classes: int | None = None, drop_pre_logits: bool = False, variant: str | None = None
                 ) -> Conversion:
    """Convert a canonical view. With `spec`, the result fits that spec (used by timm's `custom_load`); otherwise
    the architecture is inferred and `img_size` / `num_classes` / `drop_pre_logits` adjust it (with `spec`, they are
    refused: the spec says them)."""
    if spec is not None and not isinstance(spec, ViTSpec):  # a dict or "S/16" failed as "no attribute 'img_size'"
        raise TypeError(f"spec must be a ViTSpec (ViTSpec.from_dict(d), ViTSpec.from_variant('S/16')), got "
                        f"{type(spec).__name__} {spec!r:.80}")
    if spec is not None and (img_size is not None or num_classes is not None or drop_pre_logits):
        given = [name for name, value in (("img_size", img_size), ("num_classes", num_classes),
                                          ("drop_pre_logits", drop_pre_logits)) if value not in (None, False)]
        raise ValueError(f"{', '.join(given)} adjust an inferred architecture; with spec= they were ignored: put them "
                         f"in the spec (spec.replace(img_size=...)), or leave spec out")
    hint = spec.img_size if spec is not None else img_size
    source, src_grid = infer_from_view(view, hint)
    if variant is not None:
        check_variant(source, variant)
    notes: list[str] = []
    if spec is not None:
        check_compatible(source, spec)
        target = spec
    else:
        changes: dict[str, Any] = {}
        if img_size is not None:
            changes["img_size"] = img_size
        if num_classes is not None:
            changes["num_classes"] = num_classes
        if drop_pre_logits:
            changes["rep_size"] = None
        target = source.replace(**changes)
    # The table runs at the checkpoint's class count; a different count is the job of adapt_state_dict.
    table = target.replace(num_classes=source.num_classes)
    dropped: set[str] = set()
    if drop_pre_logits and source.rep_size:
        dropped = {"pre_logits/kernel", "pre_logits/bias", "head/kernel", "head/bias"}
        table = table.replace(num_classes=0)
        notes.append("pre-logits layer dropped; the head read its output, so the head is re-initialised too")
    elif target.num_classes == 0:
        notes.append(f"head of {source.num_classes} classes removed: the model outputs its pooled features")
    elif target.num_classes != source.num_classes:
        notes.append(f"head has {source.num_classes} classes, model {target.num_classes}: head re-initialised")
    elif num_classes is not None:  # asked for, and already so: said, since a new head may have been meant
        notes.append(f"head kept: --num-classes {num_classes} is the checkpoint's own class count (as timm keeps it)")

    # Validate every key and shape from the headers before reading any data.
    plan = planned(table)
    shapes = view.shapes
    missing, bad = [], []
    for rule, _, jax_keys in plan:
        for key, want in zip(jax_keys, rule.jax_shapes(table), strict=True):
            if key not in shapes:
                missing.append(_file_key(view, key))
            elif tuple(shapes[key]) != tuple(want):
                bad.append(f"{_file_key(view, key)}: {tuple(shapes[key])}, expected {tuple(want)}")
    posemb_keys = {"pos_embedding"} if src_grid is not None else set()
    if table.class_token:
        posemb_keys.add("cls")
        if "cls" not in shapes:
            missing.append(_file_key(view, "cls"))
        elif tuple(shapes["cls"]) != (1, 1, table.width):
            bad.append(f"{_file_key(view, 'cls')}: {tuple(shapes['cls'])}, expected {(1, 1, table.width)}")
    used = {k for _, _, jk in plan for k in jk} | posemb_keys | dropped
    unexpected = sorted(_file_key(view, k) for k in shapes if k not in used)
    _mismatch(sorted(set(missing)), unexpected, bad, view.layout)
    # Consistent headers may still declare hostile sizes (a 2 GiB kernel compresses to 2 MB) or integer weights
    reads = {_file_key(view, k): (tuple(shapes[k]), _source_dtype(view, k)) for k in sorted(used) if k in shapes}
    _check_float(reads, view)
    check_sizes({k: shape for k, (shape, _) in reads.items()}, _source_name(view))

    state_dict = _posemb_tensors(view, src_grid, table, notes)

    def fetch(jax_keys: tuple[str, ...]) -> list[np.ndarray]:
        arrays = [view[k] for k in jax_keys]
        if not hasattr(view.source, "dtypes"):  # no header was checked: check what was read
            _check_float({_file_key(view, k): (a.shape, a.dtype) for k, a in zip(jax_keys, arrays, strict=True)}, view)
        return arrays

    # One tensor at a time, with the next one's arrays read by a worker thread meanwhile (reading and CRC-checking
    # release the GIL, as does torch's copy): at most two rules' source arrays are alive, each released as soon as
    # its transformed copy exists. Only the worker touches the view, so its scan cache needs no lock.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="npz-read") as reader:
        pending = reader.submit(fetch, plan[0][2]) if plan else None
        for i, (rule, torch_key, _) in enumerate(plan):
            assert pending is not None
            arrays = pending.result()
            pending = reader.submit(fetch, plan[i + 1][2]) if i + 1 < len(plan) else None
            state_dict[torch_key] = rule.transform(arrays)
            del arrays
    view.release()
    return Conversion(state_dict=state_dict, spec=target, source_spec=source, layout=view.layout, notes=notes)


def convert_arrays(arrays: Mapping[str, np.ndarray], spec: ViTSpec | None = None, **options: Any
                   ) -> dict[str, torch.Tensor]:
    """Flat npz arrays (any supported layout) -> hub-vit state dict fitting `spec` (inferred when None)."""
    view = arrays if isinstance(arrays, CanonicalView) else canonicalize(arrays)
    return convert_view(view, spec, **options).state_dict


def convert_npz_file(path: str | Path, spec: ViTSpec | None = None, **options: Any) -> dict[str, torch.Tensor]:
    """Read and convert a Google `.npz` checkpoint (lazily, one array at a time). timm's `custom_load` calls this
    with the model's spec: a learned posemb is resampled to that spec's grid; a different head size is left to
    `adapt_state_dict`; a structural disagreement raises an error that names both architectures."""
    return convert_file(path, spec, **options).state_dict


def convert_file(path: str | Path, spec: ViTSpec | None = None, **options: Any) -> Conversion:
    """Like `convert_npz_file`, returning the full `Conversion` (layout, inferred spec, notes)."""
    with NpzArchive(path) as archive:
        return convert_view(canonicalize(archive), spec, **options)


def load_checkpoint(path: str | Path, spec: ViTSpec | None = None) -> dict[str, torch.Tensor]:
    """Any weights file as a hub-vit state dict: a Google `.npz` converted to fit `spec` (see `convert_npz_file`),
    `.safetensors` / `.pt` / `.pth` / `.bin` read by `hub_vit.weights.load_weights_file`. timm's `custom_load` and
    `--init` / export of a weights file read through this."""
    if Path(path).is_dir():  # was "does not exist", of a folder that does
        raise IsADirectoryError(f"{str(path)!r} is a folder, not a weights file; a hub-vit model folder loads with "
                                "hub_vit.load_model_folder")
    if Path(path).suffix.lower() == ".npz":
        if not Path(path).is_file():
            raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
        return convert_npz_file(path, spec=spec)
    return load_weights_file(path)


__all__ = ["Conversion", "convert_arrays", "convert_file", "convert_npz_file", "convert_view", "load_checkpoint"]
