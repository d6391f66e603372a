"""Per-call and `from_pretrained` options of `HubViTImageProcessor`, against transformers' own `ViTImageProcessor`.

Where the two recipes mean the same thing (an image already at the model size, so no resize and no crop), the
reference is ViT's processor with the same options; elsewhere it is the processor built with those settings.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, ViTImageProcessor
from transformers.image_utils import PILImageResampling

import hub_vit  # noqa: F401  (registers the Auto classes)
from hub_vit.catalog import default_model_folder
from hub_vit.hf import HubViTImageProcessor
from hub_vit.hf.image_processing_hub_vit import CALL_OPTIONS


@pytest.fixture(scope="module")
def at_size(photos: dict[str, np.ndarray]) -> Image.Image:
    """A real photo already at the model's 32x32: neither recipe resizes or crops it."""
    return Image.fromarray(photos["chelsea"]).resize((32, 32), Image.BILINEAR)


@pytest.fixture(scope="module")
def odd(photos: dict[str, np.ndarray]) -> Image.Image:
    return Image.fromarray(photos["coffee"]).resize((50, 40), Image.BILINEAR)  # 50 wide, 40 high


def _processor(**settings: object) -> HubViTImageProcessor:
    return HubViTImageProcessor(**{"size": {"height": 32, "width": 32}, "crop_pct": 0.875, **settings})


def _vit(**options: object) -> ViTImageProcessor:
    return ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3, **options)


@pytest.mark.parametrize("options", [
    dict(do_resize=False),
    dict(do_resize=False, do_normalize=False),  # [0, 1]
    dict(do_resize=False, do_rescale=False),  # (0..255 - 0.5) / 0.5
    dict(do_resize=False, do_rescale=False, do_normalize=False),  # the 0..255 values
    dict(do_resize=False, image_mean=[0.2, 0.4, 0.6], image_std=0.25),  # one number: every channel, as in ViT
], ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()))
def test_call_options_match_vits_processor(options: dict, at_size: Image.Image) -> None:
    processor = _processor()
    ours = processor(at_size, return_tensors="pt", **options)["pixel_values"]
    theirs = _vit()(at_size, return_tensors="pt", **options)["pixel_values"]
    assert ours.shape == theirs.shape == (1, 3, 32, 32) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs.float(), rtol=0, atol=1e-6)  # ViT keeps uint8 when nothing scales
    # the same settings given to the constructor (and so to from_pretrained) give the same pixels
    torch.testing.assert_close(_processor(**options)(at_size)["pixel_values"], ours, rtol=0, atol=0)


def test_value_ranges_without_rescale_or_normalize(odd: Image.Image) -> None:
    processor = _processor()
    unit = processor(odd, do_normalize=False)["pixel_values"]
    raw = processor(odd, do_normalize=False, do_rescale=False)["pixel_values"]
    assert 0 <= unit.min() and unit.max() <= 1 and unit.max() > 0.5
    torch.testing.assert_close(raw, unit * 255, rtol=0, atol=1e-4)
    assert torch.equal(raw, raw.round())  # whole 0..255 values
    torch.testing.assert_close(processor(odd)["pixel_values"], (unit - 0.5) / 0.5, rtol=0, atol=1e-6)


def test_calls_do_not_change_the_processor(odd: Image.Image) -> None:
    processor = _processor()
    saved, default = processor.to_dict(), processor(odd)["pixel_values"]
    own = processor.transform()
    assert processor.transform() is own  # the default path is built once
    for options in (dict(do_resize=False), dict(size=64), dict(crop_pct=0.5), dict(interpolation="nearest"),
                    dict(image_mean=0.0, image_std=1.0)):
        assert not torch.equal(processor(odd, **options)["pixel_values"], default)
        assert processor.transform(**options) is not own
    assert processor.to_dict() == saved and processor.transform() is own
    torch.testing.assert_close(processor(odd)["pixel_values"], default, rtol=0, atol=0)
    # options equal to the processor's own, or None (ViT: "use the processor's"), take the default path
    assert processor.transform(do_resize=True, size=None, crop_pct=0.875) is own


