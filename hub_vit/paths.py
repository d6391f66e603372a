"""Short names for paths shown side by side (the demo's model picker, `hub-vit classify`'s table)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def distinct_names(paths: Sequence[Path]) -> list[str]:
    """The shortest trailing part of each path that tells it apart from the others: `model` alone; `d2/model` and
    `ft/model` for two training runs' folders (the same rule for every clashing path, not the full path for the
    second one). The same path given twice gets the same name."""
    unique = list(dict.fromkeys(paths))
    depth = dict.fromkeys(unique, 1)
    while True:
        names = {path: str(Path(*path.parts[-depth[path]:])) for path in unique}  # "/model", not "//model"
        clashing = [path for path in unique if depth[path] < len(path.parts)
                    and sum(names[other] == names[path] for other in unique) > 1]
        if not clashing:
            return [names[path] for path in paths]
        for path in clashing:
            depth[path] += 1
