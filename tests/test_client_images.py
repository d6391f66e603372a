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


def test_a_binary_file_object_is_one_image_read_whole(tmp_path) -> None:
    # was: iterated as a batch, one "image" per line: a 12 KB JPEG went out as 62 junk images in 4 requests
    import io

    png = (SAMPLES / "3_0.png").read_bytes()
    assert png.count(b"\n") >= 1
    with open(SAMPLES / "3_0.png", "rb") as file:
        assert as_batch(file) == [file] and encode(file) == png
    assert [encode(image) for image in as_batch([io.BytesIO(png), io.BytesIO(b"x")])] == [png, b"x"]
    (tmp_path / "a.png").write_bytes(png)
    with open(tmp_path / "a.png") as text, pytest.raises(ValueError, match=r"is open in text mode; open the image in "
                                                                            r"binary mode: open\(path, 'rb'\)"):
        encode(text)


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


def test_a_url_is_refused_as_one_not_as_a_missing_file() -> None:
    # was: "image file 'http:/example.com/x.png' does not exist" (Path folded the '//')
    with pytest.raises(ValueError, match=r"'http://example.com/x.png' is a URL: the client sends image files, bytes "
                                         r"or PIL images, it fetches nothing; download it first"):
        encode("http://example.com/x.png")


@pytest.mark.parametrize(("image", "off_loop"), [(Image.new("RGB", (64, 64)), True), (b"\x89PNG not sent", False)])
def test_an_async_classifier_encodes_images_off_its_event_loop(image, off_loop: bool, monkeypatch) -> None:
    # was: PIL images encoded (and files read) on the event loop: two 1500x1500 images held it for 0.6 s
    import asyncio
    import threading

    import hub_vit.server.client.classifier as classifier
    from hub_vit.server.client import AsyncClassifier
    from hub_vit.server.runtime.launcher import free_port

    threads: list[threading.Thread] = []
    real = classifier.encode
    monkeypatch.setattr(classifier, "encode", lambda one: threads.append(threading.current_thread()) or real(one))
    client = AsyncClassifier(f"127.0.0.1:{free_port()}", protocol="http", timeout_s=5)

    async def run() -> None:
        async with client:
            await client.classify(image)  # nothing listens: refused once the image is encoded

    with pytest.raises(Exception):  # noqa: B017 (connection refused, as aiohttp says it)
        asyncio.run(run())
    assert len(threads) == 1 and (threads[0] is not threading.main_thread()) == off_loop, threads


def test_what_the_clients_take_and_return_is_importable_from_the_package() -> None:
    # was: `config()` and `prepare()` returned classes only their modules exported
    import hub_vit.server.client as client

    assert {"ServedConfig", "PreparedRequest", "ImageLike", "Prediction"} <= set(client.__all__)
    for name in client.__all__:
        assert getattr(client, name) is not None

