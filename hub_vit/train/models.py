"""The model a run starts from: a registered architecture (fresh or with its published weights), or any hub-vit model
folder / weights file to fine-tune, with a new classifier head when the class count differs."""

from __future__ import annotations

from pathlib import Path

from hub_vit.model import VisionTransformer
from hub_vit.train.recipe import Recipe


def init_folder_architecture(init: str | Path | None) -> str | None:
    """The architecture recorded in `init`'s config.json when `init` is a model folder, else None.

    A folder decides the architecture that is trained whatever `recipe.model` says, so the run records this name
    (recipe.json, training.json, the card) instead of the preset's default. An unreadable folder gives None here and
    its clear error from `build_model`.
    """
    if init is None or not Path(init).is_dir():
        return None
    from hub_vit.folder import read_folder_config

    architecture = (read_folder_config(init) or {}).get("architecture")
    return architecture if isinstance(architecture, str) else None


def init_resized_note(init: str | Path | None, img_size: int) -> str | None:
    """What a run says when the model folder `init` was made for another image size than the run's `img_size`: its
    position embedding is resampled (fine-tuning at a new resolution, as big_vision does), which is easy to do
    unawares since the preset, not the folder, sets the size. None otherwise (also for an unreadable folder: its error
    comes from `build_model`)."""
    if init is None or not Path(init).is_dir():
        return None
    from hub_vit.folder import read_folder_config

    config = read_folder_config(init) or {}
    size = config.get("img_size")
    if not isinstance(size, list) or len(size) != 2 or list(size) == [img_size, img_size]:
        return None
    # a learned embedding is interpolated to the new grid; a sincos2d one is a formula of the grid, computed anew
    how = "computed for the new grid" if config.get("posemb") == "sincos2d" else "resampled"
    keep = f"; pass img_size={size[0]} to keep its size" if size[0] == size[1] else ""
    return (f"--init {str(init)!r} is a {size[0]}x{size[1]} model and this run trains at {img_size}x{img_size} (the "
            f"recipe's img_size): its position embedding is {how}{keep}")


class ModelChoiceError(ValueError):
    """The model or starting weights cannot be used: an unknown pretrained tag, --pretrained for a model without
    published weights, or an --init file that is unreadable or does not fit the model (the message names the file)."""


def check_init_path(init: str | Path | None) -> None:
    """ModelChoiceError for an --init folder that is not a model folder but one of a run's: the run folder (whose
    model folder is `model/`) or one of its checkpoints (weights in `model.safetensors`, architecture in the run's
    recipe.json). Both are easy to pass by mistake, and were answered with 'config.json is missing' alone.

    FileNotFoundError for a path that is not there, or a folder without config.json: checked with the rest before
    the run folder is compared, where a resumed run said it was "started with another recipe" (the model such a
    folder does not name).
    """
    if init is not None and not Path(init).exists():
        raise FileNotFoundError(f"--init {str(init)!r} is neither a model folder nor a weights file")
    if init is None or not Path(init).is_dir() or (Path(init) / "config.json").is_file():
        return
    path = Path(init)
    if (path / "recipe.json").is_file() or (path / "checkpoints").is_dir():
        if (path / "model" / "config.json").is_file():
            raise ModelChoiceError(f"--init {str(path)!r} is a training run folder, not a model folder: pass its "
                                   f"model folder, --init {str(path / 'model')!r}")
        raise ModelChoiceError(f"--init {str(path)!r} is a training run folder whose run is not complete (no model/ "
                               "yet): finish it, or pass one of its checkpoints' weights, --init "
                               f"{str(path / 'checkpoints' / 'step_N' / 'model.safetensors')!r} with "
                               f"--model {_run_model(path) or 'ARCH'}")
    if (path / "model.safetensors").is_file() and (path / "state.pt").is_file():
        run = path.parent.parent
        raise ModelChoiceError(f"--init {str(path)!r} is a training checkpoint, not a model folder: pass its weights, "
                               f"--init {str(path / 'model.safetensors')!r} with --model {_run_model(run) or 'ARCH'} "
                               f"(the run's architecture){_or_model_folder(run)}")
    raise FileNotFoundError(f"--init {str(path)!r} is not a hub-vit model folder: config.json is missing")


