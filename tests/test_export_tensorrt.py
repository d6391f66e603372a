"""TensorRT export: a real engine on a GPU host with `tensorrt`; elsewhere the command must stop at once, clearly; and
the build and the verification on the CPU with TensorRT 10 and the GPU standing in (FakeTensorRT)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hub_vit.export import export_onnx
from hub_vit.export.tensorrt import BatchProfile, TensorRTUnavailable, require_tensorrt
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec


def _unavailable_reason() -> str | None:
    try:
        require_tensorrt()
    except TensorRTUnavailable as exc:
        return str(exc)
    return None


REASON = _unavailable_reason()


def _tiny_onnx(tmp_path: Path, *, dynamic_size: bool = False, with_attentions: bool = False) -> Path:
    torch.manual_seed(0)
    spec = ViTSpec(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, img_size=32, num_classes=10,
                   head_zeroinit=False, posemb="sincos2d", pool_type="gap", rep_size=True)
    return export_onnx(VisionTransformer(spec).eval(), tmp_path / "tiny.onnx", dynamic_size=dynamic_size,
                       with_attentions=with_attentions)


def _export_tensorrt(*args: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, ["export", "tensorrt", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.skipif(REASON is not None, reason=f"TensorRT unavailable: {REASON}")
@pytest.mark.parametrize("fp16", [True, False])
def test_engine_builds_verifies_and_records_metadata(tmp_path: Path, fp16: bool) -> None:
    from hub_vit.export.tensorrt import export_tensorrt, run_engine
    from hub_vit.export.verify import ort_outputs, ort_session, photo_batch

    onnx_path = _tiny_onnx(tmp_path)
    engine = tmp_path / "tiny.plan"
    info = export_tensorrt(onnx_path, engine, fp16=fp16, profile=BatchProfile(1, 4, 16), n_random=8, n_photos=24,
                           seed=0)
    meta = json.loads((tmp_path / "tiny.plan.json").read_text())
    assert meta["gpu"] == torch.cuda.get_device_name(0) and meta["tensorrt"]
    assert meta["profile"]["max"] == [16, 3, 32, 32] and meta["verification"]["passed"]
    assert info["precision"] == ("fp16" if fp16 else "fp32")
    for batch in (1, 5, 16):  # every batch in the profile range, against ONNX Runtime
        x = photo_batch((32, 32), batch, seed=batch)
        ref = ort_outputs(ort_session(onnx_path, ["CPUExecutionProvider"]), x)["logits"]
        got = run_engine(engine, x, batch)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= (5e-2 if fp16 else 1e-4)
        if not fp16:
            assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.skipif(REASON is None, reason="TensorRT is available here; the refusal path cannot be exercised")
def test_cli_stops_at_once_without_gpu_or_tensorrt(tmp_path: Path) -> None:
    onnx_path = _tiny_onnx(tmp_path)
    code, said = _export_tensorrt(str(onnx_path))
    assert code == 3 and "TensorRT export needs" in said, said
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.onnx"]


@pytest.mark.parametrize(("case", "named"), [
    ("missing file", "never-exported.onnx' does not exist; create it with `hub-vit export onnx`"),
    ("dynamic image size", "needs a fixed image size (export the ONNX without --dynamic-size)"),
    ("workspace 0", "--workspace-gib must be a positive number of GiB, got 0.0"),
    ("workspace nan", "--workspace-gib must be a positive number of GiB, got nan"),
    ("batches out of order", "batch profile must satisfy 1 <= min <= opt <= max, got min=9, opt=8, max=32"),
    ("engine path a folder", "is a directory; give a file name such as model.plan"),
    ("not an ONNX file", "tiny.onnx' is not a valid ONNX model (truncated or corrupt?)"),  # was a DecodeError traceback
    ("seed -1", "--seed must be between 0 and 18446744073709551615 (2**64 - 1), got -1"),  # was not checked at all
    ("engine under a file", "tiny.onnx/model.plan' cannot be written: "),  # was found when writing, after the build
    # a 2-byte text file protobuf reads as an empty model: was "has no input named 'pixel_values'"
    ("an empty model", "tiny.onnx' is not a valid ONNX model (truncated or corrupt?): it holds no graph"),
    ("the attention graph", "has outputs ['logits', 'attentions']: the TensorRT export takes the fp32 graph whose "
                            "only output is 'logits'"),
    ("an int8 graph", "is a quantized graph (ConvInteger, DynamicQuantizeLinear, MatMulInteger): the TensorRT export "
                      "takes the fp32 graph"),
])
def test_the_users_mistakes_are_named_before_tensorrt_is_looked_for(tmp_path: Path, case: str, named: str) -> None:
    """was: on a machine without TensorRT every mistake read "TensorRT export needs ...", and on one with it a
    negative workspace reached the builder and an engine path naming a folder failed after the build, uncaught."""
    attentions = case == "the attention graph"
    onnx_path = _tiny_onnx(tmp_path, dynamic_size=case == "dynamic image size", with_attentions=attentions)
    if case == "not an ONNX file":
        onnx_path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))  # a picture saved under the graph's name
    if case == "an empty model":
        onnx_path.write_bytes(b"x\n")
    if case == "an int8 graph":
        from onnxruntime.quantization import quantize_dynamic

        quantize_dynamic(onnx_path, tmp_path / "int8.onnx")
        (tmp_path / "int8.onnx").replace(onnx_path)
    args = {"missing file": [str(tmp_path / "never-exported.onnx")],
            "workspace 0": [str(onnx_path), "--workspace-gib", "0"],
            "workspace nan": [str(onnx_path), "--workspace-gib", "nan"],
            "batches out of order": [str(onnx_path), "--min-batch", "9"],
            "engine path a folder": [str(onnx_path), "-o", str(tmp_path)],
            "seed -1": [str(onnx_path), "--seed", "-1"],
            "engine under a file": [str(onnx_path), "-o", str(onnx_path / "model.plan")]}.get(case, [str(onnx_path)])
    code, said = _export_tensorrt(*args)
    assert code == 2 and named in said and "NVIDIA GPU" not in said, said  # not require_tensorrt's refusal
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.onnx"]


def test_the_export_report_is_named_as_such_with_the_graph_beside_it(tmp_path: Path) -> None:
    # was: a rich traceback, `ParseError: Message type "onnx.ModelProto" has no field named "source"`, exit 1 (onnx
    # reads a .json file as protobuf JSON), where a picture or an empty file got a one-line "not a valid ONNX model"
    from hub_vit.export.plan import ExportPlan, VerificationSet
    from hub_vit.export.variants import export_variants

    torch.manual_seed(0)
    spec = ViTSpec(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, img_size=32, num_classes=10,
                   head_zeroinit=False, posemb="sincos2d", pool_type="gap")
    out = tmp_path / "digits-onnx"
    report = export_variants(VisionTransformer(spec).eval(), out, ExportPlan(("fp32",), exporter="torchscript"),
                             VerificationSet(n_random=4, n_photos=4, seed=0))
    code, said = _export_tensorrt(report.report_file)
    assert code == 2 and "Traceback" not in said and "NVIDIA GPU" not in said, said
    assert (f"error: {report.report_file!r} is not a valid ONNX model: it is the report of `hub-vit export onnx`; "
            f"give the fp32 graph beside it: {str(out / 'model.onnx')!r}") in said, said
    renamed = tmp_path / "report.json"  # any protobuf JSON that is not a model: the generic answer
    renamed.write_text(Path(report.report_file).read_text())
    code, said = _export_tensorrt(str(renamed))
    assert code == 2 and "Traceback" not in said, said
    assert f"error: {str(renamed)!r} is not a valid ONNX model (truncated or corrupt?): Message type " \
           "\"onnx.ModelProto\" has no field named \"source\"" in said, said
    assert sorted(p.name for p in out.iterdir()) == ["model.export.json", "model.onnx"]  # no engine, no record


def test_batch_profile_is_validated() -> None:
    with pytest.raises(ValueError, match="min <= opt <= max"):
        BatchProfile(8, 4, 16)


@pytest.mark.parametrize("version", ["11.4.0.106", "9.3.0"])
def test_another_tensorrt_major_is_refused_before_anything_runs(monkeypatch, tmp_path: Path, version: str) -> None:
    """`pip install tensorrt` brings TensorRT 11 today, which removed the weakly typed FP16 build this export uses:
    an installed 11.x (or an old 9.x) must be a clear one-line refusal naming the version to install, not an
    AttributeError from deep inside the build."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__=version))
    with pytest.raises(TensorRTUnavailable, match=rf"TensorRT {version} is installed.*'tensorrt>=10,<11'"):
        require_tensorrt()
    code, said = _export_tensorrt(str(_tiny_onnx(tmp_path)))
    assert code == 3 and "is written for TensorRT 10" in said, said
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.onnx"]


