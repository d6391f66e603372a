"""Encoded image bytes -> normalised CHW float32 array, exactly as timm's eval transform does it (PIL path).

Runs without hub_vit (numpy + Pillow only): it is copied next to the Python-backend `model.py` in a generated Triton
repository, with `hub_vit/image_modes.py` beside it (the one copy of the image-mode rules). The numbers of the
transform come from the model's data config, rendered into the config parameters (`Preprocess.from_params`).
The maths follows torchvision on PIL images: shorter side resized to `floor(size / crop_pct)` (longer side
truncated), centre crop with `round((H - h) / 2)` offsets, `/ 255`, then `(x - mean) / std`, all in float32, so
served pixels equal in-process pixels bit for bit.

Two steps, so every decoder shares the checks: `Preprocess.inspect` reads the header only (no pixels): the format
whitelist, the declared size and pixel limits, the aspect-ratio bound, `jpeg_shortfall`, the EXIF orientation;
`Preprocess.load` decodes what `inspect` let through (`ends_early`, EXIF, image modes). `decode` is the two in turn.
The torch flavour decodes the JPEGs that `Header.plain_jpeg` names on its device instead (its `torch_images.py`),
and hands the rest, and any image its decoder refuses, to `load`.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# hub_vit/image_modes.py, image_formats.py and server/protocol.py, copied beside this file by hub-vit repository
try:  # (Triton runs it without hub_vit)
    from image_formats import FORMATS, NAMES, other_format, signature_format  # FORMATS: the only decoders that run
    from image_modes import to_8bit
    from protocol import image_refused
except ImportError:  # in process (tests, benchmarks): the package's own modules
    from hub_vit.image_formats import FORMATS, NAMES, other_format, signature_format
    from hub_vit.image_modes import to_8bit
    from hub_vit.server.protocol import image_refused

INTERPOLATIONS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}
CROP_MODES = ("center", "squash")


# Huffman-coded sequential JPEG frames (baseline, extended): every 8x8 block costs at least 2 bits of entropy-coded data
# (a DC code and an end-of-block code, each at least 1 bit long). Progressive and arithmetic frames can code far less.
SEQUENTIAL_HUFFMAN_SOF = (0xC0, 0xC1)
MIN_BITS_PER_BLOCK = 2
PROBE_BYTES = 4096  # inserted before the end marker by `ends_early`


def jpeg_shortfall(data: bytes) -> str | None:
    """Why a sequential Huffman JPEG's compressed data is too short for the size its frame header declares, or None.
    libjpeg fills the missing rows with grey and only warns ("Premature end of JPEG file", "Corrupt JPEG data:
    premature end of data segment"), which Pillow does not expose: a header claiming 6000x6000 over 451x300 data
    decoded without error into a grey image that was then classified. This bound is necessary, not sufficient: data
    cut a few rows short still passes it (`ends_early` checks the decoded image for that)."""
    pos, frame = 2, None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None  # not a marker where one belongs: Pillow's own parser reports it
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        segment = data[pos + 4:pos + 2 + length]
        if marker in SEQUENTIAL_HUFFMAN_SOF and len(segment) >= 6:
            height, width, count = int.from_bytes(segment[1:3], "big"), int.from_bytes(segment[3:5], "big"), segment[5]
            sampling = [(segment[7 + 3 * i] >> 4, segment[7 + 3 * i] & 15) for i in range(count)
                        if len(segment) >= 9 + 3 * i]
            frame = (width, height, sampling)
        elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return None  # progressive, lossless or arithmetic-coded: no such bound
        if marker == 0xDA:  # start of scan: the entropy-coded data follows this header, up to EOI
            if frame is None or not frame[2] or not all(h and v for h, v in frame[2]):
                return None
            width, height, sampling = frame
            scan = len(data) - (pos + 2 + length)
            if len(sampling) == 1:
                blocks = -(-width // 8) * -(-height // 8)
            else:
                h_max, v_max = max(h for h, _ in sampling), max(v for _, v in sampling)
                mcus = -(-width // (8 * h_max)) * -(-height // (8 * v_max))
                blocks = mcus * sum(h * v for h, v in sampling)
            if scan * 8 < blocks * MIN_BITS_PER_BLOCK:
                return (f"its header declares {width}x{height} pixels ({blocks} blocks of 8x8, at least "
                        f"{blocks * MIN_BITS_PER_BLOCK // 8} bytes of compressed data), but only {scan} bytes follow: "
                        "the data ends before the image does (premature end of JPEG data)")
            return None
        pos += 2 + length
    return None


def _sequential_frame(data: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, MCU width, MCU height) of a sequential Huffman JPEG, from its frame header; None for other
    JPEGs (progressive, lossless, arithmetic-coded) and for headers it cannot read."""
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        segment = data[pos + 4:pos + 2 + length]
        if marker in SEQUENTIAL_HUFFMAN_SOF and len(segment) >= 6:
            count = segment[5]
            if count < 1 or len(segment) < 6 + 3 * count:
                return None
            sampling = [(segment[7 + 3 * i] >> 4, segment[7 + 3 * i] & 15) for i in range(count)]
            if not all(h and v for h, v in sampling):
                return None
            mcu = (8, 8) if count == 1 else (8 * max(h for h, _ in sampling), 8 * max(v for _, v in sampling))
            return int.from_bytes(segment[3:5], "big"), int.from_bytes(segment[1:3], "big"), *mcu
        if 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) or marker == 0xDA:
            return None
        pos += 2 + length
    return None


