"""Calibrate the shipped digits model's out-of-domain score without retraining it, and re-render its card.

    .venv/bin/python scripts/calibrate_domain.py [FOLDER]

`hub-vit calibrate-domain` on the model's own data: fitted on the digits training split, the threshold set and
checked on the two halves of the held-out split (`hub_vit.train.digits`), and measured against the bundled photos
(scikit-image's, `hub_vit.export.verify.load_photos`, and the demo's examples), none of them a digit. `hub-vit train
--preset digits` does the same at the end of a run. Re-run after re-training: the record names the weights.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from PIL import Image

DIGITS = Path(__file__).resolve().parents[1] / "hub_vit" / "assets" / "digits"
PHOTOS = "scikit-image's bundled photos (hub_vit.export.verify.load_photos) and the demo's examples"


def write_photos(folder: Path) -> Path:
    """The bundled photos as PNG / JPEG files in `folder`."""
    from hub_vit.demo.app import examples_of
    from hub_vit.export.verify import load_photos

    folder.mkdir(parents=True)
    for name, pixels in load_photos().items():
        Image.fromarray(pixels).save(folder / f"{name}.png")
    for path in examples_of("photos"):
        shutil.copyfile(path, folder / f"demo-{path.name}")
    return folder


def main(folder: Path) -> None:
    from hub_vit.domain_fit import calibrate_domain
    from hub_vit.model_cards import write_model_card
    from hub_vit.train import digits

    with tempfile.TemporaryDirectory() as tmp:
        data = digits.write_image_folder(Path(tmp) / "digits")
        photos = write_photos(Path(tmp) / "photos")
        domain = calibrate_domain(folder, data / "train", held_out=data / "val", out_of_domain=photos,
                                  knows=digits.DOMAIN_KNOWS, examples="digits",
                                  sources=digits.domain_sources() | {"out_of_domain": PHOTOS})
    write_model_card(folder)
    print(f"threshold: {domain.statistics.threshold:.4g}")
    for key, value in domain.measured.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DIGITS)
