"""hub_vit.model_cards: model cards (README.md) for hub-vit model folders, rendered from the folder's own JSON.

`write_model_card(folder)` is what `hub-vit convert`, `hub-vit train` and `hub-vit card` call; see docs/model_cards.md.
"""

from __future__ import annotations

from .facts import FolderFacts, ModelFolderError, read_folder
from .macs import count_macs, gmacs
from .render import build_card_data, render_model_card, write_card_or_remove, write_model_card

__all__ = [
    "FolderFacts",
    "ModelFolderError",
    "build_card_data",
    "count_macs",
    "gmacs",
    "read_folder",
    "render_model_card",
    "write_card_or_remove",
    "write_model_card",
]
