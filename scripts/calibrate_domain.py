"""Measure the shipped digits model's confidence threshold and write `hub_vit/assets/digits/domain.json`.

    .venv/bin/python scripts/calibrate_domain.py [FOLDER]

In-domain: the held-out digits split (never trained on), split in two by position: the first half sets the threshold
(`hub_vit.domain.calibrate_threshold`, 95 % kept), the second half measures it. Out-of-domain: random square crops
(a quarter to all of the shorter side) of scikit-image's bundled photographs, none of them a digit. Every image goes
through the model's own eval transform, as in the demo. Re-run after re-training: the record names the weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

SEED = 0
CROPS_PER_PHOTO = 24
PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "coins", "horse", "moon", "page", "rocket", "text", "brick",
          "grass", "gravel", "clock", "immunohistochemistry", "hubble_deep_field", "colorwheel", "logo")


def out_of_domain(rng: np.random.Generator) -> list[Image.Image]:
    from skimage import data

    crops = []
    for name in PHOTOS:
        try:
            array = getattr(data, name)()
        except Exception:  # a photo scikit-image would have to download: skipped, offline
            continue
        image = Image.fromarray(array if array.dtype == np.uint8 else (array * 255).astype(np.uint8))
        width, height = image.size
        for _ in range(CROPS_PER_PHOTO):
            side = int(rng.integers(min(width, height) // 4, min(width, height) + 1))
            left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
            crops.append(image.crop((left, top, left + side, top + side)).convert("RGB"))
    return crops


def top1(explainer, images: list[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
    probs, classes = [], []
    with torch.no_grad():
        for start in range(0, len(images), 64):
            batch = torch.stack([explainer.prepare(im).tensor for im in images[start:start + 64]])
            p = explainer.model(batch).softmax(dim=-1)
            probs.append(p.max(dim=-1).values.numpy())
            classes.append(p.argmax(dim=-1).numpy())
    return np.concatenate(probs), np.concatenate(classes)


def main(folder: Path) -> None:
    from hub_vit.demo.models import folder_choice, load_explainer
    from hub_vit.domain import Domain, calibrate_threshold, write_domain
    from hub_vit.train.digits import load_digits_split

    explainer = load_explainer(folder_choice(folder))
    digits, targets = load_digits_split("val")
    half = len(digits) // 2
    scores, predicted = top1(explainer, [Image.fromarray(d) for d in digits])
    threshold = calibrate_threshold(scores[:half], keep=0.95)
    test_scores, test_right = scores[half:], predicted[half:] == targets[half:]
    kept = test_scores >= threshold
    ood_scores, _ = top1(explainer, out_of_domain(np.random.default_rng(SEED)))
    measured = {
        "rule": "5th percentile of the top-1 probability on the first half of the held-out digits split",
        "calibration_images": int(half),
        "test_images": int(len(test_scores)),
        "test_kept": round(float(kept.mean()), 4),
        "test_top1_all": round(float(test_right.mean()), 4),
        "test_top1_kept": round(float(test_right[kept].mean()), 4),
        "out_of_domain_images": int(len(ood_scores)),
        "out_of_domain_source": "random square crops of scikit-image's bundled photographs (seed 0)",
        "out_of_domain_flagged": round(float((ood_scores < threshold).mean()), 4),
        "out_of_domain_median_top1": round(float(np.median(ood_scores)), 4),
    }
    domain = Domain(knows="the handwritten digits 0-9 (8x8 scans from scikit-learn's digits data set)",
                    examples="digits", threshold=round(threshold, 4), measured=measured)
    print(write_domain(folder, domain))
    for key, value in measured.items():
        print(f"{key}: {value}")
    print(f"threshold: {domain.threshold}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "hub_vit/assets/digits")
