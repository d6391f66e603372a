"""Named hub-vit models and Google's published checkpoints for each: the data behind `timm.create_model(name)`.

Every entry is a `ViTSpec` from the variant table plus the published weights ("tags", in timm's `name.tag` sense)
that fit that architecture. Weights are Google's `.npz` files; `hub_vit.conversion` turns them into PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub_vit.data_config import GOOGLE_EVAL, DataConfig
from hub_vit.variants import CLASSIC_VIT, GENERIC_ARCHITECTURE, GENERIC_SPEC, SIMPLEVIT, ViTSpec

GCS = "https://storage.googleapis.com"
BIG_VISION_LICENSE = "apache-2.0"
VIT_JAX_LICENSE = "apache-2.0"
PAPER_SIMPLEVIT = "arXiv:2205.01580"
PAPER_VIT = "arXiv:2010.11929"
PAPER_AUGREG = "arXiv:2106.10270"

@dataclass(frozen=True)
class Weights:
    """One published checkpoint: where it lives and how its inputs must be prepared.

    `gs_url` is the location as the Google repositories list it; `url` is the same object over HTTPS.
    `results` holds published top-1 numbers (ImageNet-1k val, ReaL, v2) where the paper states them.
    """

    tag: str
    gs_url: str
    num_classes: int
    img_size: int = 224
    crop_pct: float = GOOGLE_EVAL.crop_pct
    interpolation: str = GOOGLE_EVAL.interpolation
    dataset: str = "imagenet-1k"
    license: str = BIG_VISION_LICENSE
    paper: str = PAPER_VIT
    results: dict[str, float] = field(default_factory=dict)
    sha256: str | None = None
    file: str = ""  # weights shipped inside the package (the default model): timm loads `file` before `url`
    label_names: tuple[str, ...] | None = None  # the class names, where hub-vit ships them (timm's `label_names`)

    @property
    def url(self) -> str:
        if not self.gs_url:
            return ""
        bucket_path = self.gs_url.removeprefix("gs://")
        return f"{GCS}/{bucket_path}"

    def pretrained_cfg(self) -> dict[str, Any]:
        """timm `pretrained_cfg` fields; Google's models take [-1, 1] inputs, i.e. mean = std = 0.5."""
        return dict(
            url=self.url,
            file=self.file or None,
            hf_hub_id=None,
            custom_load=True,  # npz -> hub_vit.conversion, see hub_vit.timm_plugin._load_pretrained
            num_classes=self.num_classes,
            pool_size=None,
            fixed_input_size=False,
            **DataConfig(img_size=(self.img_size, self.img_size), crop_pct=self.crop_pct,
                         interpolation=self.interpolation).pretrained_cfg(),
            first_conv="patch_embed.proj",
            classifier="head",
            license=self.license,
            paper_ids=self.paper,
            origin_url=self.gs_url or None,
            **({"label_names": list(self.label_names)} if self.label_names else {}),
        )


@dataclass(frozen=True)
class ModelEntry:
    """A registered architecture name (e.g. `simplevit_s16`) with its spec and published weights."""

    name: str
    spec: ViTSpec
    family: str
    description: str
    weights: tuple[Weights, ...] = ()

    def weight(self, tag: str) -> Weights:
        for w in self.weights:
            if w.tag == tag:
                return w
        valid = ", ".join(w.tag for w in self.weights) or "none"
        raise ValueError(f"model {self.name!r} has no pretrained tag {tag!r}; valid tags: {valid}")


_SIMPLEVIT_S16_RESULTS = {  # "Better plain ViT baselines" Table 2: ImageNet val / ReaL / v2 top-1 (%)
    "90ep": {"top1": 76.5, "real_top1": 83.1, "v2_top1": 64.2},
    "150ep": {"top1": 78.5, "real_top1": 84.5, "v2_top1": 66.4},
    "300ep": {"top1": 80.0, "real_top1": 85.4, "v2_top1": 68.3},
}


def _simplevit_s16_weights() -> tuple[Weights, ...]:
    # big_vision eval: resize_small(256) | central_crop(224) | value_range(-1, 1)
    return tuple(
        Weights(
            tag=f"i1k_{epochs}",
            gs_url=f"gs://big_vision/vit_s16_i1k_{epochs}.npz",
            num_classes=1000,
            crop_pct=224 / 256,
            paper=PAPER_SIMPLEVIT,
            results=results,
        )
        for epochs, results in _SIMPLEVIT_S16_RESULTS.items()
    )


