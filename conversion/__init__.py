"""Google JAX checkpoints (vit_jax and big_vision `.npz`) -> hub-vit PyTorch weights, with measured parity.

Pure functions (`read_npz`, `detect_layout`, `infer_spec`, `convert_arrays`, `convert_npz_file`) plus the folder
writer behind `hub-vit convert` (`hub_vit.conversion.writer.convert_to_folder`). See docs/conversion.md.
"""

from __future__ import annotations

from .convert import Conversion, convert_arrays, convert_file, convert_npz_file, convert_view, load_checkpoint
from .infer import ArchitectureMismatchError, check_compatible, check_variant, infer_spec, match_architecture
from .layouts import Layout, LayoutError, canonicalize, detect_layout
from .npz_reader import CheckpointFormatError, NpzArchive, read_npz

__all__ = [
    "ArchitectureMismatchError",
    "CheckpointFormatError",
    "Conversion",
    "Layout",
    "LayoutError",
    "NpzArchive",
    "canonicalize",
    "check_compatible",
    "check_variant",
    "convert_arrays",
    "convert_file",
    "convert_npz_file",
    "convert_view",
    "detect_layout",
    "infer_spec",
    "load_checkpoint",
    "match_architecture",
    "read_npz",
]
