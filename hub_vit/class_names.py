"""Class names for a head that came without any: ImageNet's (timm's bundled lists) where the class count says so,
else `class_i`. One rule for converted folders, served registered names, the demo and exports."""

from __future__ import annotations

IMAGENET_SUBSETS = {1000: "imagenet-1k", 21843: "imagenet-21k-goog"}  # class count -> timm's ImageNetInfo subset


def default_labels(num_classes: int, *, unique: bool = False) -> list[str]:
    """`num_classes` names ([] for a head-less model): timm's ImageNet descriptions, which repeat (ImageNet-1k has two
    "crane"s; the demo tells them apart by class index), or with `unique` (what a converted folder's labels.txt
    records) each repeated one followed by its WordNet id."""
    subset = IMAGENET_SUBSETS.get(num_classes)
    if subset is None:
        return [f"class_{i}" for i in range(num_classes)]
    from timm.data import ImageNetInfo

    info = ImageNetInfo(subset)
    names = [info.index_to_description(i) for i in range(num_classes)]
    if not unique:
        return names
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    return [f"{n} ({info.index_to_label_name(i)})" if seen[n] > 1 else n for i, n in enumerate(names)]


def numbered_labels(labels: list[str] | tuple[str, ...]) -> bool:
    """Whether `labels` only number the classes: `class_i` (`default_labels`, a head converted without names) or
    `LABEL_i` (transformers' default, a folder saved without labels)."""
    return bool(labels) and any(all(label == f"{stem}{i}" for i, label in enumerate(labels))
                                for stem in ("class_", "LABEL_"))


__all__ = ["IMAGENET_SUBSETS", "default_labels", "numbered_labels"]
