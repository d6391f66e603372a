"""Attention rollout served by the real tritonserver (CPU and torch flavours), against `hub_vit.explain` in process.

One server holds six generated repositories side by side: the shipped digits model (SimpleViT: GAP readout), tiny
random class-token and MAP models, the class-token model again built with `explain=False`, and the digits and
class-token models in the torch flavour on the CPU (`*_torch`: the model run in PyTorch, attentions from the model).
Real images (the digits samples, scikit-image's photographs), both protocols, sync and async clients,
`hub-vit classify --explain`.

Tolerance: served and in-process maps agree to 1e-5 absolute (maps are relevance mass summing to at most 1; the
attention probabilities come from ONNX Runtime on the server and from PyTorch in process, equal to float32 rounding).
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http
from PIL import Image
from tritonclient.utils import InferenceServerException
from typer.testing import CliRunner

from hub_vit.resolve import ResolvedModel, resolve_model
from hub_vit.server.client.classifier import AsyncClassifier, Classifier
from hub_vit.server.client.errors import NoExplanation
from hub_vit.server.client.messages import explain_parameters
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import template_dir, write_repository
from hub_vit.server.runtime.launcher import TritonServer, free_port
from tests.served import start_server

pytestmark = [pytest.mark.triton, pytest.mark.slow]
PROTOCOLS = ("http", "grpc")
ATOL = 1e-5
TINY = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, img_size=(48, 48), num_classes=7)
CFG = {"input_size": (3, 48, 48), "crop_pct": 0.875, "interpolation": "bicubic", "mean": (0.5, 0.5, 0.5),
       "std": (0.5, 0.5, 0.5)}
SETTINGS = [(None, None), ("max", 0.5), ("min", 0.9)]  # (head_fusion, discard_ratio); None: the server's defaults


def _tiny(pool_type: str):
    import torch

    from hub_vit.model import VisionTransformer
    from hub_vit.variants import ViTSpec

    torch.manual_seed({"tok": 1, "map": 2}[pool_type])
    posemb = "learn" if pool_type == "tok" else "sincos2d"
    spec = ViTSpec(**TINY, posemb=posemb, pool_type=pool_type, class_token=pool_type == "tok",
                   head_zeroinit=False)
    return VisionTransformer(spec).eval()


@pytest.fixture(scope="module")
def models() -> dict:
    """name -> (ResolvedModel, Explainer over the same module), the explainers as `hub-vit rollout` builds them."""
    from hub_vit.demo.models import load_explainer, resolve_choice
    from hub_vit.explain import DataConfig, Explainer

    found = {"digits": (resolve_model(None), load_explainer(resolve_choice(None)))}
    for kind in ("tok", "map"):
        module = _tiny(kind)
        labels = [f"c{i}" for i in range(TINY["num_classes"])]
        source = ResolvedModel.from_module(module, name=kind, labels=labels, pretrained_cfg=CFG)
        found[kind] = (source, Explainer(module, labels, DataConfig.from_pretrained_cfg(CFG, module.spec)))
    return found


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    combined = root / "repository"
    combined.mkdir()
    builds = [(name, source, ServingOptions(name=name)) for name, (source, _) in models.items()]
    builds.append(("plain", models["tok"][0], ServingOptions(name="plain", explain=False)))
    builds += [(f"{name}_torch", models[name][0], ServingOptions(name=f"{name}_torch", flavour="torch"))
               for name in ("digits", "tok")]
    for name, source, opts in builds:
        repo = write_repository(source, root / name, opts)
        for folder in repo.iterdir():
            if folder.is_dir():
                shutil.move(str(folder), combined / folder.name)
    with start_server(combined, timeout_s=240) as server:
        yield server


def _url(server: TritonServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def images(repo_root, photos) -> list[bytes]:
    """Real images: two digits samples (small, square) and two photographs (large, not square: a real crop box)."""
    samples = repo_root / "hub_vit" / "assets" / "digits" / "samples"
    return [(samples / "3_0.png").read_bytes(), (samples / "7_0.png").read_bytes(),
            _png(photos["chelsea"]), _png(photos["coffee"][:, :500])]


def _in_process(explainer, data: list[bytes], head_fusion: str | None, discard_ratio: float | None):
    from hub_vit.explain.image import load_image

    prepared = [explainer.prepare(load_image(item)) for item in data]
    result = explainer.rollout(prepared, head_fusion or "mean", discard_ratio or 0.0)
    return prepared, result


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", ["digits", "tok", "map", "digits_torch", "tok_torch"])
def test_served_map_equals_in_process(server, models, images, name, protocol):
    _, explainer = models[name.removesuffix("_torch")]
    with Classifier(_url(server, protocol), protocol=protocol, model=name) as client:
        for head_fusion, discard_ratio in SETTINGS:
            served = client.classify(images, explain=True, head_fusion=head_fusion, discard_ratio=discard_ratio,
                                     with_logits=True)
            prepared, result = _in_process(explainer, images, head_fusion, discard_ratio)
            for i, prediction in enumerate(served):
                assert prediction.rollout.shape == tuple(result.maps[i].shape)
                np.testing.assert_allclose(prediction.rollout, result.maps[i].numpy(), atol=ATOL, rtol=0)
                np.testing.assert_allclose(prediction.rollout_box, prepared[i].box, atol=1e-3)
                np.testing.assert_allclose(prediction.logits, result.logits[i].numpy(), atol=1e-4)
                assert prediction.labels[0] == explainer.top_k(result.logits[i], 1)[0][0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_async_client_returns_the_same_maps(server, images, protocol):
    async def run():
        async with AsyncClassifier(_url(server, protocol), protocol=protocol, model="tok") as client:
            return await client.classify(images, explain=True, head_fusion="max")

    with Classifier(_url(server, protocol), protocol=protocol, model="tok") as client:
        expected = client.classify(images, explain=True, head_fusion="max")
    for got, want in zip(asyncio.run(run()), expected, strict=True):
        np.testing.assert_array_equal(got.rollout, want.rollout)
        assert got.rollout_box == want.rollout_box


@pytest.fixture(scope="module")
def plain_export(models, tmp_path_factory) -> Path:
    """The class-token model exported as the server's plain graph was before it served rollout."""
    from hub_vit.export import export_onnx

    return export_onnx(models["tok"][0].module, tmp_path_factory.mktemp("plain") / "model.onnx", dynamic_batch=True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_without_explain_is_unchanged(server, models, images, plain_export, protocol):
    """No rollout is computed or sent, and the logits are those of the plain export on the same pixels."""
    import onnxruntime as ort
    import torch

    mod = tritonclient.http if protocol == "http" else tritonclient.grpc
    client = mod.InferenceServerClient(_url(server, protocol))
    data = np.array([[item] for item in images], dtype=np.object_)
    tensor = mod.InferInput("image", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    names = ["labels", "scores", "class_ids", "logits", "rollout", "rollout_box"]
    result = client.infer("tok", [tensor], outputs=[mod.InferRequestedOutput(n) for n in names])
    assert result.as_numpy("rollout") is None and result.as_numpy("rollout_box") is None
    prepared, _ = _in_process(models["tok"][1], images, None, None)
    pixels = torch.stack([p.tensor for p in prepared]).numpy()
    expected = ort.InferenceSession(str(plain_export), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"pixel_values": pixels})[0]
    np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-6, rtol=0)
    with Classifier(_url(server, protocol), protocol=protocol, model="tok") as explaining:
        explained = explaining.classify(images, explain=True, with_logits=True)
    np.testing.assert_allclose(result.as_numpy("logits"), np.stack([p.logits for p in explained]), atol=1e-6)


