"""`HubViTConfig`: the transformers config of a hub-vit model. Its fields are exactly the `ViTSpec` fields.

The same `config.json` also serves timm's `local-dir:` / `hf-hub:` loader: `to_dict()` adds timm's keys
(`architecture`, `num_classes`, `num_features`, `model_args`, `pretrained_cfg`, `label_names`), all derived from the
spec at save time, and `__post_init__` drops the derived ones again on load, so they can never drift apart.

This file is also bundled into every saved model folder as transformers remote code (see `hub_vit.hf.remote_code`):
at module level it may import only the bundled hub_vit modules (variants), transformers and the standard library.
"""

import dataclasses
import difflib
import os
from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig

from hub_vit.data_config import DataConfig
from hub_vit.network import load_cache_only_when_unreachable
from hub_vit.variants import (
    DEFAULT_DATA_CFG,
    GENERIC_ARCHITECTURE,
    GENERIC_SPEC,
    LABELS_FILE,
    MODEL_TYPE,
    SWITCHES,
    ViTSpec,
)

# The default config is the paper's SimpleViT-S/16 (what `HubViTConfig()` builds).
_DEFAULT = GENERIC_SPEC
SPEC_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ViTSpec))

# Keys of a timm pretrained_cfg that describe where *other* weights live; a saved folder is its own source.
_SOURCE_KEYS = ("url", "file", "state_dict", "hf_hub_id", "source", "custom_load", "architecture", "tag")
# transformers' ViT dropout settings, which these models do not have: refused unless 0
VIT_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob")
# the config's training-only fields (timm's regularisation), beside the architecture's SPEC_FIELDS
TRAINING_FIELDS = ("drop_rate", "drop_path_rate")
# Keys that timm wants at the top of config.json and that we derive from the spec and labels on every save.
_DERIVED_TIMM_KEYS = ("num_features", "model_args", "label_names")


def timm_architecture(spec: ViTSpec, named: str | None = None) -> str:
    """The registered timm name whose architecture equals `spec` (`hub_vit.catalog.timm_architecture`), else the
    generic 'hub_vit' entry point. `named` (the config's own `architecture`) is kept while it still describes `spec`:
    a model loaded as `simplevit_digits` and rebuilt with `depth=2` is no longer that model. As remote code, without
    the hub_vit package and its catalog of names, `named` or the generic name: it builds any spec."""
    try:
        from hub_vit.catalog import architecture_key, get_entry
        from hub_vit.catalog import timm_architecture as registered
    except ImportError:
        return named or GENERIC_ARCHITECTURE
    if named is not None:
        try:
            entry = get_entry(named)
        except KeyError:  # the generic entry point, or a name hub-vit does not register: the user's to keep
            return named
        if architecture_key(entry.spec) == architecture_key(spec):
            return named
    return registered(spec)


