"""Reading weight files into a hub-vit model: format dispatch, adaptation to the target model, strict loading.

Loading is always strict: a mismatch raises an error listing the missing and unexpected keys (big_vision's
`merge_params` style) and every shape that disagrees, instead of silently leaving random tensors in the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hub_vit.layers import resample_pos_table
from hub_vit.weights_check import (
    CheckpointMismatchError,
    check_against_spec,
    check_values,
    check_weights_file,
    mismatch_message,
    strip_prefix,
)

if TYPE_CHECKING:
    from hub_vit.model import VisionTransformer
    from hub_vit.variants import ViTSpec

HEAD_KEYS = ("head.weight", "head.bias")
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
# every weights format hub-vit reads (`.npz`: `hub_vit.conversion.load_checkpoint`, the others: `load_weights_file`)
WEIGHTS_SUFFIXES = (".safetensors", ".npz", *TORCH_SUFFIXES)
# where training scripts keep the weights in a torch file: {'model': sd, 'optimizer': ..., 'epoch': 3}
WEIGHTS_KEYS = ("model", "state_dict", "model_state_dict")
_TRAINING_STATE = {"optimizer", "scheduler", "step"}  # a training checkpoint's state, not its weights


class WeightsFileError(ValueError):
    """A weights file that cannot be used as weights: cut short, not the format its suffix says, or holding something
    other than a dict of tensors. `reason` says which in one line; the message also names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"weights file {str(path)!r}: {reason}")
        self.path, self.reason = path, reason


class TrainingStateError(WeightsFileError):
    """A torch file holding a training state (optimizer, scheduler, step) rather than weights."""


def check_weights_suffix(path: str | Path) -> None:
    """ValueError naming the file unless its suffix is one of WEIGHTS_SUFFIXES: checked before a model is built for
    it (a text file reached the torch unpickler, which failed with `KeyError: 101`)."""
    path = Path(path)
    if path.suffix.lower() not in WEIGHTS_SUFFIXES:
        raise ValueError(f"unsupported weights file {path.name!r}; expected .safetensors, .npz, .pt, .pth or .bin")


