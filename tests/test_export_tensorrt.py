"""TensorRT export: a real engine on a GPU host with `tensorrt`; elsewhere the command must stop at once, clearly."""

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


def _tiny_onnx(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    spec = ViTSpec(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, img_size=32, num_classes=10,
                   head_zeroinit=False, posemb="sincos2d", pool_type="gap", rep_size=True)
    return export_onnx(VisionTransformer(spec).eval(), tmp_path / "tiny.onnx")


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
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    missing = tmp_path / "never-exported.onnx"  # the check comes first: no file is even looked at
    result = CliRunner().invoke(app, ["export", "tensorrt", str(missing)])
    assert result.exit_code == 3
    assert "TensorRT export needs" in result.output
    assert list(tmp_path.iterdir()) == []


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

    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__=version))
    with pytest.raises(TensorRTUnavailable, match=rf"TensorRT {version} is installed.*'tensorrt>=10,<11'"):
        require_tensorrt()
    _load_commands()
    result = CliRunner().invoke(app, ["export", "tensorrt", str(tmp_path / "model.onnx")])
    assert result.exit_code == 3 and "is written for TensorRT 10" in " ".join(result.output.split()), result.output
    assert list(tmp_path.iterdir()) == []
