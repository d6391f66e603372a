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


def served_eval(**changes: object) -> dict[str, object]:
    """The served preprocessing's transform settings: Google's evaluation transform (the one data config's
    defaults) with `changes`, as `Preprocess.from_params` receives them from a generated config."""
    from hub_vit.data_config import GOOGLE_EVAL

    return {"interpolation": GOOGLE_EVAL.interpolation, "crop_mode": GOOGLE_EVAL.crop_mode, "mean": GOOGLE_EVAL.mean,
            "std": GOOGLE_EVAL.std, **changes}


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
    prep = imageprep.Preprocess(crop_size=(64, 64), scale_size=(73, 73), **served_eval(interpolation="bicubic"))
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
    from hub_vit.export.own_images import load_image_folder

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
    from hub_vit.server.client.images import encode

    rgb = Image.fromarray(photos["astronaut"][::8, ::8])
    if mode in ("I", "I;16"):  # 16-bit grey: the golden is the high byte (see the tests above)
        wide = np.asarray(rgb.convert("L")).astype(np.uint16) * 257
        image = Image.fromarray(wide.astype(np.int32) if mode == "I" else wide)
        expected = Image.fromarray((wide >> 8).astype(np.uint8)).convert("RGB")
    else:  # the golden is Pillow's own conversion to RGB, which the server applies to what it decodes
        image = rgb.convert(mode)
        expected = (image.convert("LA") if mode == "La" else image).convert("RGB")  # Pillow: La converts only to LA
    assert image.mode == mode
    prep = imageprep.Preprocess(crop_size=(16, 16), scale_size=(16, 16), **served_eval(crop_mode="squash"))
    np.testing.assert_array_equal(np.asarray(prep.decode(encode(image))), np.asarray(expected))


