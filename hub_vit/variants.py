"""The variant table: the single source of truth for every hub-vit architecture.

A `ViTSpec` is a frozen, typed description of one Vision Transformer. It is built from big_vision's size letters
(`"S/16"` -> width 384, depth 12, mlp 1536, 6 heads, patch 16) plus the switches that distinguish the classic ViT
(Dosovitskiy et al. 2020: class token, learned position embedding) from SimpleViT ("Better plain ViT baselines",
Beyer et al. 2022: fixed 2-D sin-cos position embedding, global average pooling, optional tanh pre-logits).

The model, the timm entry points, the transformers config, the converters, the Triton configs and the model cards
all read this table; nothing else hard-codes a width or a depth.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

from hub_vit.data_config import GOOGLE_EVAL


class Size(NamedTuple):
    """One row of big_vision's `decode_variant` table."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int


# big_vision models/vit.py::decode_variant (width, depth, mlp_dim, num_heads), in the order of that table.
SIZES: dict[str, Size] = {
    "mu": Size(32, 1, 128, 2),
    "Ti": Size(192, 12, 768, 3),
    "S": Size(384, 12, 1536, 6),
    "M": Size(512, 12, 2048, 8),
    "B": Size(768, 12, 3072, 12),
    "L": Size(1024, 24, 4096, 16),
    "So400m": Size(1152, 27, 4304, 16),
    "H": Size(1280, 32, 5120, 16),
    "g": Size(1408, 40, 6144, 16),
    "g-opt": Size(1536, 40, 6144, 16),
    "G": Size(1664, 48, 8192, 16),
    "G-opt": Size(1536, 48, 8192, 16),
    "e": Size(1792, 56, 15360, 16),
}

PosEmb = Literal["learn", "sincos2d"]
PoolType = Literal["tok", "gap", "map"]
Gelu = Literal["tanh", "erf"]
POSEMBS: tuple[str, ...] = get_args(PosEmb)
POOL_TYPES: tuple[str, ...] = get_args(PoolType)
GELUS: tuple[str, ...] = get_args(Gelu)


# The largest value each size field may take: about 10x the largest published ViT (ViT-22B: width 6144, depth 48,
# mlp 24576, 48 heads; big_vision's "e": 1792 / 56 / 15360), so no real model is refused. A config or checkpoint
# header declaring more is corrupt or hostile: refusing it here, before a module is built, keeps `depth: 1000000000`
# from building blocks for minutes and then failing with a message-less MemoryError.
BOUNDS: dict[str, int] = {
    "width": 65536, "depth": 1024, "mlp_dim": 262144, "num_heads": 1024, "patch_size": 1024, "in_chans": 1024,
    "num_classes": 1048576, "rep_size": 65536, "img_size": 65536,
}


def _bounded(name: str, value: int) -> int:
    bound = BOUNDS.get(name, BOUNDS["img_size"])  # to_2tuple also checks patch sizes, under their own name
    if value > bound:
        raise ValueError(f"{name}: {value} is out of bounds (at most {bound}, far beyond any published ViT); a "
                         "config or checkpoint that declares it is corrupt or hostile")
    return value


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(map(repr, choices))}")


def _integer(value: object) -> int | None:
    """`value` as a Python int when it is an integer (numpy's too: `np.int64(10)`), else None; a bool is no integer
    here."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None


def _positive_int(name: str, value: object) -> int:
    number = _integer(value)
    if number is None or number <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


def _bool(name: str, value: object) -> None:
    if not isinstance(value, bool):  # "false" is truthy: a class-slot embedding was built for posemb_on_cls="false"
        raise ValueError(f"{name} must be True or False, got {value!r}")


def to_2tuple(value: int | tuple[int, int] | list[int], name: str = "img_size") -> tuple[int, int]:
    """`224` -> `(224, 224)`; `(48, 64)` stays `(height, width)`."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a (height, width) pair, got {value!r}")
        return (_bounded(name, _positive_int(name, value[0])), _bounded(name, _positive_int(name, value[1])))
    size = _bounded(name, _positive_int(name, value))
    return (size, size)


def parse_variant(variant: str) -> tuple[Size, int]:
    """`"S/16"` -> (SIZES["S"], 16), as big_vision's `decode_variant` does, with errors that list the choices."""
    if not isinstance(variant, str) or variant.count("/") != 1:
        raise ValueError(f"variant must look like 'S/16' (size letter / patch size), got {variant!r}")
    letter, patch = variant.split("/")
    if letter not in SIZES:
        raise ValueError(f"unknown model size {letter!r} in {variant!r}; valid sizes: {', '.join(SIZES)}")
    if not patch.isdigit() or int(patch) <= 0:
        raise ValueError(f"patch size in {variant!r} must be a positive integer, got {patch!r}")
    return SIZES[letter], int(patch)