def _run_model(run: Path) -> str | None:
    """The architecture a run folder's recipe.json records, if it can be read."""
    import json

    try:
        model = json.loads((run / "recipe.json").read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


def _or_model_folder(run: Path) -> str:
    model = run / "model"
    return f", or the finished run's model folder, --init {str(model)!r}" if (model / "config.json").is_file() else ""


def build_model(recipe: Recipe, num_classes: int, init: str | Path | None = None) -> tuple[VisionTransformer, str]:
    """Returns (model, description of where its weights came from).

    `init`: a hub-vit model folder (`config.json` + `model.safetensors`, whose architecture is used and `recipe.model`
    ignored), or a weights file (`.safetensors`, `.npz`, `.pt`) for the architecture `recipe.model`. Position
    embeddings are resampled to `recipe.img_size` and a head of another size is replaced by a zero-initialised one
    (big_vision's fine-tuning convention).
    """
    import timm

    import hub_vit  # noqa: F401  (registers the hub-vit architectures with timm)
    from hub_vit.catalog import MODELS

    img = (recipe.img_size, recipe.img_size)
    base, _, tag = recipe.model.partition(".")
    if init is None or not Path(init).is_dir():
        if base not in MODELS:
            raise ValueError(f"unknown model {recipe.model!r}; valid names: {', '.join(MODELS)} "
                             "(or pass a model folder with --init)")
        if tag:  # else timm's "RuntimeError: Invalid pretrained tag (nope)" traceback
            try:
                MODELS[base].weight(tag)
            except ValueError as exc:
                raise ModelChoiceError(str(exc)) from None
    if tag and init is None and not recipe.pretrained:  # it trained from random weights, its card naming the tag
        raise ModelChoiceError(f"model {recipe.model!r} names the published weights {tag!r}, but the run starts from "
                               f"random weights (--scratch, pretrained=False); start from them (--pretrained) or "
                               f"name the architecture alone ({base!r}) to train from scratch")
    if init is not None and recipe.pretrained:
        # both choose the starting weights; --init used to win silently while `pretrained: true` was recorded
        raise ModelChoiceError("--pretrained and --init both choose the starting weights; pass one of them")
    if init is None:
        if recipe.pretrained and not MODELS[base].weights:
            with_weights = [name for name, entry in MODELS.items() if entry.weights]
            raise ModelChoiceError(f"model {base!r} has no published weights for --pretrained; models with weights: "
                                   f"{', '.join(with_weights)} (or drop --pretrained to train from scratch)")
        model = timm.create_model(recipe.model, pretrained=recipe.pretrained, num_classes=num_classes, img_size=img)
        source = f"{recipe.model} ({'published weights' if recipe.pretrained else 'random init, big_vision scheme'})"
        return model, source
    path = Path(init)
    if not path.exists():
        raise FileNotFoundError(f"--init {str(path)!r} is neither a model folder nor a weights file")
    try:
        return _load_init(path, recipe, num_classes, img), f"fine-tuned from {path}"
    except FileNotFoundError:
        raise
    except _init_errors() as exc:
        raise ModelChoiceError(_init_error_text(path, recipe, exc)) from None


def _load_init(path: Path, recipe: Recipe, num_classes: int, img: tuple[int, int]) -> VisionTransformer:
    from hub_vit.catalog import MODELS

    if path.is_dir():
        from hub_vit.folder import load_model_folder

        loaded, _info = load_model_folder(path)
        spec, state = loaded.spec, loaded.state_dict()
    else:
        from hub_vit.conversion import load_checkpoint

        spec = MODELS[recipe.model.split(".", 1)[0]].spec
        state = load_checkpoint(path, spec=spec)  # WeightsFileError for a file that holds no weights
    from hub_vit.weights import load_adapted_state_dict

    model = VisionTransformer(spec.replace(num_classes=num_classes, img_size=img))
    load_adapted_state_dict(model, state)  # resamples pos_embed, swaps a head of another size for a zero-init one
    return model


def _init_errors() -> tuple[type[BaseException], ...]:
    """What reading a broken or mismatched --init raises: hub-vit's ValueErrors (CheckpointMismatchError,
    ArchitectureMismatchError, CheckpointFormatError, WeightsFileError: a weights file cut short, not what its suffix
    says or holding no weights; a folder that is not a model folder), the readers' own errors where one gets past
    them (nothing here downloads, so a RuntimeError is the file's), and OSError for an unreadable one."""
    import pickle
    import struct
    import zipfile

    from safetensors import SafetensorError

    return (ValueError, KeyError, SafetensorError, pickle.UnpicklingError, struct.error, RuntimeError,
            zipfile.BadZipFile, EOFError, OSError)


def _init_error_text(path: Path, recipe: Recipe, exc: BaseException) -> str:
    import struct

    from hub_vit.weights import CheckpointMismatchError, TrainingStateError, WeightsFileError

    what = "model folder" if path.is_dir() else f"weights file (read as --model {recipe.model})"
    if isinstance(exc, TrainingStateError):  # a hub-vit run keeps the weights beside it, and knows their model
        weights, run = path.with_name("model.safetensors"), path.parent.parent.parent
        reason = ("it is the training state of a hub-vit checkpoint (optimizer, scheduler, step), not weights; pass "
                  f"the weights beside it, --init {str(weights)!r} with --model {_run_model(run) or 'ARCH'}")
    elif isinstance(exc, WeightsFileError):  # one line already, with its own advice
        reason = exc.reason
    elif isinstance(exc, (OSError, EOFError, RuntimeError, struct.error)):
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = f"cannot read it ({first}); is the file complete?"
    else:
        reason = _one_line(str(exc))
    hint = ""
    if not path.is_dir() and (isinstance(exc, CheckpointMismatchError) or type(exc).__name__ ==
                              "ArchitectureMismatchError"):
        hint = ("; a weights file is loaded into --model (the preset's default unless given): pass the file's "
                "architecture with --model, or --init its model folder")
    return f"--init {str(path)!r}: cannot use this {what}: {reason}{hint}"


def _one_line(message: str, names: int = 3) -> str:
    """A multi-line mismatch report ('missing keys (96): a, b, c, ...' per line) as one line, with the first few
    entries of each group."""
    parts = []
    for line in (line.strip() for line in message.splitlines()):
        head, sep, items = line.partition(": ")
        separator = "; " if "; " in items else ", "  # shape mismatches are '; '-separated
        listed = items.split(separator) if sep else []
        if len(listed) > names:
            line = f"{head}: {separator.join(listed[:names])}{separator}..."
        if line:
            parts.append(line.rstrip(":"))
    return " | ".join(parts) if len(parts) > 2 else "; ".join(parts)
