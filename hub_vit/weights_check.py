"""Checks on a weights file before it is trusted: its header against the config that describes it, bounded sizes,
floating-point dtypes, finite values.

Every loader (model folder, timm `local-dir:` / `hf-hub:` / `file=`, transformers `from_pretrained`) runs
`check_weights_file` on the safetensors header (names, dtypes, shapes: no tensor data is read) after the config's
fields passed `ViTSpec`'s bounds and before a module is built, so a hostile or corrupt file fails in milliseconds with
a message naming the field, instead of building blocks for a minute and dying in the allocator. `check_values` runs
on the loaded tensors: NaN / inf weights would serve NaN for every image, integer ones would be cast silently.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from hub_vit.variants import ViTSpec

# safetensors dtype names -> bytes per value. Only floating-point weights make a model.
FLOAT_ITEMSIZE: dict[str, int] = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
# The most values one tensor of a real ViT holds: ViT-22B's largest MLP kernel has 6144 x 24576 = 151M. 2^28 (1 GiB
# as float32) leaves room; a header declaring more (a 2 GiB kernel in a 4 MB compressed npz) is refused unread.
MAX_TENSOR_VALUES = 1 << 28
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header
GIB = float(1 << 30)


class CheckpointMismatchError(ValueError):
    """A state dict does not fit the model; the message lists every missing, unexpected and mis-shaped key."""


def strip_prefix(state_dict: dict[str, torch.Tensor], prefixes: tuple[str, ...] = ("vit.", "model.", "module.")
                 ) -> dict[str, torch.Tensor]:
    """Remove a wrapper prefix (transformers `vit.`, DDP `module.`) when every key carries it."""
    for prefix in prefixes:
        if state_dict and all(k.startswith(prefix) for k in state_dict):
            return {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def mismatch_message(header: str, missing: list[str], unexpected: list[str], mis_shaped: list[str],
                     missing_note: str = "", most: int | None = None) -> str:
    """One message naming every missing, unexpected and mis-shaped key, each group with its count; `most`: at most
    that many keys of each group (the header then says what they add up to, e.g. another architecture)."""
    def some(keys: list[str], sep: str) -> str:
        shown = keys if most is None or len(keys) <= most else [*keys[:most], f"... {len(keys) - most} more"]
        return sep.join(shown)

    lines = [header]
    if missing:
        lines.append(f"  missing keys ({len(missing)}){missing_note}: {some(missing, ', ')}")
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): {some(unexpected, ', ')}")
    if mis_shaped:
        lines.append(f"  shape mismatches ({len(mis_shaped)}): {some(mis_shaped, '; ')}")
    return "\n".join(lines)


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as a header declares it: shape and dtype (safetensors spelling: F32, BF16, I32, ...)."""

    shape: tuple[int, ...]
    dtype: str


