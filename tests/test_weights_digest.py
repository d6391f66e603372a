"""The weights digest conversion.json / training.json record: the same for a state dict and the safetensors file it is
saved as (whoever writes it), different as soon as one value, name, dtype or shape differs."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hub_vit.weights_digest import PREFIX, file_digest, state_dict_digest


def sample() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"blocks.0.w": torch.randn(3, 4, generator=g), "b16": torch.randn(5, generator=g).to(torch.bfloat16),
            "steps": torch.arange(6, dtype=torch.int64), "mask": torch.tensor([True, False]),
            "scalar": torch.tensor(2.5, dtype=torch.float16)}


def test_file_digest_equals_state_dict_digest_whatever_the_file_metadata(tmp_path: Path) -> None:
    state = sample()
    save_file(state, tmp_path / "a.safetensors", metadata={"format": "pt"})
    save_file(dict(reversed(list(state.items()))), tmp_path / "b.safetensors")  # other order, no metadata
    digest = state_dict_digest(state)
    assert digest.startswith(PREFIX)
    assert file_digest(tmp_path / "a.safetensors") == file_digest(tmp_path / "b.safetensors") == digest
    assert (tmp_path / "a.safetensors").read_bytes() != (tmp_path / "b.safetensors").read_bytes()


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"])
def test_every_dtype_safetensors_writes_has_a_digest(dtype: str, tmp_path: Path) -> None:
    # was: TypeError "... has no safetensors name" for dtypes safetensors' save_file writes
    torch_dtype = getattr(torch, dtype, None)
    if torch_dtype is None:
        pytest.skip(f"this torch has no {dtype}")
    state = {"t": torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch_dtype)}
    save_file(state, tmp_path / "w.safetensors")
    assert file_digest(tmp_path / "w.safetensors") == state_dict_digest(state)


@pytest.mark.parametrize("change", ["value", "name", "dtype", "shape"])
def test_any_change_changes_the_digest(change: str) -> None:
    state = sample()
    other = dict(state)
    if change == "value":
        other["blocks.0.w"] = state["blocks.0.w"].clone()
        other["blocks.0.w"][1, 2] = torch.nextafter(other["blocks.0.w"][1, 2], torch.tensor(10.0))  # one ulp
    elif change == "name":
        other["blocks.1.w"] = other.pop("blocks.0.w")
    elif change == "dtype":
        other["blocks.0.w"] = state["blocks.0.w"].double()
    else:
        other["blocks.0.w"] = state["blocks.0.w"].reshape(4, 3)  # same bytes, another shape
    assert state_dict_digest(other) != state_dict_digest(state)


def test_a_damaged_file_is_named(tmp_path: Path) -> None:
    save_file(sample(), tmp_path / "ok.safetensors")
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "short.safetensors").write_bytes(data[:-7])  # the last tensor's bytes cut off
    with pytest.raises(ValueError, match=r"short\.safetensors is truncated"):
        file_digest(tmp_path / "short.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match=r"text\.safetensors is not a safetensors file"):
        file_digest(tmp_path / "text.safetensors")
    header = json.dumps({"w": {"dtype": "F32"}}).encode()  # no shape, no offsets
    (tmp_path / "odd.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(ValueError, match=r"odd\.safetensors is not a safetensors file \(entry 'w'"):
        file_digest(tmp_path / "odd.safetensors")
    for entries in ([1, 2], {"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}},
                    {"w": {"dtype": "F32", "shape": [1], "data_offsets": [True, 4]}}, {"w": None}):
        header = json.dumps(entries).encode()
        (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
        with pytest.raises(ValueError, match=r"bad\.safetensors is not a safetensors file"):
            file_digest(tmp_path / "bad.safetensors")
