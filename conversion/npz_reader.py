"""Safe, lazy reading of Google's `.npz` checkpoints (vit_jax and big_vision both write them with `np.savez`).

Nothing is ever unpickled: each member's `.npy` header is parsed first, object dtypes are refused with a clear error,
and arrays are read with `allow_pickle=False`. The archive is opened lazily, so the converter can infer the
architecture from the headers alone and then read one array at a time (bounded memory on a 1.2 GB ViT-L file).

bfloat16 arrays are stored by numpy as 2-byte void (`|V2`); like big_vision's `utils.recover_dtype` they are
reinterpreted as bfloat16, then widened to float32 (exact: bfloat16 is the top half of a float32).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np


class CheckpointFormatError(ValueError):
    """The file is not a readable npz checkpoint (not a zip, truncated, pickled objects, unknown dtype)."""


def bf16_void_to_float32(array: np.ndarray) -> np.ndarray:
    """`|V2` (bfloat16 bytes) -> float32: shift the 16 stored bits into the high half of a 32-bit word."""
    if array.dtype.itemsize != 2:
        raise CheckpointFormatError(f"void array with itemsize {array.dtype.itemsize}; only |V2 (bfloat16) is known")
    bits = array.view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def _recover_dtype(key: str, array: np.ndarray) -> np.ndarray:
    if array.dtype.type is np.void:
        return bf16_void_to_float32(array)
    if array.dtype.kind not in "fiub":
        raise CheckpointFormatError(f"array {key!r} has dtype {array.dtype}; a checkpoint holds numbers only")
    return array


class NpzArchive(Mapping[str, np.ndarray]):
    """A read-only, lazy view of an `.npz` file: `shapes`/`dtypes` come from the headers; `archive[key]` reads.

    Use as a context manager (or call `close()`); each `archive[key]` reads that one array from disk.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"checkpoint file {str(self.path)!r} does not exist")
        if not zipfile.is_zipfile(self.path):
            with open(self.path, "rb") as f:
                head = f.read(8)
            if head.startswith(b"PK\x03\x04"):  # a zip that lost its end: the central directory is missing
                raise CheckpointFormatError(
                    f"{str(self.path)!r} is a truncated or damaged npz archive (zip header present, end of archive "
                    "missing); download or copy it again"
                )
            hint = " (it is a single .npy array, not an .npz archive)" if head.startswith(b"\x93NUMPY") else ""
            raise CheckpointFormatError(
                f"{str(self.path)!r} is not an npz checkpoint: not a zip archive (first bytes {head!r}){hint}; "
                "expected a file written by numpy.savez, as vit_jax and big_vision write them"
            )
        try:
            self._zip = zipfile.ZipFile(self.path)
            names = self._zip.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise CheckpointFormatError(f"{str(self.path)!r} is a damaged or truncated npz archive: {exc}") from exc
        self._members: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, np.dtype] = {}
        for name in names:
            key = name[:-4] if name.endswith(".npy") else name
            self._members[key] = name
            shape, dtype = self._read_header(name)
            if dtype.hasobject:
                raise CheckpointFormatError(
                    f"array {key!r} in {self.path.name!r} has dtype object (pickled Python objects); "
                    "checkpoints are loaded with allow_pickle=False and may only hold numeric arrays"
                )
            self.shapes[key] = shape
            self.dtypes[key] = dtype
        if not self._members:
            raise CheckpointFormatError(f"{str(self.path)!r} is an empty npz archive (no arrays)")

    def _read_header(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        try:
            with self._zip.open(name) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        except (ValueError, zipfile.BadZipFile, OSError, EOFError) as exc:
            raise CheckpointFormatError(
                f"member {name!r} of {self.path.name!r} is not a valid .npy array: {exc}"
            ) from exc
        return tuple(int(s) for s in shape), dtype

    # ---------------------------------------------------------------------------------------------- Mapping API
    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._members:
            raise KeyError(key)
        try:
            with self._zip.open(self._members[key]) as f:
                array = np.lib.format.read_array(f, allow_pickle=False)
        except (ValueError, zipfile.BadZipFile, OSError, EOFError) as exc:
            raise CheckpointFormatError(
                f"cannot read array {key!r} from {self.path.name!r} (truncated or corrupt file?): {exc}"
            ) from exc
        return _recover_dtype(key, array)

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Read every array of an `.npz` checkpoint (bf16 widened to float32). Errors name the file and the problem."""
    with NpzArchive(path) as archive:
        return {key: archive[key] for key in archive}


__all__ = ["CheckpointFormatError", "NpzArchive", "bf16_void_to_float32", "read_npz"]
