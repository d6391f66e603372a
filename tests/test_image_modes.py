"""16-bit greyscale images are scaled to 8 bits, not clipped to white, in every path that decodes an image.

Pillow opens a 16-bit grey PNG as mode "I;16", and `convert("RGB")` clips each sample to 255: a real photo saved
that way becomes almost all white. The golden here is numpy's `samples >> 8` saved as an ordinary 8-bit PNG (the
high byte, which is what Pillow itself keeps for 16-bit colour PNGs): every decoder must see the same pixels in both
files. The served preprocessing keeps its own copy of the rule (it runs without hub_vit), so it is checked too.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.image_modes import WIDE_GREY_MODES, to_8bit


@pytest.fixture(scope="module")
def grey16(photos) -> np.ndarray:
    """A real photo as 16-bit grey samples (H, W) uint16 that use the whole range, low byte included."""
    rgb = photos["chelsea"].astype(np.float64)
    luma = rgb @ np.array([0.299, 0.587, 0.114])  # (H, W) in [0, 255]
    return np.round(luma / 255.0 * 65535.0).astype(np.uint16)


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def png_pair(grey16, tmp_path_factory) -> tuple[Path, Path]:
    """(16-bit grey PNG, the 8-bit PNG of its high bytes) written to disk."""
    folder = tmp_path_factory.mktemp("grey16")
    wide, narrow = folder / "wide.png", folder / "narrow.png"
    wide.write_bytes(_png(grey16))
    narrow.write_bytes(_png((grey16 >> 8).astype(np.uint8)))
    assert Image.open(wide).mode == "I;16", "the fixture must really be a 16-bit PNG"
    return wide, narrow


@pytest.mark.parametrize("mode", WIDE_GREY_MODES)
def test_to_8bit_keeps_the_high_byte_in_every_wide_grey_mode(grey16, mode):
    if mode == "I":
        image = Image.fromarray(grey16.astype(np.int32))
    else:
        dtype = {"I;16": "<u2", "I;16L": "<u2", "I;16B": ">u2", "I;16N": "=u2"}[mode]
        image = Image.frombytes(mode, grey16.shape[::-1], grey16.astype(dtype).tobytes())
    assert image.mode == mode
    out = to_8bit(image)
    assert out.mode == "L"
    np.testing.assert_array_equal(np.asarray(out), grey16 >> 8)


def test_to_8bit_leaves_other_modes_alone(photos):
    image = Image.fromarray(photos["coffee"])
    assert to_8bit(image) is image


def test_pillow_still_clips_16bit_grey():
    """Why the rule exists; if a Pillow release starts scaling by itself this fails, and the rule can go."""
    image = Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16))
    assert np.asarray(image.convert("L")).max() == 255


def test_served_preprocessing_scales_16bit_grey(imageprep, png_pair):
    wide, narrow = png_pair
    prep = imageprep.Preprocess(crop_size=(64, 64), scale_size=(73, 73), interpolation="bicubic")
    served = prep(wide.read_bytes())
    np.testing.assert_array_equal(served, prep(narrow.read_bytes()))
    assert served.mean() < 0.5  # a clipped image is ~1.0 everywhere after (x - 0.5) / 0.5


def test_rollout_and_demo_loader_scales_16bit_grey(png_pair):
    from hub_vit.explain.image import load_image

    wide, narrow = png_pair
    np.testing.assert_array_equal(np.asarray(load_image(wide)), np.asarray(load_image(narrow)))


def test_training_loader_scales_16bit_grey(png_pair):
    from hub_vit.train.data import load_rgb

    wide, narrow = png_pair
    np.testing.assert_array_equal(np.asarray(load_rgb(wide)), np.asarray(load_rgb(narrow)))


def test_transformers_image_processor_scales_16bit_grey(png_pair):
    """The transformers front door (`pipeline("image-classification", model=folder)`) preprocesses with it."""
    from transformers import AutoImageProcessor

    from hub_vit.catalog import default_model_folder

    processor = AutoImageProcessor.from_pretrained(str(default_model_folder()))
    wide, narrow = png_pair
    np.testing.assert_array_equal(processor(Image.open(wide), return_tensors="np")["pixel_values"],
                                  processor(Image.open(narrow), return_tensors="np")["pixel_values"])


def test_export_verification_images_scale_16bit_grey(png_pair, tmp_path):
    from hub_vit.explain.image import DataConfig
    from hub_vit.export.verify import load_image_folder

    wide, narrow = png_pair
    for name, source in (("wide", wide), ("narrow", narrow)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "image.png").write_bytes(source.read_bytes())
    data = DataConfig(img_size=(32, 32), crop_pct=1.0)
    np.testing.assert_array_equal(load_image_folder(tmp_path / "wide", data),
                                  load_image_folder(tmp_path / "narrow", data))


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "RGBA", "CMYK", "YCbCr", "HSV", "RGBX", "RGBa", "La", "PA",
                                  "I", "I;16"])
def test_client_sends_pil_images_of_any_mode(imageprep, photos, mode):
    """The client encodes a PIL image as PNG; modes PNG cannot hold are converted to what the server would see."""
    from hub_vit.server.client import encode

    rgb = Image.fromarray(photos["astronaut"][::8, ::8])
    if mode in ("I", "I;16"):  # 16-bit grey: the golden is the high byte (see the tests above)
        wide = np.asarray(rgb.convert("L")).astype(np.uint16) * 257
        image = Image.fromarray(wide.astype(np.int32) if mode == "I" else wide)
        expected = Image.fromarray((wide >> 8).astype(np.uint8)).convert("RGB")
    else:  # the golden is Pillow's own conversion to RGB, which the server applies to what it decodes
        image = rgb.convert(mode)
        expected = (image.convert("LA") if mode == "La" else image).convert("RGB")  # Pillow: La converts only to LA
    assert image.mode == mode
    prep = imageprep.Preprocess(crop_size=(16, 16), scale_size=(16, 16), crop_mode="squash")
    np.testing.assert_array_equal(np.asarray(prep.decode(encode(image))), np.asarray(expected))


def test_client_refuses_float_images_by_name():
    from hub_vit.server.client import encode

    with pytest.raises(ValueError, match="mode 'F'"):
        encode(Image.fromarray(np.zeros((4, 4), dtype=np.float32)))