def read_safetensors_header(path: Path) -> dict[str, TensorHeader]:
    """The tensors a `.safetensors` file declares, from its JSON header alone (8-byte length, then JSON)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{str(path)!r} is not a safetensors file: {size} bytes, shorter than the 8-byte header "
                             "length a safetensors file starts with; truncated or corrupt")
        length = int.from_bytes(head, "little")
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{str(path)!r} is not a safetensors file (its header length {length} does not fit the "
                             f"{size}-byte file); truncated or corrupt")
        try:
            raw = json.loads(f.read(length))
            entries = {name: (tuple(int(d) for d in e["shape"]), str(e["dtype"]), tuple(e["data_offsets"]))
                       for name, e in raw.items() if name != "__metadata__"}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{str(path)!r} has a malformed safetensors header: {exc}") from None
    headers = {}
    for name, (shape, dtype, offsets) in entries.items():
        itemsize = FLOAT_ITEMSIZE.get(dtype)
        if itemsize is not None and (len(offsets) != 2 or offsets[1] - offsets[0] != math.prod(shape) * itemsize
                                     or offsets[1] > size - 8 - length):
            raise ValueError(f"{str(path)!r}: tensor {name!r} {shape} {dtype} does not fit its bytes in the file "
                             f"(offsets {offsets}, file {size} bytes); truncated or corrupt")
        headers[name] = TensorHeader(shape, dtype)
    return headers


def available_memory() -> int | None:
    """Bytes this process can still allocate: the least of the host's MemAvailable, the cgroup's remaining limit and
    `ulimit -v` minus what the process maps already. None where none of them is known (not Linux)."""
    found = []
    try:
        meminfo = Path("/proc/meminfo").read_text()
        found += [int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    try:
        import resource  # POSIX only
    except ImportError:
        return max(min(found), 0) if found else None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            status = Path(f"/proc/{os.getpid()}/status").read_text()
            mapped = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmSize:"))
        except (OSError, ValueError, StopIteration):
            mapped = 0
        found.append(soft - mapped)
    return max(min(found), 0) if found else None


def check_sizes(shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Refuse a tensor above MAX_TENSOR_VALUES, and a total (as float32, the model's dtype) above the memory this
    process can still allocate: both before any tensor is read or module built."""
    for name, shape in shapes.items():
        values = math.prod(shape)
        if values > MAX_TENSOR_VALUES:
            raise ValueError(f"{source}: tensor {name!r} declares shape {tuple(shape)}, {values:,} values "
                             f"({values * 4 / GIB:.1f} GiB as float32); no ViT tensor comes near "
                             f"{MAX_TENSOR_VALUES:,}: the file is corrupt or hostile, refused before reading it")
    total = 4 * sum(math.prod(shape) for shape in shapes.values())
    free = available_memory()
    if free is not None and total > free:
        raise ValueError(f"{source} declares {total / GIB:.1f} GiB of weights (as float32), more than the "
                         f"{free / GIB:.1f} GiB this process can still allocate; refused before reading it")


def check_header(headers: Mapping[str, TensorHeader], source: str) -> None:
    """Floating-point dtypes only, then `check_sizes`."""
    wrong = [f"{name} ({h.dtype})" for name, h in headers.items() if h.dtype not in FLOAT_ITEMSIZE]
    if wrong:
        raise ValueError(f"{source}: {len(wrong)} tensor(s) are not floating point: {', '.join(wrong[:5])}; model "
                         f"weights are {', '.join(FLOAT_ITEMSIZE)} (loading would cast them silently into a wrong "
                         "model)")
    check_sizes({name: h.shape for name, h in headers.items()}, source)


def _header_fields(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int | None]:
    """The size fields a state dict's shapes show (timm key names); a field whose tensor is absent is left out."""
    fields: dict[str, int | None] = {}
    blocks = {int(k.split(".")[1]) for k in shapes if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    fields["depth"] = len(blocks)
    if len(shapes.get("norm.weight", ())) == 1:
        fields["width"] = shapes["norm.weight"][0]
    if len(shapes.get("blocks.0.mlp.fc1.weight", ())) == 2:
        fields["mlp_dim"] = shapes["blocks.0.mlp.fc1.weight"][0]
    if len(conv := shapes.get("patch_embed.proj.weight", ())) == 4:
        fields["in_chans"], fields["patch_size"] = conv[1], conv[2]
    fields["num_classes"] = shapes["head.weight"][0] if len(shapes.get("head.weight", ())) == 2 else 0
    fields["rep_size"] = shapes["pre_logits.fc.weight"][0] if len(shapes.get("pre_logits.fc.weight", ())) == 2 \
        else None
    return fields


# Tensors timm's adaptation may change on load (`hub_vit.weights.adapt_state_dict`): a learned position embedding's
# grid, the patch filters' input channels, the head (dropped when its class count differs).
_ADAPTED_FIELDS = ("in_chans", "num_classes")


def check_against_spec(shapes: Mapping[str, tuple[int, ...]], spec: ViTSpec, weights: str, config: str,
                       adaptable: bool = False) -> None:
    """Raise `CheckpointMismatchError` unless the tensors `weights` declares are exactly those of `spec` (what
    `config` declares), naming the differing fields first, then every missing, unexpected and mis-shaped key. With
    `adaptable` (a bare weights file, no config of its own), what `adapt_state_dict` adapts on load may differ."""
    shapes = strip_prefix(dict(shapes))
    found = _header_fields(shapes)
    fields = [f"{config} declares {name}: {getattr(spec, name)}, {weights} holds {value}"
              for name, value in found.items()
              if value != getattr(spec, name) and not (adaptable and name in _ADAPTED_FIELDS)]
    expected = _expected_shapes(spec)
    if adaptable:
        expected = {k: v for k, v in expected.items() if not k.startswith("head.")}
        shapes = {k: v for k, v in shapes.items() if not k.startswith("head.")}
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    mis_shaped = [f"{k}: checkpoint {tuple(shapes[k])} vs model {expected[k]}"
                  for k in sorted(set(expected) & set(shapes))
                  if tuple(shapes[k]) != expected[k] and not (adaptable and _adaptable(k, shapes[k], expected[k]))]
    if fields or missing or unexpected or mis_shaped:
        header = f"{weights} does not match {config}" + (f": {'; '.join(fields)}" if fields else ":")
        raise CheckpointMismatchError(mismatch_message(header, missing, unexpected, mis_shaped))


def _expected_shapes(spec: ViTSpec) -> dict[str, tuple[int, ...]]:
    """The keys and shapes of `spec`'s state dict, from a model built on the meta device (nothing allocated; ViTSpec
    bounds the field sizes)."""
    from hub_vit.model import VisionTransformer

    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in VisionTransformer(spec).state_dict().items()}


