"""Hostile or corrupt files are refused before anything is built or read, by every loader, with a message naming
the problem: a config declaring absurd sizes, weights that disagree with their config (head included), NaN and
integer weights, headers declaring tensors no ViT has. A killed conversion's staging folder is swept by the next.

Every case here was accepted (or built for minutes, then died in the allocator) before the checks existed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import zipfile
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageClassification
from typer.testing import CliRunner

import hub_vit  # noqa: F401  (registers the timm models and the transformers Auto classes)
from hub_vit.atomic import staging_dir, sweep_staging
from hub_vit.cli import _load_commands
from hub_vit.cli.app import app
from hub_vit.conversion import convert_npz_file, read_npz
from hub_vit.folder import load_model_folder, save_model_folder
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec
from tests.stalled_convert import start_stalled_convert

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
GOOD_NPZ = JAX / "vit_jax" / "tiny_token.published.npz"  # Google's vit_jax layout, width 64, depth 2, mlp 128
SPEC = ViTSpec(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, img_size=32, num_classes=5)
LOADERS = ("folder", "timm", "transformers")
_load_commands()


def _folder(tmp_path: Path, name: str = "model") -> Path:
    torch.manual_seed(0)
    model = VisionTransformer(SPEC)
    torch.nn.init.normal_(model.head.weight)  # a head that is not all zero: a dropped head would show
    return save_model_folder(model, tmp_path / name)


def _edit_config(folder: Path, **fields: object) -> None:
    """Change size fields where every loader reads them: the transformers keys and timm's `model_args`."""
    config = json.loads((folder / "config.json").read_text())
    for key, value in fields.items():
        config[key] = value
        config["model_args"][key] = value
    if "num_classes" in fields:  # the labels follow the class count, so only the head disagrees
        n = int(fields["num_classes"])
        config["id2label"] = {str(i): f"class_{i}" for i in range(n)}
        config["label2id"] = {f"class_{i}": i for i in range(n)}
        config["label_names"] = [f"class_{i}" for i in range(n)]
        (folder / "labels.txt").write_text("".join(f"class_{i}\n" for i in range(n)))
    (folder / "config.json").write_text(json.dumps(config))


def _edit_weights(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path), metadata=metadata)


def _load(loader: str, folder: Path, **kwargs: object) -> torch.nn.Module:
    if loader == "folder":
        return load_model_folder(folder)[0]
    if loader == "timm":
        return timm.create_model(f"local-dir:{folder}", pretrained=True, **kwargs)
    return AutoModelForImageClassification.from_pretrained(folder, **kwargs)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------------------------- sizes a config declares
@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize(("field", "value"), [("depth", 1_000_000_000), ("in_chans", 1_000_000), ("width", 2**20)])
def test_absurd_config_sizes_are_refused_before_building(tmp_path: Path, loader: str, field: str, value: int) -> None:
    # each built blocks for 40+ s, then died with a message-less MemoryError
    folder = _folder(tmp_path)
    _edit_config(folder, **{field: value})
    with pytest.raises(ValueError, match=f"{field}: {value} is out of bounds"):
        _load(loader, folder)


@pytest.mark.parametrize(("text", "said"), [("{not json", "is not readable JSON (Expecting property name"),
                                            ("[1, 2]", "holds a JSON list, not an object of config fields")])
def test_a_config_that_is_not_a_json_object_is_named(tmp_path: Path, text: str, said: str) -> None:
    # was the parser's words alone ("Expecting property name enclosed in double quotes: line 1 column 2"), or an
    # AttributeError for a list, naming no file; `export onnx` and the folder loader read it
    folder = _folder(tmp_path)
    (folder / "config.json").write_text(text)
    with pytest.raises(ValueError, match=f"config.json' {re.escape(said)}"):
        load_model_folder(folder)
    result = CliRunner().invoke(app, ["export", "onnx", str(folder), "-o", str(tmp_path / "out"), "-v", "fp32"])
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("loader", LOADERS)
def test_config_that_disagrees_with_the_weights_names_the_field(tmp_path: Path, loader: str) -> None:
    folder = _folder(tmp_path)
    _edit_config(folder, depth=3, mlp_dim=128)
    with pytest.raises(ValueError) as info:
        _load(loader, folder)
    text = str(info.value)
    assert "config.json declares depth: 3, model.safetensors holds 2" in text, text
    assert "config.json declares mlp_dim: 128, model.safetensors holds 64" in text, text
    assert "missing keys (" in text and "blocks.2.attn.qkv.weight" in text, text


