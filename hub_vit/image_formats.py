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
