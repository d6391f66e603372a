"""The shipped default model (`hub_vit/assets/digits`) is a real classifier: >= 97 % top-1 on the held-out digits,
through timm (registered name and local-dir) and through transformers, with its own preprocessing each time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import hub_vit  # noqa: F401  (timm + transformers registration)
from hub_vit.catalog import DEFAULT_MODEL, MODELS, default_model_folder
from hub_vit.train.digits import load_digits_split

TARGET = 0.97  # issue #5: held-out accuracy of the shipped model
FOLDER = default_model_folder()


@pytest.fixture(scope="module")
def held_out() -> tuple[list[Image.Image], np.ndarray]:
    images, labels = load_digits_split("val")
    return [Image.fromarray(img) for img in images], labels


@pytest.fixture(scope="module")
def recorded_top1() -> float:
    return json.loads((FOLDER / "training.json").read_text())["held_out"]["top1"]


def timm_accuracy(model: torch.nn.Module, images: list[Image.Image], labels: np.ndarray) -> float:
    cfg = timm.data.resolve_data_config(model=model)
    transform = timm.data.create_transform(**cfg)
    batch = torch.stack([transform(img) for img in images])  # (N, 3, 32, 32) in [-1, 1]
    with torch.no_grad():
        pred = model.eval()(batch).argmax(-1).numpy()
    return float((pred == labels).mean())


def test_folder_contents() -> None:
    assert DEFAULT_MODEL == "simplevit_digits" and MODELS[DEFAULT_MODEL].family == "simplevit"
    for name in ("model.safetensors", "config.json", "preprocessor_config.json", "labels.txt", "training.json",
                 "README.md"):
        assert (FOLDER / name).is_file(), name
    assert (FOLDER / "labels.txt").read_text().split() == [str(d) for d in range(10)]
    assert (FOLDER / "model.safetensors").stat().st_size < 4 * 2**20  # "a few MB at most"
    training = json.loads((FOLDER / "training.json").read_text())
    assert training["held_out"]["images"] == 360 and training["dataset"]["num_train"] == 1437
    samples = sorted((FOLDER / "samples").glob("*.png"))
    assert len(samples) == 20 and {p.stem.split("_")[0] for p in samples} == {str(d) for d in range(10)}
    assert all(Image.open(p).size == (128, 128) for p in samples)


def test_held_out_split_is_fixed_and_disjoint() -> None:
    from hub_vit.train.digits import original_indices

    train, val = original_indices("train"), original_indices("val")
    assert len(train) == 1437 and len(val) == 360 and not set(train) & set(val)
    images, labels = load_digits_split("val")
    assert images.shape == (360, 32, 32, 3) and images.dtype == np.uint8
    assert np.bincount(labels).min() >= 35  # stratified: every digit ~36 times
    with pytest.raises(ValueError, match=r"unknown digits split 'test'; valid splits: 'train', 'val'"):
        load_digits_split("test")


def test_timm_registered_name(held_out, recorded_top1) -> None:
    model = timm.create_model(DEFAULT_MODEL, pretrained=True)
    accuracy = timm_accuracy(model, *held_out)
    assert accuracy >= TARGET
    assert accuracy == pytest.approx(recorded_top1, abs=1e-9)  # the card's number is what a user measures


def test_timm_local_dir(held_out) -> None:
    model = timm.create_model(f"local-dir:{FOLDER}", pretrained=True)
    assert timm_accuracy(model, *held_out) >= TARGET


def test_transformers(held_out, recorded_top1) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(FOLDER).eval()
    processor = AutoImageProcessor.from_pretrained(FOLDER)
    images, labels = held_out
    with torch.no_grad():
        logits = model(**processor(images, return_tensors="pt")).logits
    pred = [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    accuracy = float(np.mean([p == str(y) for p, y in zip(pred, labels, strict=True)]))
    assert accuracy >= TARGET
    assert accuracy == pytest.approx(recorded_top1, abs=1 / 360 + 1e-9)  # another resize implementation


def test_samples_are_classified_as_named() -> None:
    model = timm.create_model(DEFAULT_MODEL, pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    samples = sorted((FOLDER / "samples").glob("*.png"))
    batch = torch.stack([transform(Image.open(p).convert("RGB")) for p in samples])
    with torch.no_grad():
        pred = model(batch).argmax(-1).tolist()
    assert [str(p) for p in pred] == [p.stem.split("_")[0] for p in samples]
