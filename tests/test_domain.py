"""The out-of-domain score, in process: the statistic (`hub_vit.domain_score`), the folder's record of it
(`hub_vit.domain`), fitting it (`hub_vit.domain_fit`, `hub-vit calibrate-domain`) and the shipped digits model's
calibration against its targets: every shipped sample in domain, every bundled photo out of it.

The served path (the real tritonserver, CPU and torch flavours) is tests/test_domain_served.py."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.spatial.distance import mahalanobis
from typer.testing import CliRunner

from hub_vit.domain import DOMAIN_FILE, STATISTICS_FILE, Domain, guess_domain, read_domain, write_domain
from hub_vit.domain_score import (
    DomainStatistics,
    conformal_threshold,
    fewest_fit_images,
    fewest_held_out,
    fit,
    load_statistics,
    save_statistics,
    score_blocks,
)

DIGITS = Path(__file__).resolve().parents[1] / "hub_vit" / "assets" / "digits"
LABELS = [str(i) for i in range(10)]


# -- the statistic --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth, blocks", [(1, (0,)), (2, (0, 1)), (4, (0, 1, 2, 3)), (12, (2, 5, 8, 11)),
                                           (32, (7, 15, 23, 31))])
def test_the_score_reads_the_blocks_at_each_quarter_of_the_depth(depth, blocks):
    assert score_blocks(depth) == blocks


def test_the_score_is_the_mean_squared_mahalanobis_distance_per_feature():
    """Golden values from scipy's Mahalanobis distance, on the Gaussians `fit` estimates (numpy's covariance)."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(500, 3, 4)) * np.array([1.0, 3.0, 0.5, 2.0]) + 5  # (N, depth, D)
    blocks = (0, 2)
    mean, precision = fit(features, blocks)
    statistics = DomainStatistics(blocks, mean, precision, threshold=2.0)
    probe = rng.normal(size=(3, 3, 4)) * 4
    expected = []
    for image in probe:
        per_block = []
        for b in blocks:
            covariance = np.cov(features[:, b], rowvar=False, bias=True)
            per_block.append(mahalanobis(image[b], features[:, b].mean(axis=0), np.linalg.inv(covariance)) ** 2 / 4)
        expected.append(np.mean(per_block))
    np.testing.assert_allclose(statistics.scores(probe), expected, rtol=1e-4)
    assert statistics.scores(features).mean() == pytest.approx(1.0, abs=1e-3)  # in domain: about 1, by definition
    np.testing.assert_array_equal(statistics.out_of_domain(np.array([1.9, 2.0, 2.1])), [False, False, True])
    with pytest.raises(ValueError, match=r"token means of shape \(3, 4\) do not fit statistics fitted on blocks "
                                         r"\[0, 2\] of width 4"):
        statistics.scores(probe[:, 0])


def test_the_fit_refuses_fewer_images_than_twice_the_feature_width():
    # was: 20 digits fitted at width 64 (pseudo-inverse: the 44 directions they do not span weighed 0) called a photo
    # of an astronaut in-domain; just above 64, the smallest eigenvalues' noise decided the score
    rng = np.random.default_rng(0)
    assert fewest_fit_images(64) == 128 and fewest_fit_images(8) == 16
    with pytest.raises(ValueError, match=r"^15 images to fit the score on: too few for the model's feature width 8: "
                                         r"the score needs at least 16, twice the width .*; give at least 16 images of "
                                         r"the kind the model knows \(more are better\)$"):
        fit(rng.normal(size=(15, 2, 8)), (0, 1))
    mean, precision = fit(rng.normal(size=(16, 2, 8)), (0, 1))
    assert mean.shape == (2, 8) and precision.shape == (2, 8, 8)
    # enough images, but only 3 different ones: their features span 2 of the 8 directions
    duplicates = rng.normal(size=(3, 2, 8))[np.arange(40) % 3]
    with pytest.raises(ValueError, match=r"^the features of the 40 fit images span only 2 of the 8 feature directions "
                                         r"at block 1 \(duplicate or near-identical images\?\), and the score would "
                                         r"ignore the other 6; give more, and more varied, images"):
        fit(duplicates, (0, 1))


def test_the_conformal_threshold_is_the_ceil_n_plus_1_quantile():
    """Split conformal (Angelopoulos & Bates 2021, eq. 1): the ceil((n + 1)(1 - a))-th smallest of n scores."""
    scores = np.arange(1.0, 201.0)[::-1]  # 1 .. 200, unsorted
    assert conformal_threshold(scores, 0.01) == 199.0  # ceil(201 * 0.99) = 199
    assert conformal_threshold(scores, 0.1) == 181.0  # ceil(201 * 0.9) = 181
    assert fewest_held_out(0.01) == 99 and fewest_held_out(0.05) == 19
    assert conformal_threshold(np.arange(99.0), 0.01) == 98.0
    with pytest.raises(ValueError, match=r"a false-alarm rate of 1.00% needs at least 99 held-out in-domain images "
                                         r"to set its threshold, got 98: give more held-out images, or allow a "
                                         r"higher false-alarm rate"):
        conformal_threshold(np.arange(98.0), 0.01)
    with pytest.raises(ValueError, match=r"the false-alarm rate must be in \(0, 1\), got 1.5"):
        conformal_threshold(scores, 1.5)