BAD = [
    ({"explain": True, "head_fusion": "avg"}, "unknown head_fusion 'avg'; valid choices: 'mean', 'max', 'min'"),
    ({"explain": True, "discard_ratio": 1.0}, "discard_ratio must be a number in [0, 1), got 1.0"),
    ({"explain": True, "discard_ratio": -0.1}, "discard_ratio must be a number in [0, 1), got -0.1"),
    ({"explain": True, "discard_ratio": "0.5"}, "discard_ratio must be a number in [0, 1), got '0.5'"),
    ({"explain": "yes"}, "parameter 'explain' must be true or false, got 'yes'"),
    ({"head_fusion": "avg"}, "unknown head_fusion 'avg'"),  # checked without explain too: a typo is not ignored
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("parameters", "message"), BAD)
@pytest.mark.parametrize("model", ["digits", "digits_torch"])
def test_bad_explanation_parameters_are_client_errors(server, images, protocol, parameters, message, model):
    mod = tritonclient.http if protocol == "http" else tritonclient.grpc
    client = mod.InferenceServerClient(_url(server, protocol))
    data = np.array([[images[0]]], dtype=np.object_)
    tensor = mod.InferInput("image", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [tensor], outputs=[mod.InferRequestedOutput("labels")], parameters=parameters)
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert message in caught.value.message()
    # the server keeps serving, explanations included
    with Classifier(_url(server, protocol), protocol=protocol, model=model) as good:
        assert good.classify(images[:1], explain=True)[0].labels[0] == "3"