_AUGREG = "augreg"
_ORIG = "imagenet21k+imagenet2012"
# vit_jax checkpoints per size: tag -> (path under gs://vit_models/, image size, classes). The first tag is the
# default (timm convention: the 224 px AugReg i21k->i1k fine-tune). 384 px and i21k file names are the vit_jax
# README's recommended ones; 224 px fine-tunes as timm lists them. i21k "original" files carry a pre-logits layer and
# are converted with `hub-vit convert` (architecture inferred from the file) rather than loaded into these names.
_RUN = {  # AugReg pre-training runs: file stem of the i21k checkpoint
    "Ti": "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "S16": "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
    "S16_i1k": "S_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0",
    "S32": "S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
    "B8": "B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "B16": "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "B32_224": "B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0",
    "B32": "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
    "L16_224": "L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
    "L16": "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0",
}


def _ft(run: str, lr: str, res: int) -> tuple[str, int, int]:
    """An AugReg ImageNet-1k fine-tune of `run` at `res` px."""
    return (f"{_AUGREG}/{_RUN[run]}--imagenet2012-steps_20k-lr_{lr}-res_{res}.npz", res, 1000)


def _i21k(run: str) -> tuple[str, int, int]:
    return (f"{_AUGREG}/{_RUN[run]}.npz", 224, 21843)


_VIT_JAX_FILES: dict[str, dict[str, tuple[str, int, int]]] = {
    "Ti_16": {"augreg_in21k_ft_in1k": _ft("Ti", "0.03", 224), "augreg_in21k_ft_in1k_384": _ft("Ti", "0.03", 384),
              "augreg_in21k": _i21k("Ti")},
    "S_16": {"augreg_in21k_ft_in1k": _ft("S16", "0.03", 224), "augreg_in21k_ft_in1k_384": _ft("S16", "0.03", 384),
             "augreg_in21k": _i21k("S16"), "augreg_in1k": _ft("S16_i1k", "0.01", 224)},
    "S_32": {"augreg_in21k_ft_in1k": _ft("S32", "0.03", 224), "augreg_in21k": _i21k("S32")},
    "B_8": {"augreg_in21k_ft_in1k": _ft("B8", "0.01", 224), "augreg_in21k": _i21k("B8")},
    "B_16": {"augreg_in21k_ft_in1k": _ft("B16", "0.01", 224), "augreg_in21k_ft_in1k_384": _ft("B16", "0.03", 384),
             "augreg_in21k": _i21k("B16"), "orig_in21k_ft_in1k": (f"{_ORIG}/ViT-B_16-224.npz", 224, 1000),
             "orig_in21k_ft_in1k_384": (f"{_ORIG}/ViT-B_16.npz", 384, 1000)},
    "B_32": {"augreg_in21k_ft_in1k": _ft("B32_224", "0.03", 224), "augreg_in21k_ft_in1k_384": _ft("B32", "0.01", 384),
             "augreg_in21k": _i21k("B32"), "orig_in21k_ft_in1k_384": (f"{_ORIG}/ViT-B_32.npz", 384, 1000)},
    "L_16": {"augreg_in21k_ft_in1k": _ft("L16_224", "0.01", 224), "augreg_in21k_ft_in1k_384": _ft("L16", "0.01", 384),
             "augreg_in21k": _i21k("L16"), "orig_in21k_ft_in1k": (f"{_ORIG}/ViT-L_16-224.npz", 224, 1000),
             "orig_in21k_ft_in1k_384": (f"{_ORIG}/ViT-L_16.npz", 384, 1000)},
    "L_32": {"orig_in21k_ft_in1k_384": (f"{_ORIG}/ViT-L_32.npz", 384, 1000)},
    "H_14": {},
}


def _vit_weights(jax_name: str) -> tuple[Weights, ...]:
    out = []
    for tag, (path, img_size, classes) in _VIT_JAX_FILES[jax_name].items():
        out.append(Weights(
            tag=tag, gs_url=f"gs://vit_models/{path}", num_classes=classes, img_size=img_size,
            crop_pct=1.0 if img_size == 384 else 0.9,
            dataset="imagenet-21k" if classes == 21843 else "imagenet-1k",
            license=VIT_JAX_LICENSE, paper=PAPER_AUGREG if tag.startswith("augreg") else PAPER_VIT,
        ))
    return tuple(out)


