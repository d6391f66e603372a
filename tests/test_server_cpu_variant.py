"""The CPU flavour's graph: the fastest variant on this host that passes the verification criterion (`auto`), or
one forced by name, recorded in the repository manifest; a variant that fails the criterion is never served.

The digits model keeps this file fast: `auto` is built once (it times the candidates), the rest force a variant.
The served answers are checked against the fp32 PyTorch model with the criterion's bounds (issue #33): per image,
cosine >= 0.99 and relative error <= 0.15 of the logits, and top-1 agreement >= 99 % on held-out digits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from hub_vit.export import criterion, quantize
from hub_vit.export.plan import VerificationSet
from hub_vit.host import Host
from hub_vit.resolve import resolve_model as resolve
from hub_vit.server.repository import cpu_variant
from hub_vit.server.repository.manifest import cpu_variant_line
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import MANIFEST, write_repository

TRAINED = VerificationSet(n_random=8, n_photos=24, seed=0, trained=True)
INT8_OPS = {"MatMulInteger", "DynamicQuantizeLinear", "QAttention", "DynamicQuantizeMatMul"}


@pytest.fixture(autouse=True)
def _onnx_runtime_candidates_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OpenVINO candidates are tested in tests/test_openvino_variants.py; here `auto` chooses among the ONNX Runtime
    ones, as on a host without OpenVINO (and builds them in seconds)."""
    host = Host()
    host.openvino_missing = "tested in tests/test_openvino_variants.py"
    monkeypatch.setattr(cpu_variant, "this_host", lambda: host)


def _manifest(repo: Path) -> dict:
    return json.loads((repo / MANIFEST).read_text())


def _ops(repo: Path) -> set[str]:
    graph = onnx.load(str(repo / "vit_classifier" / "1" / "model.onnx"), load_external_data=False).graph
    return {node.op_type for node in graph.node}


def _cli(*args: str):
    from hub_vit.cli import _load_commands, app

    _load_commands()
    return CliRunner().invoke(app, list(args))


