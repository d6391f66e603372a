"""Images as a client sends them: encoded bytes (paths and binary file objects read as they are, PIL images encoded
losslessly as PNG); decoding, resizing and normalising happen on the server, exactly once, with the model's own
transform."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from hub_vit.image_formats import NAMES, empty_file

if TYPE_CHECKING:  # PIL is imported only where an image is encoded
    from PIL import Image

    ImageLike = str | Path | bytes | bytearray | memoryview | BinaryIO | Image.Image
else:
    ImageLike = Any
# Modes a PNG holds as they are; Pillow refuses to write the others (CMYK, YCbCr, LAB, HSV, RGBX, RGBa, La, PA, F,
# and the 16-bit "I;16L" / "I;16N", which `_png_ready` rewrites as "I;16") as PNG, and writing "I" is deprecated.
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I;16B")
# 16-bit greyscale in a byte order Pillow's PNG writer does not take; the samples are kept, only their layout changes.
_OTHER_16BIT_MODES = ("I;16L", "I;16N")


def encode(image: ImageLike) -> bytes:
    """Path / bytes / binary file object / PIL image -> encoded bytes as sent to the server; ValueError for what
    cannot be sent (`check_image`), and for a file or file object that held no bytes when read."""
    check_image(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, (str, Path)):
        data = Path(image).read_bytes()
        if not data:  # emptied since it was checked (a download still being written): still nothing to send
            raise ValueError(empty_file(str(image)))
        return data
    if _file_object(image):  # open(path, "rb"), io.BytesIO, a download's response: read from where it stands
        data = image.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):  # a text stream that is no io.TextIOBase
            raise ValueError(_text_mode(image))
        if not memoryview(data).nbytes:
            raise ValueError(f"{_file_name(image)} gave 0 bytes: it is empty, or was read to its end already (a file "
                             f"object is read from where it stands: seek(0) first); send an encoded image ({NAMES})")
        return bytes(data)
    buffer = io.BytesIO()  # a PIL image: `check_image` let nothing else through
    _png_ready(image).save(buffer, format="PNG")
    return buffer.getvalue()


def check_image(image: ImageLike) -> None:
    """ValueError naming why `image` cannot be sent, found without reading it (a path's size, not its bytes), so that
    `classify` refuses it before any connection: the server would only refuse it, and where none listens the caller
    was told about the connection instead. Empty bytes or an empty file are never an image, whatever the server;
    which formats it decodes is the server's to say (a repository hub-vit did not write may decode others)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        if not memoryview(image).nbytes:
            raise ValueError(f"empty image bytes (b'', 0 bytes); send an encoded image ({NAMES})")
        return
    if isinstance(image, str) and "://" in image:  # Path() would fold its '//' and call it a missing file
        raise ValueError(f"{image!r} is a URL: the client sends image files, bytes or PIL images, it fetches nothing; "
                         "download it first (e.g. urllib.request.urlopen(url).read()) and pass the bytes")
    if isinstance(image, (str, Path)):
        path = Path(image)
        if path.is_dir():
            raise ValueError(f"{str(path)!r} is a directory; give image files ({NAMES})")
        if not path.exists():
            raise ValueError(f"image file {str(path)!r} does not exist")
        if not path.is_file():
            raise ValueError(f"{str(path)!r} is not a regular file; give image files ({NAMES})")
        if path.stat().st_size == 0:
            raise ValueError(empty_file(str(path)))
        return
    if _file_object(image):
        if isinstance(image, io.TextIOBase):  # reading it would give text, which no decoder takes
            raise ValueError(_text_mode(image))
        return  # its bytes are known only once read, when it is sent (`encode`)
    if _pil_image(image):
        if image.mode == "F":
            raise ValueError("cannot send a mode 'F' (32-bit float) PIL image: its value range is unknown; convert it "
                             "to 'L' or 'RGB' first")
        return
    if isinstance(image, np.ndarray):  # its channel order and value range are the caller's to state
        raise ValueError(f"cannot send a numpy array (shape {image.shape}, {image.dtype}): its channel order and value "
                         "range are unknown; pass PIL.Image.fromarray(array) of an RGB uint8 array (an OpenCV image "
                         "is BGR: cv2.cvtColor(array, cv2.COLOR_BGR2RGB) first), or the image's file or bytes")
    raise ValueError(f"cannot send {type(image).__name__}; valid image types: path, bytes, a binary file object, "
                     "PIL.Image")


def check_images(images: list[ImageLike]) -> None:
    """`check_image` for each of `images` (as `as_batch` gives them); an image that is not a path is named by its index
    in the list when the list holds more than one (a path names itself)."""
    for index, image in enumerate(images):
        try:
            check_image(image)
        except ValueError as err:
            if len(images) == 1 or isinstance(image, (str, Path)):
                raise
            raise ValueError(f"image {index}: {err}") from None


def _text_mode(image: Any) -> str:
    return (f"{type(image).__name__} {getattr(image, 'name', '')!r} is open in text mode; open the image in binary "
            "mode: open(path, 'rb')")


def _file_name(image: Any) -> str:
    """A file object as a message names it: its type, and its name where it has one (open(path, "rb"))."""
    name = getattr(image, "name", None)
    return type(image).__name__ + (f" {name!r}" if isinstance(name, (str, bytes)) else "")


def encoded_off_loop(images: list[ImageLike]) -> bool:
    """Whether encoding `images` is worth a thread rather than the event loop: anything but bytes is read from disk
    or encoded as PNG (two 1500x1500 PIL images held an AsyncClassifier's loop for 0.6 s)."""
    return any(not isinstance(image, (bytes, bytearray, memoryview)) for image in images)


def _file_object(image: Any) -> bool:
    """A file object (open(path, "rb"), io.BytesIO): one image, though it iterates (line by line)."""
    return callable(getattr(image, "read", None)) and not _pil_image(image)


def _pil_image(image: Any) -> bool:
    """A PIL image, known by what encoding it uses (PIL itself is imported only where an image is encoded)."""
    return hasattr(image, "save") and hasattr(image, "mode")


def _png_ready(image: Any) -> Any:
    """A PIL image in a mode PNG can hold, converted the way the server's decoder would treat it (mode 'F' was
    refused by `check_image`)."""
    if image.mode in PNG_MODES:
        return image
    if image.mode in _OTHER_16BIT_MODES:  # same samples, rewritten little-endian as "I;16", which PNG can hold
        from PIL import Image

        return Image.frombytes("I;16", image.size, np.asarray(image).astype("<u2").tobytes())
    if image.mode == "I":
        from hub_vit.image_modes import to_8bit

        return to_8bit(image)  # 16-bit samples in 32-bit ints -> their high bytes, as the server does for 16-bit PNGs
    from hub_vit.image_modes import ALPHA_MODES, flatten_alpha

    if image.mode in ALPHA_MODES:  # RGBa, La, PA: composited onto white here, as the server does with RGBA / LA
        return flatten_alpha(image)
    return image.convert("RGB")  # CMYK, YCbCr, ...


def as_batch(images: Iterable[ImageLike] | ImageLike) -> list[ImageLike]:
    """One image, or any iterable of them (a list, a tuple, `Path("photos").glob("*.jpg")`), -> a non-empty list.
    A path, bytes, a file object, a PIL image or a numpy array is one image, though some of them iterate (a file
    object line by line: its lines were sent as images)."""
    one = (isinstance(images, (str, Path, bytes, bytearray, memoryview, np.ndarray)) or _pil_image(images)
           or _file_object(images))
    batch = [images] if one or not isinstance(images, Iterable) else list(images)
    if not batch:
        raise ValueError("no images given; pass at least one path, bytes object or PIL image")
    return batch