def _expected_keys(spec: ViTSpec) -> set[str]:
    return set(_expected_shapes(spec))


def _adaptable(key: str, found: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """`adapt_state_dict` resamples a position embedding to another token count and adapts patch filters to another
    channel count; every other dimension must match."""
    axis = {"pos_embed": 1, "patch_embed.proj.weight": 1}.get(key)
    return axis is not None and len(found) == len(expected) and all(
        a == b for i, (a, b) in enumerate(zip(found, expected, strict=True)) if i != axis)


def check_weights_file(path: str | os.PathLike[str], spec: ViTSpec, config: str = "the config",
                       adaptable: bool = False, unrelated_ok: bool = False) -> None:
    """`check_header` and `check_against_spec` for a `.safetensors` file, from its header alone. Other formats have
    no header to read (`.npz` files are checked by the converter; `.pt` / `.bin` only after loading, by
    `check_values`). `unrelated_ok` (transformers): a file that holds none of the model's tensors is checked for its
    sizes only, since nothing of it is loaded (transformers reports every weight missing and initialises it)."""
    path = Path(path)
    if path.suffix.lower() != ".safetensors" or not path.is_file():
        return
    headers = read_safetensors_header(path)
    if unrelated_ok and not set(strip_prefix({k: h.shape for k, h in headers.items()})) & _expected_keys(spec):
        check_sizes({name: h.shape for name, h in headers.items()}, repr(str(path)))
        return
    check_header(headers, repr(str(path)))
    check_against_spec({k: h.shape for k, h in headers.items()}, spec, path.name, config, adaptable)


def check_values(state_dict: Mapping[str, torch.Tensor], source: str, consequence: str = "refused") -> None:
    """Refuse integer / boolean tensors (cast silently on load) and NaN / inf values (every answer would be NaN)."""
    wrong = [f"{key} ({t.dtype})" for key, t in state_dict.items() if not t.is_floating_point()]
    if wrong:
        raise ValueError(f"{source}: {len(wrong)} tensor(s) are not floating point: {', '.join(wrong[:5])}; model "
                         f"weights are floats, {consequence}")
    bad = {key: int((~torch.isfinite(t)).sum()) for key, t in state_dict.items()
           if t.device.type != "meta" and not bool(torch.isfinite(t).all())}  # meta: offloaded, nothing to read
    if bad:
        listed = ", ".join(f"{key} ({count} of {state_dict[key].numel()})" for key, count in list(bad.items())[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ValueError(f"{source} holds NaN or inf values in {len(bad)} tensor(s): {listed}{more}; the weights are "
                         f"corrupt or from a diverged run, {consequence}")


__all__ = ["MAX_TENSOR_VALUES", "CheckpointMismatchError", "TensorHeader", "available_memory", "check_against_spec",
           "check_header", "check_sizes", "check_values", "check_weights_file", "mismatch_message",
           "read_safetensors_header", "strip_prefix"]
