"""The export's GPU-only choices on the CPU: a host described with a GPU execution provider in its onnxruntime gets
the fp16 graph in `--variant all` (and only the CPU flavour's variants in `--cpu-variant auto`), and verification's
default session asks for CUDA first where onnxruntime has it; without one, fp16 is left out with the reason."""

from __future__ import annotations

import pytest

from hub_vit.export import registry, verify
from hub_vit.host import Host


def described(providers: list[str]) -> Host:
    host = Host(flags=["avx2", "fma"])
    host.__dict__["providers"] = providers  # what this onnxruntime build would report there (a cached property)
    host.__dict__["ort_bf16_matmul"] = False  # read from a session on those providers, which do not exist here
    return host


@pytest.mark.parametrize("gpu", ["CUDAExecutionProvider", "TensorrtExecutionProvider"])
def test_with_a_gpu_provider_all_builds_the_fp16_graph_and_auto_still_only_cpu_variants(gpu: str) -> None:
    host = described([gpu, "CPUExecutionProvider"])
    chosen, left_out = registry.worth_building(host)
    assert "fp16" in chosen and "fp16" not in left_out
    cpu_chosen, _ = registry.worth_building(host, cpu=True)
    assert "fp16" not in cpu_chosen  # the CPU flavour never serves it, whatever the host has


def test_without_a_gpu_provider_fp16_is_left_out_with_the_reason() -> None:
    chosen, left_out = registry.worth_building(described(["CPUExecutionProvider"]))
    assert "fp16" not in chosen
    assert left_out["fp16"] == ("this host has no GPU execution provider in onnxruntime (CUDA / TensorRT): not worth "
                                "building here (it is built when named)")


def test_the_default_session_takes_cuda_first_where_onnxruntime_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    opened: list[list[str]] = []

    class Session:
        def __init__(self, path: str, sess_options: object = None, providers: list[str] | None = None) -> None:
            opened.append(list(providers or []))

    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", Session)
    verify.ort_session("model.onnx")
    verify.ort_session("model.onnx", providers=["CPUExecutionProvider"])
    assert opened == [["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"]]
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(ValueError, match=r"execution provider\(s\) CUDAExecutionProvider not available in this "
                                         r"onnxruntime \(.*\); available: CPUExecutionProvider"):
        verify.ort_session("model.onnx", providers=["CUDAExecutionProvider"])
