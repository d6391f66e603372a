"""The model a run starts from: a registered architecture (fresh or with its published weights), or any hub-vit model
folder / weights file to fine-tune, with a new classifier head when the class count differs."""

from __future__ import annotations

import json
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
    try:
        architecture = json.loads((Path(init) / "config.json").read_text(encoding="utf-8")).get("architecture")
    except (OSError, ValueError, AttributeError):
        return None
    return architecture if isinstance(architecture, str) else None


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
    base = recipe.model.split(".", 1)[0]
    if init is None or not Path(init).is_dir():
        if base not in MODELS:
            raise ValueError(f"unknown model {recipe.model!r}; valid names: {', '.join(MODELS)} "
                             "(or pass a model folder with --init)")
    if init is None:
        model = timm.create_model(recipe.model, pretrained=recipe.pretrained, num_classes=num_classes, img_size=img)
        source = f"{recipe.model} ({'published weights' if recipe.pretrained else 'random init, big_vision scheme'})"
        return model, source
    path = Path(init)
    if path.is_dir():
        from hub_vit.folder import load_model_folder

        loaded, _info = load_model_folder(path)
        spec, state = loaded.spec, loaded.state_dict()
    elif path.is_file():
        from hub_vit.weights import load_weights_file

        spec = MODELS[base].spec
        state = load_weights_file(path, spec=spec)
    else:
        raise FileNotFoundError(f"--init {str(path)!r} is neither a model folder nor a weights file")
    model = VisionTransformer(spec.replace(num_classes=num_classes, img_size=img))
    model.load_adapted_state_dict(state)  # resamples pos_embed, swaps a head of another size for a zero-init one
    return model, f"fine-tuned from {path}"
