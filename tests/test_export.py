"""ONNX export: graph contract, verified variants per model family, attention graph, bad input.

Tiny models (width 64, depth 2, 32x32 images) keep this file fast; the thresholds are the issues' (#4, #33): fp32 max
|logit diff| <= 1e-4; reduced precision: per-image cosine >= 0.99 and relative error <= 0.15 of the logits and the
pre-logits features, and top-1 agreement >= 99 % on in-domain images (own images, or photos of a trained model).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from hub_vit.export import export_onnx, registry
from hub_vit.export.plan import ExportPlan, VerificationSet
from hub_vit.export.variants import export_variants
from hub_vit.export.verify import photo_batch
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

TINY = dict(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, img_size=32, num_classes=10,
            head_zeroinit=False)  # a zero head would make every logit 0 and the comparisons vacuous
FAMILIES = {
    "classic_tok": ViTSpec(**TINY, posemb="learn", pool_type="tok", posemb_on_cls=True),
    "simplevit_gap": ViTSpec(**TINY, posemb="sincos2d", pool_type="gap", rep_size=True),
}


def _model(family: str) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(FAMILIES[family]).eval()


def _run(path: Path, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"pixel_values": x})


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    family = request.param
    model = _model(family)
    out = tmp_path_factory.mktemp(family)
    plan = ExportPlan(("fp32", "optimized", "int8-dynamic", "int8-static"), attentions=True)
    report = export_variants(model, out, plan, VerificationSet(n_random=8, n_photos=24, n_calibration=16, seed=0))
    return family, model, out, report


def test_fp32_graph_contract_and_dynamic_batch(exported) -> None:
    family, model, out, report = exported
    path = out / "model.onnx"
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert [i.name for i in proto.graph.input] == ["pixel_values"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.HasField("dim_value")
    for batch in (1, 3, 8):  # one file, three batch sizes, against PyTorch on real photos
        x = photo_batch((32, 32), batch, seed=batch)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        (got,) = _run(path, x)
        assert got.shape == (batch, 10)
        assert np.abs(got - expected).max() <= 1e-4


def test_variants_verified_and_reported(exported) -> None:
    family, model, out, report = exported
    data = json.loads((out / "model.export.json").read_text())
    assert data["settings"]["seed"] == 0 and data["source"]["spec"]["pool_type"] == model.spec.pool_type
    by_name = {v["variant"]: v for v in data["variants"]}
    for name in ("fp32", "optimized", "attentions"):
        v = by_name[name]
        assert v["written"], v["error"]
        assert v["verification"]["max_abs_diff"] <= 1e-4 and v["verification"]["top1_agreement"] == 1.0
    # ORT's optimizer must recognise the blocks' attention in our export (the point of the split-q/k/v layout). At
    # these tiny image sizes it leaves block 0 unfused (its LayerNorm input, cls+posemb Add, does not become a
    # SkipLayerNorm); at 224 px every block fuses (S/16: 12 of 12, see bench/results).
    assert by_name["optimized"]["fused_ops"]["Attention"] >= model.spec.depth - 1 >= 1
    assert by_name["optimized"]["fused_ops"]["SkipLayerNormalization"] >= model.spec.depth
    # int8: built, run and verified on every family. On random weights top-1 is reported, not judged (margins are
    # hundredths); the rule under test is "written if and only if every image's logits and pre-logits features keep
    # cosine >= 0.99 and relative error <= 0.15 against fp32, else the reason with the margin".
    # (The trained default model must pass outright: test_int8_passes_on_a_trained_model.)
    for name in ("int8-dynamic", "int8-static"):
        v = by_name[name]
        check = v["verification"]
        assert check is not None, v["error"]
        assert check["max_abs_diff"] > 0  # really a different, quantised graph
        worst = check["worst"]
        assert set(worst) == {"logits_min_cosine", "logits_max_rel_error", "pre_logits_min_cosine",
                              "pre_logits_max_rel_error"}
        within = min(worst["logits_min_cosine"], worst["pre_logits_min_cosine"]) >= 0.99 and \
            max(worst["logits_max_rel_error"], worst["pre_logits_max_rel_error"]) <= 0.15
        assert v["written"] == check["passed"] == within and check["top1_scope"] == "reported only"
        assert (out / f"model.{name}.onnx").exists() == v["written"]
        if v["written"]:
            ops = {n.op_type for n in onnx.load(str(out / f"model.{name}.onnx"), load_external_data=False).graph.node}
            assert ops & {"MatMulInteger", "DynamicQuantizeLinear", "QAttention", "DynamicQuantizeMatMul",
                          "QuantizeLinear"}
        else:
            assert "below the bound 0.99" in v["error"] or "above the bound 0.15" in v["error"]
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temp files or folders left behind


def test_attention_graph_matches_pytorch_attention_path(exported) -> None:
    family, model, out, report = exported
    x = np.concatenate([photo_batch((32, 32), 3, seed=5), np.random.default_rng(1).uniform(-1, 1, (2, 3, 32, 32))
                        ]).astype(np.float32)
    logits, attentions = _run(out / "model.attentions.onnx", x)
    with torch.no_grad():
        ref = model.forward_all(torch.from_numpy(x), output_attentions=True)
    n_tokens = 16 + model.spec.num_prefix_tokens
    assert attentions.shape == (5, model.spec.depth, model.spec.num_heads, n_tokens, n_tokens)
    assert np.abs(attentions - torch.stack(ref.attentions, 1).numpy()).max() <= 1e-4
    assert np.abs(logits - ref.logits.numpy()).max() <= 1e-4
    np.testing.assert_allclose(attentions.sum(-1), 1.0, atol=1e-5)  # rows are probability distributions


def test_int8_graphs_compute_the_same_integers_on_every_cpu(exported, tmp_path: Path) -> None:
    """On x86 CPUs without VNNI (AVX2), ORT's u8 x s8 kernels add pairs of products in saturating 16-bit lanes, so
    an int8 graph verified on a VNNI host could lose accuracy on another (the digits model lost 1.4 logits there).
    Saturation-free graphs: dynamic int8 keeps unsigned weights (U8U8, widened before adding); static int8 keeps
    signed weights within 7 bits, |w| <= 64, so 2 x 255 x 64 fits 16 bits. Checked on the graphs, whatever this host."""
    from onnx import numpy_helper

    from hub_vit.export.quantize import quantize_int8_dynamic, quantize_int8_static

    _, model, out, _ = exported
    quantize_int8_dynamic(out / "model.optimized.onnx", tmp_path / "d.onnx", tmp_path)
    quantize_int8_static(out / "model.onnx", tmp_path / "s.onnx", photo_batch((32, 32), 8, seed=1), tmp_path)

    def eight_bit(path: Path) -> dict[str, list[np.ndarray]]:
        found: dict[str, list[np.ndarray]] = {"int8": [], "uint8": []}
        for t in onnx.load(str(path)).graph.initializer:
            a = numpy_helper.to_array(t)
            if a.dtype in (np.int8, np.uint8):
                found[str(a.dtype)].append(a)
        return found

    dynamic, static = eight_bit(tmp_path / "d.onnx"), eight_bit(tmp_path / "s.onnx")
    assert not dynamic["int8"] and len(dynamic["uint8"]) >= 2 * model.spec.depth  # weights (+ zero points)
    assert len(static["int8"]) >= 2 * model.spec.depth
    assert max(int(np.abs(a.astype(np.int16)).max()) for a in static["int8"]) <= 64


def test_int8_passes_on_a_trained_model(tmp_path: Path) -> None:
    """The shipped default model (SimpleViT trained on digits), verified on noise + photos + held-out digits via the
    CLI's --images: int8's top-1 must agree with fp32 on >= 99 % of the digits (the photos and noise are out of domain
    for this model and have small margins; the digits are what it is for). int8-dynamic passes whole; int8-static
    (MinMax ranges from images the verification never sees) keeps the digits' answers but may miss the feature bounds
    on an out-of-domain photo, and is then refused for that, never for top-1."""
    from PIL import Image
    from typer.testing import CliRunner

    from hub_vit.catalog import DEFAULT_MODEL, default_model_folder
    from hub_vit.cli import _load_commands, app

    if not (default_model_folder() / "model.safetensors").is_file():
        pytest.skip(f"the bundled default model {DEFAULT_MODEL} is not built in this checkout")
    from hub_vit.train.digits import load_digits_split

    digits, _ = load_digits_split("val")  # (360, 32, 32, 3) uint8, never seen in training
    folder = tmp_path / "digits"
    folder.mkdir()
    for i, img in enumerate(digits):
        Image.fromarray(img).save(folder / f"{i:03d}.png")
    out = tmp_path / "out"
    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "fp32",
                                      "-v", "int8-dynamic", "-v", "int8-static", "--images", str(folder),
                                      "--random-inputs", "8", "--photos", "32", "--seed", "0"])
    report = json.loads((out / "model.export.json").read_text())
    by_name = {v["variant"]: v for v in report["variants"]}
    assert by_name["fp32"]["verification"]["extra"]["n_own_images"] == 180
    for name in ("fp32", "int8-dynamic"):
        assert by_name[name]["written"], (name, by_name[name]["error"])
    for name in ("int8-dynamic", "int8-static"):  # top-1 judged on the held-out digits, the model's own domain
        check = by_name[name]["verification"]
        assert check["top1_scope"] == "own images" and check["top1_judged"] >= 0.99
        assert check["margins"]["top1_agreement"] == pytest.approx(check["top1_judged"] - 0.99)
    static = by_name["int8-static"]
    if not static["written"]:  # refused for a feature bound (cosine / relative error), named in its error
        assert min(static["verification"]["margins"].values()) < 0 and "bound" in static["error"]
        assert result.exit_code == 1 and "int8-static" in result.output
    else:
        assert result.exit_code == 0, result.output


def test_map_model_attention_graph_has_pool_attention(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = VisionTransformer(ViTSpec(**TINY, pool_type="map")).eval()
    path = export_onnx(model, tmp_path / "map.onnx", with_attentions=True, exporter="torchscript")
    x = photo_batch((32, 32), 2, seed=3)
    logits, attentions, pool = _run(path, x)
    with torch.no_grad():
        ref = model.forward_all(torch.from_numpy(x), output_attentions=True)
    assert np.abs(pool - ref.pool_attention.numpy()).max() <= 1e-4
    assert np.abs(attentions - torch.stack(ref.attentions, 1).numpy()).max() <= 1e-4


def test_dynamic_height_width_for_sincos(tmp_path: Path) -> None:
    model = _model("simplevit_gap")
    path = export_onnx(model, tmp_path / "dyn.onnx", dynamic_size=True, exporter="torchscript")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, (h, w) in ((1, (32, 32)), (3, (48, 80)), (2, (64, 24))):
        x = photo_batch((h, w), batch, seed=h)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        (got,) = session.run(None, {"pixel_values": x})
        assert np.abs(got - expected).max() <= 1e-4, (h, w)


def test_dynamic_height_width_for_a_learned_posemb_resamples_it_as_google_does(tmp_path: Path) -> None:
    # was refused ("needs a sincos2d model"): the table's resampling is now in the graph. Golden values: at the trained
    # 64 px, vit_jax's own logits (tiny_token.io.npz); at 96 px, a model converted at 96, whose table is Google's
    # scipy zoom of the trained one (tests/test_conversion_resample.py); at 48x96, the model's own resampling
    import timm

    import hub_vit  # noqa: F401  (registers the timm architectures)

    jax = Path(__file__).resolve().parent / "fixtures" / "jax" / "vit_jax"
    tiny_token = dict(width=64, depth=2, num_heads=2, mlp_dim=128, patch_size=16, num_classes=10, posemb="learn",
                      pool_type="tok", posemb_on_cls=True)
    checkpoint = str(jax / "tiny_token.published.npz")
    model = timm.create_model("hub_vit", checkpoint_path=checkpoint, img_size=64, **tiny_token).eval()
    path = export_onnx(model, tmp_path / "dyn.onnx", dynamic_size=True)
    with np.load(jax / "tiny_token.io.npz") as io:
        inputs, logits = np.ascontiguousarray(io["inputs"].transpose(0, 3, 1, 2)), io["logits"]
    assert np.abs(_run(path, inputs)[0] - logits).max() <= 1e-5
    at_96 = timm.create_model("hub_vit", checkpoint_path=checkpoint, img_size=96, **tiny_token).eval()
    for (h, w), reference in (((96, 96), at_96), ((48, 96), model)):
        x = photo_batch((h, w), 2, seed=h)
        with torch.no_grad():
            expected = reference(torch.from_numpy(x)).numpy()
        assert np.abs(_run(path, x)[0] - expected).max() <= 1e-5, (h, w)


def test_dynamic_size_with_a_learned_posemb_refuses_the_torchscript_exporter(tmp_path: Path) -> None:
    # the tracer keeps the table's resampling for the traced size only: the graph would fail at any other
    with pytest.raises(ValueError, match=r"learned position embedding needs exporter='dynamo'"):
        export_onnx(_model("classic_tok"), tmp_path / "x.onnx", dynamic_size=True, exporter="torchscript")
    assert list(tmp_path.iterdir()) == []


def test_fp16_and_bf16_are_verified_or_refused_with_reason(tmp_path: Path) -> None:
    model = _model("classic_tok")
    report = export_variants(model, tmp_path, ExportPlan(("fp16", "bf16"), exporter="torchscript"),
                             VerificationSet(n_random=4, n_photos=12, seed=0))
    for name in ("fp16", "bf16"):
        o = report.outcome(name)
        assert (tmp_path / f"model.{name}.onnx").exists() == o.written
        if o.written:
            assert o.verification["top1_agreement"] >= 0.99 and o.verification["max_abs_diff"] > 0
        else:
            assert o.error  # e.g. ORT's CPU provider has no bfloat16 MatMul kernel
    # the fp32 base was not requested, so it is not written
    assert not (tmp_path / "model.onnx").exists()


# ---------------------------------------------------------------------------------------------------- bad input
def test_unsupported_precision_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fp8.*valid choices: " + ", ".join(registry.names())):
        export_variants(_model("classic_tok"), tmp_path / "out", ExportPlan(("fp32", "fp8")))
    assert not (tmp_path / "out").exists()


def test_unwritable_output_path_gives_clear_error_and_no_file(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(PermissionError, match="cannot write"):
        export_onnx(_model("classic_tok"), blocker / "model.onnx")
    with pytest.raises((PermissionError, NotADirectoryError), match="cannot write|is a file"):
        export_variants(_model("classic_tok"), blocker, ExportPlan(("fp32",)))
    assert blocker.read_text() == "not a folder"


def test_failed_export_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_checker(*args, **kwargs):
        raise onnx.checker.ValidationError("simulated checker failure")

    monkeypatch.setattr(onnx.checker, "check_model", broken_checker)
    with pytest.raises(ValueError, match="simulated checker failure"):
        export_onnx(_model("classic_tok"), tmp_path / "model.onnx", exporter="torchscript")
    assert list(tmp_path.iterdir()) == []


def test_weights_file_source_needs_and_uses_the_architecture(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from hub_vit.catalog import get_entry
    from hub_vit.export import load_source

    torch.manual_seed(1)
    model = VisionTransformer(get_entry("vit_ti16").spec)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    with pytest.raises(ValueError, match="--model NAME.*vit_ti16"):
        load_source(weights)
    src = load_source(weights, model_name="vit_ti16")
    assert src.kind == "weights" and src.name == "vit_ti16"
    assert torch.equal(src.module.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    with pytest.raises(ValueError, match="unknown model 'vit_nope'.*vit_ti16"):
        load_source(weights, model_name="vit_nope")


def test_cli_unknown_model_and_precision(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    runner = CliRunner()
    result = runner.invoke(app, ["export", "onnx", "vit_nope", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "unknown model 'vit_nope'" in result.output and "vit_s16" in result.output
    result = runner.invoke(app, ["export", "onnx", "vit_s16", "-v", "int4", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "int4" in result.output and "int8-dynamic" in result.output
    assert ", or all" in " ".join(result.output.split())
    result = runner.invoke(app, ["export", "onnx", "vit_s16", "--exporter", "bogus", "-o", str(tmp_path / "o")])
    text = " ".join(result.output.split())  # was offered "all" too, then refused it
    assert result.exit_code == 2 and "valid choices: 'dynamo', 'torchscript'" in text and "all" not in text, text
    assert not (tmp_path / "o").exists()


def test_cli_exports_a_model_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from hub_vit.folder import save_model_folder

    _load_commands()
    folder = save_model_folder(_model("simplevit_gap"), tmp_path / "folder")
    out = tmp_path / "exports"
    result = CliRunner().invoke(app, ["export", "onnx", str(folder), "-o", str(out), "-v", "fp32", "-v",
                                      "int8-dynamic", "--random-inputs", "4", "--photos", "12", "--seed", "0",
                                      "--exporter", "torchscript"])
    assert result.exit_code == 0, result.output
    assert (out / "model.onnx").is_file() and (out / "model.int8-dynamic.onnx").is_file()
    report = json.loads((out / "model.export.json").read_text())
    assert report["source"]["kind"] == "folder"
    assert all(v["written"] for v in report["variants"])


def test_cli_bad_opset_or_image_leaves_no_folder(tmp_path: Path) -> None:
    # opset 26 used to end in an onnx ValidationError traceback and an empty output folder; a non-image among
    # --images in an UnidentifiedImageError traceback
    from typer.testing import CliRunner

    from hub_vit.catalog import default_model_folder
    from hub_vit.cli import _load_commands, app

    _load_commands()
    runner = CliRunner()
    result = runner.invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(tmp_path / "o"), "-v",
                                 "fp32", "--opset", "26"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "exported at opset 26 is not valid ONNX" in text
    assert not (tmp_path / "o").exists()
    images = tmp_path / "images"
    images.mkdir()
    (images / "x.png").write_text("not an image")
    result = runner.invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(tmp_path / "o"), "-v",
                                 "fp32", "--images", str(images)])
    assert result.exit_code == 2 and "x.png' as an image" in " ".join(result.output.split())
    assert not (tmp_path / "o").exists()
    # a phone's photo among them was passed over in silence: calibration and verification on part of the folder
    (images / "x.png").unlink()
    (images / "photo.heic").write_bytes(b"\x00\x00\x00\x18ftypheic")
    (images / "4_1.png").write_bytes((default_model_folder() / "samples" / "4_1.png").read_bytes())
    result = runner.invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(tmp_path / "o"), "-v",
                                 "fp32", "--images", str(images)])
    assert result.exit_code == 2 and (f"--images {str(images)!r} holds 1 HEIC image that is not read: "
                                      f"{images / 'photo.heic'}; convert it to JPEG, PNG, WebP, BMP or GIF") in \
        " ".join(result.output.split()), result.output
    assert not (tmp_path / "o").exists()


def test_a_bf16_model_exports_as_its_float32_copy(tmp_path: Path) -> None:
    # was: a TorchExportError with the reason buried in it (torchscript: "Input type (float) and bias type
    # (c10::BFloat16)"); the graph is fp32 whatever the model's dtype, and the model is left as it is
    torch.manual_seed(0)
    model = VisionTransformer(ViTSpec(**TINY))
    torch.nn.init.normal_(model.head.weight, std=0.5)
    model = model.eval().to(torch.bfloat16)
    path = export_onnx(model, tmp_path / "bf16.onnx")
    assert next(model.parameters()).dtype == torch.bfloat16
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        reference = model.float()(x).numpy()  # the bf16 weights, read as float32
    got = ort.InferenceSession(str(path)).run(None, {"pixel_values": x.numpy()})[0]
    assert np.abs(got - reference).max() < 1e-4


def test_export_variants_takes_a_transformers_model_and_names_a_plan_of_the_wrong_type(tmp_path: Path) -> None:
    # was: AttributeError ("no attribute 'head_is_constant'"; "'list' object has no attribute 'providers'")
    from transformers import AutoModelForImageClassification

    from hub_vit.catalog import default_model_folder

    model = AutoModelForImageClassification.from_pretrained(default_model_folder())
    report = export_variants(model, tmp_path / "hf", ExportPlan.of(["fp32"]), VerificationSet(n_random=2, n_photos=2))
    assert [o.written for o in report.variants] == [True]
    with pytest.raises(TypeError, match=r"plan must be an ExportPlan \(ExportPlan.of\(\[...\]\) from variant names\), "
                                        "got list"):
        export_variants(model, tmp_path / "list", ["fp32"])  # type: ignore[arg-type]
    assert not (tmp_path / "list").exists()
