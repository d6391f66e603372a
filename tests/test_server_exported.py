"""Serving what `hub-vit export` wrote: the exported file is served with the model's own transform and labels, and a
TensorRT engine's batch profile is checked against the repository before Triton would refuse to load it.

Before, `hub-vit export onnx` recorded neither, so `hub-vit serve model.onnx` of the shipped digits model cropped
87.5 % (the generic default; the model's own crop_pct is 1.0) and answered `class_7` instead of `7`, silently; and
`--gpu-backend tensorrt` could not serve an exported engine at all (no metadata beside it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from typer.testing import CliRunner

pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402

from hub_vit.catalog import default_model_folder  # noqa: E402
from hub_vit.cli import _load_commands, app  # noqa: E402
from hub_vit.resolve import resolve_model  # noqa: E402
from hub_vit.server.repository.metadata import serving_metadata  # noqa: E402
from hub_vit.server.repository.options import ServingOptions  # noqa: E402
from hub_vit.server.repository.writer import write_repository  # noqa: E402

DIGITS = [str(d) for d in range(10)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The shipped digits model through the real CLI: fp32 + int8-dynamic, the metadata goes into the report."""
    out = tmp_path_factory.mktemp("export") / "digits"
    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", str(default_model_folder()), "-o", str(out), "-v", "fp32",
                                      "-v", "int8-dynamic", "--random-inputs", "4", "--photos", "8", "--seed", "0"])
    assert result.exit_code == 0, result.output
    return out


def _fake_engine(folder: Path, onnx: Path, *, lo: int = 1, hi: int = 32, size: int = 32,
                 with_model: bool = False) -> Path:
    """Bytes standing in for a plan (the repository copies it, Triton would parse it) + the `<engine>.json` that
    `hub-vit export tensorrt` writes beside a real one."""
    folder.mkdir(parents=True, exist_ok=True)
    engine = folder / "model.plan"
    engine.write_bytes(b"not a real engine")
    info = {"tensorrt": "10.x", "gpu": "test", "precision": "fp16", "onnx": str(onnx),
            "profile": {"input": "pixel_values", "min": [lo, 3, size, size], "opt": [8, 3, size, size],
                        "max": [hi, 3, size, size]}}
    if with_model:
        info["model"] = json.loads((onnx.parent / "model.export.json").read_text())["model"]
    (folder / "model.plan.json").write_text(json.dumps(info))
    return engine


@pytest.mark.parametrize("file", ["model.onnx", "model.int8-dynamic.onnx"])
def test_exported_onnx_is_served_with_the_models_transform_and_labels(exported, file):
    meta = serving_metadata(resolve_model(exported / file))
    assert meta.labels == tuple(DIGITS)
    assert (meta.crop_pct, meta.input_size, meta.interpolation) == (1.0, (32, 32), "bilinear")


def test_a_bare_onnx_file_still_falls_back_to_the_graph(exported, tmp_path):
    bare = tmp_path / "model.onnx"
    bare.write_bytes((exported / "model.onnx").read_bytes())
    meta = serving_metadata(resolve_model(bare))
    assert meta.labels[0] == "class_0" and meta.input_size == (32, 32)  # no report beside it: generic, as documented


@pytest.mark.parametrize("with_model", [False, True], ids=["via-onnx-report", "own-json"])
def test_exported_engine_serves_with_metadata_and_checked_profile(exported, tmp_path, with_model):
    engine = _fake_engine(tmp_path / ("a" if with_model else "b"), exported / "model.onnx", with_model=with_model)
    source = resolve_model(engine)
    assert serving_metadata(source).labels == tuple(DIGITS) and source.data.crop_pct == 1.0
    opts = ServingOptions(flavour="gpu", gpu_backend="tensorrt", max_batch_size=32, preferred_batch_sizes=(8, 32))
    repo = write_repository(source, tmp_path / "repo", opts)
    config = text_format.Parse((repo / "vit_classifier/config.pbtxt").read_text(), mc.ModelConfig())
    assert config.backend == "tensorrt" and config.max_batch_size == 32
    manifest = json.loads((repo / "hub_vit_repository.json").read_text())
    assert manifest["engine"]["precision"] == "fp16"  # the engine's own, not the (unused) accelerator option


@pytest.mark.parametrize("profile, options, match", [
    (dict(hi=8), dict(max_batch_size=16), r"at most 8 images per batch.*--max-batch-size 8"),
    (dict(lo=2), dict(), r"batches of 2 to 32 images; Triton sends batches from 1"),
    (dict(size=64), dict(), r"takes 64x64 images, but the model's metadata says 32x32"),
])
def test_engine_profile_that_triton_would_refuse_is_named(exported, tmp_path, profile, options, match):
    engine = _fake_engine(tmp_path / "e", exported / "model.onnx", **profile)
    with pytest.raises(ValueError, match=match):
        write_repository(resolve_model(engine), tmp_path / "repo", ServingOptions(flavour="gpu", gpu_backend="tensorrt",
                                                                            **options))
    assert not (tmp_path / "repo").exists()