def test_statistics_round_trip_and_a_damaged_file_is_named(tmp_path):
    statistics = load_statistics(DIGITS / STATISTICS_FILE)
    again = load_statistics(save_statistics(statistics, tmp_path / "copy.safetensors"))
    assert again.blocks == statistics.blocks and again.threshold == statistics.threshold
    np.testing.assert_array_equal(again.precision, statistics.precision)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"bad.safetensors is not a domain statistics file"):
        load_statistics(tmp_path / "bad.safetensors")
    from safetensors.numpy import save_file

    save_file({"mean": np.zeros((2, 3), np.float32)}, str(tmp_path / "partial.safetensors"))
    with pytest.raises(ValueError, match=r"is not a domain statistics file: it lacks blocks, precision, threshold"):
        load_statistics(tmp_path / "partial.safetensors")


# -- the folder's record --------------------------------------------------------------------------------------------
def test_the_shipped_model_knows_digits_and_its_score_is_calibrated_for_its_weights():
    domain = read_domain(DIGITS, LABELS)
    assert domain.examples == "digits" and "handwritten digits 0-9" in domain.knows
    assert domain.statistics is not None and domain.statistics.blocks == (0, 1, 2, 3)
    measured = domain.measured
    assert measured["fit_images"] == 1437 and measured["held_out_images"] == 360  # train fits, val sets the threshold
    assert measured["check_false_alarms"] <= 0.01 and measured["out_of_domain_flagged"] == 1.0


@pytest.fixture
def digits_copy(tmp_path) -> Path:
    return Path(shutil.copytree(DIGITS, tmp_path / "digits"))


def test_statistics_fitted_on_other_weights_are_not_applied(digits_copy):
    record = json.loads((digits_copy / DOMAIN_FILE).read_text())
    record["weights_digest"] = "tensors-sha256:" + "0" * 64  # as after fine-tuning: the digest differs
    (digits_copy / DOMAIN_FILE).write_text(json.dumps(record))
    domain = read_domain(digits_copy, LABELS)
    assert domain.statistics is None and domain.examples == "digits" and domain.measured == {}


def test_statistics_fitted_on_images_prepared_otherwise_are_not_applied(digits_copy, tmp_path):
    # was: a folder saved at 48x48 kept its 32x32 calibration (the sincos weights are unchanged, so the digest matched),
    # and every shipped sample came out out-of-domain (scores 2.6 to 7.1 against 2.52)
    from transformers import AutoModelForImageClassification

    resized = tmp_path / "at48"
    AutoModelForImageClassification.from_pretrained(digits_copy, img_size=48).save_pretrained(resized)
    for name in (DOMAIN_FILE, STATISTICS_FILE):
        shutil.copy(digits_copy / name, resized / name)
    assert read_domain(digits_copy, LABELS).statistics is not None  # the copy as it was: calibrated
    assert read_domain(resized, LABELS).statistics is None  # same weights, other inputs: "unknown"
    record = json.loads((digits_copy / DOMAIN_FILE).read_text())
    del record["input"]  # a record written before `input` was: judged by the weights alone, as then
    (digits_copy / DOMAIN_FILE).write_text(json.dumps(record))
    assert read_domain(digits_copy, LABELS).statistics is not None


def test_a_statistics_file_that_is_not_the_recorded_one_is_not_applied(digits_copy):
    statistics = load_statistics(digits_copy / STATISTICS_FILE)
    save_statistics(DomainStatistics(statistics.blocks, statistics.mean, statistics.precision, 1e9),
                    digits_copy / STATISTICS_FILE)  # a threshold nothing would pass: replaced, not recorded
    assert read_domain(digits_copy, LABELS).statistics is None
    (digits_copy / STATISTICS_FILE).unlink()
    assert read_domain(digits_copy, LABELS).statistics is None


def test_a_record_from_before_the_score_says_nothing_about_the_domain(tmp_path):
    """A softmax-threshold record (what domain.json held before): its threshold is no out-of-domain score."""
    shutil.copyfile(DIGITS / "model.safetensors", tmp_path / "model.safetensors")
    (tmp_path / DOMAIN_FILE).write_text(json.dumps({"knows": "x", "examples": "digits", "threshold": 0.7,
                                                    "weights_digest": "tensors-sha256:0"}))
    assert read_domain(tmp_path, ["a"]) == Domain("x", "digits")


def test_bad_records_are_named(tmp_path):
    (tmp_path / DOMAIN_FILE).write_text(json.dumps({"knows": "x", "examples": "sketches"}))
    with pytest.raises(ValueError, match=r"unknown examples 'sketches'; valid: digits, photos"):
        read_domain(tmp_path, ["a"])
    (tmp_path / DOMAIN_FILE).write_text("[]")
    with pytest.raises(ValueError, match=r"is not a domain record: .*; rewrite it with `hub-vit calibrate-domain "
                                         r"FOLDER --images DIR --knows PHRASE --examples digits\|photos`, or delete "
                                         r"it"):
        read_domain(tmp_path, ["a"])
    with pytest.raises(ValueError, match=r"unknown examples 'sketches'; valid: digits, photos"):
        write_domain(tmp_path, Domain("x", "sketches"))