def test_a_header_declaring_more_bytes_than_the_file_holds_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    path = folder / "model.safetensors"
    header = json.dumps({"head.weight": {"dtype": "F32", "shape": [32768, 16384], "data_offsets": [0, 2**31]}})
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(64))
    for loader in LOADERS:
        with pytest.raises(ValueError, match=r"tensor 'head.weight' \(32768, 16384\) F32 does not fit its bytes"):
            _load(loader, folder)


# ----------------------------------------------------------------------------------------------- head mismatch
@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_refuses_a_head_that_disagrees_with_the_config(tmp_path: Path, loader: str) -> None:
    # timm's local-dir: swapped in a zero head of the config's class count, silently
    folder = _folder(tmp_path)
    _edit_config(folder, num_classes=7)
    with pytest.raises(ValueError) as info:
        _load(loader, folder)
    text = str(info.value)
    assert "config.json declares num_classes: 7, model.safetensors holds 5" in text, text
    assert "head.weight: checkpoint (5, 32) vs model (7, 32)" in text, text


def test_a_new_head_asked_for_explicitly_is_still_given(tmp_path: Path) -> None:
    """Fine-tuning as each library spells it: timm's `num_classes=`, transformers' `ignore_mismatched_sizes=True`."""
    folder = _folder(tmp_path)
    model = timm.create_model(f"local-dir:{folder}", pretrained=True, num_classes=3)
    assert model.head.weight.shape == (3, 32) and not model.head.weight.any()
    reference = load_model_folder(folder)[0]
    assert torch.equal(model.blocks[0].attn.qkv.weight, reference.blocks[0].attn.qkv.weight)
    hf = AutoModelForImageClassification.from_pretrained(folder, num_labels=3, ignore_mismatched_sizes=True)
    assert hf.vit.head.weight.shape == (3, 32)


# ------------------------------------------------------------------------------------- values: NaN and integers
def _with_nan(state: dict[str, torch.Tensor]) -> None:
    state["blocks.1.mlp.fc1.weight"][0, :3] = float("nan")


@pytest.mark.parametrize("loader", LOADERS)
def test_nan_weights_are_refused_by_every_loader(tmp_path: Path, loader: str) -> None:
    # a folder with NaN weights was served: every answer NaN
    folder = _folder(tmp_path)
    _edit_weights(folder, _with_nan)
    with pytest.raises(ValueError, match=r"holds NaN or inf values in 1 tensor\(s\): blocks.1.mlp.fc1.weight \(3 of"):
        _load(loader, folder)


def test_nan_weights_are_refused_at_repository_build(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _edit_weights(folder, _with_nan)
    out = tmp_path / "repo"
    result = CliRunner().invoke(app, ["repository", str(out), "--model", str(folder)])
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "holds NaN or inf values in 1 tensor(s)" in text, text
    assert "model.safetensors" in text and not out.exists() and _leftovers(tmp_path) == []


def _to_int32(state: dict[str, torch.Tensor]) -> None:
    state["blocks.0.attn.proj.weight"] = state["blocks.0.attn.proj.weight"].round().to(torch.int32)


@pytest.mark.parametrize("loader", LOADERS)
def test_integer_weights_are_refused_by_every_loader(tmp_path: Path, loader: str) -> None:
    folder = _folder(tmp_path)
    _edit_weights(folder, _to_int32)
    with pytest.raises(ValueError, match=r"1 tensor\(s\) are not floating point: blocks.0.attn.proj.weight \(I32\)"):
        _load(loader, folder)


def test_integer_weights_in_a_bare_file_are_refused_by_timm(tmp_path: Path) -> None:
    """A `.pt` file has no header to read first: its values are checked once loaded, before they reach the model."""
    state = load_file(str(_folder(tmp_path) / "model.safetensors"))
    _to_int32(state)
    torch.save(state, tmp_path / "weights.pt")
    with pytest.raises(ValueError, match=r"not floating point: blocks.0.attn.proj.weight \(torch.int32\)"):
        timm.create_model("hub_vit", pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "weights.pt")),
                          **{k: v for k, v in SPEC.to_dict().items()})


