"""One data config: `hub_vit.data_config.DataConfig` reads a `pretrained_cfg` as timm's `resolve_data_config` does,
and every consumer of it (the served preprocessing, the transformers image processor, rollout's in-process transform)
turns the same image into the same tensor, which is timm's own eval transform (the golden reference)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from hub_vit.data_config import GOOGLE_EVAL, DataConfig
from hub_vit.model import VisionTransformer
from hub_vit.resolve import ResolvedModel, resolve_model
from hub_vit.variants import ViTSpec

CASES = [
    {"input_size": (3, 64, 64), "crop_pct": 0.875, "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.5,) * 3},
    {"input_size": (3, 48, 48), "crop_pct": 0.9, "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
     "std": (0.229, 0.224, 0.225)},
    {"input_size": (3, 48, 64), "crop_pct": 1.0, "interpolation": "bilinear", "crop_mode": "squash",
     "mean": (0.5,) * 3, "std": (0.5,) * 3},
]


def _spec(size: tuple[int, int]) -> ViTSpec:
    return ViTSpec(img_size=size, patch_size=16, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=2)


@pytest.mark.parametrize("cfg", CASES)
def test_reads_a_pretrained_cfg_as_timm_does(cfg) -> None:
    from timm.data import resolve_data_config

    timm_cfg = resolve_data_config(pretrained_cfg=cfg)
    data = DataConfig.from_pretrained_cfg(cfg)
    assert data.input_size == tuple(timm_cfg["input_size"]) and data.crop_pct == timm_cfg["crop_pct"]
    assert data.interpolation == timm_cfg["interpolation"] and data.crop_mode == timm_cfg["crop_mode"]
    assert data.mean == tuple(timm_cfg["mean"]) and data.std == tuple(timm_cfg["std"])


def test_missing_fields_are_googles_and_the_models_size() -> None:
    spec = _spec((48, 48)).replace(in_chans=1)
    assert DataConfig.from_pretrained_cfg(None, spec) == DataConfig(img_size=(48, 48), mean=(0.5,), std=(0.5,),
                                                                   in_chans=1)
    assert DataConfig.from_pretrained_cfg({}) == GOOGLE_EVAL == DataConfig()
    assert GOOGLE_EVAL.pretrained_cfg() == {"input_size": (3, 224, 224), "crop_pct": 0.875, "crop_mode": "center",
                                            "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.5,) * 3}
    assert DataConfig(img_size=(224, 224)).scale_size == (256, 256)  # floor(224 / 0.875), timm's rule


@pytest.mark.parametrize(("bad", "message"), [
    (dict(interpolation="cubic"), r"unknown interpolation 'cubic'; valid choices: bilinear, bicubic, nearest"),
    (dict(crop_mode="fill"), r"unsupported crop_mode 'fill'; valid choices: center, squash, border"),
    (dict(crop_pct=1.5), r"crop_pct must be a number in \(0, 1\], got 1.5"),
    (dict(crop_pct=0), r"crop_pct must be a number in \(0, 1\], got 0"),
    (dict(mean=(0.5, 0.5)), r"mean and std need one value per input channel \(3\), got mean=\(0.5, 0.5\)"),
    (dict(std=(0.5, 0.0, 0.5)), r"std must not hold 0"),
    (dict(img_size=(0, 32)), r"img_size must be \(height, width\) of positive sizes, got \(0, 32\)"),
])
def test_bad_settings_name_the_value_and_the_rule(bad, message) -> None:
    with pytest.raises(ValueError, match=message):
        DataConfig(**bad)


def test_bad_pretrained_cfg_is_named() -> None:
    with pytest.raises(ValueError, match=r"pretrained_cfg input_size must be \(channels, height, width\), positive "
                                         r"integers, got"):
        DataConfig.from_pretrained_cfg({"input_size": (32, 32)})
    with pytest.raises(ValueError, match=r"pretrained_cfg mean has 2 values for 3 input channels"):
        DataConfig.from_pretrained_cfg({"input_size": (3, 32, 32), "mean": (0.5, 0.5)})


def _served(model: ResolvedModel, imageprep, png: bytes) -> np.ndarray:
    """What the Triton server computes: the template built from the parameters rendered into its config."""
    from hub_vit.server.repository.config import preprocess_params
    from hub_vit.server.repository.metadata import serving_metadata
    from hub_vit.server.repository.options import ServingOptions

    return imageprep.Preprocess.from_params(preprocess_params(serving_metadata(model), ServingOptions()))(png)


@pytest.mark.parametrize("cfg", CASES)
def test_served_hf_and_in_process_transforms_give_the_same_tensor(cfg, imageprep, photos) -> None:
    from timm.data import create_transform

    from hub_vit.explain.image import prepare_image
    from hub_vit.hf.image_processing_hub_vit import HubViTImageProcessor

    size = cfg["input_size"][1:]
    model = ResolvedModel.from_module(VisionTransformer(_spec(size)), name="probe", pretrained_cfg=cfg)
    processor = HubViTImageProcessor.from_data_config(model.data)
    golden = create_transform(**model.data.timm_transform_args(), is_training=False)  # timm's own eval transform
    for array in photos.values():
        image = Image.fromarray(array)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        expected = golden(image).numpy()
        served = _served(model, imageprep, buffer.getvalue())
        in_process = prepare_image(image, model.data).tensor.numpy()
        hf = processor(image, return_tensors="pt")["pixel_values"][0].numpy()
        np.testing.assert_array_equal(served, expected)
        np.testing.assert_array_equal(in_process, served)
        np.testing.assert_allclose(hf, served, atol=1e-6, rtol=0)


def test_the_shipped_folder_s_processor_is_its_data_config(imageprep, photos) -> None:
    """The default model's saved `preprocessor_config.json` (what `AutoImageProcessor` loads) does what its data config
    says, as served and as rollout does it."""
    from transformers import AutoImageProcessor

    from hub_vit.explain.image import prepare_image

    model = resolve_model(None)
    processor = AutoImageProcessor.from_pretrained(str(model.folder))
    image = Image.fromarray(photos["coffee"])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    served = _served(model, imageprep, buffer.getvalue())
    np.testing.assert_array_equal(prepare_image(image, model.data).tensor.numpy(), served)
    hf = processor(image, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(hf, torch.from_numpy(served), atol=1e-6, rtol=0)
