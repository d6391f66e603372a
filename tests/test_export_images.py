"""`hub-vit export onnx --images`: the user's own images reach calibration and verification as the model sees them.

They used to be read without EXIF orientation and always as 3-channel [-1, 1] centre crops, whatever the model's
transform said: a phone photo calibrated int8 sideways, an ImageNet-normalised model was calibrated on activations it
never sees in serving, and a 1-channel model could not take --images at all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.explain.image import DataConfig
from hub_vit.export.own_images import load_image_folder


def _photo(h: int = 48, w: int = 64) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    upright = _photo()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    upright.save(tmp_path / "a" / "x.png")
    # Stored rotated, with the EXIF tag (6 = rotate 90 degrees clockwise to display) that turns it upright again.
    exif = Image.Exif()
    exif[0x0112] = 6
    upright.transpose(Image.Transpose.ROTATE_90).save(tmp_path / "b" / "x.png", exif=exif)
    data = DataConfig(img_size=(32, 32), crop_pct=1.0)
    np.testing.assert_array_equal(load_image_folder(tmp_path / "a", data), load_image_folder(tmp_path / "b", data))


def test_the_models_own_transform_is_used(tmp_path: Path) -> None:
    photo = _photo()
    photo.save(tmp_path / "x.png")
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    data = DataConfig(img_size=(32, 32), crop_pct=0.875, interpolation="bicubic", mean=mean, std=std)
    (x,) = load_image_folder(tmp_path, data)
    # Expected, from Pillow directly: shorter side 48 -> floor(32 / 0.875) = 36, width 64 -> 48, centre 32 x 32.
    resized = np.asarray(photo.resize((48, 36), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    crop = resized[2:34, 8:40]
    expected = ((crop - np.asarray(mean)) / np.asarray(std)).transpose(2, 0, 1)
    np.testing.assert_allclose(x, expected, atol=1e-5)


def test_bmp_and_gif_files_are_read_as_train_and_calibrate_domain_read_them(tmp_path: Path) -> None:
    # was: "has no .jpg/.jpeg/.png/.webp files" for the held-out split of a model trained on BMP files
    photo = _photo()
    for folder in ("png", "own"):
        (tmp_path / folder).mkdir()
    photo.save(tmp_path / "png" / "x.png")
    photo.save(tmp_path / "own" / "x.bmp")
    photo.save(tmp_path / "own" / "y.gif")
    data = DataConfig(img_size=(32, 32), crop_pct=1.0)
    (png,) = load_image_folder(tmp_path / "png", data)
    bmp, gif = load_image_folder(tmp_path / "own", data)
    np.testing.assert_array_equal(bmp, png)  # BMP is lossless
    assert gif.shape == png.shape  # GIF's palette changes the pixels


def test_one_channel_model(tmp_path: Path) -> None:
    _photo().save(tmp_path / "x.jpg")
    out = load_image_folder(tmp_path, DataConfig(img_size=(16, 16), mean=(0.5,), std=(0.5,), in_chans=1))
    assert out.shape == (1, 1, 16, 16) and out.min() >= -1 and out.max() <= 1


def test_bad_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match=r"bad\.jpg.*as an image"):
        load_image_folder(tmp_path, DataConfig(img_size=(16, 16)))
    (tmp_path / "bad.jpg").unlink()
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"has no \.jpg/\.jpeg/\.png/\.webp/\.bmp/\.gif files"):
        load_image_folder(tmp_path, DataConfig(img_size=(16, 16)))
    (tmp_path / "notes.txt").unlink()
    Image.new("RGB", (2, 200_000), (200, 10, 10)).save(tmp_path / "thin.png")  # readable, too thin to resize
    with pytest.raises(ValueError, match=r"thin\.png': aspect ratio too extreme"):  # was the reason alone, no file
        load_image_folder(tmp_path, DataConfig(img_size=(224, 224)))
