"""What `hub-vit export onnx` leaves in its output folder and says about it (environment review, findings 2, 3, 8):
an export replaces the earlier export's files as a set, prints user paths verbatim, and exports a `name.tag` with
that tag's weights, never silently with random ones. Tiny models (width 64, depth 2) keep it fast."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hub_vit.catalog import default_model_folder
from hub_vit.cli import _load_commands, app
from hub_vit.export import load_source
from hub_vit.export.export_folder import previous_export_files
from hub_vit.export.plan import ExportPlan, VerificationSet
from hub_vit.export.variants import export_variants
from hub_vit.model import VisionTransformer
from hub_vit.resolve import RANDOM_INIT
from hub_vit.variants import ViTSpec

QUICK = dict(check=VerificationSet(n_random=4, n_photos=4, seed=0))


def _model(img_size: int) -> VisionTransformer:
    torch.manual_seed(0)
    spec = ViTSpec(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, img_size=img_size, num_classes=10,
                   head_zeroinit=False, posemb="sincos2d", pool_type="gap")
    return VisionTransformer(spec).eval()


def _cli(*args: str) -> tuple[int, str]:
    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", *args])
    return result.exit_code, result.output


# ---------------------------------------------------------------------------------------- finding 2: stale variants
def test_reexport_removes_the_earlier_exports_graphs_and_nothing_else(tmp_path: Path) -> None:
    # a 32x32 export with an optimized graph, then a 64x64 model with fp32 only into the same folder: the old
    # model.optimized.onnx used to stay, unlisted, and `hub-vit repository` served it as the new model
    out = tmp_path / "exports"
    export_variants(_model(32), out, ExportPlan(("fp32", "optimized"), exporter="torchscript"), **QUICK)
    mine = {"notes.txt": "keep me", "model.mine.onnx": "not written by an export", "other.onnx": "x"}
    for name, text in mine.items():
        (out / name).write_text(text)
    other_stem = export_variants(_model(32), out, ExportPlan(("fp32",), exporter="torchscript", stem="small"),
                                 **QUICK)  # another export
    report = export_variants(_model(64), out, ExportPlan(("fp32",), exporter="torchscript"), **QUICK)
    assert not (out / "model.optimized.onnx").exists()
    assert report.removed == ["model.optimized.onnx"]
    assert json.loads((out / "model.export.json").read_text())["removed"] == ["model.optimized.onnx"]
    assert all((out / name).read_text() == text for name, text in mine.items())  # user files untouched
    assert Path(other_stem.report_file).is_file() and (out / "small.onnx").is_file()  # so is another stem's export
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("model.")) == [
        "model.export.json", "model.mine.onnx", "model.onnx"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_a_failed_reexport_keeps_the_earlier_export_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "exports"
    export_variants(_model(32), out, ExportPlan(("fp32", "optimized"), exporter="torchscript"), **QUICK)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    from hub_vit.export import variants

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C late in the run

    monkeypatch.setattr(variants, "environment", broken)  # after every graph is built, before anything is replaced
    with pytest.raises(KeyboardInterrupt):
        export_variants(_model(64), out, ExportPlan(("fp32",), exporter="torchscript"), **QUICK)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_engines_built_from_the_earlier_graphs_are_flagged_not_deleted(tmp_path: Path) -> None:
    out = tmp_path / "exports"
    export_variants(_model(32), out, ExportPlan(("fp32",), exporter="torchscript"), **QUICK)
    (out / "model.plan").write_bytes(b"engine")
    (out / "model.plan.json").write_text(json.dumps({"onnx": str(out / "model.onnx")}))
    report = export_variants(_model(64), out, ExportPlan(("fp32",), exporter="torchscript"), **QUICK)
    assert report.stale_engines == ["model.plan"] and report.removed == []
    assert (out / "model.plan").read_bytes() == b"engine"  # another command built it, at GPU cost


def test_only_export_files_count_even_if_the_report_lists_others(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "model.fp16.onnx").write_text("graph")
    (tmp_path / "model.export.json").write_text(json.dumps({"variants": [
        {"file": str(tmp_path / "notes.txt")}, {"file": "../model.x.onnx"}, {"file": str(tmp_path / "model.v2.onnx")},
        "junk", {"file": None}]}))
    (tmp_path / "model.v2.onnx").write_text("listed graph of a later version")
    # model.fp16.onnx is named like a variant but not listed (--stem model.fp16 wrote it, or a user): not this export's
    assert [p.name for p in previous_export_files(tmp_path, "model")] == ["model.export.json", "model.v2.onnx"]
    (tmp_path / "model.export.json").write_text("{not json")  # a broken report: only the report itself goes
    assert [p.name for p in previous_export_files(tmp_path, "model")] == ["model.export.json"]


@pytest.mark.parametrize("stem", ["../up", "sub/m", "", ".."])
def test_a_stem_with_a_folder_in_it_is_refused_before_anything_is_written(tmp_path: Path, stem: str) -> None:
    # "../up" reported up.onnx as written where no file was; "sub/m" failed on a missing staging path
    code, text = _cli(str(default_model_folder()), "-o", str(tmp_path / "out"), "-v", "fp32", "--stem", stem)
    assert code == 2 and "must be a plain file name" in " ".join(text.split()), text
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_named_by_the_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def full(*args: object, **kwargs: object) -> None:  # the exporter writing the graph into the staging folder
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / ".export-x1" / "model.onnx"))

    monkeypatch.setattr(torch.onnx, "export", full)
    code, text = _cli(str(default_model_folder()), "-o", str(tmp_path / "out"), "-v", "fp32", "--random-inputs", "4",
                      "--photos", "4", "--exporter", "torchscript")
    text = " ".join(text.split())
    assert code == 1 and f"cannot write the export to '{tmp_path / 'out'}': No space left on device" in text, text
    assert ".export-" not in text


def test_cli_names_the_removed_files(tmp_path: Path) -> None:
    out = tmp_path / "exports"
    export_variants(_model(32), out, ExportPlan(("fp32", "optimized"), exporter="torchscript"), **QUICK)
    code, text = _cli(str(default_model_folder()), "-o", str(out), "-v", "fp32", "--random-inputs", "4",
                      "--photos", "4", "--seed", "0", "--exporter", "torchscript")
    assert code == 0, text
    assert "removed from the earlier export in this folder (not part of this one): model.optimized.onnx" in text
    assert not (out / "model.optimized.onnx").exists()


# ------------------------------------------------------------------------------------------ finding 3: rich markup
def test_cli_prints_paths_with_brackets_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "[draft]" used to vanish from the output; "[/]" raised rich's MarkupError after the export was written
    monkeypatch.chdir(tmp_path)
    source = Path("cv [") / "]x"  # a model folder whose path holds "[/]"
    shutil.copytree(default_model_folder(), source)
    code, text = _cli(str(source), "-o", "[draft] v1", "-v", "fp32", "--random-inputs", "4", "--photos", "4",
                      "--seed", "0", "--exporter", "torchscript")
    assert code == 0, text
    assert "Traceback" not in text and "MarkupError" not in text
    assert "-> [draft] v1" in text and "report: [draft] v1/model.export.json" in text
    assert "cv [/]x/model.safetensors" in text  # the folder's weights path, in the "exporting" line
    assert Path("[draft] v1", "model.onnx").is_file()


# ------------------------------------------------------------------------------------- finding 8: name.tag weights
def test_a_tag_loads_its_published_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import timm

    built: list[tuple[str, bool]] = []

    def create_model(name: str, pretrained: bool = False, **kwargs: object) -> VisionTransformer:
        built.append((name, pretrained))
        model = _model(32)
        model.pretrained_cfg = {}
        return model

    monkeypatch.setattr(timm, "create_model", create_model)
    src = load_source("simplevit_s16.i1k_90ep")  # used to give random weights under the tag's name
    assert built == [("simplevit_s16.i1k_90ep", True)]
    assert src.weights == "pretrained i1k_90ep" and not src.random_weights
    src = load_source("simplevit_s16.i1k_90ep", pretrained=False)  # --random: asked for, so given
    assert src.random_weights and src.name == "simplevit_s16"
    assert len(built) == 1


def test_a_bare_name_without_bundled_weights_stays_random() -> None:
    src = load_source("simplevit_ti16")
    assert src.weights == RANDOM_INIT and src.random_weights
    with pytest.raises(ValueError, match="'simplevit_ti16' has no published weights.*`hub-vit export onnx` without "
                                         "--pretrained"):
        load_source("simplevit_ti16", pretrained=True)
    assert not load_source("simplevit_digits").random_weights  # shipped in the package: loaded by default
    for pretrained, flag in ((False, "--random"), (True, "--pretrained")):  # was ignored: the folder's own weights
        with pytest.raises(ValueError, match=f"{flag} chooses the weights of a registered name; .* is a model folder"):
            load_source(str(default_model_folder()), pretrained=pretrained)


def test_cli_tag_offline_is_a_one_line_error_and_writes_nothing(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    out = tmp_path / "exoff"
    code, text = _cli("simplevit_s16.i1k_90ep", "-o", str(out), "-v", "fp32")
    text = " ".join(text.split())
    assert code == 3, text  # this machine cannot download now (README, "Exit codes")
    assert "cannot download https://storage.googleapis.com/big_vision/vit_s16_i1k_90ep.npz" in text
    assert "Traceback" not in text and "random init" not in text
    assert not out.exists()


def test_cli_says_when_the_weights_are_random(tmp_path: Path) -> None:
    code, text = _cli("simplevit_digits", "--random", "-o", str(tmp_path / "o"), "-v", "fp32", "--random-inputs",
                      "4", "--photos", "4", "--seed", "0", "--exporter", "torchscript")
    text = " ".join(text.split())
    assert code == 0, text
    assert "weights: random init" in text and "with RANDOM weights (--random was given)" in text