@pytest.mark.parametrize("text, why", [
    ('{"knows": "x",', r"it is not valid JSON \(Expecting property name enclosed in double quotes at line 1, "
                       r"column 15\)"),
    (b"\xff\xfe{}", r"it is not UTF-8 text"),
    ("[]", r"its content is an array, where a record is a JSON object with the fields 'knows' and 'examples'"),
    ('"digits"', r"its content is a string, where a record is a JSON object"),
    ('{"examples": "digits"}', r"it lacks the field 'knows'"),
    ("{}", r"it lacks the fields 'knows' and 'examples'"),
    ('{"knows": ["digits"], "examples": "digits"}', r"its field 'knows' is an array, expected a string"),
    ('{"knows": null, "examples": "digits"}', r"its field 'knows' is null, expected a string"),
    ('{"knows": "x", "examples": 5}', r"its field 'examples' is a number, expected a string"),
    ('{"knows": "x", "examples": "digits", "measured": "ab"}',
     r"its field 'measured' is a string, expected an object \(names and values\)"),
    ('{"knows": "x", "examples": "digits", "measured": [["a", 1]]}', r"its field 'measured' is an array, expected"),
])
def test_a_damaged_record_says_which_field_is_wrong_not_pythons_words(tmp_path, text, why):
    # was: "(KeyError: 'examples')", "(TypeError: list indices must be integers or slices, not str)", "(ValueError:
    # dictionary update sequence element #0 has length 1; 2 is required)"; and a `measured` of pairs was taken
    path = tmp_path / DOMAIN_FILE
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(ValueError) as refused:
        read_domain(tmp_path, ["a"])
    message = str(refused.value)
    assert re.match(re.escape(f"{path} is not a domain record: ") + why, message), message
    assert not re.search(r"Error|Exception|dictionary update|indices", message), message


def test_a_record_without_measured_numbers_is_a_record(tmp_path):
    # `measured` absent or null: what the model knows, without a calibration (what write_domain writes without one)
    for record in ({"knows": "x", "examples": "digits"}, {"knows": "x", "examples": "digits", "measured": None}):
        (tmp_path / DOMAIN_FILE).write_text(json.dumps(record))
        assert read_domain(tmp_path, ["a"]) == Domain("x", "digits")


def test_guessed_domains():
    assert guess_domain([f"c{i}" for i in range(1000)]).examples == "photos"
    assert "ImageNet-1k" in guess_domain([f"c{i}" for i in range(1000)]).knows
    guessed = guess_domain(["apple", "bicycle", "cat"])
    assert guessed.knows == "its 3 classes (apple, bicycle, cat)" and guessed.statistics is None


# -- the shipped calibration, in process ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    from hub_vit.data_config import DataConfig
    from hub_vit.folder import load_model_folder

    model, info = load_model_folder(DIGITS)
    return model, DataConfig.from_pretrained_cfg(info.pretrained_cfg, info.spec), read_domain(DIGITS, LABELS)


def bundled_photos() -> dict[str, Image.Image]:
    """scikit-image's bundled photos (the export's verification set) and the demo's examples."""
    from hub_vit.demo.app import examples_of
    from hub_vit.export.verify import load_photos

    photos = {name: Image.fromarray(pixels) for name, pixels in load_photos().items()}
    return photos | {path.name: Image.open(path).convert("RGB") for path in examples_of("photos")}


def test_no_shipped_sample_is_flagged_and_every_bundled_photo_is(shipped):
    from hub_vit.domain_fit import image_features

    model, data, domain = shipped
    samples = sorted((DIGITS / "samples").glob("*.png"))
    assert len(samples) == 20
    features = image_features(model, samples, data)
    scores = domain.statistics.scores(features.token_means)
    assert not domain.statistics.out_of_domain(scores).any(), dict(zip([p.name for p in samples], scores, strict=True))
    photos = bundled_photos()
    assert len(photos) >= 15
    photo_features = image_features(model, list(photos.values()), data)
    photo_scores = domain.statistics.scores(photo_features.token_means)
    assert domain.statistics.out_of_domain(photo_scores).all(), dict(zip(photos, photo_scores, strict=True))
    # the two cases, where softmax confidence misfired both ways
    probabilities = np.exp(photo_features.logits) / np.exp(photo_features.logits).sum(axis=1, keepdims=True)
    astronaut = list(photos).index("astronaut.jpg")
    assert probabilities[astronaut].argmax() == 9 and probabilities[astronaut].max() > 0.9  # "9, 96 %", a photo
    two = [p.name for p in samples].index("2_1.png")
    sample_probabilities = np.exp(features.logits) / np.exp(features.logits).sum(axis=1, keepdims=True)
    assert sample_probabilities[two].max() < 0.7 and scores[two] < domain.statistics.threshold  # unsure, yet a digit


