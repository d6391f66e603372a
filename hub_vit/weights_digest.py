"""A digest of a model's weights by content, so that what was said about some weights stays tied to those weights.

`hub-vit convert` and `hub-vit train` record it (`weights_digest` in conversion.json / training.json) for the weights
they write; a model card repeats the claims of that record (Google's published results, conversion parity, held-out
accuracy) only while the folder's model.safetensors still holds the same weights. A folder fine-tuned, re-saved with
other values or given another weight file afterwards keeps its record, but the claims no longer describe it.

The digest covers tensor names, dtypes, shapes and values, not the file's bytes: transformers' `save_pretrained` may
write the same tensors with other metadata or in another order, and that must not count as a change.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

PREFIX = "tensors-sha256:"
_CHUNK = 1 << 24  # 16 MiB reads: a B/16 file (330 MB) hashes in well under a second, H/14 (2.5 GB) in a few
# torch dtype -> the name safetensors writes in a file's header
_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
# dtypes only newer torch releases have (safetensors writes them where torch has them)
_SAFETENSORS_DTYPES.update({getattr(torch, attr): name for attr, name in (
    ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"), ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
) if hasattr(torch, attr)})


def _entry_header(name: str, dtype: str, shape: list[int]) -> bytes:
    # length-prefixed, so no name/dtype/shape boundary can be shifted into another without changing the digest
    meta = json.dumps([name, dtype, list(shape)]).encode()
    return struct.pack("<Q", len(meta)) + meta


def state_dict_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """`tensors-sha256:<hex>` of a state dict, equal to `file_digest` of the safetensors file it is saved as."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"{name}: dtype {tensor.dtype} has no safetensors name")
        h.update(_entry_header(name, _SAFETENSORS_DTYPES[tensor.dtype], list(tensor.shape)))
        data = tensor.reshape(-1).view(torch.uint8).numpy()  # safetensors stores little-endian, as x86/ARM do
        h.update(struct.pack("<Q", data.nbytes))
        h.update(memoryview(data))
    return PREFIX + h.hexdigest()


def file_digest(path: str | Path) -> str:
    """`tensors-sha256:<hex>` of a safetensors file, read from its header and data without building tensors.

    Raises ValueError naming the file when its header is not safetensors'.
    """
    path = Path(path)
    h = hashlib.sha256()
    with path.open("rb") as f:
        try:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > path.stat().st_size - 8:  # text or another format: its first 8 bytes are no length
                raise ValueError(f"a header of {header_len} bytes does not fit in the file")
            header = json.loads(f.read(header_len))
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} is not a safetensors file (its header cannot be read: {exc})") from exc
        start = 8 + header_len
        if not isinstance(header, dict):
            raise ValueError(f"{path} is not a safetensors file (its header is not a JSON object)")
        for name in sorted(k for k in header if k != "__metadata__"):
            try:
                begin, end = header[name]["data_offsets"]
                if not (type(begin) is int and type(end) is int and 0 <= begin <= end):  # bool is an int subclass
                    raise ValueError(f"data_offsets {[begin, end]!r} are not 0 <= begin <= end")
                h.update(_entry_header(name, str(header[name]["dtype"]), list(header[name]["shape"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path} is not a safetensors file (entry {name!r} of its header: {exc!r})") from exc
            h.update(struct.pack("<Q", end - begin))
            f.seek(start + begin)
            left = end - begin
            while left:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    raise ValueError(f"{path} is truncated: tensor {name!r} ends past the end of the file")
                h.update(chunk)
                left -= len(chunk)
    return PREFIX + h.hexdigest()


__all__ = ["PREFIX", "file_digest", "state_dict_digest"]