# -- the build and the verification on the CPU, with TensorRT 10 and the GPU standing in ------------------------------
class FakeTensorRT:
    """The part of the `tensorrt` 10 API `build_engine` calls, recording it: a network of a MatMul, a LayerNorm and
    a Softmax layer; `parsed` / `built`: whether the parse and the build succeed."""

    __version__ = "10.13.0.35"

    class Logger:
        WARNING = "warning"

        def __init__(self, level: str) -> None:
            self.level = level

    class MemoryPoolType:
        WORKSPACE = "workspace"

    class BuilderFlag:
        FP16, OBEY_PRECISION_CONSTRAINTS, TF32 = "FP16", "OBEY_PRECISION_CONSTRAINTS", "TF32"

    class LayerType:
        MATRIX_MULTIPLY, NORMALIZATION, SOFTMAX = "MATRIX_MULTIPLY", "NORMALIZATION", "SOFTMAX"

    float32 = "float32"

    class Layer:
        def __init__(self, kind: str) -> None:
            self.type, self.precision, self.num_outputs, self.output_types = kind, None, 1, {}

        def set_output_type(self, index: int, dtype: str) -> None:
            self.output_types[index] = dtype

    def __init__(self, parsed: bool = True, built: bool = True) -> None:
        fake = self
        self.parsed, self.built = parsed, built
        self.layers = [self.Layer(kind) for kind in ("MATRIX_MULTIPLY", "NORMALIZATION", "SOFTMAX")]
        self.flags: list[str] = []
        self.cleared: list[str] = []
        self.pools: dict[str, int] = {}
        self.shapes: list[tuple] = []

        class Network:
            num_layers = len(self.layers)

            def get_layer(self, index: int) -> FakeTensorRT.Layer:
                return fake.layers[index]

        class Config:
            def set_memory_pool_limit(self, pool: str, size: int) -> None:
                fake.pools[pool] = size

            def set_flag(self, flag: str) -> None:
                fake.flags.append(flag)

            def clear_flag(self, flag: str) -> None:
                fake.cleared.append(flag)

            def add_optimization_profile(self, profile: object) -> None:
                pass

        class Profile:
            def set_shape(self, name: str, low: tuple, opt: tuple, high: tuple) -> None:
                fake.shapes.append((name, low, opt, high))

        class Builder:
            def __init__(self, logger: object) -> None:
                pass

            def create_network(self, flags: int) -> Network:
                return Network()

            def create_builder_config(self) -> Config:
                return Config()

            def create_optimization_profile(self) -> Profile:
                return Profile()

            def build_serialized_network(self, network: Network, config: Config) -> bytes | None:
                return b"serialized engine" if fake.built else None

        class OnnxParser:
            num_errors = 0 if parsed else 1

            def __init__(self, network: Network, logger: object) -> None:
                pass

            def parse_from_file(self, path: str) -> bool:
                return fake.parsed

            def get_error(self, index: int) -> str:
                return "In node 7 (Attention): unsupported operator"

        self.Builder, self.OnnxParser = Builder, OnnxParser


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """`install(fake)`: from then on a GPU as torch reports it, and `fake` as `tensorrt` (after the ONNX export, which
    looks for a real tensorrt module)."""
    import sys

    def install(fake: FakeTensorRT) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
        monkeypatch.setitem(sys.modules, "tensorrt", fake)

    return install