def test_client_refuses_settings_without_explain():
    with pytest.raises(ValueError, match="pass explain=True"):
        explain_parameters(False, "max", None)
    assert explain_parameters(True, None, 0.25) == {"explain": True, "discard_ratio": 0.25}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_without_rollout_is_named(server, images, protocol):
    with Classifier(_url(server, protocol), protocol=protocol, model="plain") as client:
        assert client.classify(images[:1])[0].rollout is None
        with pytest.raises(NoExplanation, match="the served model 'plain' has no explanation"):
            client.classify(images[:1], explain=True)


def test_classify_explain_of_a_model_without_rollout_is_one_line(server, repo_root, tmp_path):
    # was: the model's refusal was taken for each file's own, one line per file (4,000 for a folder), every file sent
    from hub_vit.cli import _load_commands, app

    _load_commands()
    samples = sorted((repo_root / "hub_vit" / "assets" / "digits" / "samples").glob("*.png"))
    result = CliRunner().invoke(app, ["classify", "--url", server.http_url, "--model", "plain", "--explain", "-o",
                                      str(tmp_path / "out"), *map(str, samples)])
    assert result.exit_code == 2, result.output  # a request this server cannot take: bad input, nothing done
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "the served model 'plain' has no explanation" in lines[0], result.output
    assert lines[0].endswith("ask without explain (hub-vit classify: --explain)"), result.output
    assert not (tmp_path / "out").exists()


