"""`hf-hub:ORG/NAME[@REVISION]`: a hub-vit model folder on the Hugging Face Hub, named as timm names it, fetched into
huggingface_hub's cache and used as a folder by every command (rollout, the demo, export, serve). The Hub is
emulated on a loopback port (tests/emulated_hub.py: the endpoints huggingface_hub calls, with the Hub's error codes);
the cache, huggingface_hub's downloads and the commands are the real ones."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_vit.catalog import default_model_folder
from hub_vit.network import OFFLINE_SWITCHES
from tests.emulated_hub import Repo, emulated_hub, repo_of_folder
from tests.programs import HUB_VIT, serving

SAMPLE = default_model_folder() / "samples" / "4_1.png"  # a held-out digit 4 (its file name gives its class)


@pytest.fixture
def digits_repo() -> Repo:
    """The shipped digits model folder as a Hub repository, with an exported graph and a classic ViT's `native/`
    copy of the weights beside it (neither fetched)."""
    repo = repo_of_folder(default_model_folder())
    repo.files["model.onnx"] = b"\0" * 1000
    repo.files["native/model.safetensors"] = b"\0" * 1000
    repo.files["native/config.json"] = b"{}"
    return repo


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty huggingface_hub cache for this test (read by huggingface_hub at call time)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    for switch in OFFLINE_SWITCHES:
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache


def _closed_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _env(endpoint: str, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_SWITCHES}
    return env | {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _hub_vit(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*HUB_VIT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_rollout_fetches_a_hub_model_once_and_then_runs_it_from_the_cache_without_the_hub(digits_repo, tmp_path):
    cache = tmp_path / "hf-cache"
    with emulated_hub({"my-org/digits": digits_repo}) as hub:
        done = _hub_vit("rollout", "--model", "hf-hub:my-org/digits", str(SAMPLE), "-o", "out",
                        env=_env(hub.endpoint, cache), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        fetched = set(hub.fetched("my-org/digits"))
    lines = done.stdout.splitlines()  # piped: the labels as tab-separated lines under their header
    assert lines[lines.index("label\tprobability") + 1].split("\t")[0] == "4", done.stdout
    assert (tmp_path / "out" / "4_1_rollout.png").is_file()
    # what a model folder uses, not its exported graph or its sample images
    assert {"config.json", "model.safetensors", "labels.txt", "domain.json"} <= fetched, fetched
    assert "model.onnx" not in fetched and not any("/" in name for name in fetched), fetched  # samples/, native/
    # the Hub gone: the cached snapshot is used at once, and the user is told
    started = time.monotonic()
    again = _hub_vit("rollout", "--model", "hf-hub:my-org/digits", str(SAMPLE), "-o", "out",
                     env=_env(_closed_endpoint(), cache), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "cannot reach the Hugging Face Hub" in again.stderr and "from huggingface_hub's cache" in again.stderr
    assert time.monotonic() - started < 60  # no retries waited out (huggingface_hub's take about 23 s per file)
    # a download cut short (its weights missing from the snapshot), the Hub gone: said as such, not "not cached"
    next((cache / "models--my-org--digits" / "snapshots").iterdir()).joinpath("model.safetensors").unlink()
    cut = _hub_vit("rollout", "--model", "hf-hub:my-org/digits", str(SAMPLE), env=_env(_closed_endpoint(), cache),
                   cwd=tmp_path)
    assert cut.returncode == 3, cut.stderr
    assert "holds only part of it (an interrupted download?)" in " ".join(cut.stderr.split()), cut.stderr


def test_a_hub_model_neither_reachable_nor_cached_fails_at_once_with_exit_3(tmp_path):
    started = time.monotonic()
    done = _hub_vit("rollout", "--model", "hf-hub:my-org/digits", str(SAMPLE), env=_env(_closed_endpoint(),
                    tmp_path / "empty-cache"), cwd=tmp_path)
    message = " ".join(done.stderr.split())
    assert done.returncode == 3, done.stderr
    assert message.startswith("error: cannot load 'hf-hub:my-org/digits': cannot reach the Hugging Face Hub at "
                               "http://127.0.0.1:"), message
    assert f"huggingface_hub's cache ({tmp_path / 'empty-cache'}) does not hold it" in message
    assert "Traceback" not in done.stderr and time.monotonic() - started < 60


def test_a_repository_that_is_not_a_hub_vit_model_is_refused_before_its_weights_come(hub_cache):
    from hub_vit.resolve import locate

    repos = {"google/vit-base-patch16-224": Repo({"config.json": json.dumps({"model_type": "vit"}).encode(),
                                                  "model.safetensors": b"\0" * 1000}),
             "timm/vit_small": Repo({"config.json": json.dumps({"architecture": "vit_small_patch16_224"}).encode(),
                                     "model.safetensors": b"\0" * 1000})}
    with emulated_hub(repos) as hub, pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", hub.endpoint)
        with pytest.raises(ValueError, match=r"'hf-hub:google/vit-base-patch16-224' is a transformers 'vit' model, "
                                             r"not a hub-vit model \(config.json's model_type is 'vit', expected "
                                             r"'hub_vit'\)"):
            locate("hf-hub:google/vit-base-patch16-224")
        with pytest.raises(ValueError, match=r"is a timm 'vit_small_patch16_224' model \(load it with "
                                             r"timm.create_model\('hf-hub:timm/vit_small'\)\)"):
            locate("hf-hub:timm/vit_small")
        assert hub.fetched("google/vit-base-patch16-224") == ["config.json"]  # not the weights
        assert hub.fetched("timm/vit_small") == ["config.json"]


def test_what_the_hub_does_not_have_is_named(digits_repo, hub_cache):
    from hub_vit.resolve import locate, resolve_model

    with emulated_hub({"my-org/digits": digits_repo}) as hub, pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", hub.endpoint)
        with pytest.raises(ValueError, match=r"'hf-hub:my-org/absent': no model repository 'my-org/absent' on the "
                                             r"Hugging Face Hub \(http://127.0.0.1:\d+\); a private one needs a token"):
            locate("hf-hub:my-org/absent")
        with pytest.raises(ValueError, match=r"'hf-hub:my-org/digits@v2': my-org/digits has no revision 'v2'"):
            locate("hf-hub:my-org/digits@v2")
        ref = locate(f"hf-hub:my-org/digits@{digits_repo.commit}")  # a commit is a revision too
        assert ref.kind == "folder" and ref.folder == hub_cache / "models--my-org--digits" / "snapshots" / \
            digits_repo.commit
        model = resolve_model(ref)
    assert model.name == "digits" and model.labels[4] == "4"  # the repository's name, not its snapshot's hash


def test_train_fine_tunes_a_hub_model_and_leaves_no_run_folder_when_it_cannot_be_had(digits_repo, hub_cache,
                                                                                        tmp_path):
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from tests.test_train_loop import make_folder

    _load_commands()
    data = make_folder(tmp_path / "data")  # 32x32 images of 3 colours
    quick = ["--steps", "1", "--batch-size", "8", "--warmup-steps", "1", "--mixup", "0", "--randaug", "", "--workers",
             "0", "--threads", "1", "--no-progress"]
    with emulated_hub({"my-org/digits": digits_repo}) as hub, pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", hub.endpoint)
        done = CliRunner().invoke(app, ["train", str(data), "--out", str(tmp_path / "ft"), "--init",
                                        "hf-hub:my-org/digits", *quick])
    assert done.exit_code == 0, done.output
    recipe = json.loads((tmp_path / "ft" / "recipe.json").read_text())
    assert recipe["model"] == "simplevit_digits", recipe  # the Hub folder's architecture, not the preset's
    assert recipe["init"] == str(hub_cache / "models--my-org--digits" / "snapshots" / digits_repo.commit)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", _closed_endpoint())
        failed = CliRunner().invoke(app, ["train", str(data), "--out", str(tmp_path / "ft2"), "--init",
                                          "hf-hub:my-org/other", *quick])
    assert failed.exit_code == 3, failed.output
    assert "cannot load 'hf-hub:my-org/other': cannot reach the Hugging Face Hub" in " ".join(failed.output.split())
    assert not (tmp_path / "ft2").exists()  # nothing half-made


def test_what_push_uploads_is_what_hf_hub_serves(tmp_path, hub_cache, monkeypatch):
    """`hub-vit push` into the emulated Hub (its one commit taken as the repository), then the model by name: the same
    weights and labels as the folder pushed, and push says the name to use."""
    import shutil

    import torch
    from huggingface_hub import HfApi
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app
    from hub_vit.resolve import resolve_model

    folder = tmp_path / "digits"
    shutil.copytree(default_model_folder(), folder, ignore=shutil.ignore_patterns("__pycache__"))
    with emulated_hub({}) as hub:
        def commit(api: HfApi, repo_id: str, operations: list, **kwargs: object) -> None:
            hub.repos[repo_id] = Repo({op.path_in_repo: op.path_or_fileobj if isinstance(op.path_or_fileobj, bytes)
                                       else Path(op.path_or_fileobj).read_bytes() for op in operations})

        monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kwargs: f"{api.endpoint}/{repo_id}")
        monkeypatch.setattr(HfApi, "create_commit", commit)
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        _load_commands()
        pushed = CliRunner().invoke(app, ["push", str(folder), "--repo-id", "my-org/digits", "--token", "hf_dummy"])
        assert pushed.exit_code == 0, pushed.output
        assert "serve it: hub-vit serve hf-hub:my-org/digits" in pushed.output, pushed.output
        served, local = resolve_model("hf-hub:my-org/digits"), resolve_model(folder)
    assert served.labels == local.labels and served.name == "digits"
    assert all(torch.equal(a, b) for a, b in zip(served.module.state_dict().values(),
                                                  local.module.state_dict().values(), strict=True))


@pytest.mark.parametrize("command", [["card"], ["calibrate-domain", "--images", "."], ["push", "--repo-id", "a/b"]])
def test_commands_that_write_into_the_folder_say_how_to_copy_a_hub_model_first(command: list[str]) -> None:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    done = CliRunner().invoke(app, [command[0], "hf-hub:my-org/digits@v1", *command[1:]])
    text = " ".join(done.output.replace("│", " ").split())
    assert done.exit_code == 2, text
    # "works on", not "writes into": push uploads the folder and never changes it
    assert ("'hf-hub:my-org/digits@v1' is a model on the Hugging Face Hub, and this command works on a local model "
            "folder: fetch one first (`hf download my-org/digits --local-dir DIR`) and give DIR") in text, text


@pytest.mark.parametrize(("reference", "message"), [
    ("hf-hub:", r"'hf-hub:': invalid repo id '': expected ORG/NAME"),
    ("hf-hub:digits", r"'hf-hub:digits': invalid repo id 'digits': expected ORG/NAME"),
    ("hf-hub:my-org/a b", r"invalid repo id 'my-org/a b'"),
    ("hf-hub:my-org/digits@", r"'hf-hub:my-org/digits@' names no revision after '@'"),
    ("my-org/digits", r"model path 'my-org/digits' does not exist .*; a model on the Hugging Face Hub is named "
                      r"hf-hub:my-org/digits"),
])
def test_a_malformed_hub_reference_is_refused_before_any_request(reference, message, hub_cache, monkeypatch):
    from hub_vit.resolve import locate

    monkeypatch.setenv("HF_ENDPOINT", _closed_endpoint())  # asked, it would say "cannot reach"
    with pytest.raises(ValueError, match=message):
        locate(reference)


def test_the_demos_picker_and_serve_take_a_hub_model(digits_repo, tmp_path, caplog):
    """serve fetches the model in its own process, builds in its child from that snapshot (the Hub is asked once),
    and answers as the local folder does."""
    from hub_vit.server.client.classifier import Classifier

    cache = tmp_path / "hf-cache"
    with emulated_hub({"my-org/digits": digits_repo}) as hub, \
            serving("hf-hub:my-org/digits", env=_env(hub.endpoint, cache), cwd=tmp_path) as served, \
            Classifier(f"127.0.0.1:{served.http_port}") as client:
        prediction = client.classify(SAMPLE.read_bytes())[0]
    assert prediction.labels[0] == "4", prediction
    assert "serving model vit" in served.text and served.process.returncode == 0, served.text
    assert hub.asked.count("HEAD /my-org/digits/resolve/main/config.json") == 1, hub.asked
    # asked once: the build child gets the model as serve located it, and does not ask the Hub again
    from hub_vit.demo.models import discover_choices, resolve_choice, served_choice

    with pytest.MonkeyPatch.context() as env:  # the demo's picker, the Hub gone: its key is the reference
        from huggingface_hub import constants

        env.setattr(constants, "HF_HUB_CACHE", str(cache))
        env.setenv("HF_ENDPOINT", _closed_endpoint())
        choice = resolve_choice("hf-hub:my-org/digits")  # `hub-vit demo` / `rollout --model`
        offered = discover_choices([Path("hf-hub:my-org/digits"), default_model_folder()])  # `--model-folder`
        caplog.clear()
        served = served_choice("hf-hub:my-org/digits")  # `serve --demo`: serve has just fetched it; not asked again
    assert served == choice and "cannot reach" not in caplog.text, caplog.text
    assert choice.key == "hf-hub:my-org/digits" and choice.kind == "folder", choice
    assert Path(choice.target).parent.parent == cache / "models--my-org--digits"
    assert [c.key for c in offered][1:3] == ["hf-hub:my-org/digits", "folder: digits"], offered


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