def load_weights_file(path: str | Path, prefer: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Read `.safetensors` or `.pt/.pth/.bin` (weights only, never arbitrary pickles). A Google `.npz` checkpoint is
    another format with its own reader: `hub_vit.conversion.load_checkpoint` reads all of them. `prefer`: keys of a
    torch checkpoint dict to take the weights from before WEIGHTS_KEYS (timm's EMA weights, `state_dict_ema`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except SafetensorError as exc:  # cut short, or not safetensors at all
            raise WeightsFileError(path, f"not a readable safetensors file ({exc})") from None
    if suffix in TORCH_SUFFIXES:
        return _torch_file_weights(path, prefer)
    check_weights_suffix(path)
    raise ValueError(f"{path.name!r} is a Google JAX checkpoint: read it with hub_vit.conversion.load_checkpoint "
                     "(or convert it once with `hub-vit convert`)")


def _torch_file_weights(path: Path, prefer: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The weights of a torch file: its top level when that is all tensors, else the dict of tensors under the first
    of `prefer`, then WEIGHTS_KEYS; WeightsFileError saying what it holds otherwise."""
    import pickle
    import struct
    import zipfile

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's message is a paragraph about weights_only
        raise WeightsFileError(path, "not a weights-only torch file (torch.load(weights_only=True) refuses it)") \
            from None
    # a copy cut short: RuntimeError "PytorchStreamReader failed reading zip archive"; other bytes: the legacy
    # unpickler's KeyError / EOFError / struct.error
    except (RuntimeError, EOFError, KeyError, struct.error, zipfile.BadZipFile) as exc:
        first = (str(exc).splitlines() or [""])[0]
        what = first if isinstance(exc, RuntimeError) and first else f"{type(exc).__name__}: {first}".rstrip(": ")
        raise WeightsFileError(path, f"cannot read it as a torch file ({what}); is the file complete?") from None
    if not isinstance(state, dict):
        raise WeightsFileError(path, f"it holds a {type(state).__name__}, not a dict of weights; pass a file of "
                                     "model.state_dict()")
    if _all_tensors(state):
        return state
    keys = tuple(dict.fromkeys((*prefer, *WEIGHTS_KEYS)))
    for key in keys:
        if isinstance(state.get(key), dict) and _all_tensors(state[key]):
            return state[key]
    if _TRAINING_STATE <= set(state):
        raise TrainingStateError(path, "it is the training state of a checkpoint (optimizer, scheduler, step), not "
                                       "weights; pass the model's weights file")
    entries = ", ".join(f"{k}: {type(v).__name__}" for k, v in list(state.items())[:5])
    raise WeightsFileError(path, f"not a weights file: its top level holds non-tensor entries ({entries}) and none "
                                 f"of {', '.join(keys)} is a dict of tensors; pass a file of "
                                 "model.state_dict()")


def _all_tensors(entries: dict[Any, Any]) -> bool:
    return bool(entries) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in entries.items())


def read_checked_weights(path: str | Path, spec: ViTSpec, config: str, adaptable: bool = False,
                         prefer: tuple[str, ...] = (), values: bool = True) -> dict[str, torch.Tensor]:
    """A `.safetensors` / torch weights file for a model of `spec` (what `config` names), read with the checks of
    docs/architecture.md "Loading untrusted files", each refusal naming the file: a safetensors header before any
    tensor is read (dtypes, sizes, tensors vs `spec`); a torch file, which has no header, read weights-only and then
    its tensors' shapes vs `spec`; then (`values`) no integer / NaN / inf weights. `values=False` only for a caller
    that hands the result to `adapt_state_dict(..., source=...)`, which checks them: one pass over every weight,
    not two. `adaptable`, `prefer`: as in `check_against_spec`, `load_weights_file`. Prefixes are stripped."""
    path = Path(path)
    if path.is_dir():  # load_weights_file would say it does not exist
        raise IsADirectoryError(f"{weights_source(path)} is a folder; give the weights file in it")
    check_weights_file(path, spec, config=config, adaptable=adaptable)  # no-op but for a .safetensors file
    state = strip_prefix(load_weights_file(path, prefer=prefer))
    if path.suffix.lower() != ".safetensors":
        check_against_spec({k: tuple(v.shape) for k, v in state.items()}, spec, path.name, config, adaptable)
    if values:
        check_values(state, weights_source(path))
    return state


def weights_source(path: str | Path) -> str:
    """How a refusal names a weights file (`check_values`' `source`)."""
    return f"weights file {str(path)!r}"


def adapt_state_dict(state_dict: dict[str, torch.Tensor], model: VisionTransformer,
                     source_grid: tuple[int, int] | None = None, source: str = "the checkpoint"
                     ) -> dict[str, torch.Tensor]:
    """Fit a hub-vit state dict to `model`: strip prefixes, resample a learned position embedding to the model's
    grid, adapt the patch filters to the model's input channels (`in_chans=1` from RGB weights), and drop a head whose
    class count differs (the model keeps its freshly initialised head, as for fine-tuning); refuses non-float and
    non-finite weights (`hub_vit.weights_check.check_values`). Also used as timm's
    `pretrained_filter_fn`. `source_grid` is the (rows, cols) patch grid the checkpoint's learned position embedding
    was trained on; without it the grid must be square. `source` names the weights in a refusal (`weights_source`:
    the file they were read from)."""
    state_dict = dict(strip_prefix(state_dict))
    check_values(state_dict, source)  # NaN weights would serve NaN; integer ones would be cast silently
    spec = model.spec
    pos = state_dict.get("pos_embed")
    if pos is not None and model.pos_embed is not None and pos.shape != model.pos_embed.shape:
        extra = 1 if spec.posemb_on_cls else 0
        n_old = pos.shape[1] - extra
        side = int(round(n_old**0.5))
        old_grid = tuple(source_grid) if source_grid is not None else (side, side)
        if old_grid[0] * old_grid[1] != n_old:
            raise CheckpointMismatchError(
                f"pos_embed has {pos.shape[1]} entries, which is not a square grid; cannot resample it to "
                f"{spec.grid_size[0]}x{spec.grid_size[1]}"
            )
        state_dict["pos_embed"] = resample_pos_table(pos, old_grid, spec.grid_size, extra)
    conv = state_dict.get("patch_embed.proj.weight")  # (D, C, p, p)
    in_chans = model.patch_embed.proj.weight.shape[1]
    if conv is not None and conv.ndim == 4 and conv.shape[1] != in_chans:
        # timm's rule for its own pretrained models: RGB -> 1 channel sums the filters (a grey image then gives the
        # RGB model's output for that image repeated 3x), other counts repeat and rescale them
        from timm.models import adapt_input_conv

        state_dict["patch_embed.proj.weight"] = adapt_input_conv(in_chans, conv)
    head_w = state_dict.get("head.weight")
    model_head = model.head.weight if isinstance(model.head, torch.nn.Linear) else None
    if head_w is not None and (model_head is None or head_w.shape != model_head.shape):
        for key in HEAD_KEYS:
            state_dict.pop(key, None)
        if model_head is not None:
            state_dict.update({k: v.detach().clone() for k, v in model.state_dict().items() if k in HEAD_KEYS})
    check_state_dict(state_dict, model)  # timm's own load_state_dict follows; fail here with the full diff
    return state_dict


def check_state_dict(state_dict: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Raise one error naming every missing, unexpected and mis-shaped key (big_vision `merge_params` style)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mis_shaped = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(state_dict))
        if tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or mis_shaped:
        other = _other_architecture(state_dict, expected)
        header = "checkpoint does not match the model" + (f": {other}, another architecture" if other else ":")
        raise CheckpointMismatchError(mismatch_message(header, missing, unexpected, mis_shaped,
                                                       most=5 if other else None))


def _other_architecture(state_dict: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> str:
    """'width 64, depth 2 (checkpoint) vs width 384, depth 12 (model)' where those differ, else '': a weights file
    of another size than the model named for it differs in every block, and the keys alone said it in 4 kB."""
    def size(weights: dict[str, torch.Tensor]) -> tuple[int | None, int]:
        kernel = weights.get("patch_embed.proj.weight")
        return (None if kernel is None else int(kernel.shape[0]),
                len({key.split(".")[1] for key in weights if key.startswith("blocks.")}))

    (width, depth), (model_width, model_depth) = size(state_dict), size(expected)
    if (width, depth) == (model_width, model_depth) or width is None:
        return ""
    return f"width {width}, depth {depth} (checkpoint) vs width {model_width}, depth {model_depth} (model)"


def load_strict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """`load_state_dict(strict=True)`, preceded by a full diff so the error names every problem at once."""
    check_state_dict(state_dict, model)
    model.load_state_dict(state_dict, strict=True)


def load_adapted_state_dict(model: VisionTransformer, state_dict: dict[str, torch.Tensor],
                            source: str = "the checkpoint") -> None:
    """Strictly load a checkpoint into `model` after adapting it (prefix, position-embedding size, head size);
    `source` as in `adapt_state_dict`."""
    load_strict(model, adapt_state_dict(state_dict, model, source=source))


__all__ = ["TORCH_SUFFIXES", "WEIGHTS_KEYS", "WEIGHTS_SUFFIXES", "CheckpointMismatchError", "TrainingStateError",
           "WeightsFileError", "adapt_state_dict", "check_state_dict", "check_weights_suffix",
           "load_adapted_state_dict", "load_strict", "load_weights_file", "mismatch_message", "read_checked_weights",
           "strip_prefix", "weights_source"]