def test_convert_refuses_integer_weights(tmp_path: Path) -> None:
    arrays = read_npz(GOOD_NPZ)
    key = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"
    arrays[key] = (arrays[key] * 100).astype(np.int32)
    np.savez(tmp_path / "int.npz", **arrays)
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "int.npz"), "-o", str(tmp_path / "out")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "1 weight array(s) are not floating point" in text, text
    assert f"{key} (int32)" in text and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------ an npz declaring two 2 GiB kernels
def _npz_with_huge_kernels(path: Path) -> None:
    """Google's tiny vit_jax checkpoint blown up to width 16384 / mlp 32768 with one block: every header is
    consistent, and each MLP kernel declares (16384, 32768) float32 = 2 GiB. Members over a million values hold
    only their headers (the converter must refuse before reading any of them); the others are complete arrays."""
    scale = {64: 16384, 128: 32768, 32: 8192}  # width, mlp_dim, head_dim (2 heads); no other dimension is one of these
    with np.load(GOOD_NPZ) as npz, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for key in npz.files:
            if key.startswith("Transformer/encoderblock_1/"):
                continue
            shape = tuple(scale.get(d, d) for d in npz[key].shape)
            with out.open(f"{key}.npy", "w") as member:
                if np.prod(shape) > 1_000_000:
                    np.lib.format.write_array_header_1_0(
                        member, {"descr": "<f4", "fortran_order": False, "shape": shape})
                else:
                    np.lib.format.write_array(member, np.zeros(shape, np.float32))


def test_convert_refuses_an_npz_declaring_huge_kernels(tmp_path: Path) -> None:
    # it allocated both kernels and died in torch's allocator with a raw traceback
    src = tmp_path / "huge.npz"
    _npz_with_huge_kernels(src)
    assert src.stat().st_size < 5_000_000
    result = CliRunner().invoke(app, ["convert", str(src), "-o", str(tmp_path / "out")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert ("tensor 'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel' declares shape (16384, 32768), "
            "536,870,912 values (2.0 GiB as float32)") in text, text
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="MlpBlock_3/Dense_0/kernel' declares shape"):
        convert_npz_file(src)


# ----------------------------------------------------------------------------------------- stale temp folders
def test_staging_of_dead_processes_is_swept_and_live_ones_kept(tmp_path: Path) -> None:
    target = tmp_path / "out"
    live = staging_dir(target)  # this process: alive
    host, pid, namespace = live.name[len(".out.tmp-"):].split("-")[:3]
    assert (pid, namespace) == (str(os.getpid()), f"n{os.stat('/proc/self/ns/pid').st_ino}"), live.name
    dead = tmp_path / f".out.tmp-{host}-999999999-{namespace}-abcdefgh"  # above any pid_max: no such process
    unnamed = tmp_path / f".out.tmp-{host}-999999999-abcdefgh"  # named without a namespace: judged by its pid
    other_host = tmp_path / ".out.tmp-elsewhere-999999999-abcdefgh"
    # another container of this host name (one Kubernetes pod) sharing the folder: its pid means nothing here
    other_namespace = tmp_path / f".out.tmp-{host}-999999999-n1-abcdefgh"
    old_copy = tmp_path / f".out.old-{host}-999999999-{namespace}-abcdefgh"  # the only copy while `out` is missing
    unrelated = tmp_path / ".out.tmp-notours"
    for folder in (dead, unnamed, other_host, other_namespace, old_copy, unrelated):
        folder.mkdir()
    assert sorted(sweep_staging(target)) == sorted([dead, unnamed])
    target.mkdir()
    assert sweep_staging(target) == [old_copy]  # `out` exists again: the old copy is garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other_host.name, other_namespace.name,
                                                                 unrelated.name, "out"])


