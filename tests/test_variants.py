"""The variant table: big_vision's size letters, the switches, and their error messages."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm

import hub_vit  # noqa: F401  (registers the timm models)
from hub_vit.variants import SIZES, ViTSpec, parse_variant

# big_vision models/vit.py::decode_variant, copied by hand from the research notes (width, depth, mlp, heads).
BIG_VISION_SIZES = {
    "mu": (32, 1, 128, 2), "Ti": (192, 12, 768, 3), "S": (384, 12, 1536, 6), "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12), "L": (1024, 24, 4096, 16), "So400m": (1152, 27, 4304, 16),
    "H": (1280, 32, 5120, 16), "g": (1408, 40, 6144, 16), "g-opt": (1536, 40, 6144, 16),
    "G": (1664, 48, 8192, 16), "G-opt": (1536, 48, 8192, 16), "e": (1792, 56, 15360, 16),
}


def test_size_table_matches_big_vision() -> None:
    assert {k: tuple(v) for k, v in SIZES.items()} == BIG_VISION_SIZES


@pytest.mark.parametrize(
    "variant", ["Ti/16", "S/16", "S/32", "M/16", "B/8", "B/16", "B/32", "L/16", "So400m/14", "H/14"]
)
def test_parse_variant(variant: str) -> None:
    letter, patch = variant.split("/")
    size, p = parse_variant(variant)
    assert tuple(size) == BIG_VISION_SIZES[letter] and p == int(patch)
    spec = ViTSpec.from_variant(variant)
    assert spec.variant == variant and spec.head_dim * spec.num_heads == spec.width


def test_simplevit_switches_and_normalisation() -> None:
    spec = ViTSpec.from_variant("S/16", posemb="sincos2d", pool_type="gap", rep_size=True)
    assert spec.rep_size == 384 and spec.class_token is False and spec.num_prefix_tokens == 0
    assert spec.layer_norm_eps == 1e-6 and spec.gelu == "tanh"
    assert ViTSpec.from_variant("S/16", rep_size=False).rep_size is None
    assert ViTSpec.from_variant("S/16", rep_size=128).head_hidden_size == 128
    assert ViTSpec.from_variant("S/16").class_token is True  # 'tok' pooling implies the class token
    assert ViTSpec.from_variant("S/16", img_size=(48, 64)).grid_size == (3, 4)


def test_spec_round_trips_through_json_dict() -> None:
    spec = ViTSpec.from_variant("B/32", posemb="learn", pool_type="map", img_size=(64, 96), num_classes=7)
    assert ViTSpec.from_dict(spec.to_dict()) == spec


def test_spec_is_frozen() -> None:
    spec = ViTSpec.from_variant("Ti/16")
    with pytest.raises(AttributeError):
        spec.width = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("variant", "switches", "message"),
    [
        ("Q/16", {}, "unknown model size 'Q'.*valid sizes: mu, Ti, S, M, B, L, So400m, H"),
        ("S16", {}, "must look like 'S/16'"),
        ("S/x", {}, "patch size .* must be a positive integer"),
        ("S/16", {"posemb": "rope"}, "unknown posemb 'rope'; valid choices: 'learn', 'sincos2d'"),
        ("S/16", {"pool_type": "max"}, "unknown pool_type 'max'; valid choices: 'tok', 'gap', 'map'"),
        ("S/16", {"gelu": "relu"}, "unknown gelu 'relu'; valid choices: 'tanh', 'erf'"),
        ("S/16", {"pool_type": "tok", "class_token": False}, "pool_type 'tok' needs class_token=True"),
        ("S/16", {"posemb": "sincos2d", "posemb_on_cls": True}, "posemb_on_cls=True needs"),
        ("S/16", {"img_size": 225}, "image size 225x225 is not divisible by the patch size 16"),
        ("S/16", {"dropout": 0.1}, r"unknown switch\(es\) \['dropout'\]; valid switches"),
        ("S/16", {"num_classes": -1}, "num_classes must be an integer >= 0"),
        ("S/16", {"rep_size": -3}, "rep_size must be a positive integer"),
    ],
)
def test_bad_specs_name_the_problem_and_the_choices(variant: str, switches: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTSpec.from_variant(variant, **switches)


def test_width_must_split_into_heads() -> None:
    with pytest.raises(ValueError, match="width 100 is not divisible by num_heads 3"):
        ViTSpec(width=100, depth=1, mlp_dim=10, num_heads=3, patch_size=4, img_size=8)


@pytest.mark.parametrize(("field", "value"), [("posemb_on_cls", "false"), ("head_zeroinit", "false"),
                                              ("class_token", "yes"), ("posemb_on_cls", 1)])
def test_a_switch_must_be_a_bool(field: str, value: object) -> None:
    # was: "false" is truthy, so posemb_on_cls="false" built a class-slot position embedding (the opposite)
    with pytest.raises(ValueError, match=f"{field} must be True or False, got {value!r}"):
        timm.create_model("hub_vit", variant="mu/8", img_size=32, **{field: value})


def test_numpy_integers_are_integers_and_an_infinite_eps_is_refused() -> None:
    # was: "num_classes must be an integer >= 0 ..., got 10" for np.int64(10), which timm's own ViT accepts
    model = timm.create_model("simplevit_ti16", num_classes=np.int64(10))
    assert model.head.out_features == 10 and type(model.spec.num_classes) is int
    spec = ViTSpec(width=np.int64(32), depth=2, mlp_dim=64, num_heads=2, patch_size=8, img_size=32,
                   rep_size=np.int32(8))
    assert json.loads(json.dumps(spec.to_dict()))["width"] == 32 and spec.rep_size == 8
    with pytest.raises(ValueError, match="layer_norm_eps must be a positive, finite float, got inf"):
        spec.replace(layer_norm_eps=float("inf"))  # every logit came out 0