class UnknownFieldError(TypeError, ValueError):
    """A keyword argument that no `ViTSpec` field takes (`create_model(..., not_a_model_arg=1)`): a TypeError, as Python
    raises for an unexpected keyword and timm's model contract asks, and a ValueError, as hub-vit raised it before."""


# timm's VisionTransformer arguments that a spec field says otherwise: named in the error for the timm spelling
TIMM_SPELLINGS = {
    "embed_dim": "width",
    "mlp_ratio": "mlp_dim (the MLP's hidden width itself: mlp_ratio x width)",
    "representation_size": "rep_size",
    "pos_embed": "posemb ('learn' or 'sincos2d')",
    "no_embed_class": "posemb_on_cls (its opposite)",
    "act_layer": "gelu ('tanh' or 'erf')",
    "norm_layer": "layer_norm_eps (the LayerNorm's epsilon)",
}


def unknown_fields(unknown: set[str], valid: frozenset[str], words: tuple[str, str] = ("field(s)", "fields"),
                   ) -> UnknownFieldError:
    """The error for arguments no spec field takes, naming the field a timm spelling stands for."""
    hints = [f"{name!r} is {TIMM_SPELLINGS[name]} here" for name in sorted(unknown) if name in TIMM_SPELLINGS]
    return UnknownFieldError(f"unknown {words[0]} {sorted(unknown)}; valid {words[1]}: {sorted(valid)}"
                             + (f" ({'; '.join(hints)})" if hints else ""))


