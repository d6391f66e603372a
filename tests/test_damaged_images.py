"""A JPEG, PNG or WebP whose header is cut short or damaged is named as a damaged image of its format, by the served
preprocessing and by the in-process reader (rollout, demo), never as "not an image" of another kind: the bytes say
which format they are (hub_vit.image_formats.signature_format), only the header cannot be read."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from hub_vit.data_config import GOOGLE_EVAL
from hub_vit.explain.image import ImageReadError, load_image


def _encoded(pillow_format: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 120, 200)).save(buffer, pillow_format)
    return buffer.getvalue()


# (name, format as messages write it, bytes): headers Pillow cannot read (seen as "not an image: ... are not JPEG, PNG
# or WebP" from the server, and "cannot read ... as an image (OSError)" for the WebP from rollout and the demo)
DAMAGED = [
    ("jpeg_cut_in_its_header", "JPEG", _encoded("JPEG")[:20]),
    ("png_cut_after_ihdr", "PNG", _encoded("PNG")[:33]),
    ("png_cut_in_ihdr", "PNG", _encoded("PNG")[:16]),
    ("webp_cut_in_its_header", "WebP", _encoded("WEBP")[:20]),
]


@pytest.fixture(scope="module")
def prep(imageprep):
    return imageprep.Preprocess(crop_size=(32, 32), scale_size=(36, 36), interpolation=GOOGLE_EVAL.interpolation,
                                crop_mode=GOOGLE_EVAL.crop_mode, mean=GOOGLE_EVAL.mean, std=GOOGLE_EVAL.std)


@pytest.mark.parametrize(("name", "kind", "data"), DAMAGED, ids=[case[0] for case in DAMAGED])
def test_the_server_names_a_damaged_header_by_its_format(imageprep, prep, name, kind, data):
    with pytest.raises(imageprep.BadImageError, match=rf"^damaged {kind} image: its {len(data)} bytes start as {kind}, "
                       r"but its header cannot be read \(truncated or corrupt\)"):
        prep.decode(data)


@pytest.mark.parametrize(("name", "kind", "data"), DAMAGED, ids=[case[0] for case in DAMAGED])
def test_rollout_and_the_demo_name_a_damaged_header_by_its_format(tmp_path: Path, name, kind, data):
    path = tmp_path / f"{name}.img"
    path.write_bytes(data)
    for source in (path, data):  # a file (rollout) and an upload's bytes (the demo)
        with pytest.raises(ImageReadError, match=rf"is a damaged or incomplete {kind} image \("):
            load_image(source, name=path.name)


def test_bytes_of_another_kind_are_still_not_an_image(imageprep, prep, tmp_path: Path):
    with pytest.raises(imageprep.BadImageError, match=r"^not an image: 27 bytes starting b'this is ' are not JPEG, PNG "
                       "or WebP"):
        prep.decode(b"this is not an image at all")
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, "GIF")  # a real image in a format hub-vit does not decode
    with pytest.raises(ImageReadError, match=r"^'x\.gif' is a GIF image, not one of the supported formats: JPEG, "
                       r"PNG or WebP \(convert it to one of them\)$"):  # named by its signature: no GIF decoder ran
        load_image(gif.getvalue(), name="x.gif")
    # the server names it the same way (was: "not an image: 35 bytes starting b'GIF87a...' are not JPEG, PNG or WebP")
    with pytest.raises(imageprep.BadImageError, match=r"^a GIF image, not one of the supported formats: JPEG, PNG or "
                       r"WebP \(convert it to one of them\)$"):
        prep.decode(gif.getvalue())
    tiff = io.BytesIO()
    Image.new("RGB", (8, 8)).save(tiff, "TIFF")
    with pytest.raises(imageprep.BadImageError, match=r"^a TIFF image, not one of the supported formats"):
        prep.decode(tiff.getvalue())
    bmp = io.BytesIO()
    Image.new("RGB", (8, 8)).save(bmp, "BMP")
    with pytest.raises(ImageReadError, match=r"^'x\.bmp' is a BMP image, not one of the supported"):
        load_image(bmp.getvalue(), name="x.bmp")
    # was: "is a BMP image": a text file that starts with "BM" is not one
    with pytest.raises(ImageReadError) as err:
        load_image(b"BMW 320i, 1998, 180000 km\n", name="car.txt")
    assert "BMP" not in str(err.value)
