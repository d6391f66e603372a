"""Local weight files given to timm (`pretrained_cfg_overlay=dict(file=...)`, `create_model(checkpoint_path=...)`) are
read by hub-vit's loader with its checks (docs/architecture.md "Loading untrusted files"), never by timm's: every
refusal is hub-vit's, names the file, and never advises `weights_only=False`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

import hub_vit  # noqa: F401  (registers the timm models)
import hub_vit.timm_plugin
from hub_vit.weights_check import CheckpointMismatchError

NAME = "simplevit_digits"
NPZ = Path(__file__).resolve().parent / "fixtures" / "jax" / "vit_jax" / "tiny_token.published.npz"
# vit_jax/fixtures.json: the architecture of tiny_token
TINY_TOKEN = dict(width=64, depth=2, num_heads=2, mlp_dim=128, patch_size=16, num_classes=10, img_size=64,
                  posemb="learn", pool_type="tok", posemb_on_cls=True)


def _weights() -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {k: v.clone().normal_(std=0.1) for k, v in timm.create_model(NAME).state_dict().items()}


def _bad_files(folder: Path) -> dict[str, tuple[Path, type[Exception], str]]:
    """name -> (file, the refusal's type, what it says)"""
    weights = _weights()
    files: dict[str, tuple[Path, type[Exception], str]] = {}
    text = folder / "notes.txt"
    text.write_text("hello weights\n")  # was: the unpickler's `KeyError: 101`
    files["text"] = (text, ValueError, "unsupported weights file 'notes.txt'")
    noise = folder / "noise.pt"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))  # was: "... retry with weights_only=False"
    files["random bytes .pt"] = (noise, ValueError, "not a weights-only torch file")
    for suffix in (".safetensors", ".pt"):
        nan = dict(weights, **{"blocks.0.attn.qkv.weight": torch.full_like(weights["blocks.0.attn.qkv.weight"],
                                                                           float("nan"))})
        wrong = dict(weights, **{"norm.weight": torch.ones(65)})
        for name, state in (("nan", nan), ("wrong", wrong)):
            path = folder / f"{name}{suffix}"
            save_file(state, str(path)) if suffix == ".safetensors" else torch.save(state, path)
        files[f"NaN {suffix}"] = (folder / f"nan{suffix}", ValueError,
                                  "holds NaN or inf values in 1 tensor(s): blocks.0.attn.qkv.weight")
        files[f"wrong shape {suffix}"] = (folder / f"wrong{suffix}", CheckpointMismatchError,
                                          f"declares width: 64, wrong{suffix} holds 65")
    ints = folder / "ints.pt"
    torch.save(dict(weights, **{"norm.weight": torch.ones(64, dtype=torch.int32)}), ints)
    files["integers .pt"] = (ints, ValueError, "not floating point: norm.weight (torch.int32)")
    huge = folder / "huge.safetensors"  # declares a 4 TiB kernel: was a raw SafetensorError
    header = json.dumps({"blocks.0.attn.qkv.weight": {"dtype": "F32", "shape": [1 << 20, 1 << 20],
                                                      "data_offsets": [0, 16]}}).encode()
    huge.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    files["huge shape"] = (huge, ValueError, "(1048576, 1048576) F32 does not fit its bytes in the file")
    return files


CASES = ["text", "random bytes .pt", "NaN .safetensors", "NaN .pt", "wrong shape .safetensors", "wrong shape .pt",
         "integers .pt", "huge shape"]


def _refused(path: Path, kind: type[Exception], said: str, **kwargs: object) -> str:
    with pytest.raises(kind) as caught:
        timm.create_model(NAME, **kwargs)
    message = str(caught.value)
    assert said in message and (str(path) in message or path.name in message), message
    assert "weights_only=False" not in message, message
    return message


@pytest.mark.parametrize("case", CASES)
def test_checkpoint_path_is_read_with_hub_vits_checks(tmp_path: Path, case: str) -> None:
    # was: NaN and integer weights loaded silently; the others raised timm's / torch's / safetensors' own errors
    path, kind, said = _bad_files(tmp_path)[case]
    _refused(path, kind, said, checkpoint_path=str(path))


