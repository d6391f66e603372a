"""Which images an export's parts see (hub_vit/export/verify.py `gather_evidence`): the verification images and the
int8 calibration images are drawn apart, so no variant is judged on an image it was calibrated on; the images whose
top-1 counts for a build's sensitivity search are the in-domain ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hub_vit.export.plan import LARGEST_SEED, OwnImages, VerificationSet
from hub_vit.export.verify import PHOTO_NAMES, gather_evidence
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

N_RANDOM, N_PHOTOS, N_CALIBRATION, N_OWN = 3, 5, 6, 8


@pytest.fixture(scope="module")
def model() -> VisionTransformer:
    torch.manual_seed(0)
    spec = ViTSpec(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, img_size=32, num_classes=5,
                   head_zeroinit=False)
    return VisionTransformer(spec).eval()


def _rows(images: np.ndarray) -> set[bytes]:
    return {image.tobytes() for image in images}


@pytest.mark.parametrize("seed", [0, 1, LARGEST_SEED])  # the calibration draws from one seed of its own
def test_calibration_and_verification_share_no_image(model: VisionTransformer, seed: int) -> None:
    own = np.random.default_rng(12345).uniform(-1, 1, (N_OWN, 3, 32, 32)).astype(np.float32)
    n_photos = len(PHOTO_NAMES) + 4  # the centre crops and some random ones
    check = VerificationSet(n_random=N_RANDOM, n_photos=n_photos, n_calibration=N_CALIBRATION, seed=seed,
                            own=OwnImages(own, source="test"))
    evidence = gather_evidence(model, check, calibrated=True)
    verification, calibration = _rows(evidence.x), _rows(evidence.calibration)
    assert len(evidence.x) == N_RANDOM + n_photos + N_OWN // 2
    assert len(evidence.calibration) == N_CALIBRATION + N_OWN // 2
    assert not verification & calibration  # the photos' centre crops included: the verification's alone
    assert _rows(own[0::2]) <= verification and _rows(own[1::2]) <= calibration
    # top-1 counts for the search on the own images only (the model's classes mean something there)
    assert evidence.top1_counts is not None
    assert _rows(evidence.calibration[evidence.top1_counts]) == _rows(own[1::2])
    # the bounds judge a calibrated variant on the own images alone, in the verification and in the search
    assert evidence.own_mask is not None
    assert _rows(evidence.calibration[evidence.own_mask]) == _rows(own[1::2])
    assert evidence.own_from == N_RANDOM + n_photos and _rows(evidence.x[evidence.own_from:]) == _rows(own[0::2])
    assert check.bounds_for(True, evidence.own_from) == {"bounds_from": N_RANDOM + n_photos,
                                                         "bounds_scope": "own images"}
    assert check.bounds_for(False, evidence.own_from) == {"bounds_from": 0, "bounds_scope": "every image"}
    assert check.describe()["calibrated_bounds_scope"] == "own images"


def test_a_trained_models_calibration_counts_top1_on_its_photo_crops(model: VisionTransformer) -> None:
    check = VerificationSet(n_random=N_RANDOM, n_photos=N_PHOTOS, n_calibration=N_CALIBRATION, seed=0, trained=True)
    evidence = gather_evidence(model, check, calibrated=True)
    assert not _rows(evidence.x) & _rows(evidence.calibration)
    n_photos = N_CALIBRATION - round(N_CALIBRATION * N_RANDOM / (N_RANDOM + N_PHOTOS))
    assert evidence.top1_counts is not None and int(evidence.top1_counts.sum()) == n_photos
    # no own images: the bounds judge every image, the photos and noise included
    assert evidence.own_mask is None and evidence.own_from == 0
    assert check.bounds_for(True, evidence.own_from)["bounds_scope"] == "every image"
    assert check.describe()["calibrated_bounds_scope"] == "every image"
    noise = evidence.calibration[~evidence.top1_counts]  # what is left is uniform noise in [-1, 1]
    assert len(noise) == N_CALIBRATION - n_photos and noise.min() >= -1 and noise.max() <= 1


def test_an_untrained_model_counts_no_top1_and_nothing_is_drawn_without_calibration(model: VisionTransformer) -> None:
    check = VerificationSet(n_random=N_RANDOM, n_photos=N_PHOTOS, n_calibration=N_CALIBRATION, seed=0)
    assert gather_evidence(model, check, calibrated=True).top1_counts is None
    evidence = gather_evidence(model, check, calibrated=False)
    assert not len(evidence.calibration) and evidence.top1_counts is None


def test_the_calibration_images_are_the_same_whatever_the_verification_seed(model: VisionTransformer) -> None:
    # a model exports to the same static int8 graph every time (a fresh draw per run moved the digits model's held-out
    # cosine across the 0.99 bound one run in 60)
    drawn = [gather_evidence(model, VerificationSet(n_random=N_RANDOM, n_photos=N_PHOTOS, n_calibration=N_CALIBRATION,
                                                    seed=seed), calibrated=True).calibration for seed in (0, 7, None)]
    assert len(drawn[0]) == N_CALIBRATION
    assert all(np.array_equal(drawn[0], other) for other in drawn[1:])