@pytest.mark.parametrize("mode", ["RGBa", "La", "PA", "RGBA", "LA"])
def test_client_sends_transparent_pil_images_as_the_server_would_see_them(imageprep, photos, mode):
    """Half-transparent pixels reach the server composited onto white, whichever alpha mode the PIL image has (RGBa /
    La / PA used to drop alpha, showing hidden colours)."""
    from hub_vit.image_modes import flatten_alpha
    from hub_vit.server.client.images import encode

    rgba = Image.fromarray(photos["astronaut"][::8, ::8]).convert("RGBA")
    alpha = np.zeros(rgba.size[::-1], np.uint8)
    alpha[:, : alpha.shape[1] // 2] = 255  # left half opaque, right half fully transparent
    rgba.putalpha(Image.fromarray(alpha))
    image = rgba.convert("LA").convert(mode) if mode in ("La", "LA") else rgba.convert(mode)
    assert image.mode == mode
    prep = imageprep.Preprocess(crop_size=(16, 16), scale_size=(16, 16), **served_eval(crop_mode="squash"))
    decoded = np.asarray(prep.decode(encode(image)))
    expected = np.asarray(flatten_alpha(image).convert("RGB"))
    np.testing.assert_array_equal(decoded, expected)
    if mode != "PA":  # PA's alpha survives conversion from RGBA only as the palette allows; the others keep it exactly
        assert (decoded[:, -1] == 255).all(), "the transparent half must arrive white"


def test_client_refuses_float_images_by_name():
    from hub_vit.server.client.images import encode

    with pytest.raises(ValueError, match="mode 'F'"):
        encode(Image.fromarray(np.zeros((4, 4), dtype=np.float32)))


# -- transparency -------------------------------------------------------------------------------------------------
# What the user sees of a transparent image is it on a white page; every path must give the model that. The golden
# is numpy's own composite onto white of binary alpha (0 or 255, exact), saved as an ordinary opaque PNG.


def _cutout_and_golden(photo: np.ndarray, mode: str) -> tuple[Image.Image, np.ndarray]:
    """(a transparent image in `mode` whose hidden pixels keep a colour, its composite onto white as RGB uint8)."""
    rgb = photo[::4, ::4].copy()
    h, w = rgb.shape[:2]
    visible = np.zeros((h, w), dtype=bool)
    visible[:, w // 2:] = True  # the right half is shown; the left half is hidden but keeps the photo's colours
    if mode == "RGBA":
        image = Image.fromarray(np.dstack([rgb, np.where(visible, 255, 0).astype(np.uint8)]), "RGBA")
        golden = np.where(visible[..., None], rgb, 255)
    elif mode == "LA":  # black ink on a transparent background: hidden pixels black, as a paint program saves them
        ink = np.where(rgb.mean(axis=2) > 100, 0, 255).astype(np.uint8)  # ink alpha where the photo is bright
        image = Image.fromarray(np.dstack([np.zeros_like(ink), ink]), "LA")
        golden = np.repeat(np.where(ink == 255, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    else:  # "P": a palette PNG whose first entry is transparent (tRNS), the hidden pixels pointing at a dark red
        index = np.where(visible, 2, 1).astype(np.uint8)
        index[:, : w // 4] = 0  # the hidden colour itself: black
        image = Image.fromarray(index, "P")
        image.putpalette([0, 0, 0, 200, 30, 30, 20, 200, 20] + [0] * (768 - 9))
        image.info["transparency"] = bytes([0, 0, 255] + [255] * 253)  # entries 0 and 1 hidden, 2 shown
        colours = np.array([[0, 0, 0], [200, 30, 30], [20, 200, 20]], dtype=np.uint8)
        golden = np.where(index[..., None] == 2, colours[index], 255).astype(np.uint8)
    return image, golden.astype(np.uint8)


@pytest.fixture(scope="module", params=["RGBA", "LA", "P"])
def transparent(request, photos, tmp_path_factory) -> tuple[Path, Path]:
    """(a transparent PNG, the opaque PNG of its composite onto white) on disk."""
    image, golden = _cutout_and_golden(photos["chelsea"], request.param)
    folder = tmp_path_factory.mktemp(f"alpha-{request.param}")
    cutout, flat = folder / "cutout.png", folder / "flat.png"
    image.save(cutout)
    Image.fromarray(golden).save(flat)
    reopened = Image.open(cutout)
    assert reopened.mode == request.param and (request.param != "P" or "transparency" in reopened.info)
    return cutout, flat


def test_rollout_and_demo_loader_composite_transparency_onto_white(transparent):
    from hub_vit.explain.image import load_image

    cutout, flat = transparent
    np.testing.assert_array_equal(np.asarray(load_image(cutout).convert("RGB")), np.asarray(load_image(flat)))


def test_served_preprocessing_composites_transparency_onto_white(imageprep, transparent):
    cutout, flat = transparent
    prep = imageprep.Preprocess(crop_size=(64, 64), scale_size=(73, 73), **served_eval(interpolation="bicubic"))
    np.testing.assert_array_equal(np.asarray(prep.decode(cutout.read_bytes())),
                                  np.asarray(prep.decode(flat.read_bytes())))
    np.testing.assert_array_equal(prep(cutout.read_bytes()), prep(flat.read_bytes()))


def test_training_loader_composites_transparency_onto_white(transparent):
    from hub_vit.train.data import load_rgb

    cutout, flat = transparent
    np.testing.assert_array_equal(np.asarray(load_rgb(cutout)), np.asarray(load_rgb(flat)))


def test_transformers_image_processor_composites_transparency_onto_white(transparent):
    from transformers import AutoImageProcessor

    from hub_vit.catalog import default_model_folder

    processor = AutoImageProcessor.from_pretrained(str(default_model_folder()))
    cutout, flat = transparent
    np.testing.assert_array_equal(processor(Image.open(cutout), return_tensors="np")["pixel_values"],
                                  processor(Image.open(flat), return_tensors="np")["pixel_values"])


def test_partial_alpha_is_blended_with_white_alike_in_process_and_served(imageprep):
    """Half-transparent pixels: in-process (hub_vit.image_modes) and served (imageprep's own copy) agree exactly,
    and both are the usual `c * a + 255 * (1 - a)` to rounding."""
    from hub_vit.image_modes import to_8bit

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(24, 32, 4), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format="PNG")
    prep = imageprep.Preprocess(crop_size=(16, 16), scale_size=(16, 16), **served_eval(crop_mode="squash"))
    served = np.asarray(prep.decode(buffer.getvalue()))
    in_process = np.asarray(to_8bit(Image.open(io.BytesIO(buffer.getvalue()))))
    np.testing.assert_array_equal(served, in_process)
    alpha = rgba[..., 3:].astype(np.float64) / 255
    expected = rgba[..., :3] * alpha + 255 * (1 - alpha)
    assert np.abs(in_process.astype(np.float64) - expected).max() <= 1


def test_opaque_images_are_left_as_they_are(photos):
    from hub_vit.image_modes import to_8bit

    rgb = photos["coffee"][::8, ::8]
    opaque = Image.fromarray(np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)]), "RGBA")
    np.testing.assert_array_equal(np.asarray(to_8bit(opaque)), rgb)  # alpha 255 everywhere: the same pixels
    plain = Image.fromarray(rgb)
    assert to_8bit(plain) is plain


def test_16bit_grey_colour_key_is_composited_onto_white_in_process_and_served(imageprep, grey16, tmp_path):
    """A 16-bit grey PNG with a tRNS colour key: the keyed samples are transparent, so white, like any other
    transparency (they kept their own grey before: the wide-grey branch returned before compositing)."""
    from hub_vit.explain.image import load_image

    samples = grey16[::4, ::4].copy()
    key = int(samples[0, 0])
    assert key >> 8 != 255, "a key that is already white would hide the bug"
    samples[:, : samples.shape[1] // 3] = key  # the left third hidden
    path = tmp_path / "keyed16.png"
    Image.fromarray(samples).save(path, transparency=key)
    assert Image.open(path).info.get("transparency") == key, "the fixture must carry a 16-bit colour key"
    golden = np.where(samples == key, 255, samples >> 8).astype(np.uint8)  # numpy: white where keyed, else high byte

    np.testing.assert_array_equal(np.asarray(to_8bit(Image.open(path))), golden)
    np.testing.assert_array_equal(np.asarray(load_image(path).convert("RGB")), np.dstack([golden] * 3))
    prep = imageprep.Preprocess(crop_size=(64, 64), scale_size=(73, 73), **served_eval(interpolation="bicubic"))
    np.testing.assert_array_equal(np.asarray(prep.decode(path.read_bytes())), np.dstack([golden] * 3))
