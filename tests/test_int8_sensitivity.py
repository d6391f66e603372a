"""The search for the layers static int8 keeps in float (hub_vit/export/sensitivity.py) is judged by the verification
criterion: its margin is the worst image's distance to a bound as a fraction of the bound's slack (numbers below
worked out by hand from the criterion's bounds, cosine >= 0.99, relative error <= 0.15, top-1 >= 99 %). The search
itself runs on OpenVINO: tests/test_openvino_variants.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hub_vit.export.sensitivity import margin, per_image_margins


def _outputs(*rows: list[float]) -> dict[str, np.ndarray]:
    x = np.array(rows, dtype=np.float64)
    return {"logits": x, "pre_logits": x}


def test_margin_is_the_worst_images_share_of_the_slack_left() -> None:
    reference = _outputs([1.0, 0.0], [0.0, 1.0])
    assert margin(reference, reference, None) == pytest.approx(1.0)  # equal to fp32: all of the slack
    # image 0 off by 0.1 across: cosine 1/sqrt(1.01) = 0.99504 (50.4 % of the 0.01 slack left), relative error 0.1
    # (33.3 % of the 0.15 slack left): the nearer bound counts
    got = _outputs([1.0, 0.1], [0.0, 1.0])
    assert per_image_margins(reference, got) == pytest.approx([1 / 3, 1.0])
    assert margin(reference, got, None) == pytest.approx(1 / 3)
    # 1.3 times as long (cosine 1), relative error 0.3: outside the bound by as much as the whole slack
    assert margin(reference, _outputs([1.3, 0.0], [0.0, 1.0]), None) == pytest.approx(-1.0)
    assert (1 / math.sqrt(1.01) - 0.99) / 0.01 > 1 / 3


def test_margin_counts_top1_over_the_images_that_count() -> None:
    reference = _outputs(*[[1.0, 0.0]] * 99, [1.0, 0.9])
    flipped = _outputs(*[[1.0, 0.0]] * 99, [0.9, 1.0])  # the last image's class flips
    counts = np.ones(100, bool)
    # 99 % agreement is on the bound; the flipped image's own cosine (0.9945) is 45 % inside its bound
    assert margin(reference, flipped, counts) == pytest.approx(0.0)
    assert margin(reference, flipped, None) == pytest.approx(per_image_margins(reference, flipped).min())
    counts[:50] = False  # 98 % over the 50 that count: outside by the whole slack
    assert margin(reference, flipped, counts) == pytest.approx(-1.0)


def test_margin_judges_the_bounds_on_the_own_images_when_told() -> None:
    """The search judges a model with its own images as the verification does: the bounds on those alone."""
    reference = _outputs([1.0, 0.0], [0.0, 1.0], [1.0, 1.0])
    got = _outputs([1.3, 0.0], [0.0, 1.0], [1.0, 1.1])  # image 0 (noise, say) outside by the whole slack
    assert margin(reference, got, None) == pytest.approx(-1.0)
    own = np.array([False, True, True])
    # image 2: relative error 0.1 / sqrt(2) = 0.0707 (52.9 % of the slack left), cosine 0.99887 (88.7 %)
    assert margin(reference, got, None, own) == pytest.approx(1 - (0.1 / math.sqrt(2)) / 0.15)
    assert margin(reference, got, None, np.array([True, True, True])) == pytest.approx(-1.0)
