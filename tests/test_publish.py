"""`hub-vit push`: a complete folder goes up in one commit; anything wrong (no network, offline mode, a missing
file, a bad repo id) fails at once with a clear message and nothing is sent."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_vit import publish
from hub_vit.model_cards import ModelFolderError, write_model_card

REPO = Path(__file__).resolve().parents[1]
HUB_VIT = Path(sys.executable).with_name("hub-vit")
UNROUTABLE = "http://192.0.2.1"  # TEST-NET-1 (RFC 5737): reserved for documentation, never routed


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete hub-vit model folder (hub_vit.folder writer: weights, config, remote code, labels) + its card."""
    from hub_vit.folder import save_model_folder
    from hub_vit.model import VisionTransformer
    from hub_vit.variants import ViTSpec

    spec = ViTSpec.from_variant("mu/16", img_size=32, num_classes=3, posemb="sincos2d", pool_type="gap")
    path = save_model_folder(VisionTransformer(spec), tmp_path_factory.mktemp("push") / "tiny",
                             labels=["cat", "dog", "bird"])
    write_model_card(path)
    return path


@pytest.fixture()
def hub_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every HfApi method that would talk to the Hub; the tests assert it stays empty."""
    from huggingface_hub import HfApi

    calls: list[str] = []
    for name in ("create_repo", "create_commit", "upload_folder", "upload_file", "whoami"):
        monkeypatch.setattr(HfApi, name, lambda self, *a, _n=name, **k: calls.append(_n))
    return calls


def closed_port() -> int:
    """A local TCP port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------- no network
def test_unreachable_hub_fails_fast_and_uploads_nothing(folder: Path, hub_calls: list[str]) -> None:
    before = digest(folder)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    t0 = time.perf_counter()
    with pytest.raises(publish.HubUnreachableError, match=r"cannot reach the Hugging Face Hub at http://127\.0\.0\.1"):
        publish.push_folder(folder, "hub-vit-test/tiny", token="hf_dummy", endpoint=endpoint)
    assert time.perf_counter() - t0 < 5
    assert hub_calls == []
    assert digest(folder) == before  # the folder (card included) is untouched


def test_connect_timeout_is_honoured(folder: Path, hub_calls: list[str]) -> None:
    t0 = time.perf_counter()
    with pytest.raises(publish.HubUnreachableError, match="192.0.2.1"):
        publish.push_folder(folder, "hub-vit-test/tiny", token="hf_dummy", endpoint=UNROUTABLE, timeout=1.0)
    assert time.perf_counter() - t0 < 4  # 1 s connect timeout (or an immediate "network unreachable")
    assert hub_calls == []


