"""The verification criterion (hub_vit.export.criterion) on real graphs: a damaged graph is refused with the margin
it misses by, int8 of a random ViT-Ti/16 passes, and the exported files keep the `pixel_values` -> `logits` contract
although verification also reads the pre-logits features.

Bounds (issue #33): per image, cosine >= 0.99 and relative error <= 0.15 of the logits and of the pre-logits
features against fp32; top-1 agreement >= 99 % judged only on in-domain images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from hub_vit.export import criterion, quantize
from hub_vit.export.plan import ExportPlan, VerificationSet
from hub_vit.export.probe import PRE_LOGITS, expose_pre_logits, head_input
from hub_vit.export.variants import export_variants
from hub_vit.export.verify import ort_outputs, ort_session, torch_outputs, verification_inputs
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

TINY = ViTSpec(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, img_size=32, num_classes=10,
               head_zeroinit=False, posemb="sincos2d", pool_type="gap", rep_size=True)


def _tiny() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(TINY).eval()


def _damage(src: Path, dst: Path, noise: float) -> None:
    """Add noise (`noise` x the weights' std) to the patch embedding: the kind of error a broken quantiser or kernel
    makes, felt by every later layer."""
    proto = onnx.load(str(src))
    target = next(t for t in proto.graph.initializer if t.name.endswith("patch_embed.proj.weight"))
    weights = numpy_helper.to_array(target)
    rng = np.random.default_rng(0)
    damaged = weights + noise * weights.std() * rng.standard_normal(weights.shape).astype(weights.dtype)
    target.CopyFrom(numpy_helper.from_array(damaged, target.name))
    onnx.save(proto, str(dst))


def test_per_image_numbers() -> None:
    ref = np.array([[1.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    got = np.array([[0.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    cos, rel = criterion.per_image(ref, got)
    np.testing.assert_allclose(cos, [0.0, 1.0, 1.0])
    np.testing.assert_allclose(rel[:2], [np.sqrt(5.0), 0.0])


def test_top1_is_judged_only_on_the_given_scope() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((20, 10))
    got = ref.copy()
    got[:10] = ref[:10] * 0.999 + 0.002 * rng.standard_normal((10, 10))  # near-ties may flip: fine for noise
    swapped = got.copy()
    swapped[15] = ref[15][::-1]  # one in-domain image's classes reversed: cosine fails too
    reported = criterion.judge("x", "int8", ref, got, provider="p", n_random=10, seed=0)
    assert reported.passed and reported.top1_scope == "reported only" and reported.top1_judged is None
    flipped = got.copy()
    flipped[12] = ref[12]
    flipped[12, [ref[12].argmax(), ref[12].argmin()]] = flipped[12, [ref[12].argmin(), ref[12].argmax()]]
    judged = criterion.judge("x", "int8", ref, flipped, provider="p", n_random=10, seed=0, top1_from=10,
                             top1_scope="own images")
    assert not judged.passed and judged.top1_judged == pytest.approx(0.9)
    assert "top-1 agreement 90.0% < 99% over 10 own images (by 9.0%)" in judged.reason


def test_the_bounds_judge_from_bounds_from_and_report_the_images_before() -> None:
    """A calibrated variant of a model with its own images is judged on those (criterion.judge `bounds_from`): an
    image before them far outside the bounds is reported, not judged; the same error on an own image fails, naming
    that image by its index among all."""
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((12, 10))
    got = ref + 0.01 * rng.standard_normal((12, 10))
    got[2] = -ref[2]  # a noise image: cosine -1, relative error 2
    judged = criterion.judge("x", "int8", ref, got, provider="p", n_random=4, seed=0, reference_features=ref,
                             candidate_features=got, bounds_from=8, bounds_scope="held-out images")
    assert judged.passed, judged.reason
    assert judged.bounds_scope == "held-out images" and judged.worst["logits_min_cosine"] > 0.99
    assert judged.extra["reported_only"]["images"] == 8
    assert judged.extra["reported_only"]["logits_min_cosine"] == pytest.approx(-1.0)
    assert judged.extra["reported_only"]["pre_logits_max_rel_error"] == pytest.approx(2.0)
    text = criterion.summary(judged)
    assert text.startswith("on the held-out images: logits min cosine")
    assert "the other 8 images' lowest cosine -1" in text
    everywhere = criterion.judge("x", "int8", ref, got, provider="p", n_random=4, seed=0)
    assert not everywhere.passed and "on image 2 " in everywhere.reason and "reported_only" not in everywhere.extra
    got[10] = -ref[10]
    own_failed = criterion.judge("x", "int8", ref, got, provider="p", n_random=4, seed=0, bounds_from=8)
    assert not own_failed.passed and "cosine similarity -1.0000 on image 10 " in own_failed.reason
    assert own_failed.bounds_scope == "images 8-11" and everywhere.bounds_scope == "every image"
    with pytest.raises(ValueError, match="bounds_from must index one of the 12 images, got 12"):
        criterion.judge("x", "int8", ref, got, provider="p", n_random=4, seed=0, bounds_from=12)


def test_damaged_graph_is_refused_saying_by_how_much(tmp_path: Path) -> None:
    model = _tiny()
    x, seed = verification_inputs(model, n_random=4, n_photos=12, seed=0)
    ref = torch_outputs(model, x)
    from hub_vit.export import export_onnx

    probe = expose_pre_logits(export_onnx(model, tmp_path / "fp32.onnx"), tmp_path / "probe.onnx")
    _damage(probe, tmp_path / "damaged.onnx", noise=0.5)
    got = ort_outputs(ort_session(tmp_path / "damaged.onnx", ["CPUExecutionProvider"]), x)
    result = criterion.judge("int8-dynamic", "int8", ref["logits"], got["logits"], provider="cpu", n_random=4,
                             seed=seed, reference_features=ref[PRE_LOGITS], candidate_features=got[PRE_LOGITS])
    assert not result.passed
    worst = result.worst["pre_logits_min_cosine"]
    assert worst < 0.99 and result.margins["pre_logits_min_cosine"] == pytest.approx(worst - 0.99)
    assert f"pre_logits cosine similarity {worst:.4f}" in result.reason
    assert f"is {0.99 - worst:.4f} below the bound 0.99" in result.reason


def test_export_refuses_a_variant_that_fails_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8-dynamic step made to write a damaged graph: not written, no file, the error gives the margin."""
    real = quantize.quantize_int8_dynamic

    def damaged(src: Path, dst: Path, workdir: Path, **options: bool) -> None:
        _damage(Path(src), Path(workdir) / "damaged.onnx", noise=0.5)
        real(Path(workdir) / "damaged.onnx", dst, workdir, **options)

    monkeypatch.setattr(quantize, "quantize_int8_dynamic", damaged)
    report = export_variants(_tiny(), tmp_path, ExportPlan(("fp32", "int8-dynamic")),
                             VerificationSet(n_random=4, n_photos=12, seed=0))
    outcome = report.outcome("int8-dynamic")
    assert not outcome.written and not (tmp_path / "model.int8-dynamic.onnx").exists()
    assert outcome.error.startswith("verification failed: ")
    assert "below the bound 0.99" in outcome.error or "above the bound 0.15" in outcome.error
    assert report.outcome("fp32").written


def test_int8_of_a_random_vit_ti_passes(tmp_path: Path) -> None:
    """ViT-Ti/16 at 224 px with random weights (top-1 margins of hundredths): the int8 graphs pass on the features,
    and the written files still read `pixel_values` and write only `logits`."""
    from hub_vit.export import load_source

    src = load_source("vit_ti16", pretrained=False)
    assert src.random_weights
    report = export_variants(src.module, tmp_path, ExportPlan(("int8-dynamic", "int8-dynamic-s8", "int8-static")),
                             VerificationSet(n_random=4, n_photos=12, n_calibration=16, seed=0))
    for name in ("int8-dynamic", "int8-dynamic-s8", "int8-static"):
        outcome = report.outcome(name)
        assert outcome.written, outcome.error
        check = outcome.verification
        assert check["passed"] and check["top1_scope"] == "reported only"
        assert min(check["margins"].values()) >= 0 and check["worst"]["logits_min_cosine"] < 1.0
        proto = onnx.load(str(tmp_path / f"model.{name}.onnx"), load_external_data=False)
        assert [o.name for o in proto.graph.output] == ["logits"]


def test_head_input_is_found_or_refused(tmp_path: Path) -> None:
    from hub_vit.export import export_onnx

    path = export_onnx(_tiny(), tmp_path / "m.onnx")
    assert head_input(path)
    proto = onnx.load(str(path))
    proto.graph.output[0].name = "scores"  # a graph of another contract: no tensor named logits
    head = next(n for n in proto.graph.node if "logits" in n.output)
    head.output[list(head.output).index("logits")] = "scores"
    onnx.save(proto, str(tmp_path / "other.onnx"))
    with pytest.raises(ValueError, match="'logits' is written by no node, not a Gemm/MatMul head"):
        head_input(tmp_path / "other.onnx")