# -- fitting --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digit_folders(tmp_path_factory) -> Path:
    from hub_vit.train.digits import write_image_folder

    return write_image_folder(tmp_path_factory.mktemp("digits") / "data")


@pytest.mark.slow
def test_the_shipped_calibration_is_what_calibrating_the_shipped_model_gives(digit_folders, tmp_path):
    """The shipped statistics are current: scripts/calibrate_domain.py's fit on the digits' splits, again."""
    from hub_vit.domain_fit import calibrate_domain
    from hub_vit.train import digits

    folder = Path(shutil.copytree(DIGITS, tmp_path / "digits"))
    photos = tmp_path / "photos"
    photos.mkdir()
    for name, image in bundled_photos().items():
        image.save(photos / f"{name}.png")  # the demo's astronaut.jpg beside scikit-image's astronaut
    domain = calibrate_domain(folder, digit_folders / "train", held_out=digit_folders / "val", out_of_domain=photos,
                              knows=digits.DOMAIN_KNOWS, examples="digits", sources=digits.domain_sources())
    shipped = read_domain(DIGITS, LABELS)
    assert domain.statistics.threshold == pytest.approx(shipped.statistics.threshold, rel=1e-5)
    np.testing.assert_allclose(domain.statistics.mean, shipped.statistics.mean, rtol=1e-4, atol=1e-5)
    for key in ("fit_images", "held_out_images", "check_false_alarms", "out_of_domain_images", "auroc"):
        assert domain.measured[key] == shipped.measured[key], key
    assert read_domain(folder, LABELS).statistics is not None  # written, for these weights


def test_calibrate_domain_writes_a_score_that_applies(digits_copy, digit_folders):
    """One folder of images: 3 in 4 fitted, 1 in 4 held out; the record says what was measured on what."""
    from hub_vit.domain_fit import calibrate_domain

    (digits_copy / DOMAIN_FILE).unlink()
    (digits_copy / STATISTICS_FILE).unlink()
    domain = calibrate_domain(digits_copy, digit_folders / "train", false_alarm_rate=0.05, max_images=400)
    assert domain.measured["fit_images"] == 400 and domain.measured["held_out_images"] == 359  # 1437 // 4
    assert domain.knows == "its 10 classes (0, 1, 2, 3, 4, ...)" and domain.examples == "photos"  # guessed
    assert "every 4th image, not fitted" in domain.measured["held_out_source"]
    assert read_domain(digits_copy, LABELS).statistics.threshold == domain.statistics.threshold


def test_a_training_set_of_bmp_and_gif_files_is_calibrated_on(digits_copy, digit_folders, tmp_path):
    # `hub-vit train` takes BMP and GIF (docs/training.md); its out-of-domain fit read only JPEG/PNG/WebP, so a BMP
    # set ended uncalibrated, told to run `calibrate-domain`, which refused the same folder
    from PIL import Image

    from hub_vit.domain_fit import calibrate_domain

    converted = tmp_path / "bmp_gif"
    for index, png in enumerate(sorted((digit_folders / "train").rglob("*.png"))[:240]):
        target = converted / png.parent.name / f"{png.stem}.{'bmp' if index % 2 else 'gif'}"
        target.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(png) as image:
            image.save(target)
    (digits_copy / STATISTICS_FILE).unlink()
    domain = calibrate_domain(digits_copy, converted, false_alarm_rate=0.05, max_images=400)
    assert domain.measured["fit_images"] + domain.measured["held_out_images"] == 240
    assert read_domain(digits_copy, LABELS).statistics is not None


