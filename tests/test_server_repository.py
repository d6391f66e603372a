"""The generated Triton repository: configs parse as Triton's own ModelConfig, follow the model's metadata, and the
server-side transform equals timm's eval transform pixel for pixel (no server started here)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image

pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402

from hub_vit.resolve import ResolvedModel, resolve_model  # noqa: E402
from hub_vit.server.repository.config import preprocess_params  # noqa: E402
from hub_vit.server.repository.metadata import ServingMetadata, graph_model, serving_metadata  # noqa: E402
from hub_vit.server.repository.options import ServingOptions  # noqa: E402
from hub_vit.server.repository.writer import outdated_files, write_repository  # noqa: E402


def served_eval(**changes: object) -> dict[str, object]:
    """The served preprocessing's transform settings: Google's evaluation transform (the one data config's
    defaults) with `changes`, as `Preprocess.from_params` receives them from a generated config."""
    from hub_vit.data_config import GOOGLE_EVAL

    return {"interpolation": GOOGLE_EVAL.interpolation, "crop_mode": GOOGLE_EVAL.crop_mode, "mean": GOOGLE_EVAL.mean,
            "std": GOOGLE_EVAL.std, **changes}


def _parse(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory) -> Path:
    from hub_vit.export import export_onnx
    from hub_vit.model import VisionTransformer
    from hub_vit.variants import ViTSpec

    spec = ViTSpec(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, img_size=(48, 48), num_classes=7,
                   posemb="sincos2d", pool_type="gap")
    return export_onnx(VisionTransformer(spec).eval(), tmp_path_factory.mktemp("onnx") / "tiny.onnx")


@pytest.fixture(scope="module")
def meta() -> ServingMetadata:
    return ServingMetadata("tiny", tuple(f"kind {i}" for i in range(7)), (48, 48), crop_pct=0.9,
                           interpolation="bicubic")


def test_cpu_repository_configs_follow_metadata(tmp_path, onnx_file, meta):
    opts = ServingOptions(max_batch_size=8, preferred_batch_sizes=(2, 8), max_queue_size=3, top_k=3)
    repo = write_repository(graph_model(meta, onnx_file), tmp_path / "repo", opts)
    # one Python step decodes, classifies and ranks, behind the ensemble clients call (which counts overload)
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == ["vit", "vit_classifier"]
    ensemble, config = _parse(repo / "vit/config.pbtxt"), _parse(repo / "vit_classifier/config.pbtxt")
    assert ensemble.platform == "ensemble"
    (step,) = ensemble.ensemble_scheduling.step
    assert step.model_name == "vit_classifier" and dict(step.input_map) == {"image": "image"}
    assert set(step.output_map) == {"logits", "scores", "class_ids", "labels", "domain", "domain_score"}
    assert config.backend == "python" and not config.platform
    for model in (ensemble, config):
        assert [(i.name, i.data_type, list(i.dims)) for i in model.input] == [("image", mc.TYPE_STRING, [1])]
        assert {o.name: list(o.dims) for o in model.output} == {
            "logits": [7], "scores": [3], "class_ids": [3], "labels": [3], "domain": [1], "domain_score": [1]}
        assert model.max_batch_size == 8
    assert config.parameters["scale_size"].string_value == "[53, 53]"  # floor(48 / 0.9), timm's rule
    assert config.parameters["crop_size"].string_value == "[48, 48]"
    assert config.parameters["interpolation"].string_value == "bicubic"
    assert config.parameters["top_k"].string_value == "3"
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 8]
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 3 and policy.timeout_action == mc.ModelQueuePolicy.REJECT
    # a client's queue timeout applies only below a non-zero default (Triton's PolicyQueue::Enqueue)
    assert policy.allow_timeout_override and policy.default_timeout_microseconds > 0
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU and config.instance_group[0].count == 2
    # warm-ups on the encoded PNG at batch 1 and at max_batch_size (the first full batch must not pay ORT's first run)
    warmups = [(w.batch_size, w.inputs["image"].input_data_file) for w in config.model_warmup]
    assert warmups == [(1, "image"), (8, "image")]
    files = {p.name for p in (repo / "vit_classifier/1").iterdir()}
    # an .onnx file has no out-of-domain statistics: the step has the code, not domain.safetensors (unknown)
    assert files == {"model.py", "imageprep.py", "image_modes.py", "image_formats.py", "topk.py", "triton_errors.py",
                     "model.onnx", "labels.txt", "openvino_runtime.py", "protocol.py", "domain_outputs.py",
                     "domain_score.py", "stub_gc.py", "cgroup_limits.py"}
    assert config.parameters["domain_file"].string_value == "domain.safetensors"
    assert (repo / "vit_classifier/1/labels.txt").read_text().splitlines() == list(meta.labels)
    warm = (repo / "vit_classifier/warmup/image").read_bytes()
    assert int.from_bytes(warm[:4], "little") == len(warm) - 4 and warm[5:8] == b"PNG"


def test_a_top_k_past_the_classes_serves_them_all_and_the_manifest_says_so(tmp_path, onnx_file, meta):
    # was: configs answered 7 while the manifest (what `health` and a rewrite read back) recorded 11
    repo = write_repository(graph_model(meta, onnx_file), tmp_path / "repo", ServingOptions(top_k=11))
    config = _parse(repo / "vit_classifier/config.pbtxt")
    assert config.parameters["top_k"].string_value == "7"
    assert {o.name: list(o.dims) for o in config.output}["scores"] == [7]
    assert json.loads((repo / "hub_vit_repository.json").read_text())["options"]["top_k"] == 7
    assert outdated_files(repo) == []


def test_gpu_repository_uses_tensorrt_accelerator(tmp_path, onnx_file, meta):
    opts = ServingOptions(flavour="gpu", precision="FP16", queue_timeout_us=2500)
    repo = write_repository(graph_model(meta, onnx_file), tmp_path / "repo", opts)
    for step in ("preprocess", "classifier", "postprocess"):  # every batched step limits its own queue
        policy = _parse(repo / f"vit_{step}/config.pbtxt").dynamic_batching.default_queue_policy
        assert policy.default_timeout_microseconds == 2500 and policy.allow_timeout_override, step
    cls = _parse(repo / "vit_classifier/config.pbtxt")
    assert cls.backend == "onnxruntime" and cls.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    accel = cls.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accel.name == "tensorrt" and accel.parameters["precision_mode"] == "FP16"
    assert [o.name for o in cls.output] == ["logits"]
    steps = [s.model_name for s in _parse(repo / "vit/config.pbtxt").ensemble_scheduling.step]
    assert steps == ["vit_preprocess", "vit_classifier", "vit_postprocess"]
    pre = _parse(repo / "vit_preprocess/config.pbtxt")
    assert list(pre.output[0].dims) == [3, 48, 48] and pre.input[0].data_type == mc.TYPE_STRING
    assert pre.parameters["scale_size"].string_value == "[53, 53]"
    assert {p.name for p in (repo / "vit_preprocess/1").iterdir()} == {"model.py", "imageprep.py", "image_modes.py",
                                                                      "image_formats.py", "protocol.py",
                                                                      "triton_errors.py", "stub_gc.py"}
    assert {p.name for p in (repo / "vit_classifier/1").iterdir()} == {"model.onnx"}
    # the logits alone do not judge the domain: the postprocess step answers `unknown`, through the ensemble
    assert {p.name for p in (repo / "vit_postprocess/1").iterdir()} == {"model.py", "topk.py", "labels.txt",
                                                                       "protocol.py", "domain_outputs.py",
                                                                       "stub_gc.py"}
    top = _parse(repo / "vit/config.pbtxt").ensemble_scheduling.step[2]
    assert {"domain", "domain_score"} <= set(top.output_map)
    post = _parse(repo / "vit_postprocess/config.pbtxt")  # a queue policy and two instances: no batcher stall
    assert post.dynamic_batching.default_queue_policy.max_queue_size == opts.max_queue_size
    assert post.instance_group[0].count == 2 and post.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    with pytest.raises(ValueError, match="plan"):
        write_repository(graph_model(meta, onnx_file), tmp_path / "trt",
                         ServingOptions(flavour="gpu", gpu_backend="tensorrt"))
    assert not (tmp_path / "trt").exists()  # nothing half-written


@pytest.mark.parametrize("flavour", ["cpu", "gpu"])
def test_without_the_queue_policy_no_step_has_one_and_the_front_is_told(tmp_path, onnx_file, meta, flavour):
    """A queue policy turns off the batcher's prefetching in Triton's core (docs/serving.md, "The queue policy"):
    queue_policy=False writes none on any batched step; `takes_queue_timeouts` tells the front whether a request's
    own queue timeout would be applied (with the policy) or silently ignored (without)."""
    from hub_vit.server.repository.config import takes_queue_timeouts

    written = {}
    for policy in (True, False):
        repo = write_repository(graph_model(meta, onnx_file), tmp_path / f"{flavour}_{policy}",
                                ServingOptions(flavour=flavour, queue_policy=policy))
        batched = [c for c in map(_parse, sorted(repo.glob("*/config.pbtxt"))) if c.HasField("dynamic_batching")]
        assert batched and all(c.dynamic_batching.HasField("default_queue_policy") == policy for c in batched)
        assert takes_queue_timeouts(repo) == policy
        written[policy] = json.loads((repo / "hub_vit_repository.json").read_text())["options"]["queue_policy"]
    assert written == {True: True, False: False}
    assert not takes_queue_timeouts(tmp_path / "no such repository")  # no batched step: nothing applies a timeout


@pytest.mark.parametrize("bad, match", [
    (dict(flavour="tpu"), "valid: cpu, gpu"),
    # Triton applies a queue timeout through the policy: without one it would be dropped without a word
    (dict(queue_policy=False, queue_timeout_us=500), "queue_timeout_us=500 is applied by Triton's queue policy, which "
                                                     "queue_policy=False leaves out"),
    (dict(queue_policy="no"), "queue_policy must be True or False, got 'no'"),
    (dict(precision="INT4"), "valid: FP16, FP32"),
    (dict(max_batch_size=4, preferred_batch_sizes=(8,)), "outside 1..max_batch_size=4"),
    (dict(name="../x"), "letters, digits"),
    (dict(queue_timeout_us=-1), "0 or a positive number of microseconds"),
    (dict(queue_timeout_us=86_400_000_001), r"at most 86400000000 \(one day\)"),
])
def test_bad_options_name_the_choices(bad, match):
    with pytest.raises(ValueError, match=match):
        ServingOptions(**bad)


def test_existing_repository_is_not_replaced_silently(tmp_path, onnx_file, meta):
    source = graph_model(meta, onnx_file)
    write_repository(source, tmp_path / "repo")
    with pytest.raises(FileExistsError, match="overwrite"):
        write_repository(source, tmp_path / "repo")
    write_repository(source, tmp_path / "repo", ServingOptions(top_k=2), overwrite=True)
    assert "dims: 2" in (tmp_path / "repo/vit/config.pbtxt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # no temp leftovers
    other = tmp_path / "photos"  # --overwrite on a folder that is not a generated repository deletes nothing
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"jpeg")
    with pytest.raises(FileExistsError, match="not a repository written by `hub-vit repository`"):
        write_repository(source, other, overwrite=True)
    assert (other / "cat.jpg").read_bytes() == b"jpeg"
    with pytest.raises(FileExistsError, match="not a repository written by"):  # said without --overwrite too
        write_repository(source, other)


def test_overwrite_keeps_models_added_beside_the_generated_ones(tmp_path, onnx_file, meta):
    # was: `--overwrite` replaced the whole folder, deleting a model added by hand beside hub-vit's (one Triton
    # repository often holds several) without a word
    source = graph_model(meta, onnx_file)
    repo = write_repository(source, tmp_path / "repo")
    (repo / "handmade" / "1").mkdir(parents=True)
    (repo / "handmade" / "config.pbtxt").write_text('name: "handmade"\nbackend: "python"\n')
    (repo / "NOTES.md").write_text("notes")
    with pytest.raises(FileExistsError, match=r"also holds what `hub-vit repository` did not write \('NOTES.md', "
                                              r"'handmade/'\); replacing it would delete them"):
        write_repository(source, repo, ServingOptions(top_k=2), overwrite=True)
    assert (repo / "handmade" / "config.pbtxt").is_file() and (repo / "NOTES.md").read_text() == "notes"



@pytest.mark.parametrize("flavour", ["cpu", "gpu"])
def test_outdated_files_names_what_an_earlier_hub_vit_wrote(tmp_path, onnx_file, meta, flavour):
    import json

    opts = ServingOptions(flavour=flavour, max_batch_size=8, preferred_batch_sizes=(8,), top_k=3)
    repo = write_repository(graph_model(meta, onnx_file), tmp_path / "repo", opts)
    assert outdated_files(repo) == []  # what this version writes, read back from the manifest's model and options
    # As the hub-vit before per-request queue timeouts wrote it: no override in the queue policy, and a manifest
    # without that option or a version
    config = repo / "vit_classifier/config.pbtxt"
    config.write_text(config.read_text().replace("    default_timeout_microseconds: 86400000000\n", "")
                      .replace("    allow_timeout_override: true\n", ""))
    manifest = json.loads((repo / "hub_vit_repository.json").read_text())
    del manifest["hub_vit_version"], manifest["options"]["queue_timeout_us"]
    manifest["options"]["an_option_from_elsewhere"] = 1  # not one this version knows: left out, not an error
    (repo / "hub_vit_repository.json").write_text(json.dumps(manifest))
    assert outdated_files(repo) == ["vit_classifier/config.pbtxt"]
    step = "vit_classifier" if flavour == "cpu" else "vit_postprocess"
    (repo / step / "1/topk.py").unlink()
    with (repo / step / "1/model.py").open("a") as f:
        f.write("# edited\n")
    assert sorted(outdated_files(repo)) == sorted(["vit_classifier/config.pbtxt", f"{step}/1/model.py",
                                                   f"{step}/1/topk.py"])
    (repo / "hub_vit_repository.json").write_text("{not json")
    assert outdated_files(repo) is None and outdated_files(tmp_path) is None  # nothing to compare with


def test_a_refused_repository_leaves_no_folder_behind(tmp_path, onnx_file, meta):
    # the parents made for it (a/b) stayed after a refusal
    source = graph_model(meta, onnx_file)
    with pytest.raises(ValueError, match="serves a prebuilt engine"):
        write_repository(source, tmp_path / "a/b/repo", ServingOptions(flavour="gpu", gpu_backend="tensorrt"))
    assert list(tmp_path.iterdir()) == []
    # a max_pixels below the model's own resize would refuse every image, the warm-up's first (it did, as "0.0 MP")
    with pytest.raises(ValueError, match=r"max_pixels \(--max-pixels\) 2000 is less than the model's own resize "
                                         r"before the crop \(53x53 = 2809 pixels\)"):
        write_repository(source, tmp_path / "repo", ServingOptions(max_pixels=2000))
    assert list(tmp_path.iterdir()) == []
    write_repository(source, tmp_path / "repo", ServingOptions(max_pixels=2809))


def test_only_rgb_classifiers_are_served(tmp_path, meta):
    # a 1-channel model was written, then its warm-up failed in the stub (or tritonserver crashed with SIGSEGV)
    from hub_vit.export import export_onnx
    from hub_vit.model import VisionTransformer
    from hub_vit.variants import ViTSpec

    with pytest.raises(ValueError, match=r"model 'grey' takes 1-channel input \(1, 32, 32\); only RGB"):
        ServingMetadata.from_pretrained_cfg("grey", {"input_size": (1, 32, 32)}, ["a", "b"])
    with pytest.raises(ValueError, match="mean and std must have 3 values"):
        ServingMetadata("grey", ("a", "b"), (32, 32), mean=(0.5,), std=(0.5,))
    spec = ViTSpec(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, img_size=(32, 32), num_classes=2,
                   posemb="sincos2d", pool_type="gap", in_chans=1)
    onnx = export_onnx(VisionTransformer(spec).eval(), tmp_path / "grey.ONNX")  # the suffix in any case
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\) -> \(B, C\) graph, got \[\d+, 1, 32, 32\]"):
        resolve_model(onnx)


def test_an_onnx_file_without_inputs_is_named(tmp_path, onnx_file):
    # was a raw IndexError from the graph's first input
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Constant", [], ["logits"], value=helper.make_tensor(
        "c", TensorProto.FLOAT, [1, 2], [0.0, 1.0]))], "g", [], [helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, [1, 2])])
    onnx.save(helper.make_model(graph), tmp_path / "constant.onnx")
    with pytest.raises(ValueError, match="expected a classifier graph with one input"):
        resolve_model(tmp_path / "constant.onnx")
    # weights listed among the inputs as well (keep_initializers_as_inputs): still one input to feed
    model = onnx.load(onnx_file)
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer)
    onnx.save(model, tmp_path / "weights_as_inputs.onnx")
    source = resolve_model(tmp_path / "weights_as_inputs.onnx")
    assert serving_metadata(source).input_size == (48, 48) and source.num_classes == 7


def test_resolve_rejects_unknown_sources(tmp_path):
    with pytest.raises(ValueError, match="valid names: .*simplevit_s16"):
        resolve_model("no_such_model")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.onnx"))
    with pytest.raises(ValueError, match="not a hub-vit model folder"):
        resolve_model(tmp_path)


def test_exported_onnx_without_metadata_reads_the_graph(onnx_file):
    source = resolve_model(onnx_file)
    assert serving_metadata(source).input_size == (48, 48) and source.num_classes == 7


@pytest.mark.parametrize("crop_pct, interpolation", [(0.875, "bilinear"), (1.0, "bicubic"), (0.9, "bicubic")])
def test_server_transform_equals_timm_eval_transform(imageprep, photos, crop_pct, interpolation):
    """Golden: timm's own `create_transform` on the same decoded photo; our numpy/PIL path must match exactly."""
    from timm.data import create_transform, resolve_data_config

    cfg = {"input_size": (3, 64, 64), "crop_pct": crop_pct, "interpolation": interpolation,
           "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    meta = ServingMetadata.from_pretrained_cfg("t", cfg, None, 3)
    ours = imageprep.Preprocess.from_params(preprocess_params(meta, ServingOptions()))  # what the server reads
    timm_tf = create_transform(**resolve_data_config(pretrained_cfg=cfg), is_training=False)
    for array in photos.values():
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        expected = timm_tf(Image.fromarray(array)).numpy()
        np.testing.assert_array_equal(ours(buffer.getvalue()), expected)


def test_panorama_equals_timm_and_extreme_aspect_ratios_are_refused(imageprep, photos):
    """The shorter side is resized first, so a thin image grows: 2x200000 px (a 2 kB PNG) would become 248x24800000.
    A 10:1 panorama is still served exactly as timm transforms it; the thin one is refused from its header alone."""
    from timm.data import create_transform, resolve_data_config

    cfg = {"input_size": (3, 224, 224), "crop_pct": 0.9, "interpolation": "bicubic", "mean": (0.5,) * 3,
           "std": (0.5,) * 3}
    meta = ServingMetadata.from_pretrained_cfg("t", cfg, None, 3)
    ours = imageprep.Preprocess.from_params(preprocess_params(meta, ServingOptions()))
    panorama = Image.fromarray(photos["coffee"]).resize((2000, 200))
    buffer = io.BytesIO()
    panorama.save(buffer, format="PNG")
    expected = create_transform(**resolve_data_config(pretrained_cfg=cfg), is_training=False)(panorama).numpy()
    np.testing.assert_array_equal(ours(buffer.getvalue()), expected)

    thin = io.BytesIO()
    Image.new("RGB", (2, 200_000), (200, 10, 10)).save(thin, format="PNG")
    header_only = thin.getvalue()[:thin.getvalue().index(b"IDAT") + 4]  # no pixel data: refused on the header
    for data in (thin.getvalue(), header_only):
        with pytest.raises(imageprep.BadImageError, match=r"aspect ratio too extreme: a 2x200000 image would be "
                                                          r"resized to 248x24800000"):
            ours(data)


def test_exif_orientation_is_applied(imageprep, photos):
    ours = imageprep.Preprocess(crop_size=(64, 64), scale_size=(64, 64), **served_eval(crop_mode="squash"))
    upright = Image.fromarray(photos["chelsea"])
    exif = Image.Exif()
    exif[0x0112] = 3  # Orientation: rotated 180 degrees
    buffer = io.BytesIO()
    upright.rotate(180).save(buffer, format="PNG", exif=exif)
    plain = io.BytesIO()
    upright.save(plain, format="PNG")
    np.testing.assert_array_equal(ours(buffer.getvalue()), ours(plain.getvalue()))


def test_cli_repository_writes_gpu_flavour(tmp_path, onnx_file):
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    runner = CliRunner()
    result = runner.invoke(app, ["repository", str(tmp_path / "repo"), "--model", str(onnx_file), "--flavour", "gpu",
                                 "--max-batch-size", "32"])
    assert result.exit_code == 0, result.output
    assert _parse(tmp_path / "repo/vit_classifier/config.pbtxt").max_batch_size == 32
    result = runner.invoke(app, ["repository", str(tmp_path / "bad"), "--model", str(onnx_file), "--flavour", "tpu"])
    assert result.exit_code != 0 and "valid: cpu, gpu" in result.output
    assert not (tmp_path / "bad").exists()
    # options of the other flavour would do nothing: refused, not dropped without a word
    for flags, message in ((["--preprocess-instances", "4"], "the CPU flavour decodes in each classifier instance"),
                           (["--flavour", "gpu", "--no-spinning"], "the gpu flavour runs Triton's own")):
        result = runner.invoke(app, ["repository", str(tmp_path / "bad"), "--model", str(onnx_file), *flags])
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
        assert not (tmp_path / "bad").exists()


def test_cli_repository_of_a_registered_name_offline_exits_3(tmp_path, monkeypatch):
    # was 1 ("cannot load model"), as for weights that cannot be read: nothing asked is wrong, the host is offline
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    _load_commands()
    result = CliRunner().invoke(app, ["repository", str(tmp_path / "repo"), "--model", "vit_ti16.augreg_in21k_ft_in1k"])
    text = " ".join(result.output.split())
    assert result.exit_code == 3, text
    assert text.startswith("error: cannot load model 'vit_ti16.augreg_in21k_ft_in1k': cannot download https://"), text
    assert not (tmp_path / "repo").exists()


def test_cli_repository_defaults_are_serving_options_defaults(tmp_path, onnx_file):
    """The CLI reads its defaults from ServingOptions: with no options it writes the very configs the API writes."""
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, ["repository", str(tmp_path / "cli"), "--model", str(onnx_file)])
    assert result.exit_code == 0, result.output
    write_repository(resolve_model(str(onnx_file)), tmp_path / "api", ServingOptions())
    configs = sorted(p.relative_to(tmp_path / "api") for p in (tmp_path / "api").glob("*/config.pbtxt"))
    assert len(configs) == 2
    for config in configs:
        assert (tmp_path / "cli" / config).read_text() == (tmp_path / "api" / config).read_text(), config