def data_config(spec: ViTSpec, pretrained_cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete timm `pretrained_cfg` for a model of this spec: published-weights fields if given, else defaults.

    `input_size`, `num_classes` and the classifier/stem names always come from the spec (they describe this model).
    """
    cfg = {**DEFAULT_DATA_CFG, **{k: v for k, v in (pretrained_cfg or {}).items() if k not in _SOURCE_KEYS}}
    cfg.update(
        input_size=[spec.in_chans, *spec.img_size],
        num_classes=spec.num_classes,
        first_conv="patch_embed.proj",
        classifier="head",
        fixed_input_size=False,  # sincos is recomputed and learned embeddings resampled for any size
    )
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


def refuse_vit_dropout(kwargs: dict[str, Any]) -> None:
    """ValueError for a transformers ViT dropout setting (`VIT_DROPOUT`) in `kwargs` at a value other than 0: a ported
    recipe must not lose its dropout silently. At 0 it asks for nothing."""
    for name in VIT_DROPOUT:
        if kwargs.get(name):
            raise ValueError(f"{name}={kwargs[name]!r}: hub-vit models have no dropout inside the blocks (Google's "
                             "recipes use none); their regularisation is drop_rate (dropout before the head) and "
                             "drop_path_rate (stochastic depth)")


def label_at(id2label: dict[Any, str], index: int) -> str:
    """`id2label[index]`, also when the keys are strings: transformers' fine-tuning recipe builds
    `{str(i): label}` and `from_pretrained(..., id2label=...)` sets it after construction, unconverted."""
    if index in id2label:
        return id2label[index]
    if str(index) in id2label:
        return id2label[str(index)]
    raise ValueError(f"id2label has no label for class {index}; it needs one for each of the classes (keys 0 .. "
                     f"n-1), got keys {sorted(map(str, id2label))[:10]}")


def saved_label_names(id2label: dict[Any, str]) -> list[str]:
    """The class names of a saved config.json's `id2label`, in class order (its keys are strings there)."""
    return [label_at(id2label, i) for i in range(len(id2label))]


def check_labels_file(folder: str | os.PathLike[str], labels: list[str], id2label: list[str]) -> None:
    """ValueError when a model folder's labels.txt (`labels`, one class name per line; [] when it has none) names
    other classes than its config.json (`id2label`, in class order): the two are written together, and a folder whose
    files disagree answers with other names in hub-vit's CLI and server than in transformers."""
    if not labels or labels == id2label:
        return
    if len(labels) != len(id2label):
        difference = f"{len(labels)} lines against {len(id2label)} entries"
    else:
        index = next(i for i, (a, b) in enumerate(zip(labels, id2label, strict=True)) if a != b)
        difference = f"class {index} is {labels[index]!r} in {LABELS_FILE}, {id2label[index]!r} in id2label"
    raise ValueError(f"{folder}: {LABELS_FILE} disagrees with config.json id2label: {difference}")


@strict(accept_kwargs=True)
class HubViTConfig(PreTrainedConfig):
    r"""Configuration of a hub-vit Vision Transformer (classic ViT or SimpleViT).

    Every architecture field is a `hub_vit.variants.ViTSpec` field and is validated by it (a bad value raises a
    `ValueError` naming the valid choices). `num_classes` is the classifier size and is the same number as
    transformers' `num_labels` (`len(id2label)`). `pretrained_cfg` is the timm data config (input size, crop,
    interpolation, mean/std) that the image processor reproduces; `architecture` is the timm model name.

    Example:
    ```python
    >>> from hub_vit import ViTSpec
    >>> from hub_vit.hf import HubViTConfig
    >>> config = HubViTConfig.from_spec(ViTSpec.from_variant("Ti/16", posemb="sincos2d", pool_type="gap"))
    ```
    """

    model_type = MODEL_TYPE
    # timm's name for the classifier size (transformers keeps it as len(id2label)), and the names transformers' own
    # configs use for the spec fields, read by its tooling (ConfigTester, DeepSpeed's "auto" sizes, ...): aliases of
    # the one field each, never second copies
    attribute_map: ClassVar[dict[str, str]] = {
        "num_classes": "num_labels",
        "hidden_size": "width",
        "num_hidden_layers": "depth",
        "num_attention_heads": "num_heads",
        "intermediate_size": "mlp_dim",
        "num_channels": "in_chans",
    }

    width: int = _DEFAULT.width
    depth: int = _DEFAULT.depth
    mlp_dim: int = _DEFAULT.mlp_dim
    num_heads: int = _DEFAULT.num_heads
    patch_size: int = _DEFAULT.patch_size
    img_size: int | list[int] | tuple[int, ...] = tuple(_DEFAULT.img_size)
    in_chans: int = _DEFAULT.in_chans
    posemb: str = _DEFAULT.posemb
    pool_type: str = _DEFAULT.pool_type
    class_token: bool | None = None  # None: derived from pool_type, as in ViTSpec
    posemb_on_cls: bool = _DEFAULT.posemb_on_cls
    # S/16's pre-logits layer as the spec's own switch (True = as wide as the model), not its normalised width 384,
    # so a config with another width gets a pre-logits layer of its own width
    rep_size: int | bool | None = True if _DEFAULT.rep_size == _DEFAULT.width else _DEFAULT.rep_size
    layer_norm_eps: float = _DEFAULT.layer_norm_eps
    gelu: str = _DEFAULT.gelu
    head_zeroinit: bool = _DEFAULT.head_zeroinit
    final_norm: bool = _DEFAULT.final_norm
    # timm side: model name and data config (None = derived from the spec / defaults when saved)
    architecture: str | None = None
    pretrained_cfg: dict | None = None
    # training-only regularisation, as timm's models take it (`VisionTransformer`): dropout on the features the head
    # reads, and stochastic depth rising linearly to this rate over the blocks; neither changes the weights
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def __post_init__(self, **kwargs: Any) -> None:
        # A dict that to_dict() wrote (config.json: it always has timm's `model_args`) is data: its extra attributes
        # are kept as transformers keeps them, and its top-level `num_classes` is timm's view of the weight file (0
        # for a saved backbone), while the labels are id2label. Keywords a person passes get the typo guard.
        other = kwargs.get("model_type")
        if other is not None and other != self.model_type:  # before the typo guard: its fields are another model's
            raise ValueError(f"this config is of model_type {other!r}, not {self.model_type!r}: load it with "
                             f"transformers' Auto classes (AutoModelForImageClassification) or the {other!r} model's "
                             "own class; a hub-vit model folder has model_type 'hub_vit'")
        saved = "model_args" in kwargs
        for key in _DERIVED_TIMM_KEYS + (("num_classes",) if saved else ()):  # re-derived on save, never read back
            kwargs.pop(key, None)
        if "variant" in kwargs:  # the timm generic entry point's spelling; a config stores the fields themselves
            raise ValueError(f"HubViTConfig has no 'variant' field; build it from the variant table: "
                             f"HubViTConfig.from_spec(ViTSpec.from_variant({kwargs['variant']!r}, ...))")
        refuse_vit_dropout(kwargs)
        self._check_rates()
        known = set(SWITCHES) | set(self.attribute_map)
        typos = {k: difflib.get_close_matches(k, SWITCHES, n=1, cutoff=0.8) for k in kwargs if k not in known}
        typos = {k: v[0] for k, v in typos.items() if v and not saved}
        if typos:
            bad, guess = next(iter(typos.items()))
            raise ValueError(f"unknown HubViTConfig field {bad!r} (did you mean {guess!r}?); "
                             f"valid architecture fields: {', '.join(SPEC_FIELDS)}")
        self._refuse_disagreeing_aliases(kwargs)
        num_classes = kwargs.pop("num_classes", None)
        if num_classes is not None and kwargs.get("num_labels", num_classes) != num_classes:
            raise ValueError(f"num_classes={num_classes} and num_labels={kwargs['num_labels']} are the same setting "
                             "(timm's and transformers' names for it); pass one of them")
        if self.id2label is None and "num_labels" not in kwargs:
            kwargs["num_labels"] = _DEFAULT.num_classes if num_classes is None else num_classes
        elif num_classes is not None and self.id2label is not None and len(self.id2label) != num_classes:
            raise ValueError(f"num_classes={num_classes} disagrees with id2label, which has {len(self.id2label)} "
                             "labels; pass one of them")
        elif num_classes is not None and self.id2label is None:
            kwargs["num_labels"] = num_classes
        super().__post_init__(**kwargs)
        spec = self.to_spec()  # validates every field; then store the normalised values (e.g. rep_size=True -> 384)
        # the data config every reader (processor, hub-vit's CLI, the server) builds from it, checked once here: a
        # `"mean": "x"` in a config.json was "could not convert string to float: 'x'" at the first image
        DataConfig.from_pretrained_cfg(self.pretrained_cfg, spec)
        self.img_size = list(spec.img_size)
        self.class_token = spec.class_token
        self.rep_size = spec.rep_size

    def check_saved_model_args(self, model_args: Any) -> None:
        """ValueError when the `model_args` saved beside this config in a config.json (what timm's `local-dir:` builds
        the model from) describe another model than its fields (what transformers and hub-vit's folder loader build):
        written together, they disagree only in a hand-edited file, and the front doors would build different models
        from one folder (an edited `num_classes` was refused by timm alone). Run by the loaders on the saved config,
        before what a caller asks on top (`num_labels=`, `img_size=`) changes it."""
        if not isinstance(model_args, dict):
            return
        fields = {k: v for k, v in model_args.items() if k in SPEC_FIELDS}
        try:
            described = ViTSpec(**{**fields, "img_size": tuple(fields.get("img_size") or self.img_size)})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid model_args: {exc}") from None
        built = self.weights_spec()
        differ = [f"{name}: {getattr(described, name)!r} in model_args, {getattr(built, name)!r} in the fields"
                  for name in SPEC_FIELDS if name in fields and getattr(described, name) != getattr(built, name)]
        if differ:
            raise ValueError("model_args (timm's reading) and the config's fields (transformers' and hub-vit's) "
                             f"describe different models: {'; '.join(differ)}; the file was edited by hand? Set "
                             "both, or save the model again")

    def _refuse_disagreeing_aliases(self, kwargs: dict[str, Any]) -> None:
        """ValueError for a transformers name (`hidden_size`) given beside its hub-vit field (`width`) at another value
        than the field's own: one of them was dropped without a word (the alias won). A field at its default counts
        as not given."""
        for alias, name in self.attribute_map.items():
            if alias in kwargs and name in SPEC_FIELDS:
                value, default = getattr(self, name), getattr(type(self), name, None)
                if value != default and kwargs[alias] != value:
                    raise ValueError(f"{alias}={kwargs[alias]!r} and {name}={value!r} are the same setting "
                                     f"(transformers' and hub-vit's names for it); pass one of them")

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' `save_pretrained`, validated before the folder is made: transformers made it, then its
        `validate()` refused the config (a value assigned after construction, `config.pool_type = "cls"`) with
        huggingface_hub's StrictDataclassClassValidationError, leaving an empty folder. Here a ValueError, nothing
        written."""
        try:
            self.validate()
        except StrictDataclassError as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, ValueError) else exc
            raise ValueError(" ".join(str(cause).split())) from None
        return super().save_pretrained(save_directory, *args, **kwargs)

    def validate_fields(self) -> None:
        """transformers' `validate()`, which `save_pretrained` runs: the checks `__post_init__` makes, again, for
        values assigned after construction (`config.pool_type = "cls"`; assignment itself checks only the type)."""
        self._check_rates()
        self.to_spec()

    def _check_rates(self) -> None:
        for name in TRAINING_FIELDS:
            rate = getattr(self, name)
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
                raise ValueError(f"{name} must be a number in [0, 1), got {rate!r}")

    # ------------------------------------------------------------------------------------------------------- spec
    def to_spec(self) -> ViTSpec:
        """The `ViTSpec` this config describes (raises ValueError for any invalid field)."""
        values = {name: getattr(self, name) for name in SPEC_FIELDS}
        values["num_classes"] = self.num_labels or 0
        if isinstance(values["img_size"], list):
            values["img_size"] = tuple(values["img_size"])
        try:
            return ViTSpec(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid HubViTConfig: {exc}") from exc

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        """transformers' `from_dict` (what `from_pretrained` and hub-vit's folder loader build with); a field of the
        wrong type (`"width": "64"` in a config.json) is a ValueError naming it, as every other bad value is (was
        huggingface_hub's StrictDataclassFieldValidationError, which no reader of a folder expects)."""
        try:
            return super().from_dict(config_dict, **kwargs)
        except StrictDataclassError as exc:
            raise ValueError(f"invalid HubViTConfig: {' '.join(str(exc).split())}") from None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' `from_pretrained`; a Hub repo id while the Hub cannot be reached (an offline switch on, or no
        connection within a few seconds) loads from the local cache only, at once, with a warning; not cached,
        `HubUnreachableError` says both (was: huggingface_hub's retries, 23 s, then its advice)."""
        path = pretrained_model_name_or_path
        return load_cache_only_when_unreachable(
            path, kwargs, lambda given: super(HubViTConfig, cls).from_pretrained(path, *args, **given), "config.json")

    @classmethod
    def from_spec(cls, spec: ViTSpec, **kwargs: Any) -> "HubViTConfig":
        """`HubViTConfig.from_spec(spec, id2label=..., pretrained_cfg=...)`; id2label needs num_classes entries.
        A keyword that is a spec field (`num_classes=5`, `img_size=384`) overrides the spec's value."""
        fields = spec.to_dict()
        if "id2label" in kwargs or "num_labels" in kwargs:
            fields.pop("num_classes")
        return cls(**{**fields, **kwargs})

    def weights_spec(self) -> ViTSpec:
        """The spec of the weights a model with this config saves: `to_spec()`, headless when the config was saved by
        the backbone (`architectures == ["HubViTModel"]`), which keeps `num_labels` for a classifier built from it
        but has no head."""
        spec = self.to_spec()
        return spec.replace(num_classes=0) if self.architectures == ["HubViTModel"] else spec

    # ------------------------------------------------------------------------------------------------------- timm
    def timm_config(self) -> dict[str, Any]:
        """timm's view of the saved model (the keys `timm.create_model('local-dir:...')` reads from config.json)."""
        spec = self.weights_spec()
        labels = [label_at(self.id2label, i) for i in range(spec.num_classes)] if self.id2label else []
        generic = all(label == f"LABEL_{i}" for i, label in enumerate(labels))
        out: dict[str, Any] = dict(
            architecture=timm_architecture(spec, self.architecture),
            num_classes=spec.num_classes,
            num_features=spec.width,  # timm's meaning: what forward_features gives per token (timm writes it so)
            model_args=spec.to_dict(),
            pretrained_cfg=data_config(spec, self.pretrained_cfg),
        )
        if labels and not generic:
            out["label_names"] = labels
        return out

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output.update(self.timm_config())
        return output


__all__ = ["DEFAULT_DATA_CFG", "GENERIC_ARCHITECTURE", "HubViTConfig", "data_config", "timm_architecture"]