@pytest.mark.parametrize("case, message", [
    ("few-held-out", r"a false-alarm rate of 1.00% needs at least 99 held-out images to set the threshold, got 20; "
                     r"give more held-out images or a higher false-alarm rate"),
    ("overlap", r"--held-out '.*' shares 20 images with --images '.*'; held-out images must be ones the score is "
                r"not fitted on"),
    ("ood-images", r"--out-of-domain '.*images' shares 20 images with --images '.*images'; out-of-domain images "
                   r"must be ones the model should not know"),  # was measured: an AUROC of 0.5, the set against itself
    ("ood-held", r"--out-of-domain '.*held' shares 20 images with --held-out '.*held'; out-of-domain images must be "
                 r"ones the model should not know"),
    # both counts in one message: one rerun fixes them
    ("few-fit", r"^error: a false-alarm rate of 1.00% needs at least 99 held-out images to set the threshold, got 1; "
                r"give more held-out images or a higher false-alarm rate; and 4 images to fit the score on "
                r"\('.*images'\): too few for the model's feature width 64"),
    # was: written (10 was the fewest), and the score called a photo in-domain: 20 images span 19 of 64 directions
    ("few-for-width", r"^error: 20 images to fit the score on \('.*images'\): too few for the model's feature width "
                      r"64: the score needs at least 128, twice the width \(.*\); give at least 128 images of the "
                      r"kind the model knows \(more are better\)$"),
    # was: "" kept the record's phrase in silence, and a line break went into the record and the card
    ("knows-empty", r"^error: --knows must be a phrase on one line, not empty \(it is shown after \"this model "
                    r"knows\"\), got ''; leave --knows out to keep what the folder's record says$"),
    ("knows-blank", r"--knows must be a phrase on one line, not empty .*, got ' '"),
    ("knows-lines", r"--knows must be a phrase on one line, not empty .*, got 'two\\nlines'"),
    ("knows-newline", r"--knows must be a phrase on one line, not empty .*, got 'digits\\n'"),
    ("file", r"--images '.*00.png' is a file; give a folder of images"),
    ("missing", r"image folder '.*nowhere' does not exist"),
    ("missing-model", r"model folder '.*no-model' does not exist"),  # named first: its images are missing too
    # was: "needs at least 99 held-out images", then, with enough images, that the folder is no hub-vit model's
    ("transformers-model", r"config.json has model_type 'vit', expected 'hub_vit' \(is this a hub-vit model folder"),
    # was: named only once there were enough held-out images
    ("ood-empty", r"image folder '.*empty' has no .jpg/.jpeg/.png/.webp/.bmp/.gif files"),
    ("rate", r"the false-alarm rate must be in \(0, 1\), got 0.0"),
    # was fitted on the folder's PNGs alone, in silence
    ("phone-photos", r"--images '.*images' holds 2 HEIC / TIFF images that are not read: .*images/a.heic, "
                     r".*images/b.tif; convert them to JPEG, PNG, WebP, BMP or GIF, or move them out of the folder"),
    ("examples", r"unknown examples 'sketches'; valid: digits, photos"),
    # was: a traceback after the fit had replaced domain.safetensors
    ("record-folder", r"'.*domain.json' is a folder; calibrate-domain writes the file domain.json there: move the "
                      r"folder away"),
])
def test_bad_calibrations_are_refused_by_name_before_anything_is_written(digits_copy, tmp_path, case, message):
    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    images, held = tmp_path / "images", tmp_path / "held"
    for folder in (images, held):
        folder.mkdir()
        for i in range(5 if case == "few-fit" else 20):
            Image.new("RGB", (8, 8), (i, i, i)).save(folder / f"{i:02d}.png")
    target = {"file": images / "00.png", "missing": tmp_path / "nowhere",
              "missing-model": tmp_path / "nowhere"}.get(case, images)
    model = tmp_path / "no-model" if case == "missing-model" else digits_copy
    if case == "transformers-model":
        from transformers import ViTConfig, ViTForImageClassification

        model = tmp_path / "vit"
        ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, image_size=32, patch_size=16)).save_pretrained(model)
    (tmp_path / "empty").mkdir()
    lenient = ["--held-out", str(held), "--false-alarm-rate", "0.2"]  # few held-out images are enough at 20 %
    extra = {"few-held-out": ["--held-out", str(held)], "overlap": ["--held-out", str(images)],
             "ood-images": [*lenient, "--out-of-domain", str(images)],
             "ood-held": [*lenient, "--out-of-domain", f"{tmp_path}/./held"],  # another spelling of the same folder
             "rate": ["--false-alarm-rate", "0"], "examples": ["--examples", "sketches"],
             "ood-empty": ["--out-of-domain", str(tmp_path / "empty")], "few-for-width": lenient,
             "knows-empty": [*lenient, "--knows", ""], "knows-blank": [*lenient, "--knows", " "],
             "knows-lines": [*lenient, "--knows", "two\nlines"],
             "knows-newline": [*lenient, "--knows", "digits\n", "--examples", "digits"]}.get(case, [])
    if case == "phone-photos":
        (images / "a.heic").write_bytes(b"\x00\x00\x00\x18ftypheic")
        (images / "b.tif").write_bytes(b"II*\x00")
    if case == "record-folder":
        (digits_copy / "domain.json").unlink()
        (digits_copy / "domain.json").mkdir()
    before = sorted(p.name for p in digits_copy.iterdir())
    statistics = (digits_copy / "domain.safetensors").read_bytes()
    _load_commands()
    result = CliRunner().invoke(app, ["calibrate-domain", str(model), "--images", str(target), *extra])
    assert result.exit_code == 2, result.output
    assert re.search(message, " ".join(result.output.split())), result.output
    assert sorted(p.name for p in digits_copy.iterdir()) == before  # nothing written
    assert (digits_copy / "domain.safetensors").read_bytes() == statistics


def test_max_images_below_the_fewest_fit_images_is_refused(digits_copy, tmp_path):
    # was: at least 20 (twice the old fewest, 10), whatever the model: 100 images fitted at width 64 passed the plan
    from hub_vit.domain_fit import calibrate_domain

    statistics = (digits_copy / STATISTICS_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"^max_images must be at least 128, the fewest fit images for the model's "
                                         r"feature width 64, got 100$"):
        calibrate_domain(digits_copy, tmp_path / "never read", max_images=100)
    assert (digits_copy / STATISTICS_FILE).read_bytes() == statistics


def test_the_cli_calibrates_and_prints_what_it_measured(digits_copy, digit_folders):
    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    _load_commands()
    result = CliRunner().invoke(app, ["calibrate-domain", str(digits_copy), "--images", str(digit_folders / "train"),
                                      "--held-out", str(digit_folders / "val"), "--knows", "digits, scanned"])
    assert result.exit_code == 0, result.output
    domain = read_domain(digits_copy, LABELS)
    assert domain.knows == "digits, scanned" and domain.examples == "digits"  # kept from the folder's record
    assert f"threshold {domain.statistics.threshold:.4g}" in result.output
    assert "check_false_alarms:" in result.output and math.isfinite(domain.statistics.threshold)