# The default model: trained in this repository with `hub-vit train` (scripts/train_default_model.sh) and shipped in
# the package, so everything works offline. The held-out split is `hub_vit.train.digits.load_digits_split("val")`.
DEFAULT_MODEL = "simplevit_digits"
DIGIT_LABELS: tuple[str, ...] = tuple(str(d) for d in range(10))  # its classes: the digit each image shows
# The architecture the generic entry points build with no arguments (timm's `hub_vit`, transformers' `HubViTConfig()`)
GENERIC_DEFAULT = "simplevit_s16"


def default_model_folder() -> Path:
    """The shipped default model: a hub-vit model folder (timm `local-dir:`, transformers `from_pretrained`)."""
    return Path(__file__).resolve().parent / "assets" / "digits"


# SimpleViT on scikit-learn's 8x8 digits upsampled to 32x32 RGB: patch 4 -> 8x8 grid; recipe in docs/training.md.
DIGITS_SPEC = ViTSpec(width=64, depth=4, mlp_dim=256, num_heads=4, patch_size=4, img_size=(32, 32), num_classes=10,
                      **SIMPLEVIT)


def _digits_entry() -> ModelEntry:
    weights = Weights(
        tag="sklearn_digits", gs_url="", num_classes=10, img_size=32, crop_pct=1.0, dataset="sklearn-digits",
        paper=PAPER_SIMPLEVIT, file=str(default_model_folder() / "model.safetensors"), label_names=DIGIT_LABELS,
    )
    return ModelEntry(name=DEFAULT_MODEL, spec=DIGITS_SPEC, family="simplevit", weights=(weights,),
                      description="SimpleViT (width 64, depth 4, patch 4) trained on scikit-learn digits, 32x32 RGB")


def _entries() -> dict[str, ModelEntry]:
    entries: list[ModelEntry] = []
    for short, variant in [("ti16", "Ti/16"), ("s16", "S/16"), ("s32", "S/32"), ("m16", "M/16"), ("b16", "B/16"),
                           ("b32", "B/32"), ("l16", "L/16"), ("so400m14", "So400m/14"), ("h14", "H/14")]:
        entries.append(ModelEntry(
            name=f"simplevit_{short}",
            spec=GENERIC_SPEC if variant == "S/16" else ViTSpec.from_variant(variant, **SIMPLEVIT),
            family="simplevit",
            description=f"SimpleViT-{variant}: sincos2d posemb, global average pooling, tanh pre-logits, no cls token",
            weights=_simplevit_s16_weights() if short == "s16" else (),
        ))
    for short, variant in [("ti16", "Ti/16"), ("s16", "S/16"), ("s32", "S/32"), ("b8", "B/8"), ("b16", "B/16"),
                           ("b32", "B/32"), ("l16", "L/16"), ("l32", "L/32"), ("h14", "H/14")]:
        jax_name = variant.replace("/", "_")
        entries.append(ModelEntry(
            name=f"vit_{short}",
            spec=ViTSpec.from_variant(variant, **CLASSIC_VIT),
            family="vit",
            description=f"ViT-{variant} (vit_jax): class token, learned position embedding, linear head",
            weights=_vit_weights(jax_name),
        ))
    entries.append(_digits_entry())
    return {e.name: e for e in entries}


MODELS: dict[str, ModelEntry] = _entries()


def get_entry(name: str) -> ModelEntry:
    """Look a registered name up; the error lists every valid name."""
    base = name.split(".", 1)[0]
    if base not in MODELS:
        raise KeyError(f"unknown hub-vit model {name!r}; valid names: {', '.join(MODELS)}")
    return MODELS[base]


def timm_architecture(spec: ViTSpec) -> str:
    """The registered timm name whose architecture equals `spec` (ignoring classes, image size and head init),
    else the generic 'hub_vit' entry point."""
    key = architecture_key(spec)
    return next((name for name, entry in MODELS.items() if architecture_key(entry.spec) == key), GENERIC_ARCHITECTURE)


def architecture_key(spec: ViTSpec) -> dict[str, Any]:
    """The fields that make two specs the same registered architecture (classes, image size and head init aside)."""
    return {k: v for k, v in spec.to_dict().items() if k not in ("num_classes", "img_size", "head_zeroinit")}


def weights_at_url(url: str | None) -> tuple[ModelEntry, Weights] | None:
    """The published weights the catalog downloads from `url` (https), if any: how a URL or vanity name given to
    `hub-vit convert` is recognised as a catalog checkpoint (its name, hash and data config)."""
    for entry in MODELS.values():
        for weights in entry.weights:
            if url and weights.url == url:
                return entry, weights
    return None
