"""What the Python clients take as images: one image, or any iterable of them; a numpy array is refused with the way
to send it (its channel order is the caller's to state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.server.client.images import as_batch, encode

SAMPLES = Path(__file__).resolve().parents[1] / "hub_vit" / "assets" / "digits" / "samples"


def test_any_iterable_of_images_is_a_batch_in_its_order() -> None:
    # was: `classify(Path("photos").glob("*.jpg"))` was refused: "cannot send generator"
    files = sorted(SAMPLES.glob("3_*.png"))
    assert len(files) >= 2
    assert as_batch(path for path in files) == files
    assert as_batch(tuple(files)) == files and as_batch(files) == files


@pytest.mark.parametrize("image", [str(SAMPLES / "3_0.png"), SAMPLES / "3_0.png", b"\x89PNG...", bytearray(b"x"),
                                   Image.new("RGB", (4, 4))], ids=["str", "path", "bytes", "bytearray", "pil"])
def test_one_image_is_a_batch_of_one_though_it_iterates(image) -> None:
    assert as_batch(image) == [image]


def test_no_images_is_refused() -> None:
    with pytest.raises(ValueError, match="no images given"):
        as_batch(iter([]))


def test_a_numpy_array_is_refused_with_the_way_to_send_it() -> None:
    # was: "cannot send ndarray": the caller was not told how (nor that OpenCV's arrays are BGR)
    array = np.zeros((32, 48, 3), np.uint8)
    assert as_batch(array) == [array]  # one image, not 32 rows
    with pytest.raises(ValueError, match=r"cannot send a numpy array \(shape \(32, 48, 3\), uint8\).*"
                                         r"PIL\.Image\.fromarray\(array\).*cv2\.COLOR_BGR2RGB"):
        encode(array)