def test_a_killed_convert_leaves_staging_that_the_next_run_sweeps(tmp_path: Path) -> None:
    # SIGKILL runs no cleanup: `.out.tmp-*` with a full copy of the weights stayed for good
    proc = start_stalled_convert(GOOD_NPZ, tmp_path / "out")
    try:
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.stdout.close()
    left = _leftovers(tmp_path)
    assert len(left) == 1 and left[0].startswith(".out.tmp-") and f"-{proc.pid}-" in left[0]
    result = CliRunner().invoke(app, ["convert", str(GOOD_NPZ), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert _leftovers(tmp_path) == [] and (tmp_path / "out" / "model.safetensors").is_file()
    assert os.access(tmp_path / "out", os.R_OK)


def _broken_weights_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a weights file that holds no usable weights, what the refusal says of it)."""
    good = _folder(tmp_path) / "model.safetensors"
    state = load_file(str(good))
    files = {"cut.safetensors": (good.read_bytes()[:2000], "not a readable safetensors file (Error while "
                                 "deserializing header"),
             "empty.safetensors": (b"", "not a readable safetensors file"),
             "junk.pt": (b"hello" * 100, "cannot read it as a torch file (KeyError: 101); is the file complete?"),
             "pickled.pt": (b"\x80\x04\x95\x0e\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94.",
                            "not a weights-only torch file")}
    found = {}
    for name, (data, said) in files.items():
        (tmp_path / name).write_bytes(data)
        found[name] = (tmp_path / name, said)
    for name, value, said in (("list.pt", [1, 2], "it holds a list, not a dict of weights"),
                              ("state.pt", {"optimizer": {}, "scheduler": {}, "step": 3},
                               "the training state of a checkpoint (optimizer, scheduler, step), not weights"),
                              ("other.pt", {"weights": state, "epoch": 3}, "none of model, state_dict, "
                               "model_state_dict is a dict of tensors")):
        torch.save(value, tmp_path / name)
        found[name] = (tmp_path / name, said)
    cut = tmp_path / "cut.pt"  # a copy cut short
    torch.save(state, cut)
    cut.write_bytes(cut.read_bytes()[:1000])
    found["cut.pt"] = (cut, "is the file complete?")
    return found


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")  # pickled.pt's, on its way to the refusal
def test_a_weights_file_that_holds_no_weights_is_named_by_the_reader(tmp_path: Path) -> None:
    # was: SafetensorError, KeyError, AttributeError ('int' object has no attribute 'startswith') tracebacks
    from hub_vit.weights import WeightsFileError, load_weights_file

    for path, said in _broken_weights_files(tmp_path).values():
        with pytest.raises(WeightsFileError) as caught:
            load_weights_file(path)
        assert str(caught.value).startswith(f"weights file {str(path)!r}: ") and said in str(caught.value), caught.value
    state = load_file(str(tmp_path / "model" / "model.safetensors"))  # the folder _broken_weights_files saved
    torch.save({"model": state, "optimizer": {}, "epoch": 3}, tmp_path / "checkpoint.pt")  # a training script's
    assert load_weights_file(tmp_path / "checkpoint.pt").keys() == state.keys()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
def test_export_of_a_broken_weights_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    for name, (path, said) in _broken_weights_files(tmp_path).items():
        out = tmp_path / f"out_{name}"
        result = runner.invoke(app, ["export", "onnx", str(path), "--model", "simplevit_digits", "-o", str(out),
                                     "--variant", "fp32"])
        flat = " ".join(result.output.split())
        assert result.exit_code == 2 and f"error: weights file {str(path)!r}: " in flat and said in flat, flat
        assert "Traceback" not in result.output and not out.exists()


def test_a_weights_file_given_with_its_architecture_is_checked_naming_the_file(tmp_path: Path) -> None:
    # `hub-vit export FILE --model NAME`: the refusal named no file ("the checkpoint holds NaN ...")
    from hub_vit.catalog import default_model_folder

    state = load_file(str(default_model_folder() / "model.safetensors"))
    state["blocks.0.mlp.fc1.weight"][0, :3] = float("nan")
    weights = tmp_path / "nan.safetensors"
    save_file(state, str(weights))
    _load_commands()
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", "onnx", str(weights), "--model", "simplevit_digits", "-o", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and f"weights file '{weights}' holds NaN or inf values in 1 tensor(s)" in text, text
    assert not out.exists()