def test_offline_mode_fails_before_any_connection(folder: Path, hub_calls: list[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    connects: list[object] = []
    monkeypatch.setattr(socket.socket, "connect", lambda self, addr: connects.append(addr))
    t0 = time.perf_counter()
    with pytest.raises(publish.HubUnreachableError, match="HF_HUB_OFFLINE"):
        publish.push_folder(folder, "hub-vit-test/tiny", token="hf_dummy")
    # nothing was tried (no connect at all); the bound only catches huggingface_hub's retries (about 20 s), with room
    # for a busy machine
    assert time.perf_counter() - t0 < 10
    assert hub_calls == [] and connects == []


def _cli_push(folder: Path, env_extra: dict[str, str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), COLUMNS="200", **env_extra)  # no cached token, wide error lines
    t0 = time.perf_counter()
    proc = subprocess.run([str(HUB_VIT), "push", str(folder), "--repo-id", "hub-vit-test/tiny", "--token", "hf_x"],
                          capture_output=True, text=True, env=env, timeout=120)
    return proc, time.perf_counter() - t0


def test_cli_push_without_network(folder: Path, tmp_path: Path) -> None:
    """The real default endpoint (huggingface.co) from this machine, which has no internet."""
    try:
        publish.check_reachable(publish.hub_endpoint(), timeout=3)
    except publish.HubUnreachableError:
        pass
    else:
        pytest.skip("huggingface.co is reachable from this machine; this test covers the no-network path")
    proc, seconds = _cli_push(folder, {}, tmp_path)
    assert proc.returncode == 3, proc.stderr
    message = " ".join(proc.stderr.split())
    assert "cannot reach the Hugging Face Hub at https://huggingface.co" in message
    assert "Nothing was uploaded." in message
    assert seconds < 60  # interpreter + torch import; the network check itself is bounded by --timeout (3 s)


def test_cli_push_with_hf_hub_offline(folder: Path, tmp_path: Path) -> None:
    proc, _ = _cli_push(folder, {"HF_HUB_OFFLINE": "1"}, tmp_path)
    assert proc.returncode == 3, proc.stderr
    message = " ".join(proc.stderr.split())
    assert "HF_HUB_OFFLINE is set" in message and "Nothing was uploaded." in message


# ---------------------------------------------------------------------------------------------------- bad folders
@pytest.fixture()
def no_network_check(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Folder validation must come first: these tests fail if the Hub is even looked for."""
    looked: list[str] = []
    monkeypatch.setattr(publish, "check_reachable", lambda endpoint, timeout=0: looked.append(endpoint))
    return looked


def test_a_file_given_as_the_folder_is_named(folder: Path, hub_calls: list[str], no_network_check: list[str]) -> None:
    # was "does not exist or is not a directory" for a file that exists
    with pytest.raises(ModelFolderError, match=r"config\.json' is a file; give the folder that holds config\.json"):
        publish.push_folder(folder / "config.json", "hub-vit-test/tiny", token="hf_dummy")
    assert hub_calls == [] and no_network_check == []


@pytest.mark.parametrize("missing", ["model.safetensors", "README.md", "labels.txt", "preprocessor_config.json",
                                     "modeling_hub_vit.py"])
def test_incomplete_folder_is_refused(folder: Path, tmp_path: Path, missing: str, hub_calls: list[str],
                                      no_network_check: list[str]) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / missing).unlink()
    with pytest.raises(ModelFolderError, match="refusing to push") as err:
        publish.push_folder(broken, "hub-vit-test/tiny", token="hf_dummy")
    text = str(err.value)
    assert missing in text or ("modeling_hub_vit" in missing and "trust_remote_code" in text)
    if missing == "README.md":
        assert "hub-vit card" in text
    assert hub_calls == [] and no_network_check == []


def test_an_empty_labels_file_is_refused(folder: Path, tmp_path: Path, hub_calls: list[str],
                                         no_network_check: list[str]) -> None:
    # was: passed every check (only an unreachable Hub stopped it), publishing a classifier without class names
    broken = tmp_path / "empty-labels"
    shutil.copytree(folder, broken)
    (broken / "labels.txt").write_text("")
    with pytest.raises(ModelFolderError, match=r"labels\.txt lists 0 labels but the model has \d+ classes"):
        publish.push_folder(broken, "hub-vit-test/tiny", token="hf_dummy")
    assert hub_calls == [] and no_network_check == []


def test_headless_folder_needs_no_labels(tmp_path: Path, hub_calls: list[str]) -> None:
    """num_classes 0 (a SigLIP image tower, `--num-classes 0`): there are no classes to name, and hub-vit's own
    writers leave labels.txt out, so its absence must not block a push. A classifier without one is still refused
    (test above)."""
    from hub_vit.folder import save_model_folder
    from hub_vit.model import VisionTransformer
    from hub_vit.variants import ViTSpec

    spec = ViTSpec.from_variant("mu/16", img_size=32, num_classes=0, posemb="sincos2d", pool_type="gap")
    path = save_model_folder(VisionTransformer(spec), tmp_path / "tower", labels=None)
    write_model_card(path)
    assert not (path / "labels.txt").exists()
    plan = publish.validate_folder(path)
    assert "labels.txt" not in plan.files and {"model.safetensors", "config.json", "README.md"} <= set(plan.files)
    assert hub_calls == []


def test_cli_refuses_folder_without_weights(folder: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    _load_commands()
    broken = tmp_path / "no-weights"
    shutil.copytree(folder, broken)
    (broken / "model.safetensors").unlink()
    result = CliRunner().invoke(app, ["push", str(broken), "--repo-id", "hub-vit-test/tiny", "--token", "x"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2
    assert "missing model.safetensors" in message and "Nothing was uploaded." in message


def test_unparsable_card_is_refused(folder: Path, tmp_path: Path, no_network_check: list[str]) -> None:
    broken = tmp_path / "bad-card"
    shutil.copytree(folder, broken)
    (broken / "README.md").write_text("---\nlicense: [unclosed\n---\n# card\n")
    with pytest.raises(ModelFolderError, match="does not parse as a model card"):
        publish.push_folder(broken, "hub-vit-test/tiny", token="hf_dummy")
    assert no_network_check == []


@pytest.mark.parametrize("repo_id", ["tiny", "a/b/c", "org/bad--name", "org/name.git", "org/has space", "",
                                     "me/x-", "me/x.", "me./x"])  # the last three: the Hub's own rule
def test_bad_repo_id_is_refused(folder: Path, repo_id: str, no_network_check: list[str]) -> None:
    with pytest.raises(ValueError, match=r"invalid repo id .* expected ORG/NAME"):
        publish.push_folder(folder, repo_id, token="hf_dummy")
    assert no_network_check == []


@pytest.mark.parametrize("timeout", [0, -1.0, 1e9])
def test_bad_timeout_is_refused(folder: Path, timeout: float, no_network_check: list[str]) -> None:
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds in \(0, 600\]"):
        publish.push_folder(folder, "hub-vit-test/tiny", token="hf_dummy", timeout=timeout)
    assert no_network_check == []


# ---------------------------------------------------------------------------------------------------- the upload
def test_upload_is_one_commit_of_the_whole_folder(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                  no_network_check: list[str]) -> None:
    """With the network check passed, exactly one repo creation and one commit carry every file of the folder."""
    from huggingface_hub import HfApi, ModelCard

    seen: dict[str, object] = {}
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: seen.update(repo=(repo_id, kw))
                        or f"{self.endpoint}/{repo_id}")
    monkeypatch.setattr(HfApi, "create_commit", lambda self, repo_id, operations, **kw: seen.update(
        ops={op.path_in_repo: op for op in operations}, commit=kw))
    (folder / ".DS_Store").write_bytes(b"litter")  # never uploaded
    try:
        url = publish.push_folder(folder, "hub-vit-test/tiny", private=True, token="hf_dummy",
                                  endpoint="https://hub.example")
    finally:
        (folder / ".DS_Store").unlink()
    assert url == "https://hub.example/hub-vit-test/tiny"
    assert seen["repo"] == ("hub-vit-test/tiny", {"private": True, "exist_ok": True, "repo_type": "model"})
    ops = seen["ops"]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(ops) == on_disk  # weights, config, preprocessor, labels, card and every remote-code module
    assert {"model.safetensors", "config.json", "preprocessor_config.json", "labels.txt", "README.md",
            "configuration_hub_vit.py", "modeling_hub_vit.py", "image_processing_hub_vit.py"} <= set(ops)
    card = ModelCard(ops["README.md"].path_or_fileobj.decode())  # the uploaded card names the repo
    assert 'timm.create_model("hf-hub:hub-vit-test/tiny"' in card.text
    assert "hf-hub:hub-vit-test/tiny" not in (folder / "README.md").read_text()  # the local card is unchanged


# ---------------------------------------------------------------------------------------------------- messages
def test_cli_push_of_a_card_without_metadata_prints_only_hub_vits_error(folder: Path, tmp_path: Path) -> None:
    """huggingface_hub's "Repo card metadata block was not found. Setting CardData to empty." came first."""
    broken = tmp_path / "no-metadata"
    shutil.copytree(folder, broken)
    (broken / "README.md").write_text("# a card without YAML metadata\n")
    proc, _ = _cli_push(broken, {}, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.splitlines() == [
        f"error: refusing to push {broken}: README.md has no YAML metadata; regenerate it with `hub-vit card "
        f"{broken}`. Nothing was uploaded."]


@pytest.mark.parametrize("name", ["labels.txt", "README.md"])
def test_a_directory_where_a_file_belongs_is_named(name: str, folder: Path, tmp_path: Path, hub_calls: list[str],
                                                   no_network_check: list[str]) -> None:
    """Was "missing labels.txt" for a folder that has a labels.txt (a directory)."""
    broken = tmp_path / "dir"
    shutil.copytree(folder, broken)
    (broken / name).unlink()
    (broken / name).mkdir()
    with pytest.raises(ModelFolderError, match=rf"refusing to push .*: {re.escape(name)} is a directory \(") as err:
        publish.push_folder(broken, "hub-vit-test/tiny", token="hf_dummy")
    assert "missing" not in str(err.value) and "hub-vit card" not in str(err.value)
    assert hub_calls == [] and no_network_check == []


def test_what_push_uploads_is_every_file_but_hidden_bytecode_and_temp_files(tmp_path: Path) -> None:
    """docs/model_cards.md's list, on a copy of the shipped folder: its records, calibration and samples go up."""
    from hub_vit import catalog

    copy = Path(shutil.copytree(catalog.default_model_folder(), tmp_path / "digits"))
    for litter in (".DS_Store", ".git/config", "__pycache__/m.cpython-312.pyc", "samples/__pycache__/x.pyc",
                   "stray.pyc", ".README.md.abc.tmp", "samples/part.tmp"):
        (copy / litter).parent.mkdir(parents=True, exist_ok=True)
        (copy / litter).write_bytes(b"x")
    files = set(publish.validate_folder(copy).files)
    assert {"training.json", "domain.json", "domain.safetensors", "labels.txt", "README.md"} <= files
    assert any(name.startswith("samples/") for name in files)
    kept = {p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()}
    assert files == {name for name in kept if not re.search(r"(^|/)(\.|__pycache__/)|\.(pyc|tmp)$", name)}