def test_classify_explain_writes_the_rollout_overlays(server, models, repo_root, tmp_path):
    """`hub-vit classify --explain -o DIR` writes what `hub-vit rollout -o DIR` writes for the same model."""
    from hub_vit.cli import _load_commands, app

    _load_commands()

    samples = repo_root / "hub_vit" / "assets" / "digits" / "samples"
    photo = tmp_path / "chelsea.png"
    from skimage import data as skdata

    Image.fromarray(skdata.chelsea()).save(photo)
    files = [str(samples / "3_0.png"), str(samples / "8_0.png"), str(photo)]
    runner = CliRunner()
    served = runner.invoke(app, ["classify", "--url", server.http_url, "--model", "digits", "--explain",
                                 "-o", str(tmp_path / "served"), "--head-fusion", "max", *files])
    assert served.exit_code == 0, served.output
    local = runner.invoke(app, ["rollout", "-o", str(tmp_path / "local"), "--head-fusion", "max", *files])
    assert local.exit_code == 0, local.output
    for name in ("3_0_rollout.png", "8_0_rollout.png", "chelsea_rollout.png"):
        a = np.asarray(Image.open(tmp_path / "served" / name)).astype(int)
        b = np.asarray(Image.open(tmp_path / "local" / name)).astype(int)
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= 2  # one colour-table step, where a map value sits on a rounding edge
    as_json = runner.invoke(app, ["classify", "--url", server.http_url, "--model", "digits", "--explain", "-o",
                                  str(tmp_path / "json"), "--head-fusion", "max", "--json", *files])
    assert as_json.exit_code == 0, as_json.output
    written = [json.loads(line)["rollout_png"] for line in as_json.stdout.splitlines()]  # the same overlays, named
    assert written == [str(tmp_path / "json" / name) for name in ("3_0_rollout.png", "8_0_rollout.png",
                                                                  "chelsea_rollout.png")]
    for name in written:
        served_png = tmp_path / "served" / Path(name).name
        assert np.array_equal(np.asarray(Image.open(name)), np.asarray(Image.open(served_png)))


def test_classify_explain_bad_settings_fail_before_any_request(tmp_path, repo_root):
    from hub_vit.cli import _load_commands, app

    _load_commands()

    image = str(repo_root / "hub_vit" / "assets" / "digits" / "samples" / "3_0.png")
    runner = CliRunner()
    url = f"127.0.0.1:{free_port()}"  # nothing listens: a request would fail differently
    result = runner.invoke(app, ["classify", "--url", url, "--explain", "--head-fusion", "avg", image])
    assert result.exit_code != 0 and "unknown --head-fusion 'avg'; valid choices: mean, max, min" in result.output
    result = runner.invoke(app, ["classify", "--url", url, "--explain", "--discard-ratio", "1", image])
    assert result.exit_code != 0 and "--discard-ratio must be a number in [0, 1), got 1.0" in result.output
    result = runner.invoke(app, ["classify", "--url", url, "--head-fusion", "max", image])
    assert result.exit_code != 0 and "add --explain" in result.output
    assert not (tmp_path / "out").exists()
    # was found after every image was classified (the whole table printed, then the error)
    result = runner.invoke(app, ["classify", "--url", url, "--explain", "-o", "/proc/hub-vit-no-such", image])
    assert result.exit_code == 2 and "cannot create --out '/proc/hub-vit-no-such': No such file or directory" in \
        result.output, result.output
    # an existing folder nothing can be written in: was found after every request was answered, and with --json the
    # answers were never printed
    result = runner.invoke(app, ["classify", "--url", url, "--explain", "--json", "-o", "/sys", image])
    assert result.exit_code == 2 and "cannot write in --out '/sys': " in result.output, result.output
    # made before the request, and taken away again when no overlay was written (here: no server)
    result = runner.invoke(app, ["classify", "--url", url, "--explain", "-o", str(tmp_path / "new" / "out"), image])
    assert result.exit_code == 1 and "Connection refused" in result.output, result.output
    assert not (tmp_path / "new").exists()
    # a folder where an overlay goes: was found after the answers came, in atomic's words ("give a file name")
    (tmp_path / "taken" / "3_0_rollout.png").mkdir(parents=True)
    result = runner.invoke(app, ["classify", "--url", url, "--explain", "-o", str(tmp_path / "taken"), image])
    assert result.exit_code == 2 and f"{str(tmp_path / 'taken' / '3_0_rollout.png')!r} is a folder where the overlay " \
        "is written: remove or rename it, or choose another --out" in " ".join(result.output.split()), result.output