@pytest.mark.parametrize("case", CASES)
def test_pretrained_cfg_overlay_file_is_read_with_hub_vits_checks(tmp_path: Path, case: str) -> None:
    # was: a text file and random bytes reached torch.load (`KeyError: 101`, advice to retry with weights_only=False);
    # NaN weights were refused as "the checkpoint", naming no file
    path, kind, said = _bad_files(tmp_path)[case]
    _refused(path, kind, said, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


@pytest.mark.parametrize("case", ["text", "wrong shape .safetensors", "huge shape"])
def test_what_a_files_name_or_header_shows_is_refused_before_the_model_is_built(tmp_path: Path, case: str,
                                                                                monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    def build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was built before the file was refused")

    path, kind, said = _bad_files(tmp_path)[case]
    monkeypatch.setattr(hub_vit.timm_plugin, "build_model_with_cfg", build)
    _refused(path, kind, said, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_good_files_load_exactly_by_both_routes(tmp_path: Path, suffix: str) -> None:
    weights = _weights()
    path = tmp_path / f"model{suffix}"
    save_file(weights, str(path)) if suffix == ".safetensors" else torch.save({"model": weights, "epoch": 3}, path)
    for kwargs in (dict(checkpoint_path=str(path)), dict(pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))):
        state = timm.create_model(NAME, **kwargs).state_dict()
        assert all(torch.equal(state[k], v) for k, v in weights.items()), kwargs


def test_checkpoint_path_takes_the_ema_weights_as_timm_does(tmp_path: Path) -> None:
    # timm's load_checkpoint(use_ema=True) prefers `state_dict_ema`; hub-vit's reader alone would take `state_dict`
    weights = _weights()
    ema = {k: v + 1 for k, v in weights.items()}
    torch.save({"state_dict": weights, "state_dict_ema": ema}, tmp_path / "train.pt")
    model = timm.create_model(NAME, checkpoint_path=str(tmp_path / "train.pt"))
    assert torch.equal(model.norm.weight, ema["norm.weight"])
    timm.models.load_checkpoint(model, str(tmp_path / "train.pt"), use_ema=False)
    assert torch.equal(model.norm.weight, weights["norm.weight"])


def test_checkpoint_path_of_a_class_count_the_model_lacks_is_refused_not_given_a_new_head(tmp_path: Path) -> None:
    # loaded strictly, as timm does: a random head saved into a folder would pass for the trained one
    save_file(_weights(), str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=f"{NAME} declares num_classes: 5, model.safetensors holds 10"):
        timm.create_model(NAME, num_classes=5, checkpoint_path=str(tmp_path / "model.safetensors"))


def test_other_timm_models_keep_timms_checkpoint_loader(tmp_path: Path) -> None:
    source = timm.create_model("test_vit", num_classes=3)
    torch.save(source.state_dict(), tmp_path / "test_vit.pt")
    model = timm.create_model("test_vit", num_classes=3, checkpoint_path=str(tmp_path / "test_vit.pt"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in source.state_dict().items())


def test_the_advice_for_a_weights_file_where_a_folder_is_needed_checks_the_weights(tmp_path: Path) -> None:
    # `hub-vit rollout --model nan.safetensors` advises hub_vit.save_model_folder(timm.create_model(NAME,
    # checkpoint_path=FILE), FOLDER): that route must refuse what a folder's loader refuses
    from hub_vit.resolve import locate

    path, kind, said = _bad_files(tmp_path)["NaN .safetensors"]
    with pytest.raises(ValueError, match=r"timm.create_model\(NAME, checkpoint_path=FILE\)"):
        locate(str(path), takes=frozenset({"folder"}))
    _refused(path, kind, said, checkpoint_path=str(path))


@pytest.mark.parametrize("route", ["checkpoint_path", "file"])
def test_an_npz_missing_a_kernel_is_a_value_error_naming_the_file(tmp_path: Path, route: str) -> None:
    # was: KeyError, its message repr-quoted; `hub-vit convert` printed the same text cleanly
    with np.load(NPZ) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"}
    path = tmp_path / "missing.npz"
    np.savez(path, **arrays)
    kwargs = dict(checkpoint_path=str(path)) if route == "checkpoint_path" else \
        dict(pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    with pytest.raises(ValueError, match=f"^weights file '{path}': checkpoint is missing '.*', which every ViT"):
        timm.create_model("hub_vit", **kwargs, **TINY_TOKEN)


def test_checkpoint_path_of_a_folder_says_how_a_folder_loads(tmp_path: Path) -> None:
    # was: timm's bare FileNotFoundError(), its log alone naming the path
    with pytest.raises(IsADirectoryError, match=f"checkpoint_path='{tmp_path}' is a folder; .*'local-dir:{tmp_path}'"):
        timm.create_model(NAME, checkpoint_path=str(tmp_path))
