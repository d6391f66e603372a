"""The torch flavour's data path: encoded images -> normalised (N, 3, H, W) float32 pixels on the model's device,
written straight into the batch the forward pass reads (torch_runner.Runner.batch).

Per image, in this order:
1. The header, on the CPU, without decoding (imageprep's `Preprocess.inspect`): the format whitelist, the declared
   size and pixel limits, the aspect-ratio bound, `jpeg_shortfall`, the EXIF orientation. A refused image costs no
   device work and gets imageprep's own words.
2. For JPEGs imageprep calls plain (`Header.plain_jpeg`: 8-bit Y or YCbCr, closed by an end marker), the scan check,
   on the CPU, on the thread pool: imageprep's `scan_may_end_early` reads the whole scan at 1/8 scale and looks for
   the flat mid-grey last MCU libjpeg leaves where data ran out. A JPEG cut short and closed again must be caught
   here, before the device: nvJPEG decodes it without a word and fills its missing blocks with whatever its output
   memory last held (another request's pixels, as an H200 showed), so nothing after the decode can tell.
3. The decode. Plain JPEGs that passed are decoded together in one `torchvision.io.decode_jpeg(list, device=...)`
   call: nvJPEG on cuda; on cpu libjpeg-turbo, the library Pillow decodes with (the same pixels, tested), which is how
   CI runs this very code. When the batched call fails (it returns nothing for any image then), each image is decoded
   alone; an image the device decoder refuses, a suspect of step 2, and every PNG, WebP or other JPEG, is decoded by
   imageprep on the CPU (`Preprocess.load`, on the thread pool): the CPU flavour's pixels, or its refusal in its words
   (`ends_early` decides a suspect). Decoded uint8 goes to the device.
4. On the device (`DeviceTransform`): the EXIF orientation (flips and transposes), the resize as Pillow does it (two
   separable passes, horizontal first, each rounded to uint8 half up, as Pillow's fixed-point filters round), the
   centre crop, `/ 255` and `(x - mean) / std` in float32, into rows of the batch. Images of one size, orientation
   and kind run as one group. Other interpolations than bilinear and bicubic (nearest, lanczos, box, hamming) are
   resized by imageprep on the CPU instead, and cropped and normalised here.

No host tensor is made in step 4 (tests/test_torch_images.py runs it on the meta device under a recorder).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

# Set once, for the process (catch_warnings around each call would race with imageprep's own in the decode threads):
# the decoders only read the request's bytes and Pillow's arrays, which torch notes as not writable; torchvision 0.29+
# notes that its image decoders are deprecated, which is no news for this server's log. (tests/conftest.py sets them
# for every test too: pytest puts the filters back after each one.)
QUIET_WARNINGS = ("The given buffer is not writable", "The given NumPy array is not writable",
                  "The image decoding and encoding capabilities of TorchVision are deprecated")
for _message in QUIET_WARNINGS:
    warnings.filterwarnings("ignore", message=_message)

# Pillow's filters the device has: antialiased bilinear and bicubic (F.interpolate: Pillow's kernels and support). Not
# nearest: Pillow picks its pixels by summing the scale in double one column after another, which a parallel device
# computes otherwise at some columns (a neighbour, tens of levels away)
DEVICE_RESIZE = {"bilinear": "bilinear", "bicubic": "bicubic"}


@dataclass(frozen=True)
class Decoded:
    """One image decoded, on the device, before the transform."""

    pixels: torch.Tensor  # (3, h, w) uint8
    orientation: int = 1  # EXIF orientation still to apply (1: none)
    resized: bool = False  # resized by imageprep already (an interpolation the device has no filter for)

    def group(self) -> tuple[Any, ...]:
        return (*self.pixels.shape, self.orientation, self.resized)


def orient(images: torch.Tensor, orientation: int) -> torch.Tensor:
    """(..., H, W) -> the EXIF orientation applied, as ImageOps.exif_transpose applies it (Pillow's transposes)."""
    if orientation == 2:  # FLIP_LEFT_RIGHT
        return images.flip(-1)
    if orientation == 3:  # ROTATE_180
        return images.flip(-2, -1)
    if orientation == 4:  # FLIP_TOP_BOTTOM
        return images.flip(-2)
    if orientation == 5:  # TRANSPOSE
        return images.transpose(-2, -1)
    if orientation == 6:  # ROTATE_270
        return images.transpose(-2, -1).flip(-1)
    if orientation == 7:  # TRANSVERSE
        return images.transpose(-2, -1).flip(-2, -1)
    if orientation == 8:  # ROTATE_90
        return images.transpose(-2, -1).flip(-2)
    return images


def _round_like_pillow(values: torch.Tensor) -> torch.Tensor:
    """Pillow's fixed-point filters end each pass with `clip8((sum + half) >> bits)`: round half up, then clip."""
    return values.add_(0.5).floor_().clamp_(0, 255)


class DeviceTransform:
    """Resize, crop and normalise on the device, as imageprep's `Preprocess.pixels` does on PIL images.

    `preprocess`: the step's imageprep `Preprocess` (sizes, interpolation, mean / std)."""

    def __init__(self, preprocess: Any, device: torch.device) -> None:
        self.prep, self.device = preprocess, device
        self.mode = DEVICE_RESIZE.get(preprocess.interpolation)  # None: imageprep resizes on the CPU
        # made once, on the device: a table built per call would be a host tensor copied over every time
        self.mean = torch.tensor(preprocess.mean, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(preprocess.std, dtype=torch.float32, device=device).view(1, 3, 1, 1)

    def resize(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, h, w) uint8 -> (N, 3, h', w') float32 holding whole numbers, h' x w' the resize before the crop."""
        height, width = images.shape[-2:]
        new_w, new_h = self.prep.resized_size(width, height)
        values = images.float()
        if (new_h, new_w) == (height, width):
            return values
        if new_w != width:  # Pillow: the horizontal pass first, each pass only where that side changes
            values = _round_like_pillow(F.interpolate(values, size=(height, new_w), mode=self.mode, antialias=True))
        if new_h != height:
            values = _round_like_pillow(F.interpolate(values, size=(new_h, new_w), mode=self.mode, antialias=True))
        return values

    def __call__(self, images: torch.Tensor, orientation: int, resized: bool, out: torch.Tensor) -> None:
        """(N, 3, h, w) uint8 images of one group -> `out` (N, 3, H, W) float32, normalised."""
        images = orient(images, orientation)
        values = images.float() if resized else self.resize(images)
        left, top, right, bottom = self.prep.crop_box(values.shape[-1], values.shape[-2])
        out.copy_(values[..., top:bottom, left:right])
        out.div_(255).sub_(self.mean).div_(self.std)  # float32 throughout, as imageprep's numpy: the same numbers


def decode_jpegs(encoded: Sequence[bytes], device: torch.device) -> list[torch.Tensor | Exception]:
    """JPEG bytes -> (3, h, w) uint8 RGB on `device`, in one batched call (nvJPEG on cuda); where that call fails,
    each alone, a failure standing in for its image."""
    from torchvision.io import ImageReadMode, decode_jpeg

    data = [torch.frombuffer(item, dtype=torch.uint8) for item in encoded]
    try:
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
    except Exception:  # noqa: BLE001 - one bad image fails the batched call; decoded alone, it names itself
        pass
    decoded: list[torch.Tensor | Exception] = []
    for item in data:
        try:
            decoded.append(decode_jpeg(item, mode=ImageReadMode.RGB, device=device))
        except Exception as err:  # noqa: BLE001 - imageprep decodes it on the CPU and decides
            decoded.append(err)
    return decoded


# The most source pixels one group's transform holds at once: 2^27 (a float32 copy of them is 1.5 GiB); a batch of 256
# phone photos of one size (12 MP each) runs in 24 parts instead of asking for 37 GiB at once
GROUP_PIXELS = 1 << 27


def _chunks(members: list[int], decoded: Sequence[Decoded]) -> list[list[int]]:
    """One group's images in parts of at most GROUP_PIXELS source pixels (at least one image each)."""
    height, width = decoded[members[0]].pixels.shape[-2:]
    per_part = max(1, GROUP_PIXELS // (height * width))
    return [members[i:i + per_part] for i in range(0, len(members), per_part)]


class ImagePath:
    """The module docstring's steps for one Triton model instance (1 to 3 in `decode`, 4 in `transform_into`), with
    its imageprep module (the scan check), its `Preprocess` and a thread pool for the scan checks and CPU decodes."""

    def __init__(self, imageprep: Any, preprocess: Any, device: torch.device, pool: Executor | None = None) -> None:
        self.imageprep, self.prep, self.device, self.pool = imageprep, preprocess, device, pool
        self.transform = DeviceTransform(preprocess, device)
        self.pin = device.type == "cuda"  # pinned host memory: the copy runs without staging through the driver

    def decode(self, encoded: Sequence[bytes]) -> list[Decoded | Exception]:
        """Every image of one execution -> its `Decoded`, or the exception that refuses it (a `BadImageError` in
        imageprep's words, or e.g. a MemoryError)."""
        results: list[Decoded | Exception | None] = [None] * len(encoded)
        headers: dict[int, Any] = {}
        for index, data in enumerate(encoded):
            try:
                headers[index] = self.prep.inspect(data)
            except Exception as err:  # noqa: BLE001 - refused on the header (BadImageError), or e.g. MemoryError
                results[index] = err
        plain = [i for i, h in headers.items() if h.plain_jpeg and self.transform.mode is not None]
        may_end_early = self._map(self._scan_check, [(encoded[i], headers[i]) for i in plain])
        on_device = [i for i, doubtful in zip(plain, may_end_early, strict=True) if not doubtful]
        on_cpu = sorted(set(headers) - set(on_device))
        if on_device:
            for index, image in zip(on_device, decode_jpegs([encoded[i] for i in on_device], self.device),
                                    strict=True):
                if isinstance(image, Exception):
                    on_cpu.append(index)
                    continue
                results[index] = Decoded(image, headers[index].orientation)
        for index, result in zip(on_cpu, self._map(self._cpu_decode, [(encoded[i], headers[i]) for i in on_cpu]),
                                 strict=True):
            results[index] = result
        return results  # type: ignore[return-value]  # every slot is filled above

    def _map(self, function: Any, items: list) -> list:
        """On the pool, except a lone item (its handoff to a thread would cost more than it overlaps)."""
        if self.pool is None or len(items) < 2:
            return [function(item) for item in items]
        return list(self.pool.map(function, items))

    def _scan_check(self, item: tuple[bytes, Any]) -> bool:
        """Step 2 for one plain JPEG: True when it may end early, or when the check itself fails (e.g. a MemoryError):
        imageprep then decodes it and decides, and the other images of the batch go on."""
        try:
            return self.imageprep.scan_may_end_early(*item)
        except Exception:  # noqa: BLE001 - decided by imageprep's own decode, in its words
            return True

    def _cpu_decode(self, item: tuple[bytes, Any]) -> Decoded | Exception:
        data, header = item
        try:
            image = self.prep.load(data, header)  # RGB, EXIF orientation applied
            if self.transform.mode is None:
                image = self.prep.resized(image)
            return Decoded(self._upload(np.asarray(image, dtype=np.uint8)), resized=self.transform.mode is None)
        except Exception as err:  # noqa: BLE001 - a bad image, or e.g. a MemoryError: its request fails
            return err

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """(h, w, 3) uint8 on the host -> (3, h, w) uint8 on the device."""
        host = torch.from_numpy(array)
        if self.pin:
            host = host.pin_memory()
        return host.to(self.device, non_blocking=self.pin).permute(2, 0, 1)

    def transform_into(self, decoded: Sequence[Decoded], out: torch.Tensor) -> list[int]:
        """Decoded images -> `out[:N]` (normalised); returns the order: batch row k holds `decoded[order[k]]` (the
        images of one group sit side by side)."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, item in enumerate(decoded):
            groups.setdefault(item.group(), []).append(index)
        order: list[int] = []
        for members in (chunk for group in groups.values() for chunk in _chunks(group, decoded)):
            first = decoded[members[0]]
            images = torch.stack([decoded[i].pixels for i in members]) if len(members) > 1 else first.pixels[None]
            self.transform(images, first.orientation, first.resized, out[len(order):len(order) + len(members)])
            order += members
        return order
