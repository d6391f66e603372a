"""The image formats hub-vit takes from users, stated once: what the server decodes (and so what `hub-vit classify`
sends), what `hub-vit rollout` and the demo read, what the docs list.

Only these decoders ever run on untrusted bytes: Pillow's rarer decoders (BMP, GIF, TIFF, ...) are where its CVEs
have been. The served preprocessing (`server/repository/templates/preprocess/imageprep.py`) runs without hub_vit:
`hub-vit repository` copies this file beside it, so it must import nothing.
"""

from __future__ import annotations

FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP")  # Pillow's names, for `Image.open(..., formats=FORMATS)`
NAMES = "JPEG, PNG or WebP"  # the same, as people write them, for messages and help
SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp")  # file names of these formats (bundled examples)
# The user's own files on disk (a training set, the images an out-of-domain score is fitted on) may also be BMP or GIF,
# as timm's and torchvision's folder datasets take them; such files are trusted as the user's, unlike an upload. A
# model trained or calibrated on them still serves JPEG, PNG and WebP.
OWN_FILE_FORMATS: tuple[str, ...] = (*FORMATS, "BMP", "GIF")
OWN_FILE_SUFFIXES: tuple[str, ...] = (*SUFFIXES, ".bmp", ".gif")
OWN_FILE_NAMES = "JPEG, PNG, WebP, BMP or GIF"
# The names of images in formats hub-vit does not read that people keep beside their photos (a phone's HEIC, a
# scanner's TIFF): a folder's such files are named as left out, not passed over in silence.
OTHER_SUFFIXES: dict[str, str] = {".gif": "GIF", ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF", ".heic": "HEIC",
                                  ".heif": "HEIF", ".avif": "AVIF", ".jxl": "JPEG XL"}


def empty_file(label: str, names: str = NAMES) -> str:
    """The refusal of a file with no bytes at all (an upload cut off, a file created and never written), in the words
    `hub-vit rollout` and the serving clients both use; `names`: the formats the caller reads."""
    return f"{label!r} is empty (0 bytes); supported formats: {names}"


def signature_format(data: bytes) -> str | None:
    """The format whose signature `data` starts with, as people write it (JPEG, PNG, WebP), or None: bytes that claim
    to be one of these though Pillow cannot read their header are a damaged image, not some other kind of file."""
    if data.startswith(b"\xff\xd8\xff"):  # SOI, then the first marker
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    return None


# Other images people try, by signature: named in the refusal, so the user knows to convert rather than to repair
_OTHER_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"GIF87a", "GIF"), (0, b"GIF89a", "GIF"), (0, b"II*\x00", "TIFF"), (0, b"MM\x00*", "TIFF"),
    (4, b"ftypheic", "HEIC"), (4, b"ftypheix", "HEIC"), (4, b"ftypmif1", "HEIF"), (4, b"ftypavif", "AVIF"),
    (0, b"\x00\x00\x00\x0cjXL ", "JPEG XL"), (0, b"\xff\x0a", "JPEG XL"), (0, b"%PDF", "PDF"))


def other_format(data: bytes) -> str | None:
    """The image format other than JPEG, PNG and WebP that `data` starts with (GIF, BMP, TIFF, HEIC, AVIF, ...), by
    its signature alone (no decoder runs), or None."""
    if _bmp(data):
        return "BMP"
    return next((name for offset, magic, name in _OTHER_SIGNATURES if data[offset:offset + len(magic)] == magic), None)


SIGNATURE_BYTES = 32  # read from the start of a file: enough for every signature `other_format` checks

# The sizes a BMP's DIB header (the 4 bytes after its 14-byte file header) may have: OS/2 1.x and 2.x, Windows
# BITMAPINFOHEADER and its V2-V5 successors. "BM" alone starts many a text file ("BMW ...").
_DIB_HEADER_SIZES = (12, 16, 40, 52, 56, 64, 108, 124)


def _bmp(data: bytes) -> bool:
    return data[:2] == b"BM" and len(data) >= 18 and int.from_bytes(data[14:18], "little") in _DIB_HEADER_SIZES