def test_settings_changed_in_place_take_effect(odd: Image.Image) -> None:
    # was: the cached transform was keyed on the processor's own dict and lists, so after a first call
    # `processor.size["height"] = 48` (transformers' idiom) still gave 32 x 32 pixels, even with size=processor.size
    processor = _processor()
    assert processor(odd)["pixel_values"].shape == (1, 3, 32, 32)
    processor.size["height"] = 48
    assert processor(odd)["pixel_values"].shape == (1, 3, 48, 32)
    assert processor(odd, size=processor.size)["pixel_values"].shape == (1, 3, 48, 32)
    processor.image_mean[0] = 1.0
    expected = _processor(size={"height": 48, "width": 32}, image_mean=[1.0, 0.5, 0.5])(odd)["pixel_values"]
    torch.testing.assert_close(processor(odd)["pixel_values"], expected, rtol=0, atol=0)


def test_size_crop_and_resize_switches(odd: Image.Image) -> None:
    processor = _processor()
    assert processor(odd, size=64)["pixel_values"].shape == (1, 3, 64, 64)
    torch.testing.assert_close(processor(odd, size={"height": 48, "width": 64})["pixel_values"],
                               _processor(size={"height": 48, "width": 64})(odd)["pixel_values"], rtol=0, atol=0)
    # no resize: the centre 32x32 of the 50x40 image itself; no crop: the resized image (shorter side 32 / 0.875)
    pixels = np.asarray(odd, dtype=np.float32) / 127.5 - 1  # (40, 50, 3) in [-1, 1]
    expected = torch.from_numpy(pixels[4:36, 9:41]).permute(2, 0, 1)
    torch.testing.assert_close(processor(odd, do_resize=False)["pixel_values"][0], expected, rtol=0, atol=1e-6)
    assert processor(odd, do_center_crop=False)["pixel_values"].shape == (1, 3, 36, 45)
    uncut = processor(odd, do_resize=False, do_center_crop=False)["pixel_values"][0]
    torch.testing.assert_close(uncut, torch.from_numpy(pixels).permute(2, 0, 1), rtol=0, atol=1e-6)


def test_resample_is_vits_name_for_the_interpolation(odd: Image.Image) -> None:
    processor = _processor()
    bicubic = processor(odd, interpolation="bicubic")["pixel_values"]
    torch.testing.assert_close(processor(odd, resample=PILImageResampling.BICUBIC)["pixel_values"], bicubic,
                               rtol=0, atol=0)
    assert _processor(resample=Image.Resampling.BICUBIC).interpolation == "bicubic"
    with pytest.raises(ValueError, match=r"resample=3 \(bicubic\) and interpolation='nearest' disagree"):
        processor(odd, resample=3, interpolation="nearest")


def test_return_tensors_none_gives_a_list_as_vits_processor(odd: Image.Image, at_size: Image.Image) -> None:
    ours = _processor()([odd, at_size], return_tensors=None)["pixel_values"]
    theirs = _vit()([odd, at_size], return_tensors=None)["pixel_values"]
    assert type(ours) is type(theirs) is list and all(isinstance(p, torch.Tensor) for p in ours + theirs)
    assert [p.shape for p in ours] == [p.shape for p in theirs] == [(3, 32, 32)] * 2
    # images of different sizes: a list, or a clear error for one batch
    sizes = _processor()([odd, at_size], do_resize=False, do_center_crop=False, return_tensors=None)["pixel_values"]
    assert [tuple(p.shape) for p in sizes] == [(3, 40, 50), (3, 32, 32)]
    with pytest.raises(ValueError, match=r"different sizes after preprocessing .* pass return_tensors=None"):
        _processor()([odd, at_size], do_resize=False, do_center_crop=False)
    # the default stays one (B, C, H, W) tensor: every existing caller indexes pixel_values as a batch
    assert _processor()([odd, at_size])["pixel_values"].shape == (2, 3, 32, 32)


def test_device_is_taken_as_vits_processor_takes_it(odd: Image.Image) -> None:
    # was: TypeError "unexpected preprocessing argument(s) ['device']"; the meta device shows the move on any host
    ours = _processor()(odd, device="meta")["pixel_values"]
    theirs = _vit()(odd, device="meta", return_tensors="pt")["pixel_values"]
    assert ours.device == theirs.device == torch.device("meta") and ours.shape == theirs.shape
    assert all(p.device.type == "meta" for p in _processor()([odd, odd], device="meta", return_tensors=None)[
        "pixel_values"])
    with pytest.raises(ValueError, match="needs torch tensors; numpy arrays"):
        _processor()(odd, device="meta", return_tensors="np")