# -- the features the served steps score ----------------------------------------------------------------------------
def test_the_exported_graphs_write_the_token_means_the_model_computes(shipped, tmp_path):
    """export_onnx(with_token_means): the plain graph, the attention graph and the logits part cut from it."""
    import onnxruntime as ort
    import torch

    from hub_vit.export.onnx_export import export_onnx, logits_subgraph
    from hub_vit.model import token_means

    model = shipped[0]
    x = torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        out = model.forward_all(x, output_hidden_states=True)
    expected = {"logits": out.logits.numpy(), "token_means": token_means(out.hidden_states).numpy()}
    assert expected["token_means"].shape == (3, 4, 64)
    plain = export_onnx(model, tmp_path / "plain.onnx", with_token_means=True)
    attentions = export_onnx(model, tmp_path / "attentions.onnx", with_attentions=True, with_token_means=True)
    cut = logits_subgraph(attentions, tmp_path / "cut.onnx")
    for graph, names in ((plain, ["logits", "token_means"]), (attentions, ["logits", "attentions", "token_means"]),
                         (cut, ["logits", "token_means"])):
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        found = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"pixel_values": x.numpy()}),
                         strict=True))
        assert list(found) == names, graph
        for name in ("logits", "token_means"):
            np.testing.assert_allclose(found[name], expected[name], atol=1e-4, err_msg=f"{graph.name}: {name}")
    assert [o.name for o in ort.InferenceSession(str(export_onnx(model, tmp_path / "m.onnx")),
                                                 providers=["CPUExecutionProvider"]).get_outputs()] == ["logits"]


def test_every_exported_variant_carries_the_token_means(shipped, tmp_path):
    """The CPU flavour's variants are built from the fp32 graph: each keeps `token_means` (and drops the
    verification's `pre_logits`), so a reduced-precision graph still feeds the score."""
    import onnx

    from hub_vit.export.plan import ExportPlan, VerificationSet
    from hub_vit.export.variants import export_variants

    report = export_variants(shipped[0], tmp_path / "out", ExportPlan(("fp32", "optimized", "int8-dynamic"),
                                                                      token_means=True),
                             VerificationSet(n_random=4, n_photos=4, seed=0))
    written = [o for o in report.variants if o.written]
    assert len(written) >= 2 and report.settings["with_token_means"]
    for outcome in written:
        outputs = [o.name for o in onnx.load(outcome.file, load_external_data=False).graph.output]
        assert outputs == ["logits", "token_means"], (outcome.variant, outputs)


def test_the_torch_runner_carries_the_token_means_with_the_logits(shipped):
    """The torch step's model (server/repository/torch_domain.py) through the flavour's Runner, on the CPU: the
    plain and the explained pass both return (N, C + depth * D), which the step splits back."""
    import torch

    from hub_vit.model import token_means
    from hub_vit.server.repository.torch_domain import LogitsAndTokenMeans
    from hub_vit.server.repository.torch_runner import Runner

    model = shipped[0]
    runner = Runner(LogitsAndTokenMeans(model), torch.device("cpu"), (32, 32), (1, 2, 4))
    batch = np.random.default_rng(1).uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        out = model.forward_all(torch.from_numpy(batch), output_hidden_states=True)
    expected = np.concatenate([out.logits.numpy(), token_means(out.hidden_states).flatten(1).numpy()], axis=1)
    np.testing.assert_allclose(runner(batch), expected, atol=1e-5)
    logits, attentions, _ = runner.with_attentions(batch)
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    assert attentions.shape == (3, 4, 4, 64, 64)


def test_bf16_features_keep_every_verdict(shipped):
    """The torch flavour on a GPU runs the model (and so the token means) under bf16 autocast; the same autocast on the
    CPU moves the shipped model's scores by less than 5 % and changes no verdict on the samples and photos."""
    import torch

    from hub_vit.explain.image import prepare_image
    from hub_vit.model import token_means

    model, data, domain = shipped
    images = [Image.open(p) for p in sorted((DIGITS / "samples").glob("*.png"))] + list(bundled_photos().values())
    x = torch.stack([prepare_image(image, data).tensor for image in images])
    with torch.no_grad():
        exact = domain.statistics.scores(token_means(model.forward_all(x, output_hidden_states=True).hidden_states))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model.forward_all(x, output_hidden_states=True).hidden_states
        bf16 = domain.statistics.scores(token_means(hidden).float().numpy())
    np.testing.assert_allclose(bf16, exact, rtol=0.05)
    np.testing.assert_array_equal(domain.statistics.out_of_domain(bf16), [False] * 20 + [True] * (len(images) - 20))