@dataclass(frozen=True)
class ViTSpec:
    """Everything that determines a hub-vit model's architecture (and hence its state-dict keys and shapes).

    `rep_size` follows big_vision: `None`/`False`/`0` = no pre-logits layer, `True` = a Dense(width)+tanh layer,
    an int = a Dense(int)+tanh layer. It is stored normalised (an int or None).
    `posemb_on_cls` is the original ViT convention (vit_jax, HF `ViTModel`): the learned position embedding has a
    class-token slot and is added *after* the class token is prepended. big_vision adds it to the patches only.
    `final_norm` is timm's switch of that name: False = no LayerNorm after the last block (`norm` is an identity and
    has no weights), what `prune_intermediate_layers(prune_norm=True)` leaves; every published model has one.
    """

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    img_size: tuple[int, int] = (224, 224)
    in_chans: int = 3
    num_classes: int = 1000
    posemb: PosEmb = "learn"
    pool_type: PoolType = "tok"
    class_token: bool | None = None
    posemb_on_cls: bool = False
    rep_size: int | bool | None = None
    layer_norm_eps: float = 1e-6
    gelu: Gelu = "tanh"
    head_zeroinit: bool = True
    final_norm: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise fields in place once, here
        for name in ("width", "depth", "mlp_dim", "num_heads", "patch_size", "in_chans"):
            set_(self, name, _bounded(name, _positive_int(name, getattr(self, name))))
        num_classes = _integer(self.num_classes)
        if num_classes is None or num_classes < 0:
            raise ValueError(f"num_classes must be an integer >= 0 (0 = no classifier head), got {self.num_classes!r}")
        set_(self, "num_classes", _bounded("num_classes", num_classes))
        for name in ("posemb_on_cls", "head_zeroinit", "final_norm"):
            _bool(name, getattr(self, name))
        if self.class_token is not None:
            _bool("class_token", self.class_token)
        set_(self, "img_size", to_2tuple(self.img_size))
        _choice("posemb", self.posemb, POSEMBS)
        _choice("pool_type", self.pool_type, POOL_TYPES)
        _choice("gelu", self.gelu, GELUS)
        if self.class_token is None:
            set_(self, "class_token", self.pool_type == "tok")
        if self.pool_type == "tok" and not self.class_token:
            raise ValueError("pool_type 'tok' needs class_token=True (it pools the class token)")
        if self.class_token and self.pool_type != "tok":
            raise ValueError(f"class_token=True is only used by pool_type 'tok', not {self.pool_type!r}")
        if self.posemb_on_cls and not (self.class_token and self.posemb == "learn"):
            raise ValueError("posemb_on_cls=True needs a class token and posemb='learn'")
        if self.rep_size is True:
            set_(self, "rep_size", self.width)
        elif self.rep_size is False or self.rep_size == 0:
            set_(self, "rep_size", None)
        elif self.rep_size is not None:
            set_(self, "rep_size", _bounded("rep_size", _positive_int("rep_size", self.rep_size)))
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
        if self.posemb == "sincos2d" and self.width % 4:
            raise ValueError(f"posemb 'sincos2d' needs a width divisible by 4, got {self.width}")
        if not (isinstance(self.layer_norm_eps, float) and 0 < self.layer_norm_eps < math.inf):
            raise ValueError(f"layer_norm_eps must be a positive, finite float, got {self.layer_norm_eps!r}")
        check_image_size(self.img_size, self.patch_size)

    # ----------------------------------------------------------------------------------------------------------------
    @classmethod
    def from_variant(cls, variant: str, **switches: Any) -> ViTSpec:
        """`ViTSpec.from_variant("S/16", posemb="sincos2d", pool_type="gap", rep_size=True)`."""
        size, patch = parse_variant(variant)
        unknown = set(switches) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise unknown_fields(unknown, SWITCHES, ("switch(es)", "switches"))
        return cls(**{**size._asdict(), "patch_size": patch, **switches})

    @property
    def variant(self) -> str | None:
        """The big_vision variant string (`"S/16"`) if the size is a row of the table, else None."""
        size = Size(self.width, self.depth, self.mlp_dim, self.num_heads)
        letter = next((k for k, v in SIZES.items() if v == size), None)
        return f"{letter}/{self.patch_size}" if letter else None

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.class_token else 0

    @property
    def head_hidden_size(self) -> int:
        """Width of the vector the classifier head reads (after the optional pre-logits layer): timm's
        `head_hidden_size`. timm's `num_features` is the width, what `forward_features` gives per token."""
        return self.rep_size or self.width

    def replace(self, **changes: Any) -> ViTSpec:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise unknown_fields(unknown, SWITCHES)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; `ViTSpec.from_dict(spec.to_dict()) == spec`. `final_norm` appears only when False."""
        out = dataclasses.asdict(self)
        out["img_size"] = list(self.img_size)
        # only a pruned model lacks the final norm: leaving the default out keeps every other model's config.json
        # `model_args`, card and cache key as they were, and readable by hub-vit versions without the field
        if self.final_norm:
            del out["final_norm"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ViTSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ViTSpec field(s) {sorted(unknown)}; valid fields: {sorted(known)}")
        return cls(**data)


SWITCHES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(ViTSpec))


def check_image_size(img_size: tuple[int, int], patch_size: int) -> None:
    """Raise a ValueError that names both numbers when an image does not tile into whole patches."""
    height, width = img_size
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"image size {height}x{width} is not divisible by the patch size {patch_size}; "
            f"use a multiple of {patch_size} (e.g. {max(1, height // patch_size) * patch_size}x"
            f"{max(1, width // patch_size) * patch_size})"
        )


# The two families' switches. SimpleViT (big_vision configs/vit_s16_i1k.py): sincos2d + GAP + Dense+tanh pre-logits
# (rep_size=True); no cls token. Classic ViT (vit_jax): class token, learned position embedding with a class-token
# slot, linear head.
SIMPLEVIT: dict[str, Any] = dict(posemb="sincos2d", pool_type="gap", rep_size=True)
CLASSIC_VIT: dict[str, Any] = dict(posemb="learn", pool_type="tok", posemb_on_cls=True)

# What the generic entry points build with no arguments (timm's `hub_vit`, transformers' `HubViTConfig()`): the
# paper's SimpleViT-S/16 (the catalog's `simplevit_s16`). `GENERIC_ARCHITECTURE` is timm's name for that entry point,
# which builds any spec (passed as `model_args`).
GENERIC_SPEC = ViTSpec.from_variant("S/16", **SIMPLEVIT)
GENERIC_ARCHITECTURE = "hub_vit"
# config.json's `model_type` in a hub-vit model folder: transformers' HubViTConfig, and what the folder readers and
# the Hub fetch check
MODEL_TYPE = "hub_vit"
# a model folder's class names, one per line (line i = class i): hub_vit.folder writes and checks it, and a
# transformers save_pretrained over a folder rewrites it (the remote-code bundle holds this module, not the folder's)
LABELS_FILE = "labels.txt"

# timm data config of a Google ViT without published weights: Google's evaluation transform (hub_vit.data_config),
# without an input size (the spec's img_size gives it)
DEFAULT_DATA_CFG: dict[str, Any] = {k: v for k, v in GOOGLE_EVAL.pretrained_cfg().items() if k != "input_size"}