def test_onnx_with_other_tensor_names_is_refused(tmp_path, meta):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", 3, 48, 48])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["b", 3, 48, 48])],
    )
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph), path)
    with pytest.raises(ValueError, match="must read 'pixel_values' and write 'logits'"):
        write_repository(graph_model(meta, path), tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_ort_threads_follow_the_models_compute(tmp_path):
    """A compute-bound ViT (Ti/16 at 224: 1.3 GMACs) gets every core per classifier instance and spinning threads;
    with two instances they take turns on the cores, because two spinning sessions starve each other. The tiny
    default model (2 MMACs) gets one share of the cores and never spins: its threads would starve the preprocessing
    stub (bench/bench_serve.py measured both). Explicit settings win."""
    import timm

    from hub_vit.catalog import default_model_folder

    def settings(source, name, **options):
        repo = write_repository(source, tmp_path / name, ServingOptions(**options))
        params = _parse(repo / "vit_classifier" / "config.pbtxt").parameters
        return tuple(params[key].string_value for key in ("intra_op_threads", "allow_spinning", "take_turns"))

    ti16 = ResolvedModel.from_module(timm.create_model("simplevit_ti16", num_classes=3), name="ti16",
                                   labels=["a", "b", "c"])
    digits = resolve_model(str(default_model_folder()))
    assert settings(ti16, "ti16") == ("all", "1", "1")
    assert settings(ti16, "ti16_one", classifier_instances=1) == ("all", "1", "0")
    assert settings(ti16, "ti16_still", ort_spinning=False) == ("all", "0", "0")
    assert settings(digits, "digits") == ("share", "0", "0")
    assert settings(digits, "digits_one", classifier_instances=1) == ("share", "0", "0")
    assert settings(digits, "forced", ort_spinning=True, intra_op_threads=3) == ("3", "1", "1")
    with pytest.raises(ValueError, match="intra_op_threads must be 0"):
        ServingOptions(intra_op_threads=-1)
