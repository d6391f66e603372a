"""Verification on the model's own domain: a model folder names its held-out images (training.json
`dataset.held_out_images`, read by `hub_vit.folder.held_out_images`), and the export and the CPU flavour judge a
reduced-precision variant's top-1 on them instead of on photos (`hub_vit.export.own_images.verification_set`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.catalog import default_model_folder
from hub_vit.export.own_images import verification_set
from hub_vit.folder import DIGITS_HELD_OUT, held_out_images
from hub_vit.resolve import ResolvedModel
from hub_vit.resolve import resolve_model as resolve

COUNTS = dict(n_random=4, n_photos=4, n_calibration=8, seed=0)


def _folder_naming(tmp_path: Path, named: object) -> Path:
    """A copy of the shipped model folder whose training.json names `named` as its held-out images."""
    folder = tmp_path / "model"
    shutil.copytree(default_model_folder(), folder)
    record = json.loads((folder / "training.json").read_text())
    record["dataset"]["held_out_images"] = named
    (folder / "training.json").write_text(json.dumps(record))
    return folder


def test_the_shipped_model_names_its_held_out_digits() -> None:
    record = held_out_images(default_model_folder())
    assert record is not None and record.generated == DIGITS_HELD_OUT
    check = verification_set(resolve(None), **COUNTS)
    assert check.own is not None and check.own.scope == "held-out images" and check.top1_scope == "held-out images"
    assert check.own.images.shape == (360, 3, 32, 32) and check.trained
    assert "scikit-learn's digits" in check.own.source and check.describe()["n_own_images"] == 360
    from hub_vit.digits_data import load_digits_split

    first, _ = load_digits_split("val")
    np.testing.assert_allclose(check.own.images[0], first[0].transpose(2, 0, 1) / 127.5 - 1, atol=1e-6)


def test_a_folder_of_held_out_images_is_read_with_the_models_transform(tmp_path: Path) -> None:
    images = tmp_path / "val"
    for label in ("0", "1"):
        (images / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (64, 64), (40 * i, 100, int(label) * 200)).save(images / label / f"{i}.png")
    folder = _folder_naming(tmp_path, str(images))
    assert held_out_images(folder).folder == images
    check = verification_set(resolve(folder), limit=4, **COUNTS)
    assert check.own.images.shape == (4, 3, 32, 32)  # resized to the model's 32 px; evenly spaced: both classes
    assert {round(float(x[2].mean()), 2) for x in check.own.images} == {-1.0, round(200 / 127.5 - 1, 2)}
    relative = _folder_naming(tmp_path / "rel", "../../val")  # relative to the model folder
    assert held_out_images(relative).folder.resolve() == images.resolve()


def test_unreadable_held_out_images_fall_back_to_photos_with_a_note(tmp_path: Path) -> None:
    folder = _folder_naming(tmp_path, str(tmp_path / "moved"))
    check = verification_set(resolve(folder), **COUNTS)
    assert check.own is None and check.top1_scope == "photos"
    assert "held-out images in" in check.note and "does not exist" in check.note and "photos" in check.note
    with pytest.raises(ValueError, match="dataset.held_out_images must name a folder of images or 'digits:val'"):
        held_out_images(_folder_naming(tmp_path / "bad", 3))


def test_own_images_win_and_an_in_memory_model_has_none(tmp_path: Path) -> None:
    images = tmp_path / "mine"
    images.mkdir()
    Image.new("RGB", (32, 32), (9, 9, 9)).save(images / "a.png")
    check = verification_set(resolve(None), images=images, **COUNTS)
    assert check.own.scope == "own images" and check.own.source == f"--images {images}" and len(check.own.images) == 1
    trained = resolve(None)
    module = ResolvedModel.from_module(trained.module, name="digits", labels=list(trained.labels))
    check = verification_set(module, **COUNTS)
    assert check.own is None and not check.trained and check.top1_scope == "reported only"