@pytest.mark.parametrize(("options", "error", "needle"), [
    (dict(rescale_factor=1 / 127.5), TypeError, r"unexpected preprocessing argument\(s\) \['rescale_factor'\]; valid: "
                                                r"images, return_tensors, device, size, crop_pct"),
    (dict(crop_size=32), TypeError, r"\['crop_size'\]; valid: .*do_resize, do_center_crop, do_rescale"),
    (dict(size={"shortest_edge": 40}), ValueError, r"'shortest_edge' and 'longest_edge' are not supported"),
    (dict(do_resize="no"), ValueError, "do_resize must be True or False, got 'no'"),
    (dict(do_normalize=1), ValueError, "do_normalize must be True or False, got 1"),
    (dict(crop_pct=1.5), ValueError, r"crop_pct must be a number in \(0, 1\], got 1.5"),
    (dict(interpolation="cubic"), ValueError, "unknown interpolation 'cubic'; valid choices: bilinear"),
    (dict(resample=9), ValueError, r"unknown resample 9; valid: a PIL.Image.Resampling value \(0=nearest"),
    (dict(image_mean=[0.5]), ValueError, r"image_mean has 1 values, but this processor's images have 3 channels"),
    (dict(image_std=[0.5, 0.0, 0.5]), ValueError, "image_std must be positive"),
])
def test_bad_call_options_are_named(options: dict, error: type, needle: str, odd: Image.Image) -> None:
    processor = _processor()
    with pytest.raises(error, match=needle):
        processor(odd, **options)
    assert set(CALL_OPTIONS) >= {"do_resize", "size", "do_normalize", "do_rescale", "image_mean", "image_std",
                                 "resample", "crop_pct", "do_center_crop"}


# ------------------------------------------------------------------------------------------------ from_pretrained
def test_from_pretrained_applies_the_options(odd: Image.Image, tmp_path) -> None:
    folder = default_model_folder()  # a 32x32 model, crop_pct 1.0
    base = AutoImageProcessor.from_pretrained(folder)
    tuned = AutoImageProcessor.from_pretrained(folder, do_resize=False, do_normalize=False, resample=3)
    assert (tuned.do_resize, tuned.do_normalize, tuned.interpolation) == (False, False, "bicubic")
    expected = base(odd, do_resize=False, do_normalize=False, resample=3)["pixel_values"]
    torch.testing.assert_close(tuned(odd)["pixel_values"], expected, rtol=0, atol=0)
    assert base.do_resize and base.interpolation == "bilinear"  # loading another one changed nothing
    # a switched-off step is saved and comes back; the model folders' own file has no switches (all on)
    tuned.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert written["do_resize"] is False and written["do_normalize"] is False and "do_rescale" not in written
    again = HubViTImageProcessor.from_pretrained(tmp_path)
    assert (again.do_resize, again.do_normalize, again.do_rescale) == (False, False, True)
    shipped = json.loads((folder / "preprocessor_config.json").read_text())
    assert not any(key.startswith("do_") for key in shipped)


@pytest.mark.parametrize("kwargs", [dict(shortest_edge=64), dict(rescale_factor=2.0), dict(crop_size=64),
                                    dict(do_resise=False)])
def test_from_pretrained_warns_about_options_it_cannot_apply(kwargs: dict) -> None:
    # ViT's processor drops them silently: a requested preprocessing change would be lost without a word
    with pytest.warns(UserWarning, match=rf"ignores \['{next(iter(kwargs))}'\]: not settings of this processor; "
                                         r"valid settings: size, crop_pct, interpolation"):
        processor = AutoImageProcessor.from_pretrained(default_model_folder(), **kwargs)
    assert processor.to_dict() == AutoImageProcessor.from_pretrained(default_model_folder()).to_dict()
    assert not set(kwargs) & set(vars(processor))  # not set as unread attributes either


def test_from_pretrained_stays_quiet_about_loader_and_model_kwargs() -> None:
    # pipeline() hands its dtype, code_revision and model kwargs to the image processor too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        processor = AutoImageProcessor.from_pretrained(default_model_folder(), dtype=torch.bfloat16,
                                                       code_revision=None, attn_implementation="eager", size=64)
    assert processor.size == {"height": 64, "width": 64}


@pytest.mark.parametrize("image", [Image.new("RGB", (0, 0)), np.zeros((0, 32, 3), np.uint8), torch.zeros(3, 32, 0)],
                         ids=["pil 0x0", "numpy 0 rows", "torch 0 columns"])
def test_an_image_without_pixels_is_a_value_error(image: object) -> None:
    # was a ZeroDivisionError from the resize arithmetic; the docs promise ValueError for bad inputs
    for processor in (_processor(), AutoImageProcessor.from_pretrained(default_model_folder())):
        with pytest.raises(ValueError, match="an image without pixels cannot be resized"):
            processor(image)
