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