def test_the_gpu_paths_bf16_weights_keep_every_verdict(shipped):
    """What the torch flavour runs on a GPU: not autocast but the weights (and so the residual stream, the LayerNorms
    and the token means) cast to bf16 in its Runner. On the CPU in the same dtype the shipped model's scores move by
    less than 5 % and no verdict changes on the samples and photos."""
    import torch

    from hub_vit.explain.image import prepare_image
    from hub_vit.model import token_means
    from hub_vit.server.repository.torch_domain import LogitsAndTokenMeans
    from hub_vit.server.repository.torch_runner import Runner

    model, data, domain = shipped
    images = [Image.open(p) for p in sorted((DIGITS / "samples").glob("*.png"))] + list(bundled_photos().values())
    x = torch.stack([prepare_image(image, data).tensor for image in images])
    with torch.no_grad():
        exact = domain.statistics.scores(token_means(model.forward_all(x, output_hidden_states=True).hidden_states))
    classes = model.spec.num_classes
    runner = Runner(LogitsAndTokenMeans(copy.deepcopy(model)), torch.device("cpu"), tuple(x.shape[-2:]),
                    (len(images),), dtype=torch.bfloat16, classes=classes)
    assert {p.dtype for p in runner.model.parameters()} == {torch.bfloat16}
    with torch.inference_mode():
        runner.batch(len(images)).copy_(x)
        ranked = runner.run(len(images))
    [features] = runner.fetch(ranked.features)  # (N, depth * D) float32, from bf16 hidden states
    bf16 = domain.statistics.scores(features.reshape(len(images), model.spec.depth, -1))
    np.testing.assert_allclose(bf16, exact, rtol=0.05)
    np.testing.assert_array_equal(domain.statistics.out_of_domain(bf16), [False] * 20 + [True] * (len(images) - 20))


# -- the demo, in process -------------------------------------------------------------------------------------------
def test_the_demo_marks_a_photo_and_not_an_unsure_digit():
    """The demo's own model: the astronaut (softmax "9, 96 %") is marked as not the kind of image the model knows;
    the shipped sample 2_1.png (67 %, which the softmax threshold called "probably not a digit") is not."""
    from hub_vit.demo.app import Demo, domain_note, example_images
    from hub_vit.demo.backends import IN_PROCESS
    from hub_vit.demo.models import ModelCache, discover_choices

    demo = Demo(cache=ModelCache(discover_choices()), examples=example_images())
    key = demo.cache.keys[0]
    photo = Path(__file__).resolve().parents[1] / "hub_vit" / "demo" / "examples" / "astronaut.jpg"
    status = demo.analyze(str(photo), key, IN_PROCESS, "mean", 0.0, None, None)[5]
    assert status.startswith("**Not the kind of image this model knows: its out-of-domain score ") and \
        "this model knows only the handwritten digits 0-9" in status and "out of domain (score" in status, status
    answer = demo.analyze(str(DIGITS / "samples" / "2_1.png"), key, IN_PROCESS, "mean", 0.0, None, None)
    labels, status = answer[0], answer[5]
    assert max(labels.values()) < 0.7 and "not the kind" not in status and "in domain (score" in status, status
    assert "out-of-domain score is above 2.52 is marked as not the kind of image" in domain_note(demo.domain(key))
    uncalibrated = Domain("the handwritten digits 0-9", "digits")
    assert domain_note(uncalibrated).endswith("No out-of-domain score is calibrated for it: whether an image is of "
                                              "that kind is unknown.")


