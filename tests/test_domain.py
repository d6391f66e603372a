"""`hub_vit.domain`: what a model knows and its measured confidence rule (domain.json), as the demo and the card
read it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hub_vit.domain import DOMAIN_FILE, Domain, calibrate_threshold, guess_domain, read_domain

DIGITS = Path(__file__).resolve().parents[1] / "hub_vit" / "assets" / "digits"


def test_the_shipped_model_knows_digits_with_a_measured_threshold():
    domain = read_domain(DIGITS, [str(i) for i in range(10)])
    assert domain.examples == "digits" and "handwritten digits 0-9" in domain.knows
    assert 0 < domain.threshold < 1
    # the example: the digits model called a photo of a cat "8" at 43 %; that is marked, a sure digit is not
    assert domain.unsure(0.43) and not domain.unsure(0.99)
    assert domain.measured["out_of_domain_flagged"] > 0.5 and domain.measured["test_top1_kept"] >= 0.98


def test_a_threshold_measured_on_other_weights_is_not_applied(tmp_path):
    folder = Path(shutil.copytree(DIGITS, tmp_path / "digits"))
    record = json.loads((folder / DOMAIN_FILE).read_text())
    record["weights_digest"] = "tensors-sha256:" + "0" * 64  # as after fine-tuning: the digest differs
    (folder / DOMAIN_FILE).write_text(json.dumps(record))
    domain = read_domain(folder, [str(i) for i in range(10)])
    assert domain.threshold is None and domain.examples == "digits"


def test_bad_records_are_named(tmp_path):
    (tmp_path / DOMAIN_FILE).write_text(json.dumps({"knows": "x", "examples": "sketches"}))
    with pytest.raises(ValueError, match=r"unknown examples 'sketches'; valid: digits, photos"):
        read_domain(tmp_path, ["a"])
    (tmp_path / DOMAIN_FILE).write_text("[]")
    with pytest.raises(ValueError, match="is not a domain record"):
        read_domain(tmp_path, ["a"])


def test_guessed_domains():
    assert guess_domain([f"c{i}" for i in range(1000)]).examples == "photos"
    assert "ImageNet-1k" in guess_domain([f"c{i}" for i in range(1000)]).knows
    guessed = guess_domain(["apple", "bicycle", "cat"])
    assert guessed.knows == "its 3 classes (apple, bicycle, cat)" and guessed.threshold is None
    assert not Domain("x", "photos").unsure(0.01)


def test_calibrate_threshold_keeps_the_asked_share():
    values = np.linspace(0.0, 1.0, 101)
    assert calibrate_threshold(values, keep=0.95) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="keep in"):
        calibrate_threshold(values, keep=0)


def test_the_card_shows_the_rule_only_for_the_weights_it_was_measured_on(tmp_path):
    from hub_vit.model_cards.sections import domain_section

    labels = [str(i) for i in range(10)]
    section = domain_section(DIGITS, labels)
    assert section is not None and "handwritten digits 0-9" in section["note"]
    assert ("confidence threshold (top-1 probability)", f"{read_domain(DIGITS, labels).threshold:.4f}") in \
        section["rows"]
    assert "## What this model knows" in (DIGITS / "README.md").read_text()
    assert domain_section(tmp_path, labels) is None  # no domain.json