def last_block(width: int, height: int, mcu_w: int, mcu_h: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a JPEG's last MCU (bottom right, the last one decoded)."""
    return (width - 1) // mcu_w * mcu_w, (height - 1) // mcu_h * mcu_h, width, height


# A missing block decodes as flat luma 128: the last MCU's luma (these weights) within this of it is "flat mid-grey"
MID_GREY, FLAT_WITHIN = 128.0, 1.5  # 1.5: rounding of the colour conversion (a missing MCU is within 1 of 128)
LUMA = (0.299, 0.587, 0.114)


def ends_early(data: bytes, image: Image.Image) -> bool:
    """Whether a decoded sequential JPEG (`image`, loaded from `data`) ran out of scan data before its last MCU.

    libjpeg meets the end-of-image marker early (data cut a few rows short and closed again, or a header declaring
    a few more rows than the data holds), warns ("Corrupt JPEG data: premature end of data segment") and decodes
    every missing block as all-zero coefficients: flat luma 128. Pillow hides the warning, so this looks at the result:
    the last MCU (bottom right, the last one decoded) must not be flat luma 128; if it is, the image is decoded
    again with zero bytes inserted before the final marker. A complete scan ends before them, so the pixels cannot
    change; a scan that ends early decodes them into its missing blocks, so they do. The second decode runs only for
    images whose last MCU is flat mid-grey. Plain truncation (no end marker) is refused by Pillow itself."""
    frame = _sequential_frame(data)
    end = data.rfind(b"\xff\xd9")
    if frame is None or end < 0 or image.mode not in ("RGB", "L"):
        return False
    width, height, mcu_w, mcu_h = frame
    if (width, height) != image.size:
        return False
    last = np.asarray(image.crop(last_block(width, height, mcu_w, mcu_h)), dtype=np.float32)
    luma = last if image.mode == "L" else last @ np.asarray(LUMA, dtype=np.float32)
    if np.abs(luma - MID_GREY).max() > FLAT_WITHIN:
        return False
    # 4 KiB: zero bits decode to at most 27 bits per coefficient, so they reach past the block being decoded when the
    # data ran out (which libjpeg already completed with zero bits) into the first block it left at zero
    padded = Image.open(io.BytesIO(data[:end] + bytes(PROBE_BYTES) + data[end:]), formats=("JPEG",))
    padded.load()
    return padded.tobytes() != image.tobytes()


# libjpeg's DCT scalings: decoded at 1/8 every Huffman code is still read, but each 8x8 block costs one pixel
DCT_SCALES = (8, 4, 2, 1)


def scan_may_end_early(data: bytes, header: Header) -> bool:
    """Whether a sequential JPEG (`header`: `inspect`'s, with its `last_block`) may have run out of scan data before
    its last MCU, judged without decoding its pixels in full: libjpeg decodes it at 1/8 scale (the whole scan read,
    missing blocks filled as `ends_early` describes) and its last MCU, scaled, is checked for flat mid-grey. A suspect
    is decoded in full by `load`, whose `ends_early` decides; data libjpeg cannot read at all is suspect too.

    The torch flavour asks this before a JPEG goes to a device decoder: nvJPEG fills the blocks past the data's end
    with whatever its output memory last held (another image's pixels), so the decoded image cannot tell."""
    if header.last_block is None:
        return True
    width, height = header.size
    try:
        image = Image.open(io.BytesIO(data), formats=("JPEG",))
        image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
        image.load()
    except Exception:  # noqa: BLE001 - corrupt data: imageprep's own decode names it
        return True
    scale = next((s for s in DCT_SCALES if image.size == (-(-width // s), -(-height // s))), None)
    if scale is None or image.mode not in ("RGB", "L"):
        return True
    left, top, right, bottom = header.last_block
    # Pillow's own luma (ITU-R 601-2: LUMA's weights, rounded to an integer): no numpy, nothing but C while the
    # decode pool's threads share one interpreter
    last = image.crop((left // scale, top // scale, -(-right // scale), -(-bottom // scale)))
    low, high = (last if image.mode == "L" else last.convert("L")).getextrema()
    return MID_GREY - FLAT_WITHIN <= low and high <= MID_GREY + FLAT_WITHIN


def scan_closed(data: bytes) -> bool:
    """Whether a JPEG's last end-of-image marker comes after its first start-of-scan marker (an embedded thumbnail's
    end marker, in an APP segment before the scan, does not count). Cut short without one, the data is what Pillow
    refuses as truncated."""
    scan = data.find(b"\xff\xda")
    return 0 <= scan < data.rfind(b"\xff\xd9")


# ImageOps.exif_transpose's orientations: 1 is the stored image; 2-8 a flip, a rotation or both
ORIENTATIONS = range(1, 9)
EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class Header:
    """What `Preprocess.inspect` read of an image without decoding it; every check that needs no pixels has passed.

    `orientation`: the EXIF orientation exif_transpose applies (read where it reads it; 1 for PNG and WebP, whose
    EXIF can follow the pixel data and is applied by `load`). `last_block`: a sequential JPEG's last MCU, which
    `ends_early` inspects once decoded (None for others). `plain_jpeg`: a JPEG whose pixels any conforming decoder
    gives as `load` does (8-bit Y or YCbCr, an end marker after its scan), so it may be decoded elsewhere (the torch
    flavour's device) with `orientation` and the `last_block` check applied there."""

    format: str  # one of FORMATS
    size: tuple[int, int]  # (width, height) as stored
    mode: str  # Pillow's mode as stored
    orientation: int = 1
    last_block: tuple[int, int, int, int] | None = None
    plain_jpeg: bool = False
    image: Image.Image | None = field(default=None, repr=False, compare=False)  # opened lazily: `load` decodes it

    @property
    def oriented_size(self) -> tuple[int, int]:
        """(width, height) once the orientation is applied: 5-8 swap the sides."""
        return self.size[::-1] if self.orientation >= 5 else self.size


class BadImageError(ValueError):
    """The client sent bytes we refuse to classify (answered as a client error, never a server fault)."""

    @classmethod
    def empty_request(cls) -> BadImageError:
        """A request whose `image` tensor holds no image at all."""
        return cls(f"the request holds no image; send at least one encoded {NAMES}")

    def of_image(self, index: int) -> BadImageError:
        """This refusal as the request's answer: image `index` (0-based in the request), tagged so that clients read
        which image failed without reading the sentence (protocol.py's `image-refused`)."""
        return BadImageError(image_refused(index, str(self)))


def _pixels(count: int) -> str:
    """`48.0 MP`, or the exact count below a tenth of a megapixel (a low --max-pixels read `0.0 MP`)."""
    return f"{count / 1e6:.1f} MP" if count >= 100_000 else f"{count} pixels"


def _declared_pixels(err: Exception) -> str:
    """The pixel count in Pillow's decompression-bomb message ("Image size (2500000000 pixels) exceeds ...")."""
    found = re.search(r"\((\d+) pixels\)", str(err))
    return f"{int(found[1]) / 1e6:.1f} MP" if found else "more pixels than Pillow decodes"


@dataclass(frozen=True)
class Preprocess:
    """One model's eval transform; built once per Triton model instance."""

    # The model's data config (hub_vit.data_config), rendered into the config parameters: no defaults restated here
    crop_size: tuple[int, int]  # (H, W) the model's input
    scale_size: tuple[int, int]  # (H, W) before cropping; square -> shorter-side resize
    interpolation: str
    crop_mode: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    max_pixels: int = 40_000_000  # most pixels an image may have, decoded or resized; checked on the header

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"unknown interpolation {self.interpolation!r}; valid: {', '.join(INTERPOLATIONS)}")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"unsupported crop_mode {self.crop_mode!r}; valid: {', '.join(CROP_MODES)}")
        if self.crop_mode == "center" and self.scale_size[0] != self.scale_size[1]:
            raise ValueError(f"crop_mode 'center' needs a square scale size, got {self.scale_size}; use 'squash'")
        if self.scale_size[0] < self.crop_size[0] or self.scale_size[1] < self.crop_size[1]:
            raise ValueError(f"scale size {self.scale_size} is smaller than the crop {self.crop_size} (crop_pct > 1)")

    # ------------------------------------------------------------------------------------------------------------
    def decode(self, data: bytes) -> Image.Image:
        """Bytes -> RGB image with EXIF orientation applied; `BadImageError` naming the problem otherwise."""
        return self.load(data, self.inspect(data))

    def inspect(self, data: bytes) -> Header:
        """The header's checks, before any pixel is decoded: `BadImageError` naming the problem, else the `Header`."""
        if not data:
            raise BadImageError(f"empty image (0 bytes); send encoded {NAMES} bytes")
        with self._bomb_warnings():
            try:
                image = Image.open(io.BytesIO(data), formats=FORMATS)  # lazy: reads the header only
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
                # Pillow checks inside open(), before the header check below can: past its warning limit (89 MP)
                # when max_pixels is lower, always past its hard limit (twice that). Same message, same way out.
                raise BadImageError(self._too_large(_declared_pixels(err))) from None
            except Exception as err:  # UnidentifiedImageError; plain ValueError / OSError for some malformed headers
                claimed = signature_format(data)
                if claimed is not None:  # a JPEG, PNG or WebP cut short or damaged: not "some other kind of file"
                    detail = "" if isinstance(err, UnidentifiedImageError) else f" ({err})"
                    raise BadImageError(f"damaged {claimed} image: its {len(data)} bytes start as {claimed}, but its "
                                        f"header cannot be read (truncated or corrupt){detail}") from None
                other = other_format(data)  # by its signature alone: no decoder of that format runs
                if other is not None:
                    raise BadImageError(f"a {other} image, not one of the supported formats: {NAMES} (convert it to "
                                        "one of them)") from None
                if isinstance(err, UnidentifiedImageError):
                    raise BadImageError(
                        f"not an image: {len(data)} bytes starting {data[:8]!r} are not {NAMES}"
                    ) from None
                raise BadImageError(f"cannot read image header: {err}") from None
        width, height = image.size
        if width * height > self.max_pixels:
            raise BadImageError(self._too_large(f"{width}x{height} = {_pixels(width * height)}"))
        # The shorter side is resized before the crop, so a thin image grows: a 2 kB PNG of 2x200000 pixels
        # would become 248x24800000 (18 GB). EXIF rotation swaps the sides, which leaves this product unchanged.
        new_w, new_h = self.resized_size(width, height)
        if new_w * new_h > self.max_pixels:
            raise BadImageError(
                f"aspect ratio too extreme: a {width}x{height} image would be resized to {new_w}x{new_h} = "
                f"{new_w * new_h} pixels before the centre crop, more than the limit of {self.max_pixels}"
            )
        if image.format != "JPEG":
            return Header(image.format, (width, height), image.mode, image=image)
        short = jpeg_shortfall(data)
        if short is not None:
            raise BadImageError(f"truncated JPEG image: {short}")
        try:  # read where exif_transpose reads it (EXIF, else XMP): a JPEG's come before its pixels
            orientation = image.getexif().get(EXIF_ORIENTATION, 1)
        except Exception:  # noqa: BLE001 - unreadable EXIF: `load`'s exif_transpose meets it again and decides, on
            orientation = None  # an image opened afresh (Pillow keeps a half-read EXIF as read)
            with self._bomb_warnings():
                image = Image.open(io.BytesIO(data), formats=FORMATS)
        frame = _sequential_frame(data)
        return Header(
            "JPEG", (width, height), image.mode, orientation if orientation in ORIENTATIONS else 1,
            last_block=None if frame is None or frame[:2] != (width, height) else last_block(*frame),
            plain_jpeg=orientation is not None and image.mode in ("RGB", "L") and scan_closed(data), image=image)

    def load(self, data: bytes, header: Header) -> Image.Image:
        """Decode what `inspect(data)` returned: RGB with EXIF orientation applied, or `BadImageError`."""
        image, (width, height) = header.image, header.size
        with self._bomb_warnings():
            try:
                image.load()
                if image.format == "JPEG" and ends_early(data, image):
                    raise BadImageError(f"truncated JPEG image: its data ends before its last rows ({width}x{height} "
                                        "declared; premature end of JPEG data)")
                # 16-bit grey scaled to 8 bits, transparency composited onto white (hub_vit/image_modes.py's rules)
                return to_8bit(ImageOps.exif_transpose(image)).convert("RGB")
            except BadImageError:
                raise
            except Exception as err:  # truncated or corrupt data surfaces only while decoding
                raise BadImageError(f"cannot decode {image.format} image ({width}x{height}): {err}") from None

    @contextlib.contextmanager
    def _bomb_warnings(self) -> Iterator[None]:
        """Our own header check enforces max_pixels; Pillow's warning limit (89 MP) applies only when max_pixels is
        not raised above it (its hard limit, twice that, always applies)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if self.max_pixels > Image.MAX_IMAGE_PIXELS else "error",
                                  Image.DecompressionBombWarning)
            yield

    def _too_large(self, declared: str) -> str:
        hard = f"; Pillow's own limit of {2 * Image.MAX_IMAGE_PIXELS / 1e6:.1f} MP always applies" \
            if self.max_pixels > 2 * Image.MAX_IMAGE_PIXELS else ""
        return (f"image too large: it declares {declared}, more than this server's limit of "
                f"{_pixels(min(self.max_pixels, 2 * Image.MAX_IMAGE_PIXELS))} (hub-vit serve --max-pixels{hard}); "
                "refused before decoding, as a decompression bomb guard")

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(W, H) of a `width` x `height` image after the resize that comes before the crop."""
        if self.crop_mode == "squash":
            return self.scale_size[1], self.scale_size[0]
        size = self.scale_size[0]  # shorter side -> size, longer side truncated (torchvision Resize(int))
        short, long = min(width, height), max(width, height)
        new_short, new_long = size, int(size * long / short)
        return (new_short, new_long) if width <= height else (new_long, new_short)

    def resized(self, image: Image.Image) -> Image.Image:
        """The resize before the crop (Pillow's filter of the model's interpolation)."""
        new_w, new_h = self.resized_size(*image.size)
        if (new_w, new_h) == image.size:
            return image
        return image.resize((new_w, new_h), INTERPOLATIONS[self.interpolation])

    def crop_box(self, new_w: int, new_h: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of the centre crop in an image resized to `new_w` x `new_h`."""
        crop_h, crop_w = self.crop_size
        top = int(round((new_h - crop_h) / 2.0))
        left = int(round((new_w - crop_w) / 2.0))
        return left, top, left + crop_w, top + crop_h

    def pixels(self, image: Image.Image) -> np.ndarray:
        """RGB PIL image -> (3, H, W) float32, normalised."""
        image = self.resized(image)
        image = image.crop(self.crop_box(*image.size))
        array = np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).astype(np.float32) / np.float32(255)  # (3,H,W)
        mean = np.asarray(self.mean, dtype=np.float32).reshape(3, 1, 1)
        std = np.asarray(self.std, dtype=np.float32).reshape(3, 1, 1)
        return (array - mean) / std

    def __call__(self, data: bytes) -> np.ndarray:
        return self.pixels(self.decode(data))

    def batch(self, images: np.ndarray) -> np.ndarray:
        """One request's `image` tensor ((B,) or (B, 1) encoded images) -> (B, 3, H, W); the BadImageError names
        the first bad image by its 0-based index in the request."""
        if images.size == 0:
            raise BadImageError.empty_request()
        pixels = []
        for index, data in enumerate(images.reshape(-1)):
            try:
                pixels.append(self(data if isinstance(data, bytes) else bytes(data)))
            except BadImageError as err:
                raise err.of_image(index) from None
        return np.stack(pixels)

    @classmethod
    def from_params(cls, params: dict[str, str]) -> Preprocess:
        """From a generated config.pbtxt's parameters (string values; the sizes, mean and std as JSON lists)."""
        return cls(
            crop_size=tuple(json.loads(params["crop_size"])),
            scale_size=tuple(json.loads(params["scale_size"])),
            interpolation=params["interpolation"],
            crop_mode=params["crop_mode"],
            mean=tuple(json.loads(params["mean"])),
            std=tuple(json.loads(params["std"])),
            max_pixels=int(params["max_pixels"]),
        )