def _damaged_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8-dynamic built from a graph whose patch embedding is off by noise: fails the criterion by a wide margin."""
    from onnx import numpy_helper

    real = quantize.quantize_int8_dynamic

    def damaged(src: Path, dst: Path, workdir: Path, **options: bool) -> None:
        proto = onnx.load(str(src))
        target = next(t for t in proto.graph.initializer if t.name.endswith("patch_embed.proj.weight"))
        weights = numpy_helper.to_array(target)
        noise = 0.5 * weights.std() * np.random.default_rng(0).standard_normal(weights.shape)
        target.CopyFrom(numpy_helper.from_array((weights + noise).astype(weights.dtype), target.name))
        onnx.save(proto, str(Path(workdir) / "damaged.onnx"))
        real(Path(workdir) / "damaged.onnx", dst, workdir, **options)

    monkeypatch.setattr(quantize, "quantize_int8_dynamic", damaged)


def _fastest(name: str):
    """Timings in which `name` is ten times faster than every other graph (the real ones are load-dependent)."""
    return lambda graphs, *args: {n: (0.001 if n == name else 0.01) for n in graphs}


def test_auto_keeps_fp32_for_a_tiny_model_without_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_variant, "select", lambda *args, **kwargs: pytest.fail("measured a tiny model"))
    repo = write_repository(resolve(None), tmp_path / "repo", ServingOptions(cpu_variant="auto"))
    recorded = _manifest(repo)["cpu_variant"]
    assert recorded["variant"] == "fp32" and recorded["reason"].startswith("a tiny model (< 0.1 GMACs per image)")
    assert not _ops(repo) & INT8_OPS


def test_auto_selection_is_recorded_in_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hub_vit.server.repository import writer as repository

    monkeypatch.setattr(repository, "compute_bound_model", lambda source: True)  # the digits model taken as a big one
    repo = write_repository(resolve(None), tmp_path / "repo", ServingOptions(cpu_variant="auto"))
    recorded = _manifest(repo)["cpu_variant"]
    assert recorded["requested"] == "auto" and recorded["isa_flags"] == cpu_variant.this_host().flags
    rows = {row["variant"]: row for row in recorded["candidates"]}
    assert list(rows) == cpu_variant.candidates()[0] and not any(name.startswith("openvino") for name in rows)
    timed = {name: row["images_per_s"] for name, row in rows.items() if row["verified"]}
    assert "fp32" in timed and all(row["verification"] for row in rows.values() if row["verified"])
    assert recorded["variant"] == max(timed, key=timed.get)
    assert recorded["reason"].startswith(f"fastest verified of {', '.join(timed)} at batch 8")
    for row in rows.values():  # the rejected ones say why
        assert row["verified"] == (row["error"] == "")
    assert cpu_variant_line(repo) == f"CPU variant: {recorded['variant']} ({recorded['reason']})"
    assert not [p for p in (repo / "vit_classifier" / "1").iterdir() if p.name.startswith(".")]  # no leftovers
    proto = onnx.load(str(repo / "vit_classifier" / "1" / "model.onnx"), load_external_data=False)
    # the verification's pre_logits dropped; the out-of-domain score's features kept (the shipped model is calibrated)
    assert [o.name for o in proto.graph.output] == ["logits", "token_means"]


def test_a_variant_failing_the_criterion_is_never_selected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = resolve(None).module
    monkeypatch.setattr(cpu_variant, "_time_graphs", _fastest("int8-dynamic"))
    graph, selection, tmp = cpu_variant.select(module, "auto", TRAINED, batch=4, work_dir=tmp_path)
    tmp.cleanup()
    assert selection.variant == "int8-dynamic"  # the control: verified and fastest, so chosen
    _damaged_int8(monkeypatch)
    graph, selection, tmp = cpu_variant.select(module, "auto", TRAINED, batch=4, work_dir=tmp_path)
    tmp.cleanup()
    assert selection.variant != "int8-dynamic"
    row = next(r for r in selection.candidates if r["variant"] == "int8-dynamic")
    assert not row["verified"] and "images_per_s" not in row
    assert "below the bound 0.99" in row["error"] and "not eligible: int8-dynamic" in selection.reason


def test_a_forced_variant_failing_the_criterion_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _damaged_int8(monkeypatch)
    with pytest.raises(ValueError, match=r"cpu_variant 'int8-dynamic' is not served: verification failed: .*"
                                         r"is 0\.\d+ below the bound 0\.99"):
        write_repository(resolve(None), tmp_path / "repo", ServingOptions(cpu_variant="int8-dynamic"))
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_forced_variant_this_host_cannot_build_is_refused_before_the_export(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # was: the variant export ran (27 s for the digits model), then "cpu_variant 'bf16' is not served: not built: ..."
    from hub_vit.export import registry, variants

    monkeypatch.setattr(registry.Variant, "missing", lambda self, host=None: (
        ["onnxruntime has no bfloat16 MatMul kernel here"] if self.name == "bf16" else []))
    monkeypatch.setattr(variants, "export_variants", lambda *args, **kwargs: pytest.fail("exported"))
    with pytest.raises(ValueError, match=r"--cpu-variant bf16 cannot be built on this host: onnxruntime has no "
                                         r"bfloat16 MatMul kernel here \(this host builds fp32, optimized, "):
        write_repository(resolve(None), tmp_path / "repo", ServingOptions(cpu_variant="bf16"))
    assert list(tmp_path.iterdir()) == []


def test_bad_variant_names_and_combinations_are_refused(tmp_path: Path) -> None:
    valid = ("auto, fp32, optimized, int8-dynamic, int8-dynamic-s8, int8-static, bf16, openvino-fp32, openvino-bf16, "
             "openvino-int8, openvino-int8-dynamic")
    with pytest.raises(ValueError, match=f"unknown cpu_variant 'int4'; valid choices: {valid}"):
        ServingOptions(cpu_variant="int4")
    with pytest.raises(ValueError, match="cpu_variant 'int8-static' chooses the CPU flavour's graph; flavour 'torch'"):
        ServingOptions(flavour="torch", cpu_variant="int8-static")
    from hub_vit.server.runtime.launcher import free_port

    ports = [flag for name in ("--http-port", "--grpc-port", "--metrics-port") for flag in (name, str(free_port()))]
    for command in ("repository", "serve"):  # serve: refused before the model is loaded
        result = _cli(command, str(tmp_path / "repo"), "--cpu-variant", "int4") if command == "repository" else \
            _cli(command, "--cpu-variant", "int4", *ports)
        assert result.exit_code == 2, result.output
        assert f"unknown --cpu-variant 'int4'; valid choices: {valid}" in " ".join(result.output.split())
    assert not (tmp_path / "repo").exists()
    tmp_path.joinpath("existing").mkdir()
    result = _cli("serve", "--repository", str(tmp_path / "existing"), "--cpu-variant", "int8-static", *ports)
    assert result.exit_code == 2
    assert "--cpu-variant chooses the graph of the repository serve builds; --repository serves one as it was " \
           "written" in " ".join(result.output.split())


def test_an_exported_file_is_served_as_given_or_refused_for_a_variant(tmp_path: Path) -> None:
    from hub_vit.export.plan import ExportPlan, VerificationSet
    from hub_vit.export.variants import export_variants

    module = resolve(None).module
    export_variants(module, tmp_path / "exp", ExportPlan(("fp32",)), VerificationSet(n_random=2, n_photos=4, seed=0))
    source = resolve(tmp_path / "exp" / "model.onnx")
    repo = write_repository(source, tmp_path / "repo", ServingOptions(cpu_variant="auto"))
    assert _manifest(repo)["cpu_variant"]["variant"] == "as given"
    with pytest.raises(ValueError, match="cpu_variant 'int8-static' is built and verified from the model, but .* "
                                         "is an exported file"):
        write_repository(source, tmp_path / "repo2", ServingOptions(cpu_variant="int8-static"))


@pytest.mark.triton
@pytest.mark.slow
def test_forced_int8_is_served_within_the_criterion_of_fp32(tmp_path: Path) -> None:
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder
    from tests.served import digit_pngs, fp32_logits, served_logits

    result = _cli("repository", str(tmp_path / "repo"), "--cpu-variant", "int8-dynamic")
    assert result.exit_code == 0, result.output
    assert "CPU variant: int8-dynamic (forced (--cpu-variant int8-dynamic); passes the verification criterion)" \
        in " ".join(result.output.split())
    repo = tmp_path / "repo"
    assert _ops(repo) & INT8_OPS  # really the int8 graph
    payloads = digit_pngs(48)
    served = served_logits(repo, payloads)
    model, info = load_model_folder(default_model_folder())
    fp32 = fp32_logits(model, info.pretrained_cfg, payloads)
    cos, rel = criterion.per_image(fp32, served)
    assert cos.min() >= 0.99 and rel.max() <= 0.15, (cos.min(), rel.max())
    assert rel.max() > 1e-4  # int8 really answered, not an fp32 graph
    assert (fp32.argmax(1) == served.argmax(1)).mean() >= 0.99


def test_the_command_lines_list_every_registered_variant() -> None:
    """The choices and help come from the registry (hub_vit/export/registry.py): serve's and repository's
    --cpu-variant name every variant the CPU flavour serves, export's --variant every variant."""
    from hub_vit.cli import _load_commands, app
    from hub_vit.export import registry

    _load_commands()
    for command, names in ((["serve"], registry.names(cpu=True)), (["repository"], registry.names(cpu=True)),
                           (["export", "onnx"], registry.names())):
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})  # no name wrapped at a "-"
        text = " ".join(result.output.replace("│", " ").split())
        assert result.exit_code == 0, result.output
        for name in names:
            variant = registry.get(name)
            assert f"{name} ({registry.RUNTIMES[variant.runtime]} {variant.precision})" in text, (command, name)


def test_serve_says_why_a_first_start_can_take_minutes(tmp_path: Path) -> None:
    # `auto` on a compute-bound model builds, verifies and times its candidates (100 s for a ViT-S on 2 cores), under a
    # spinner that said only "exporting the model and writing the repository"
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.cli.serve_build import builds_variants
    from hub_vit.cli.serve_run import BUILD_STATUS, VARIANTS_NOTE, build_status
    from hub_vit.folder import save_model_folder

    ti16 = resolve(str(save_model_folder(VisionTransformer(ViTSpec.from_variant("Ti/16", num_classes=3)),
                                         tmp_path / "ti16", labels=["a", "b", "c"])))
    auto = ServingOptions(cpu_variant="auto")  # serve's default
    assert builds_variants(ti16, auto)  # 1.26 GMACs per image
    assert not builds_variants(ti16, ServingOptions(cpu_variant="fp32"))  # nothing to build
    assert not builds_variants(ti16, ServingOptions(flavour="torch"))
    assert not builds_variants(resolve(None), auto)  # the digits model: fp32 without measuring
    assert (build_status(True), build_status(False)) == (BUILD_STATUS + VARIANTS_NOTE, BUILD_STATUS)