@pytest.fixture()
def served_rollout(imageprep):
    """The template module, loaded from its file as the Python backend loads it."""
    spec = importlib.util.spec_from_file_location("served_rollout", template_dir("common") / "served_rollout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["served_rollout"] = module
    spec.loader.exec_module(module)
    return module


def test_explain_settings_parsing(served_rollout):
    parse = served_rollout.explain_settings
    assert parse("{}") is None and parse(json.dumps({"timeout": 5})) is None
    assert parse({"explain": False, "head_fusion": "max"}) is None
    assert parse({"explain": True}) == served_rollout.ExplainSettings("mean", 0.0)
    assert parse(json.dumps({"explain": True, "head_fusion": "min", "discard_ratio": 0})) == \
        served_rollout.ExplainSettings("min", 0.0)
    with pytest.raises(ValueError, match=r"discard_ratio must be a number in \[0, 1\), got True"):
        parse({"explain": True, "discard_ratio": True})


class _Request:
    """What `split_explained` reads of a Python-backend request: its parameters' JSON."""

    def __init__(self, parameters: dict) -> None:
        self._parameters = json.dumps(parameters)

    def parameters(self) -> str:
        return self._parameters


def test_split_explained(served_rollout):
    """One batch split the way both classifier steps (ORT and torch) split it: explained requests out with their
    settings, a bad parameter answered by its own refusal, the plain ones left in place for the plain path."""
    requests = [_Request({}), _Request({"explain": True, "head_fusion": "max"}),
                _Request({"explain": True, "head_fusion": "avg"}), _Request({"explain": False})]
    responses: list = [None] * len(requests)
    asked, rest = served_rollout.split_explained(requests, responses, lambda message: ("refused", message))
    assert [(place, settings) for place, _, settings in asked] == [(1, served_rollout.ExplainSettings("max", 0.0))]
    assert asked[0][1] is requests[1]
    assert rest == [requests[0], None, None, requests[3]]
    assert responses[:2] == [None, None] and responses[3] is None
    assert responses[2][0] == "refused" and "'avg'" in responses[2][1] and "mean" in responses[2][1]


def test_repository_layout_and_manifest(models, tmp_path):
    """The attention graph beside the plain one; the manifest records the rollout layout, so a repository checks
    as current (serve --repository); without explain neither graph nor outputs are there."""
    from hub_vit.server.repository.writer import outdated_files

    repo = write_repository(models["map"][0], tmp_path / "explained", ServingOptions())
    step = repo / "vit_classifier" / "1"
    assert {"model.onnx", "model_attentions.onnx", "served_rollout.py", "explained.py"} <= {p.name for p in
                                                                                         step.iterdir()}
    manifest = json.loads((repo / "hub_vit_repository.json").read_text())
    assert manifest["rollout"] == {"grid": [6, 6], "readout": "map", "num_prefix_tokens": 0}
    assert outdated_files(repo) == []
    assert 'name: "rollout"' in (repo / "vit" / "config.pbtxt").read_text()


def _stubs_with_torch(server: TritonServer) -> dict[int, bool]:
    """The server's Python-backend stubs (pid -> whether torch's library is mapped into it)."""
    stubs = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            command = (status.parent / "cmdline").read_bytes()
            maps = (status.parent / "maps").read_text()
        except OSError:  # a process that ended meanwhile
            continue
        if int(fields["PPid"]) == server.process.pid and b"triton_python_backend_stub" in command:
            stubs[int(status.parent.name)] = "libtorch" in maps
    return stubs


def test_a_stub_imports_torch_only_for_its_first_explained_request(tmp_path, images):
    # torch (about 270 MB of private memory per stub, and seconds at start and stop) was imported when the step
    # loaded, in every instance, whether or not a request ever asked for an explanation
    repo = write_repository(resolve_model(None), tmp_path / "repository", ServingOptions(classifier_instances=1))
    with start_server(repo) as server, Classifier(server.http_url) as client:
        assert client.classify(images[:2])[0].rollout is None
        stubs = _stubs_with_torch(server)
        assert len(stubs) == 1 and not any(stubs.values()), stubs
        assert client.classify(images[:2], explain=True)[0].rollout is not None
        assert list(_stubs_with_torch(server).values()) == [True]