@pytest.mark.parametrize("fp16", [True, False])
def test_the_build_pins_layernorm_and_softmax_in_fp16_and_clears_tf32_in_fp32(stand_in_gpu, tmp_path, fp16):
    from hub_vit.export.tensorrt import build_engine

    trt = FakeTensorRT()
    onnx_path = _tiny_onnx(tmp_path)
    stand_in_gpu(trt)
    info = build_engine(onnx_path, tmp_path / "tiny.plan", fp16=fp16, profile=BatchProfile(1, 4, 16),
                        workspace_gib=2.0)
    assert (tmp_path / "tiny.plan").read_bytes() == b"serialized engine"
    assert trt.pools == {"workspace": 2 * 2**30}
    assert trt.shapes == [("pixel_values", (1, 3, 32, 32), (4, 3, 32, 32), (16, 3, 32, 32))]
    matmul, norm, softmax = trt.layers
    if fp16:
        assert trt.flags == ["FP16", "OBEY_PRECISION_CONSTRAINTS"] and trt.cleared == []
        assert [(layer.precision, layer.output_types) for layer in (norm, softmax)] == [("float32", {0: "float32"})] * 2
        assert (matmul.precision, matmul.output_types) == (None, {})  # everything else left to TensorRT
    else:
        assert trt.flags == [] and trt.cleared == ["TF32"]  # TF32 would miss the fp32 threshold
        assert all(layer.precision is None for layer in trt.layers)
    assert info["gpu"] == "NVIDIA H200" and info["compute_capability"] == "9.0" and info["tensorrt"] == "10.13.0.35"
    assert info["precision"] == ("fp16" if fp16 else "fp32")
    assert info["profile"] == {"input": "pixel_values", "min": [1, 3, 32, 32], "opt": [4, 3, 32, 32],
                               "max": [16, 3, 32, 32]}


