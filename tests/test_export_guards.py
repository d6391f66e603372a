"""Export guards found in review: the documented opset per model family, a zero head that would verify vacuously,
and an unavailable execution provider. Tiny models (width 64, depth 2, 32x32) keep it fast."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from typer.testing import CliRunner

from hub_vit.catalog import default_model_folder
from hub_vit.cli import _load_commands, app
from hub_vit.export import export_onnx
from hub_vit.export.onnx_export import graph_opset
from hub_vit.export.plan import ExportPlan, VerificationSet
from hub_vit.export.variants import export_variants
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

TINY = dict(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, img_size=32, num_classes=10,
            head_zeroinit=False)
FAMILIES = {
    "classic_tok": ViTSpec(**TINY, posemb="learn", pool_type="tok", posemb_on_cls=True),
    "simplevit_gap": ViTSpec(**TINY, posemb="sincos2d", pool_type="gap", rep_size=True),  # the default model's kind
    "map": ViTSpec(**TINY, pool_type="map"),
}
DOCUMENTED_OPSET = 17  # docs/export.md: model.onnx is opset 17 (TensorRT and older runtimes rely on it)


def _model(spec: ViTSpec) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(spec).eval()


def _ort_logits(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x})[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("with_attentions", [False, True], ids=["logits", "attentions"])
def test_dynamo_export_is_the_documented_opset(family: str, with_attentions: bool, tmp_path: Path) -> None:
    # SimpleViT graphs used to stay at opset 18: the exporter's down-conversion failed on the GAP ReduceMean
    model = _model(FAMILIES[family])
    path = export_onnx(model, tmp_path / "m.onnx", with_attentions=with_attentions)
    assert graph_opset(path) == DOCUMENTED_OPSET
    x = np.random.default_rng(0).uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_ort_logits(path, x), expected, atol=1e-4, rtol=0)


def test_dynamic_size_sincos_export_is_the_documented_opset(tmp_path: Path) -> None:
    model = _model(FAMILIES["simplevit_gap"])
    path = export_onnx(model, tmp_path / "m.onnx", dynamic_size=True)
    assert graph_opset(path) == DOCUMENTED_OPSET
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 48, 64)).astype(np.float32)  # not the 32x32 it was traced at
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_ort_logits(path, x), expected, atol=1e-4, rtol=0)


def test_explicit_newer_opset_is_kept(tmp_path: Path) -> None:
    path = export_onnx(_model(FAMILIES["simplevit_gap"]), tmp_path / "m.onnx", opset=18)
    assert graph_opset(path) == 18


def test_zero_head_is_refused_instead_of_passing_vacuously(tmp_path: Path) -> None:
    # every logit 0: max |diff| would be 0 and top-1 agreement 100 % by ties, whatever the graph computes
    model = _model(ViTSpec(**{**TINY, "head_zeroinit": True}, posemb="learn", pool_type="tok"))
    assert not model.head.weight.any()
    out = tmp_path / "exports"
    for n_random, n_photos in ((4, 4), (1, 0)):  # one image too: logits equal across images were the old test
        with pytest.raises(ValueError, match="logits do not depend on the input") as err:
            export_variants(model, out, ExportPlan(("fp32",)),
                            VerificationSet(n_random=n_random, n_photos=n_photos, seed=0))
        assert "head's weight is all zero" in str(err.value)
        assert not out.exists()
    with torch.no_grad():
        model.head.bias.fill_(0.5)  # a bias alone changes nothing: every image still gets the same logits
    with pytest.raises(ValueError, match="logits do not depend on the input"):
        export_variants(model, out, ExportPlan(("fp32",)), VerificationSet(n_random=1, n_photos=0, seed=0))


def test_a_head_with_any_weight_is_verified(tmp_path: Path) -> None:
    model = _model(ViTSpec(**{**TINY, "head_zeroinit": True}, posemb="learn", pool_type="tok"))
    with torch.no_grad():
        model.head.weight[0, 0] = 1e-3  # tiny, but the logits now depend on the image
    report = export_variants(model, tmp_path / "exports", ExportPlan(("fp32",), exporter="torchscript"),
                             VerificationSet(n_random=4, n_photos=4, seed=0))
    assert report.outcome("fp32").written


def test_cli_unavailable_provider_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    _load_commands()
    missing = "NoSuchExecutionProvider"
    assert missing not in ort.get_available_providers()
    out = tmp_path / "exports"
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "fp32",
                                      "--provider", missing])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert missing in text and "CPUExecutionProvider" in text  # names the bad one and the valid choices
    assert not out.exists()  # no report left behind


@pytest.mark.parametrize(("args", "message"), [
    # was "expected non-negative integer" (numpy) and "Overflow when unpacking long long" (torch), after the build
    (("--seed", "-1"), "--seed must be between 0 and 18446744073709551615 (2**64 - 1), got -1"),
    (("--seed", "18446744073709551616"), "--seed must be between 0 and 18446744073709551615 (2**64 - 1), got "
                                         "18446744073709551616"),
    # was one message for the three flags, naming none
    (("--photos", "-5"), "--photos must be an integer >= 0, got -5"),
    (("--calibration", "-1"), "--calibration must be an integer >= 0, got -1"),
    (("--random-inputs", "0", "--photos", "0"), "--random-inputs and --photos are both 0: the verification set would "
                                                 "be empty"),
])
def test_cli_verification_flags_are_refused_before_anything_is_built(tmp_path: Path, args: tuple[str, ...],
                                                                     message: str) -> None:
    _load_commands()
    out = tmp_path / "exports"
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "fp32",
                                      *args])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and f"error: {message}" in text and "exporting" not in text, text
    assert not out.exists()


@pytest.mark.parametrize("case", ["under-a-file", "pseudo-file-system"])
def test_an_out_that_cannot_be_made_is_refused_before_the_export(tmp_path: Path, case: str) -> None:
    # was: refused only after the whole export (minutes on a large model), by the final write
    afile = tmp_path / "afile"
    afile.write_text("x")
    out, message = {"under-a-file": (afile / "x", f"--out {str(afile / 'x')!r} cannot be a folder: {str(afile)!r} is "
                                                  "a file"),
                    # in the words rollout, classify and repository use
                    "pseudo-file-system": (Path("/proc/hub-vit-export"), "cannot create --out '/proc/hub-vit-export': "
                                                                         "No such file or directory in '/proc'")}[case]
    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and message in text, text
    assert "exporting" not in text  # nothing built
    assert not list(Path("/proc").glob(".hub-vit-probe-*"))


def test_an_out_named_like_an_onnx_file_is_refused_with_the_flags_that_name_the_file(tmp_path: Path) -> None:
    # was: `-o vit.onnx` (as torch.onnx.export takes it) made a folder vit.onnx/ holding model.onnx and four more files
    _load_commands()
    out = tmp_path / "vit.onnx"
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert (f"error: --out {str(out)!r} names an .onnx file, but export onnx writes a folder (model.onnx, its other "
            f"variants and model.export.json); give a folder, e.g. -o {str(tmp_path / 'vit')!r}, and --stem 'vit' to "
            "name the files vit.onnx ...") in text, text
    assert not out.exists() and "exporting" not in text
    out.mkdir()  # a folder that exists is the user's choice of name
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "fp32"])
    assert result.exit_code == 0, result.output
    assert (out / "model.onnx").is_file()


@pytest.mark.parametrize("blocked", ["model.onnx", "model.openvino-fp32.bin", "model.export.json"])
def test_a_folder_where_an_export_file_goes_is_named_before_anything_is_built(tmp_path: Path, blocked: str) -> None:
    # was: after the whole build, "[Errno 21] Is a directory" naming the hidden staging file it was moved from
    out = tmp_path / "exports"
    (out / blocked / "kept").mkdir(parents=True)
    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "fp32",
                                      "-v", "openvino-fp32"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert (f"error: {str(out / blocked)!r} is a folder where the export writes the file {blocked}: move it away or "
            "give another --out or --stem") in text, text
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [blocked, f"{blocked}/kept"]


def test_only_the_fp32_graph_is_required_when_no_variant_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # was: every default variant counted as named, so an int8-static graph that failed verification on a run's fresh
    # photo crops failed the export (exit 1 on one run, 0 on the next, for the same model and command)
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from hub_vit.export import registry
    from hub_vit.export.plan import ExportPlan

    plan = ExportPlan.of(None)
    assert plan.variants == registry.names(default=True)
    assert [name for name in plan.variants if plan.required(name)] == ["fp32"]
    named = ExportPlan.of(["fp32", "int8-static"])  # named: each must be written
    assert named.required("fp32") and named.required("int8-static")

    asked: list[object] = []
    real = ExportPlan.of.__func__

    def recording(cls, requested, *args, **kwargs):
        asked.append(requested)
        return real(cls, requested, *args, **kwargs)

    monkeypatch.setattr(ExportPlan, "of", classmethod(recording))
    _load_commands()
    for args in ([], ["-v", "int8-static"]):  # stopped at once by the missing model, after the plan
        result = CliRunner().invoke(app, ["export", "onnx", "/nonexistent/model", *args])
        assert result.exit_code == 2, result.output
    assert asked == [None, ["int8-static"]]


def test_the_fp32_graph_is_required_under_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # was: `all` marked fp32 optional like the variants it chose itself, so an fp32 graph that failed verification
    # exited 0 (report: "required": false) while the completed export replaced a good earlier one with nothing
    from hub_vit.export import criterion

    assert ExportPlan.of(["all"]).required("fp32") and ExportPlan.of(["all", "fp32"]).required("fp32")
    assert ExportPlan(("fp32", "optimized"), optional={"fp32", "optimized"}).optional == {"optimized"}
    out = tmp_path / "exports"
    export_variants(_model(FAMILIES["simplevit_gap"]), out, ExportPlan(("fp32",), exporter="torchscript"),
                    VerificationSet(n_random=4, n_photos=4, seed=0))  # the good earlier export
    monkeypatch.setattr(criterion, "FP32_MAX_ABS", -1.0)  # below any |diff|: every fp32 graph fails its bound
    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "all",
                                      "--random-inputs", "4", "--photos", "4", "--calibration", "4", "--seed", "0",
                                      "--exporter", "torchscript"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text  # as `-v fp32` or no --variant: a required variant was not written
    assert "not written: fp32 (reasons in the table and the report)" in text, text
    report = json.loads((out / "model.export.json").read_text())
    fp32 = next(v for v in report["variants"] if v["variant"] == "fp32")
    assert fp32["required"] and not fp32["written"] and fp32["error"].startswith("verification failed: ")
    # a completed export replaces the earlier one whatever failed, as for every required variant (docs/export.md)
    assert report["removed"] == ["model.onnx"] and not (out / "model.onnx").exists()


@pytest.mark.parametrize("case", ["a picture", "a missing .onnx file", "a missing folder"])
def test_a_source_that_is_no_model_is_told_what_export_takes(tmp_path: Path, case: str) -> None:
    # was: "give a model folder, an .onnx file, a TensorRT engine (.plan, .engine) or a weights file" (what serve
    # takes), for a command that refuses .onnx files and engines
    from PIL import Image

    picture = tmp_path / "image.jpg"
    Image.new("RGB", (8, 8)).save(picture)
    source = {"a picture": picture, "a missing .onnx file": tmp_path / "missing.onnx",
              "a missing folder": tmp_path / "no-such-model"}[case]
    _load_commands()
    out = tmp_path / "exports"
    result = CliRunner().invoke(app, ["export", "onnx", str(source), "-o", str(out)])
    text = " ".join(result.output.split())
    takes = "a model folder or a weights file (.safetensors, .npz, .pt, .pth, .bin)"
    said = f"{str(source)!r} is a file but not a model: give {takes}" if case == "a picture" else \
        f"model path {str(source)!r} does not exist (expected {takes})"
    assert result.exit_code == 2, text
    assert f"error: {said}" in text, text
    assert ".onnx file" not in text and "TensorRT engine" not in text, text
    assert not out.exists()


def test_a_model_without_a_classifier_head_exports(tmp_path: Path) -> None:
    # was: exit 2, "'logits' is written by a Gather node, not a Gemm/MatMul head; cannot find the pre-logits features
    # to verify", for a folder its own model card says exports to ONNX (`hub-vit convert --num-classes 0`)
    import json

    from hub_vit.folder import load_model_folder

    _load_commands()
    folder, out = tmp_path / "features", tmp_path / "exports"
    fixture = Path(__file__).parent / "fixtures" / "jax" / "big_vision" / "tiny_learn_map.npz"
    result = CliRunner().invoke(app, ["convert", str(fixture), "-o", str(folder), "--num-classes", "0"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["export", "onnx", str(folder), "-o", str(out), "-v", "fp32", "-v",
                                      "int8-dynamic", "--seed", "0"])
    assert result.exit_code == 0, result.output
    report = {v["variant"]: v for v in json.loads((out / "model.export.json").read_text())["variants"]}
    # its `logits` are its features: no classes, so top-1 agreement is reported, never judged
    assert report["int8-dynamic"]["verification"]["top1_scope"] == "reported only", report["int8-dynamic"]
    model = load_model_folder(folder)[0].eval()
    x = np.random.default_rng(0).random((2, 3, *model.spec.img_size), dtype=np.float32)
    with torch.no_grad():
        features = model(torch.from_numpy(x)).numpy()  # (2, width): the head is the identity
    assert features.shape == (2, model.spec.width)
    np.testing.assert_allclose(_ort_logits(out / "model.onnx", x), features, atol=1e-4)


def test_a_named_variant_this_host_cannot_build_is_refused_before_the_export(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # was: the whole export ran, then exit 1 with a folder holding only model.export.json ("bf16: not written - not
    # built: onnxruntime has no bfloat16 MatMul kernel ..."), where the docs call an unsupported precision bad input
    from hub_vit.export import registry

    monkeypatch.setattr(registry.Variant, "missing", lambda self, host=None: (
        ["onnxruntime has no bfloat16 MatMul kernel here"] if self.name == "bf16" else []))
    _load_commands()
    out = tmp_path / "exports"
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "bf16"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert "error: --variant bf16 cannot be built on this host: onnxruntime has no bfloat16 MatMul kernel here (this " \
           "host builds fp32, optimized," in text, text
    assert not out.exists()


def test_verification_counts_in_python_are_named_by_their_fields() -> None:
    # was: "--random-inputs must be >= 0" from the Python API (a flag its callers never typed), and 2.5 taken
    from hub_vit.export.plan import VerificationSet

    with pytest.raises(ValueError, match=r"n_random must be an integer >= 0, got 2.5"):
        VerificationSet(n_random=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_random and n_photos are both 0"):
        VerificationSet(n_random=0, n_photos=0)