# -- calibrate-domain on a folder as users leave it: a damaged record, files that are no images, a card -------------
def _few(source: Path, target: Path, count: int) -> Path:
    """`count` of the digit images under `source` (every class, sorted) copied into `target`: a calibration that
    takes seconds."""
    files = sorted(source.rglob("*.png"))
    for path in files[:: max(len(files) // count, 1)][:count]:
        (target / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / path.parent.name / path.name)
    return target


def _calibrate(*args: str):
    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    _load_commands()
    return CliRunner().invoke(app, ["calibrate-domain", *args])


@pytest.fixture(scope="module")
def few_digits(digit_folders, tmp_path_factory) -> tuple[Path, Path]:
    """150 training digits to fit on, 30 held-out ones: at 5 % enough to set a threshold, too few to split."""
    root = tmp_path_factory.mktemp("few")
    return _few(digit_folders / "train", root / "train", 150), _few(digit_folders / "val", root / "val", 30)


@pytest.mark.parametrize("damage", ["{", json.dumps({"knows": "x", "examples": "sketches"})])
def test_a_damaged_record_is_refused_before_the_fit_or_replaced_when_told_what_the_model_knows(
        digits_copy, few_digits, damage):
    # was: the whole fit, then "is not a domain record ...; write it with `hub-vit calibrate-domain`", the command run
    train, val = few_digits
    (digits_copy / DOMAIN_FILE).write_text(damage)
    statistics = (digits_copy / STATISTICS_FILE).read_bytes()
    fake = train / "no_image.png"  # would stop a run that reads the images: the refusal comes before that
    fake.write_text("not an image")
    try:
        result = _calibrate(str(digits_copy), "--images", str(train), "--held-out", str(val), "--false-alarm-rate",
                            "0.05")
    finally:
        fake.unlink()
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "domain.json" in text and "give both --knows and --examples to replace it " \
        "with a new record, or delete it" in text, text
    assert (digits_copy / DOMAIN_FILE).read_text() == damage and \
        (digits_copy / STATISTICS_FILE).read_bytes() == statistics  # nothing written
    result = _calibrate(str(digits_copy), "--images", str(train), "--held-out", str(val), "--false-alarm-rate",
                        "0.05", "--knows", "digits, scanned", "--examples", "digits")
    assert result.exit_code == 0, result.output
    domain = read_domain(digits_copy, LABELS)
    assert domain.knows == "digits, scanned" and domain.examples == "digits" and domain.statistics is not None


def test_the_cli_says_what_an_unchecked_false_alarm_rate_means_and_when_the_threshold_applies(digits_copy,
                                                                                           few_digits):
    # was: "check_false_alarms: None", and nothing said that a running serve or demo keeps the old threshold
    train, val = few_digits
    result = _calibrate(str(digits_copy), "--images", str(train), "--held-out", str(val), "--false-alarm-rate",
                        "0.05")
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    assert "check_false_alarms: not measured: 30 held-out images do not split into two halves of at least 19 each" \
        in text and "None" not in text, text
    assert "a running `hub-vit serve` or `hub-vit demo` of this folder uses the new threshold once restarted" in text


def test_held_out_help_says_all_of_them_set_the_threshold():
    # was: "half set the threshold, half check it"; every held-out image sets it, the check is 2-fold
    import typer.main

    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    _load_commands()
    command = typer.main.get_command(app).commands["calibrate-domain"]  # type: ignore[attr-defined]
    [held_out] = [param for param in command.params if param.name == "held_out"]
    assert "all of them set the threshold" in held_out.help and "half set" not in held_out.help


@pytest.mark.parametrize("case", ["all-text", "one-among-many"])
def test_files_that_are_no_images_are_named_before_they_are_counted_or_fitted(digits_copy, few_digits, tmp_path,
                                                                               case):
    # was: ten text files named *.png gave "8 images to fit the score on", and one fake among real images was named
    # only after the features of the others were computed
    train, val = few_digits
    if case == "all-text":
        images = tmp_path / "text"
        images.mkdir()
        for i in range(10):
            (images / f"{i:02d}.png").write_text("notes")
        first = images / "00.png"
    else:
        images = Path(shutil.copytree(train, tmp_path / "train"))
        first = images / "5" / "0000_copy.png"
        first.write_text("notes")
    before = sorted(p.name for p in digits_copy.iterdir())
    held = [] if case == "all-text" else ["--held-out", str(val)]  # all-text: 8 fitted, 2 held out, as counted
    result = _calibrate(str(digits_copy), "--images", str(images), *held, "--false-alarm-rate", "0.05")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and f"cannot decode image {str(first)!r}" in text, text
    assert sorted(p.name for p in digits_copy.iterdir()) == before


def test_the_model_card_is_rerendered_when_it_is_the_card_hub_vit_writes(digits_copy, few_digits):
    # was: README.md kept the old threshold and rates; scripts/calibrate_domain.py re-rendered it, the CLI did not
    from hub_vit.model_cards import render_model_card, write_model_card

    train, val = few_digits
    card = digits_copy / "README.md"
    edited = card.read_text() + "\nA note of the publisher's.\n"
    card.write_text(edited)  # a person's edit is never overwritten: the note says how to update it
    result = _calibrate(str(digits_copy), "--images", str(train), "--held-out", str(val), "--false-alarm-rate", "0.05")
    text = " ".join(result.output.split())
    assert result.exit_code == 0 and card.read_text() == edited, text
    assert "is not the card `hub-vit card` writes for this folder now" in text and \
        f"`hub-vit card {digits_copy}` re-renders it" in text, text
    write_model_card(digits_copy)
    old = card.read_text()
    result = _calibrate(str(digits_copy), "--images", str(train), "--held-out", str(val), "--false-alarm-rate", "0.1")
    text = " ".join(result.output.split())
    assert result.exit_code == 0 and f"updated {card}" in text, text
    assert card.read_text() == str(render_model_card(digits_copy)) != old  # the new record's numbers


def test_trainings_uncalibrated_warning_names_the_runs_own_domain(digits_copy, few_digits, tmp_path):
    # was: `hub-vit calibrate-domain FOLDER --images DIR --held-out DIR`, which records 'photos' for the digits
    import shlex

    from hub_vit.train.digits import DOMAIN_KNOWS
    from hub_vit.train.loop import TrainingWarning, calibrate_domain_or_warn

    train, val = few_digits
    data = tmp_path / "data"
    shutil.copytree(train, data / "train")
    _few(val, data / "val", 10)  # too few to set a threshold at 1 %
    with pytest.warns(TrainingWarning) as warned:
        calibrate_domain_or_warn(digits_copy, data, Domain(DOMAIN_KNOWS, "digits"))
    message = str(warned[0].message)
    assert f"hub-vit calibrate-domain {digits_copy} --images DIR --held-out DIR --knows {shlex.quote(DOMAIN_KNOWS)} " \
        "--examples digits`" in message, message
