"""Mutation fuzzing of the two decoders that see untrusted bytes: the served preprocessing and the demo's reader.

Pillow normalises only a few exception types; others (ValueError, OSError, struct.error, EXIF parsing errors) escape
from `open`, `load` or `exif_transpose`. On the server, one escaped exception would fail every request batched with the
bad one, not only its own. So: real JPEG/PNG/WebP files (one with an EXIF orientation), mutated by seeded bit flips,
truncations, random runs and duplicated slices; every result must be a finite (3, H, W) array or our own error type.
Seeded, so a failure reproduces; ~3,000 cases per decoder, a few seconds.
"""

from __future__ import annotations

import io
import random
import warnings

import numpy as np
import pytest
from PIL import Image

CASES = 3000


def served_eval(**changes: object) -> dict[str, object]:
    """The served preprocessing's transform settings: Google's evaluation transform (the one data config's
    defaults) with `changes`, as `Preprocess.from_params` receives them from a generated config."""
    from hub_vit.data_config import GOOGLE_EVAL

    return {"interpolation": GOOGLE_EVAL.interpolation, "crop_mode": GOOGLE_EVAL.crop_mode, "mean": GOOGLE_EVAL.mean,
            "std": GOOGLE_EVAL.std, **changes}


@pytest.fixture(scope="module")
def seed_files(photos) -> list[bytes]:
    files = []
    for array in (photos["astronaut"][::4, ::4], photos["chelsea"][::4, ::4]):
        for fmt, options in (("JPEG", {"quality": 80}), ("PNG", {}), ("WEBP", {"quality": 80})):
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, format=fmt, **options)
            files.append(buffer.getvalue())
        exif = Image.Exif()
        exif[0x0112] = 6  # rotated: exif_transpose parses the EXIF block, which mutations corrupt
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", exif=exif)
        files.append(buffer.getvalue())
    return files


def _mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and out:  # flip a few bits anywhere
            for _ in range(rng.randint(1, 8)):
                out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif op == 1:  # truncate
            out = out[:rng.randrange(len(out) + 1)]
        elif op == 2 and out:  # overwrite a short run with random bytes
            at, n = rng.randrange(len(out)), rng.randint(1, 16)
            out[at:at + n] = bytes(rng.randrange(256) for _ in range(n))
        elif op == 3 and out:  # an extreme value in the headers (sizes, lengths, markers)
            out[rng.randrange(min(len(out), 200))] = rng.choice([0x00, 0xFF, 0x7F, 0x80])
        elif op == 4:  # duplicate a slice in place
            start = rng.randrange(len(out) + 1)
            end = rng.randrange(start, len(out) + 1)
            out[start:start] = out[start:end]
    return bytes(out)


def _fuzz(seed_files: list[bytes], decode, error: type[Exception]) -> dict[str, int]:
    rng = random.Random(0)
    outcomes = {"decoded": 0, "refused": 0}
    for case in range(CASES):
        data = _mutate(rng.choice(seed_files), rng)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "Corrupt EXIF data" and friends: expected here
                pixels = decode(data)
        except error:
            outcomes["refused"] += 1
            continue
        except Exception as exc:  # the point of the test: nothing else may escape
            pytest.fail(f"case {case}: {type(exc).__name__} escaped the decoder: {exc}")
        assert pixels.ndim == 3 and pixels.shape[0] == 3 and np.isfinite(pixels).all(), f"case {case}"
        outcomes["decoded"] += 1
    return outcomes


def test_served_preprocessing_raises_only_bad_image_errors(imageprep, seed_files):
    prep = imageprep.Preprocess(crop_size=(32, 32), scale_size=(36, 36), **served_eval())
    outcomes = _fuzz(seed_files, prep, imageprep.BadImageError)
    assert outcomes["refused"] > CASES // 4 and outcomes["decoded"] > CASES // 10, outcomes  # both paths exercised


def test_demo_reader_raises_only_image_read_errors(seed_files):
    from hub_vit.explain.image import DataConfig, ImageReadError, load_image, prepare_image

    config = DataConfig(img_size=(32, 32), crop_pct=0.9)
    outcomes = _fuzz(seed_files, lambda data: prepare_image(load_image(data), config).tensor.numpy(), ImageReadError)
    assert outcomes["refused"] > CASES // 4 and outcomes["decoded"] > CASES // 10, outcomes
