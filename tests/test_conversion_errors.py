"""Bad input gives a clear error naming the problem, and `hub-vit convert` leaves no output folder behind.

Covers the issue's five bad files (text renamed .npz, truncated npz, object array, missing key, wrong shape) plus
architecture disagreements, unknown sources, and downloads that cannot reach the network (must fail fast).
"""

from __future__ import annotations

import functools
import http.server
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import hub_vit  # noqa: F401
from hub_vit.cli import _load_commands
from hub_vit.cli.app import app
from hub_vit.conversion import (
    ArchitectureMismatchError,
    CheckpointFormatError,
    LayoutError,
    convert_npz_file,
    read_npz,
)
from hub_vit.conversion.download import DownloadError, resolve_source, sha256_file
from hub_vit.weights import CheckpointMismatchError

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
GOOD = JAX / "vit_jax" / "tiny_token.published.npz"
BV = JAX / "big_vision" / "tiny_learn_tok.npz"
_load_commands()


def run_convert(src: Path | str, out: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["convert", str(src), "-o", str(out), *extra])
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines; compare on one line


def rewrite(tmp_path: Path, src: Path, edit) -> Path:
    arrays = read_npz(src)
    edit(arrays)
    path = tmp_path / "edited.npz"
    np.savez(path, **arrays)
    return path


def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.npz"
    path.write_text("this is a text file, not a checkpoint\n")
    return path


