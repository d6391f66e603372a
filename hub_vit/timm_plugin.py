"""The timm front door: `import hub_vit` registers every `hub_vit.catalog.MODELS` name with timm (once timm is
imported: `hub_vit.registration`).

`timm.create_model("simplevit_s16")` builds the paper's S/16; `timm.create_model("vit_b16.augreg_in21k_ft_in1k_384",
pretrained=True)` downloads and converts Google's npz; `pretrained_cfg_overlay=dict(file="model.safetensors")`
loads a local file, and `file="x.npz"` converts a local Google npz (no `custom_load=True` needed), as does
`checkpoint_path="x.npz"` (through `model.load_pretrained`, timm's hook for files it does not read). Every local
file, `file=` or `checkpoint_path=`, is read by hub-vit's loader with its checks (docs/architecture.md "Loading
untrusted files"), never by timm's. The entry-point functions are generated from the catalog, so the table stays the
only source.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import timm.models
from timm.models import (
    _factory,
    _helpers,
    build_model_with_cfg,
    generate_default_cfgs,
    register_model,
    resolve_pretrained_cfg,
)

from hub_vit.catalog import MODELS, ModelEntry
from hub_vit.variants import DEFAULT_DATA_CFG, GENERIC_ARCHITECTURE, GENERIC_SPEC, ViTSpec

if TYPE_CHECKING:
    import torch

    from hub_vit.model import VisionTransformer

# The model and the weight adapter are imported inside `_build`, not here: this module runs from the post-import
# hook that fires once timm is imported (hub_vit.registration), which can happen while `hub_vit.model` itself is
# still importing timm. Registration needs only the catalog.

# No published weights: still a complete data config (Google's models take [-1, 1] inputs: mean = std = 0.5).
_UNTRAINED_CFG = dict(
    url="", custom_load=True, num_classes=1000, input_size=(3, 224, 224), first_conv="patch_embed.proj",
    classifier="head", license="apache-2.0", **DEFAULT_DATA_CFG,
)


def _cfgs_for(entry: ModelEntry) -> dict[str, dict[str, Any]]:
    if not entry.weights:
        img = entry.spec.img_size
        return {entry.name: dict(_UNTRAINED_CFG, input_size=(3, *img))}
    return {f"{entry.name}.{w.tag}": w.pretrained_cfg() for w in entry.weights}


default_cfgs = generate_default_cfgs({k: v for e in MODELS.values() for k, v in _cfgs_for(e).items()})


def _build(architecture: str, spec: ViTSpec, pretrained: bool, cfg: Any, **kwargs: Any) -> VisionTransformer:
    """timm's builder (pretrained cfg, weight loading, features_only) for one spec; the one place that imports the
    model, so registration itself stays free of it (see the note at the top)."""
    from hub_vit.model import VisionTransformer, register_checkpoint_loader
    from hub_vit.weights import adapt_state_dict

    register_checkpoint_loader(_load_pretrained)  # timm's custom_load and checkpoint_path=x.npz read through it
    if pretrained:
        if cfg is not None and not (cfg.url or cfg.file or cfg.hf_hub_id):
            # timm's own words, before the build: it built the model first (vit_h14: 632M parameters, 9 s) to say it
            raise RuntimeError(f"No pretrained weights exist for {architecture}. Use `pretrained=False` for random "
                               "init (`hub-vit models` lists the pretrained tags of each model).")
        _check_file(cfg)
        _check_weights(architecture, spec, cfg, kwargs)
    builder_log = logging.getLogger("timm.models._builder")
    builder_log.addFilter(_drop_adapted_conv_notice)
    try:
        model = build_model_with_cfg(
            VisionTransformer,
            architecture,
            pretrained,
            pretrained_cfg=cfg,
            spec=spec,
            pretrained_filter_fn=adapt_state_dict,
            feature_cfg=dict(out_indices=min(3, spec.depth), feature_cls="getter"),  # timm ViT: the last 3 blocks
            **kwargs,
        )
    finally:
        builder_log.removeFilter(_drop_adapted_conv_notice)
    return model


def _drop_adapted_conv_notice(record: logging.LogRecord) -> bool:
    """timm's loader warns "Pretrained patch_embed.proj weights already match the model, but input_size declares 3
    source channels and the model has 1. Loading unchanged." for every `in_chans=` build: they match because
    `adapt_state_dict` (timm's filter here) adapted them already, by timm's own rule (`adapt_input_conv`)."""
    return "weights already match the model" not in record.getMessage()


def _load_pretrained(model: VisionTransformer, checkpoint_path: str) -> None:
    """`model.load_pretrained(path)` (timm's `custom_load`: every local `file=`, and `create_model(...,
    checkpoint_path="x.npz")`): a Google `.npz` converted to fit the model's spec, or a safetensors / torch state dict
    read with hub-vit's checks; then adapted (`adapt_state_dict`) and loaded strictly. Refusals name the file."""
    from hub_vit.weights import load_adapted_state_dict, read_checked_weights, weights_source

    path = Path(checkpoint_path)
    if path.suffix.lower() == ".npz":
        state = _converted(path, model.spec)
    else:  # values: checked by adapt_state_dict below, one pass
        state = read_checked_weights(path, model.spec, _architecture(model), adaptable=True, values=False)
    load_adapted_state_dict(model, state, source=weights_source(path))


def _converted(path: Path, spec: ViTSpec) -> dict[str, torch.Tensor]:
    """A Google `.npz` converted to fit `spec`. The converter's inference raises a KeyError for a checkpoint that lacks
    a tensor every ViT has (`hub-vit convert` prints its text); here it would surface as a repr-quoted KeyError."""
    from hub_vit.conversion import load_checkpoint
    from hub_vit.weights import weights_source

    try:
        return load_checkpoint(path, spec=spec)
    except KeyError as exc:
        raise ValueError(f"{weights_source(path)}: {exc.args[0] if exc.args else 'a tensor is missing'}") from None


def _architecture(model: torch.nn.Module) -> str:
    """The timm name `model` was built as, for messages ("simplevit_digits declares width: 64, ..."); timm sets
    `pretrained_cfg` before it loads weights."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return str(cfg.get("architecture") or "the model")


# timm's own `load_checkpoint`, which `_load_checkpoint` hands every other model and every call it does not take over
# (`__wrapped__`: the original still, should this module be imported again)
_timm_load_checkpoint = getattr(_helpers.load_checkpoint, "__wrapped__", _helpers.load_checkpoint)
_EMA_KEYS = ("state_dict_ema", "model_ema")  # timm's `use_ema=True`: a training checkpoint's EMA weights first


def _load_checkpoint(model: torch.nn.Module, checkpoint_path: str, *args: Any, **kwargs: Any) -> Any:
    """timm's `load_checkpoint`, which `create_model(..., checkpoint_path=FILE)` calls once the model is built, for a
    hub-vit model: FILE read by hub-vit's loader with its checks (`read_checked_weights`: a safetensors header before
    any tensor is read, weights-only torch files, shapes, values), then loaded strictly as timm does, no adaptation.
    timm reads the file itself for every suffix but `.npz` / `.npy` (those go to `model.load_pretrained`, hub-vit's
    already): NaN weights loaded silently, and a text file or random bytes gave raw unpickler errors advising
    `weights_only=False`. The entry point never sees `checkpoint_path`, so this is the only place to catch it. Other
    models, and calls asking for timm's non-strict / remapping / filtering / unsafe loading, go to timm's own. The
    options are read from timm's own signature: its releases differ in them (`weights_only` is recent)."""
    from hub_vit.model import VisionTransformer
    from hub_vit.weights import check_state_dict, read_checked_weights

    call = inspect.signature(_timm_load_checkpoint).bind(model, checkpoint_path, *args, **kwargs)
    call.apply_defaults()
    options = call.arguments
    path = Path(checkpoint_path)
    own = (isinstance(model, VisionTransformer) and options.get("strict", True) and options.get("weights_only", True)
           and not options.get("remap") and options.get("filter_fn") is None)
    if not own or path.suffix.lower() in (".npz", ".npy"):
        return _timm_load_checkpoint(model, checkpoint_path, *args, **kwargs)
    if path.is_dir():
        raise IsADirectoryError(f"checkpoint_path={str(path)!r} is a folder; give the weights file in it, or load a "
                                f"model folder as timm.create_model('local-dir:{path}', pretrained=True)")
    prefer = _EMA_KEYS if options.get("use_ema", True) else ()
    state = read_checked_weights(path, model.spec, _architecture(model), prefer=prefer)
    check_state_dict(state, model)  # a mismatch the spec cannot show (a custom block) is still named in full
    return model.load_state_dict(state, strict=True)


# `create_model` calls `_factory.load_checkpoint`; `timm.models.load_checkpoint` is the same function, public
_load_checkpoint.__wrapped__ = _timm_load_checkpoint  # type: ignore[attr-defined]
for _module in (_factory, _helpers, timm.models):
    _module.load_checkpoint = _load_checkpoint  # type: ignore[attr-defined]


def _check_file(cfg: Any) -> None:
    """A `pretrained_cfg_overlay=dict(file=...)` that names no file (timm's loader raised a `FileNotFoundError` with
    no message, its log alone naming the path), or a file of no weights format hub-vit reads (a text file gave the
    unpickler's `KeyError: 101`): refused before the model is built."""
    if cfg.source == "local-dir" and cfg.file:  # cfg's `file` is the folder
        _check_local_folder(Path(cfg.file))
        return
    if not cfg.file:
        return
    path = Path(cfg.file)
    if path.is_dir():
        raise IsADirectoryError(f"pretrained_cfg_overlay file={str(path)!r} is a folder; give the weights file in it "
                                f"(model.safetensors, a .pth, a Google .npz), or load a model folder as "
                                f"timm.create_model('local-dir:{path}', pretrained=True)")
    if not path.is_file():
        raise FileNotFoundError(f"pretrained_cfg_overlay file={str(path)!r}: no such file")
    if cfg.source not in ("local-dir", "hf-hub"):  # timm names those files itself
        from hub_vit.weights import check_weights_suffix

        check_weights_suffix(path)


# the files timm's `local-dir:` loader takes as the weights, in its order (`timm.models._hub._PREFERRED_FILES`); past
# them it falls back to the first *.safetensors in the folder: in a hub-vit folder, the out-of-domain statistics
LOCAL_DIR_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth")


def _check_local_folder(folder: Path) -> None:
    """A `local-dir:` folder of a hub-vit model: its weights are there (one file: shards are named), and its
    labels.txt agrees with config.json's id2label, as hub-vit's folder loader and transformers' check them."""
    from hub_vit.folder import model_folder_files, read_config_json, read_labels
    from hub_vit.hf.configuration_hub_vit import check_labels_file, saved_label_names

    if not any((folder / name).is_file() for name in LOCAL_DIR_WEIGHTS):
        model_folder_files(folder)  # names what is missing (or that the weights are in shards)
    id2label = read_config_json(folder / "config.json").get("id2label")
    if isinstance(id2label, dict):
        check_labels_file(folder, read_labels(folder), saved_label_names(id2label))


def _check_weights(architecture: str, spec: ViTSpec, cfg: Any, kwargs: dict[str, Any]) -> None:
    """The weights file's header against what describes it, before timm builds the model (`hub_vit.weights_check`).
    A `local-dir:` / `hf-hub:` folder's weights must be exactly what its config.json's `model_args` describe (timm
    passes them as `pretrained_model_args`), head included: a different `num_classes=` asked for here still gets a
    new head, as in timm. A bare `file=` is compared with the model being built, less what loading adapts. A torch
    file has no header: it is checked as it is read, right after the build (`_load_pretrained`); reading it here as
    well would read every weight twice."""
    from hub_vit.weights_check import check_weights_file

    saved = kwargs.get("pretrained_model_args")
    path = _local_weights(cfg)
    if path is None:
        return
    if saved:
        fields = {k: v for k, v in saved.items() if k in ViTSpec.__dataclass_fields__}
        check_weights_file(path, ViTSpec(**fields), config="config.json")
        return
    target = spec.replace(**{k: v for k, v in kwargs.items() if k in ViTSpec.__dataclass_fields__})
    check_weights_file(path, target, config=architecture, adaptable=True)


def _local_weights(cfg: Any) -> Path | None:
    """The local safetensors file timm will load for `cfg` (downloaded first for `hf-hub:`, into timm's cache), or
    None (a URL: Google's npz goes through the converter, which checks its headers itself)."""
    if cfg.source == "local-dir" and cfg.file:
        return Path(cfg.file) / "model.safetensors"
    if cfg.source == "hf-hub" and cfg.hf_hub_id:
        from timm.models import _hub

        repo, _, revision = cfg.hf_hub_id.partition("@")
        try:
            return Path(_hub.hf_hub_download(repo_id=repo, filename="model.safetensors", revision=revision or None))
        except Exception:  # noqa: BLE001  (no such file, offline: timm's own loader reports it)
            return None
    return Path(cfg.file) if cfg.file else None


def create_hub_vit(name: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Build a registered hub-vit model through timm's builder (pretrained cfg, weight loading, features_only)."""
    entry = MODELS[name]
    # A tag fixes the input size its weights were trained at (e.g. `.augreg_in21k_ft_in1k_384`): build at that size
    # unless the caller asks for another one, in which case learned position embeddings are resampled on load.
    cfg = resolve_pretrained_cfg(name, kwargs.pop("pretrained_cfg", None), kwargs.pop("pretrained_cfg_overlay", None))
    cfg = _file_through_hub_vit(cfg)
    kwargs.setdefault("img_size", tuple(cfg.input_size[-2:]))
    if pretrained and cfg.url and not (cfg.file or cfg.state_dict) and cfg.source in ("", "timm", None):
        cfg = replace(cfg, file=str(_fetch(entry, cfg)))
    return _build(name, entry.spec, pretrained, cfg, **kwargs)


def _file_through_hub_vit(cfg: Any) -> Any:
    """A local `file=` loads through timm's `custom_load` hook (`_load_pretrained`: hub-vit's reader and checks; a
    Google `.npz` converted). timm resets `custom_load` whenever a `file` is given, and its own loader hands the file
    to `torch.load` (an npz failed with a bare `hasRecord("version")` error, random bytes with advice to retry with
    `weights_only=False`) or to safetensors with no checks (NaN weights, a huge declared shape)."""
    if cfg.file and cfg.source not in ("local-dir", "hf-hub") and not cfg.state_dict and not cfg.custom_load:
        return replace(cfg, custom_load=True)
    return cfg


def _fetch(entry: ModelEntry, cfg: Any) -> Path:
    """Google's npz through hub-vit's own downloader instead of timm's: the cache `hub-vit convert` uses, the
    catalog's sha256 checked, and without network a `DownloadError` that names the URL to fetch by hand and where to
    put it (timm's raises a bare `URLError: Name or service not known`)."""
    from hub_vit.conversion.download import download

    sha256 = next((w.sha256 for w in entry.weights if w.tag == cfg.tag), None)
    return download(cfg.url, expected_sha256=sha256, catalog_name=f"{entry.name}.{cfg.tag}")


def _make_entrypoint(entry: ModelEntry) -> Callable[..., VisionTransformer]:
    def entrypoint(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
        return create_hub_vit(entry.name, pretrained=pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = entry.name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = entry.description
    return entrypoint


for _entry in MODELS.values():
    globals()[_entry.name] = register_model(_make_entrypoint(_entry))


CUSTOM_ARCHITECTURE = GENERIC_ARCHITECTURE
default_cfgs[CUSTOM_ARCHITECTURE] = generate_default_cfgs({CUSTOM_ARCHITECTURE: dict(_UNTRAINED_CFG)})[
    CUSTOM_ARCHITECTURE
]


@register_model
def hub_vit(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Any architecture the variant table can describe: `variant="S/16"` plus switches, or `ViTSpec` fields (a
    model folder's `model_args`). This is the timm `architecture` of converted checkpoints that match no registered
    name. With no arguments it builds the generic default, the paper's SimpleViT-S/16 (as `HubViTConfig()`), and
    some fields without a variant change that default (`depth=6`): every name timm lists builds with its defaults.
    (timm drops keyword arguments that are None, so `model_args` with every size field are read as a whole spec.)"""
    spec_fields = {k: kwargs.pop(k) for k in list(kwargs) if k in ViTSpec.__dataclass_fields__}
    variant = kwargs.pop("variant", None)
    if variant:
        spec = ViTSpec.from_variant(variant, **spec_fields)
    elif all(name in spec_fields for name in ("width", "depth", "mlp_dim", "num_heads", "patch_size")):
        spec = ViTSpec(**spec_fields)
    else:
        default = GENERIC_SPEC
        if default.rep_size == default.width:  # its pre-logits layer is as wide as the model, whatever the width
            spec_fields.setdefault("rep_size", True)
        spec = ViTSpec(**{**dataclasses.asdict(default), **spec_fields})
    cfg = _file_through_hub_vit(resolve_pretrained_cfg(CUSTOM_ARCHITECTURE, kwargs.pop("pretrained_cfg", None),
                                                       kwargs.pop("pretrained_cfg_overlay", None)))
    # given back to timm's builder, which otherwise fills them in from the cfg's input size (3 channels) and class
    # count, over the spec's: `in_chans=1` built a 3-channel model without a word
    kwargs.setdefault("img_size", spec.img_size)
    kwargs.setdefault("num_classes", spec.num_classes)
    kwargs.setdefault("in_chans", spec.in_chans)
    return _build(CUSTOM_ARCHITECTURE, spec, pretrained, cfg, **kwargs)