def test_engine_without_metadata_says_what_is_missing(tmp_path):
    engine = tmp_path / "model.plan"
    engine.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"model\.plan\.json.*hub-vit export tensorrt"):
        resolve_model(engine)


def test_precision_is_refused_for_a_prebuilt_engine(exported, tmp_path):
    engine = _fake_engine(tmp_path / "e", exported / "model.onnx")
    _load_commands()
    result = CliRunner().invoke(app, ["repository", str(tmp_path / "repo"), "--flavour", "gpu", "--gpu-backend",
                                      "tensorrt", "--precision", "FP32", "--model", str(engine)])
    assert result.exit_code == 2 and "fixed when it is built" in " ".join(result.output.split())
    assert not (tmp_path / "repo").exists()
    result = CliRunner().invoke(app, ["repository", str(tmp_path / "repo"), "--flavour", "gpu", "--gpu-backend",
                                      "tensorrt", "--max-batch-size", "32", "--preprocess-instances", "4",
                                      "--model", str(engine)])
    assert result.exit_code == 0, result.output
    pre = text_format.Parse((tmp_path / "repo/vit_preprocess/config.pbtxt").read_text(), mc.ModelConfig())
    assert pre.instance_group[0].count == 4


def test_export_from_the_registered_name_keeps_the_labels(tmp_path):
    """`hub-vit export onnx simplevit_digits` (the name, not the folder) recorded no labels: served as class_N."""
    _load_commands()
    result = CliRunner().invoke(app, ["export", "onnx", "simplevit_digits", "-o", str(tmp_path), "-v", "fp32",
                                      "--random-inputs", "2", "--photos", "4", "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert serving_metadata(resolve_model(tmp_path / "model.onnx")).labels == tuple(DIGITS)


def test_a_graph_with_a_fixed_batch_is_named_before_triton_would_crash_on_it(tmp_path):
    """`hub-vit export onnx --no-dynamic-batch` then `hub-vit serve`: the warmup at max_batch_size 16 failed inside
    tritonserver, which died with SIGSEGV, the reason only in its log. Now refused with the way out, and served (for
    real) with that way out: max_batch_size 1."""
    import onnx

    from hub_vit.export.onnx_export import export_onnx
    from hub_vit.folder import load_model_folder
    from hub_vit.server.client.classifier import Classifier
    from tests.served import start_server

    model, _ = load_model_folder(default_model_folder())
    graph = export_onnx(model, tmp_path / "fixed" / "model.onnx", dynamic_batch=False)
    assert onnx.load(str(graph)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1  # really fixed
    (graph.parent / "labels.txt").write_text("\n".join(DIGITS) + "\n")
    with pytest.raises(ValueError, match=r"takes batches of exactly 1 image\(s\) .* max_batch_size 16: pass "
                                         r"--max-batch-size 1, or export it again without --no-dynamic-batch"):
        write_repository(resolve_model(graph), tmp_path / "refused", ServingOptions())
    assert not (tmp_path / "refused").exists()
    repo = write_repository(resolve_model(graph), tmp_path / "repo", ServingOptions(max_batch_size=1,
                                                                               preferred_batch_sizes=(1,)))
    sample = default_model_folder() / "samples" / "7_0.png"
    with start_server(repo) as server, Classifier(server.http_url) as client:
        assert [p.labels[0] for p in client.classify([sample, sample])] == ["7", "7"]  # split into 2 requests


def test_a_graph_of_another_model_than_its_metadata_is_refused(exported, tmp_path):
    """A graph left beside metadata of another model (an earlier export's file next to a newer report) crashed the
    warmup when the image size differed, and would have answered with the wrong labels when only classes did."""
    from hub_vit.server.repository.metadata import ServingMetadata
    from hub_vit.server.repository.writer import check_graph

    graph = exported / "model.onnx"  # 32x32 images, 10 classes
    with pytest.raises(ValueError, match=r"takes 32x32 images, the metadata says 224x224: they describe different"):
        check_graph(graph, 16, ServingMetadata(name="x", labels=tuple(DIGITS), input_size=(224, 224)))
    with pytest.raises(ValueError, match=r"the graph has 10 classes, the metadata 3 labels"):
        check_graph(graph, 16, ServingMetadata(name="x", labels=("a", "b", "c"), input_size=(32, 32)))
    check_graph(graph, 16, ServingMetadata(name="x", labels=tuple(DIGITS), input_size=(32, 32)))