def truncated(tmp_path: Path) -> Path:
    path = tmp_path / "truncated.npz"
    path.write_bytes(GOOD.read_bytes()[: GOOD.stat().st_size // 2])
    return path


def object_array(tmp_path: Path) -> Path:
    path = tmp_path / "objects.npz"
    np.savez(path, **{"embedding/kernel": np.array([{"evil": "pickle"}], dtype=object)})  # numpy pickles it
    return path


def missing_key(tmp_path: Path) -> Path:
    return rewrite(tmp_path, GOOD, lambda a: a.pop("Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"))


def wrong_shape(tmp_path: Path) -> Path:
    def edit(a: dict) -> None:
        a["head/bias"] = np.zeros(11, np.float32)  # the head kernel says 10 classes

    return rewrite(tmp_path, GOOD, edit)


def missing_block(tmp_path: Path) -> Path:
    # The message read "encoder blocks are not numbered 0..0: found [1]"
    def edit(a: dict) -> None:
        for key in [k for k in a if k.startswith("Transformer/encoderblock_0/")]:
            a.pop(key)

    return rewrite(tmp_path, GOOD, edit)


BAD_FILES = {
    "text_renamed_npz": (text_file, CheckpointFormatError, ["not an npz checkpoint", "not a zip archive"]),
    "truncated_npz": (truncated, CheckpointFormatError, ["truncated"]),
    "object_array": (object_array, CheckpointFormatError, ["'embedding/kernel'", "dtype object", "allow_pickle=False"]),
    "missing_key": (missing_key, CheckpointMismatchError,
                    ["missing keys (1)", "Linen names", "Transformer/encoderblock_1/MlpBlock_0/Dense_0/bias"]),
    "wrong_shape": (wrong_shape, CheckpointMismatchError, ["shape mismatches (1)", "head/bias: (11,), expected (10,)"]),
    "missing_block": (missing_block, LayoutError,
                      ["encoder block encoderblock_0 missing", "the checkpoint has encoderblock_1",
                       "numbered 0, 1, 2, ... without gaps"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_api_error(case: str, tmp_path: Path) -> None:
    make, exc_type, phrases = BAD_FILES[case]
    with pytest.raises(exc_type) as info:
        convert_npz_file(make(tmp_path))
    for phrase in phrases:
        assert phrase in str(info.value), f"{phrase!r} not in: {info.value}"


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_cli_leaves_no_folder(case: str, tmp_path: Path) -> None:
    make, _, phrases = BAD_FILES[case]
    out = tmp_path / "out"
    code, output = run_convert(make(tmp_path), out)
    assert code != 0
    assert "error:" in output
    for phrase in phrases:
        assert phrase in output, f"{phrase!r} not in: {output}"
    assert not out.exists(), "a failed conversion must not leave an output folder"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], "temporary folder left behind"


def test_variant_disagreement_names_both(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = run_convert(GOOD, out, "--variant", "S/16")
    assert code != 0 and not out.exists()
    assert "'S/16' means width 384" in output and "the checkpoint has width 64" in output


def test_spec_disagreement_names_both() -> None:
    from hub_vit.catalog import MODELS

    with pytest.raises(ArchitectureMismatchError) as info:
        convert_npz_file(GOOD, MODELS["vit_s16"].spec)
    assert "width 64 (checkpoint) vs 384 (model)" in str(info.value)


def test_a_spec_of_the_wrong_type_or_with_options_it_overrides_is_named(tmp_path: Path) -> None:
    # was: AttributeError "'dict' object has no attribute 'img_size'"; img_size / num_classes beside a spec were
    # ignored without a word; a folder was "a weights file that does not exist"
    from hub_vit.conversion import load_checkpoint
    from hub_vit.conversion.infer import infer_spec

    spec = infer_spec(read_npz(GOOD))
    for wrong in (spec.to_dict(), "mu/8"):
        with pytest.raises(TypeError, match=r"spec must be a ViTSpec \(ViTSpec.from_dict\(d\)"):
            convert_npz_file(GOOD, wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="img_size, num_classes adjust an inferred architecture; with spec= they were "
                                         "ignored"):
        convert_npz_file(GOOD, spec, img_size=96, num_classes=3)
    assert convert_npz_file(GOOD, spec.replace(img_size=(96, 96)))["pos_embed"].shape[1] > \
        convert_npz_file(GOOD, spec)["pos_embed"].shape[1]
    with pytest.raises(IsADirectoryError, match="is a folder, not a weights file; a hub-vit model folder loads with"):
        load_checkpoint(tmp_path)


def test_existing_output_folder_is_not_touched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, output = run_convert(GOOD, out)
    assert code != 0 and "is not a hub-vit model folder" in output and "choose another output folder" in output
    assert (out / "keep.txt").read_text() == "mine"


def test_bad_options(tmp_path: Path) -> None:
    code, output = run_convert(GOOD, tmp_path / "a", "--img-size", "big")
    assert code != 0 and "--img-size must be N or HEIGHTxWIDTH" in output
    code, output = run_convert(GOOD, tmp_path / "b", "--img-size", "70")
    assert code != 0 and "not divisible by the patch size 16" in output
    code, output = run_convert(JAX / "vit_jax" / "tiny_token_h48w64.published.npz", tmp_path / "c")
    assert code != 0 and "not a square grid" in output and "--img-size 48x64" in output
    assert not any((tmp_path / n).exists() for n in "abc")


def test_unknown_source_lists_choices(tmp_path: Path) -> None:
    code, output = run_convert("no-such-model", tmp_path / "out")
    assert code != 0 and "i1k-s16-300ep" in output and "vit_ti16.augreg_in21k_ft_in1k" in output
    code, output = run_convert("vit_b16.nonexistent_tag", tmp_path / "out")
    assert code != 0 and "valid tags" in output


@pytest.mark.parametrize("name", ["simplevit_digits", "simplevit_digits.sklearn_digits"])
def test_the_shipped_model_is_not_a_checkpoint_to_convert(name: str, tmp_path: Path) -> None:
    # was: "error: unknown url type: ''" (its catalog weight has no URL: it ships as a model folder)
    result = CliRunner().invoke(app, ["convert", name, "-o", str(tmp_path / "out")])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2 and "simplevit_digits.sklearn_digits is not a Google checkpoint: it ships with " \
                                      "hub-vit as the model folder" in flat, flat
    assert not (tmp_path / "out").exists()


def test_offline_download_fails_fast_with_instructions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise OSError("Network is unreachable (simulated)")

    monkeypatch.setattr(socket, "create_connection", no_network)
    start = time.monotonic()
    out = tmp_path / "out"
    code, output = run_convert("i1k-s16-300ep", out, "--timeout", "2")
    assert time.monotonic() - start < 10
    assert code != 0 and not out.exists()
    url = "https://storage.googleapis.com/big_vision/vit_s16_i1k_300ep.npz"
    assert f"cannot download {url}" in output and "Download it by hand" in output
    assert str(tmp_path / "cache") in output  # where to put the file
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # no half file, visible or hidden
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_dir() and not any(p.iterdir())]  # no empty folders


def test_unreachable_host_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    with socket.socket() as s:  # a port nobody listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(DownloadError, match=f"cannot download http://127.0.0.1:{port}/x.npz"):
        resolve_source(f"http://127.0.0.1:{port}/x.npz", timeout=2, progress=False)
    assert time.monotonic() - start < 5


def test_offline_env_never_touches_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    with pytest.raises(DownloadError, match="offline mode"):
        resolve_source("gs://vit_models/imagenet21k/ViT-B_16.npz", progress=False)


def test_download_over_http_is_cached_with_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real HTTP download (local server) lands in the sha256-keyed cache; a second resolve needs no network."""
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(BV.parent))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{BV.name}"
    try:
        first = resolve_source(url, progress=False)
    finally:
        server.shutdown()
        server.server_close()
    assert first.sha256 == sha256_file(BV) and first.path.read_bytes() == BV.read_bytes()
    assert first.path.is_relative_to(tmp_path / "cache")
    again = resolve_source(url, progress=False)  # server is gone: must come from the cache
    assert again.path == first.path and again.sha256 == first.sha256
