"""Strict JPEG decoding in the served preprocessing (`imageprep.py`, shared by every served flavour that decodes).

libjpeg decodes a sequential JPEG whose scan data ends before its last rows (cut short and closed with an end marker
again, or a header declaring more rows than the data holds) without an error: the missing blocks come out flat grey
and only a warning, which Pillow does not expose, says so. Those images must be refused as client errors; complete
images, mid-grey ones included, must still decode. Real photos (scikit-image's), encoded by Pillow.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

CUTS = (100, 300, 600, 3000)  # bytes cut from the end; a few hundred is a few rows of a 451x300 photo


def jpeg(array: np.ndarray, **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def prep(imageprep):
    from tests.test_image_fuzz import served_eval

    return imageprep.Preprocess(crop_size=(224, 224), scale_size=(248, 248), **served_eval())


@pytest.fixture(scope="module", params=["astronaut", "chelsea"])
def photo(request, photos) -> np.ndarray:
    return np.asarray(Image.fromarray(photos[request.param]).resize((451, 300)))


@pytest.mark.parametrize("options", [{}, {"subsampling": 0}, {"quality": 95, "optimize": True}],
                         ids=["4:2:0", "4:4:4", "q95-optimized"])
@pytest.mark.parametrize("cut", CUTS)
def test_scan_data_cut_short_and_closed_again_is_refused(prep, imageprep, photo, options, cut):
    whole = jpeg(photo, **options)
    assert prep(whole).shape == (3, 224, 224)
    short = whole[:-cut] + b"\xff\xd9"  # the end-of-image marker, as a repaired download or a proxy leaves it
    with pytest.raises(imageprep.BadImageError) as refused:
        prep(short)
    assert "truncated JPEG image: its data ends before its last rows (451x300 declared; premature end of JPEG data)" \
        in str(refused.value), refused.value


@pytest.mark.parametrize("cut", CUTS)
def test_scan_data_cut_short_without_its_end_marker_is_refused(prep, imageprep, photo, cut):
    with pytest.raises(imageprep.BadImageError, match=r"cannot decode JPEG image \(451x300\): image file is truncated"):
        prep(jpeg(photo)[:-cut])


@pytest.mark.parametrize("extra_rows", [5, 16, 40])
def test_a_header_declaring_a_few_more_rows_than_the_data_is_refused(prep, imageprep, photo, extra_rows):
    # the lower bound on the data's size (2 bits per block) passes these: only the decoded image shows it
    taller = bytearray(jpeg(photo))
    frame = taller.find(b"\xff\xc0")
    taller[frame + 5:frame + 7] = struct.pack(">H", 300 + extra_rows)
    assert imageprep.jpeg_shortfall(bytes(taller)) is None
    with pytest.raises(imageprep.BadImageError, match=rf"its data ends before its last rows \(451x{300 + extra_rows}"):
        prep(bytes(taller))


@pytest.mark.parametrize("name, make", [
    ("flat mid-grey", lambda: np.full((300, 451, 3), 128, np.uint8)),
    ("mid-grey bottom", lambda: np.concatenate([np.full((150, 451, 3), 30, np.uint8),
                                                np.full((150, 451, 3), 128, np.uint8)])),
    ("grey-level mid-grey", lambda: np.full((300, 451), 128, np.uint8)),
])
def test_complete_images_whose_last_rows_are_mid_grey_still_decode(prep, name, make):
    # a missing block decodes as flat luma 128: a complete image that really ends so must not be taken for one
    array = make()
    pixels = prep(jpeg(array))
    assert pixels.shape == (3, 224, 224) and np.allclose(pixels[:, -1, -1], 128 / 255 * 2 - 1, atol=0.02), name


def test_complete_jpegs_decode_as_pillow_decodes_them(prep, photo):
    for options in ({}, {"progressive": True}, {"subsampling": 0}):
        data = jpeg(photo, **options)
        assert np.array_equal(np.asarray(prep.decode(data)), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