@pytest.mark.parametrize(("parsed", "built", "message"), [
    (False, True, r"TensorRT could not parse .*tiny.onnx: In node 7 \(Attention\): unsupported operator"),
    (True, False, r"TensorRT failed to build an engine from .*tiny.onnx")])
def test_a_failed_parse_or_build_names_why_and_leaves_no_engine(stand_in_gpu, tmp_path, parsed, built, message):
    from hub_vit.export.tensorrt import build_engine

    onnx_path = _tiny_onnx(tmp_path)
    stand_in_gpu(FakeTensorRT(parsed=parsed, built=built))
    with pytest.raises(RuntimeError, match=message):
        build_engine(onnx_path, tmp_path / "tiny.plan")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.onnx"]


@pytest.mark.parametrize("agrees", [True, False])
def test_an_engine_is_kept_with_its_record_only_when_it_verifies(stand_in_gpu, tmp_path, monkeypatch, agrees):
    """The verification of `export_tensorrt` against ONNX Runtime, the engine's answers standing in: agreeing logits
    keep the engine and write its JSON record; others delete the engine and write nothing."""
    from hub_vit.export import tensorrt
    from hub_vit.export.verify import ort_outputs, ort_session

    onnx_path = _tiny_onnx(tmp_path)
    stand_in_gpu(FakeTensorRT())

    def run_engine(engine_path, x, batch_size):
        logits = ort_outputs(ort_session(onnx_path, ["CPUExecutionProvider"]), x)["logits"]
        return logits if agrees else logits[:, ::-1].copy()  # the classes reversed: top-1 wrong

    monkeypatch.setattr(tensorrt, "run_engine", run_engine)
    engine = tmp_path / "tiny.plan"
    if agrees:
        info = tensorrt.export_tensorrt(onnx_path, engine, n_random=4, n_photos=8, seed=0)
        record = json.loads((tmp_path / "tiny.plan.json").read_text())
        assert record["verification"]["passed"] and record["verification"]["reference"].startswith("onnxruntime")
        assert record == json.loads(json.dumps(info)) and engine.is_file()
    else:
        with pytest.raises(RuntimeError, match="TensorRT engine failed verification against ONNX Runtime"):
            tensorrt.export_tensorrt(onnx_path, engine, n_random=4, n_photos=8, seed=0)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.onnx"]
