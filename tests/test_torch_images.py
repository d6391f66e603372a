"""The torch flavour's data path (server/repository/torch_images.py) on CPU tensors: the code a GPU host runs, with
torchvision's CPU JPEG decoder (libjpeg-turbo, Pillow's own library) where the GPU runs nvJPEG.

Checked against imageprep, the CPU flavour's transform (Pillow), on real photos (scikit-image's) and the digits
samples: the same pixels to one uint8 level, the same refusals in the same words, the same EXIF orientations, and
through the real model (the shipped digits model) the same top-1 with logits within LOGITS_ATOL. JPEGs whose scan
data ends early are refused before the device decoder sees them, also when that decoder (as nvJPEG does) fills the
missing blocks with another image's pixels. The device part (orientation, resize, crop, normalise) runs on the meta
device too, where a recorder reports any tensor made on the host; so does the whole path with the decoder standing in
for nvJPEG (asked for the device) and the CPU decodes' uploads pinned, as on cuda.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from hub_vit.server.repository import torch_images
from hub_vit.server.repository.torch_images import DEVICE_RESIZE, DeviceTransform, ImagePath, orient
from tests.test_device_placement import HostTensors
from tests.test_image_fuzz import served_eval

CPU, META = torch.device("cpu"), torch.device("meta")
SAMPLES = sorted((Path(__file__).resolve().parents[1] / "hub_vit/assets/digits/samples").glob("*.png"))
# Pillow's resize filters use 22-bit fixed-point weights, torch's float32 ones: a value within that rounding of x.5
# rounds the other way, by one uint8 level (two after bicubic's second pass). Measured: photos at 224, at most 0.2 %
# of one image's pixels (none on most); the 128 px digits samples shrunk to 36 px (flat, hard-edged: many sums land
# on x.5) up to 2 % bilinear, 3.7 % bicubic. One 2-D pass instead of Pillow's two rounded ones differs on about 15 %
# of a photo's pixels by up to 6 levels, a wrong filter, crop or normalisation on most by many
MOST_LEVELS, MOST_DIFFERING = 2, 5e-2
# the digits model's logits move by at most 2e-3 for such pixels (measured 1.8e-3 bilinear, 3e-4 bicubic); 5e-3
# leaves room for another host's float32 while a wrong filter, crop or normalisation moves them by 0.1 or more
LOGITS_ATOL = 5e-3
ORIENTATIONS = range(1, 9)


def encode(array: np.ndarray, fmt: str = "JPEG", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def with_orientation(array: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(array, "JPEG", quality=90, exif=exif.tobytes())


def prep_for(imageprep, size: int, interpolation: str = "bilinear", crop_pct: float = 0.875):
    scale = int(size / crop_pct)
    return imageprep.Preprocess(crop_size=(size, size), scale_size=(scale, scale),
                                **served_eval(interpolation=interpolation))


def device_pixels(path: ImagePath, payloads: list[bytes], decoded: list | None = None) -> np.ndarray:
    """The data path end to end on the CPU (`decoded`: the payloads' decode, already done): (N, 3, H, W) pixels in
    the payloads' order."""
    decoded = path.decode(payloads) if decoded is None else decoded
    refused = [item for item in decoded if isinstance(item, Exception)]
    assert not refused, refused
    out = torch.zeros(len(payloads), 3, *path.prep.crop_size, device=path.device)
    with torch.inference_mode():
        order = path.transform_into(decoded, out)
    pixels = np.empty(out.shape, np.float32)
    pixels[order] = out.cpu().numpy()
    return pixels


def on_the_device(monkeypatch) -> list[list[bytes]]:
    """Records the images each call of the device decoder (`torch_images.decode_jpegs`) is given."""
    calls: list[list[bytes]] = []
    real = torch_images.decode_jpegs
    monkeypatch.setattr(torch_images, "decode_jpegs",
                        lambda data, device: calls.append(list(data)) or real(data, device))
    return calls


def assert_pixels_close(got: np.ndarray, want: np.ndarray, std: float = 0.5) -> None:
    levels = np.abs(got - want) * std * 255  # back in uint8 levels
    assert levels.max() <= MOST_LEVELS + 1e-3, levels.max()
    for image in levels:
        assert (image > 1e-3).mean() <= MOST_DIFFERING, (image > 1e-3).mean()


@pytest.fixture(scope="module")
def payloads(photos) -> list[bytes]:
    """Real photos as JPEG (4:2:0 and 4:4:4, progressive), PNG and WebP, a grey JPEG and the digits samples."""
    found = [encode(photos["chelsea"], quality=90), encode(photos["astronaut"], subsampling=0, quality=95),
             encode(photos["coffee"], progressive=True), encode(photos["chelsea"], "PNG"),
             encode(photos["coffee"], "WEBP", lossless=True), encode(photos["astronaut"][..., 0], quality=90)]
    return found + [p.read_bytes() for p in SAMPLES]


# -- the transform against imageprep ------------------------------------------------------------------------------
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest", "lanczos"])
@pytest.mark.parametrize("size", [224, 32])
def test_device_pixels_are_imageprep_pixels(imageprep, payloads, interpolation, size):
    """Every format and kind of JPEG, downscaled (photos) and upscaled (128 px digits to 224); lanczos has no torch
    filter: imageprep resizes on the CPU, the device crops and normalises."""
    prep = prep_for(imageprep, size, interpolation)
    pixels = device_pixels(ImagePath(imageprep, prep, CPU), payloads)
    want = np.stack([prep(data) for data in payloads])
    assert_pixels_close(pixels, want)


def test_plain_jpegs_are_decoded_on_the_device_and_the_rest_by_imageprep(imageprep, payloads, monkeypatch):
    calls = on_the_device(monkeypatch)
    ImagePath(imageprep, prep_for(imageprep, 224), CPU).decode(payloads)
    # one batched call: the sequential JPEGs (4:2:0, 4:4:4, grey); not the progressive one, the PNG or the WebP
    assert calls == [[payloads[0], payloads[1], payloads[5]]]


def test_same_top1_and_logits_through_the_real_model(imageprep, payloads, photos):
    """The shipped digits model (32 px, bilinear) on the digits samples, held-out digits and the photos."""
    from hub_vit.catalog import default_model_folder
    from hub_vit.folder import load_model_folder
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.config import preprocess_params
    from hub_vit.server.repository.metadata import serving_metadata
    from hub_vit.server.repository.options import ServingOptions
    from hub_vit.train.digits import load_digits_split

    model, _ = load_model_folder(default_model_folder())
    prep = imageprep.Preprocess.from_params(preprocess_params(serving_metadata(resolve_model(None)), ServingOptions()))
    val, _ = load_digits_split("val")
    data = payloads + [encode(image, "PNG") for image in val[:100]]
    pixels = device_pixels(ImagePath(imageprep, prep, CPU), data)
    want = np.stack([prep(item) for item in data])
    with torch.no_grad():
        got, expected = model(torch.from_numpy(pixels)).numpy(), model(torch.from_numpy(want)).numpy()
    assert (got.argmax(1) == expected.argmax(1)).all()
    np.testing.assert_allclose(got, expected, atol=LOGITS_ATOL, rtol=0)


# -- EXIF orientation ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_every_exif_orientation_is_applied_as_exif_transpose_applies_it(imageprep, photos, orientation):
    """A non-square photo in each of the 8 orientations: the header reads it, the device applies it, and the pixels
    equal Pillow's `ImageOps.exif_transpose` (the CPU flavour's) exactly; the whole transform matches imageprep."""
    from torchvision.io import ImageReadMode, decode_jpeg

    data = with_orientation(photos["chelsea"][:, :400], orientation)
    prep = prep_for(imageprep, 224)
    header = prep.inspect(data)
    assert header.orientation == orientation and header.plain_jpeg
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    assert header.oriented_size == (expected.shape[1], expected.shape[0])
    stored = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    np.testing.assert_array_equal(orient(stored, orientation).permute(1, 2, 0).numpy(), expected)
    # torchvision's own EXIF option (CPU only: its CUDA decoder ignores it, hence `orient` on the device)
    np.testing.assert_array_equal(decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                              mode=ImageReadMode.RGB, apply_exif_orientation=True)
                                  .permute(1, 2, 0).numpy(), expected)
    pixels = device_pixels(ImagePath(imageprep, prep, CPU), [data])
    assert_pixels_close(pixels, prep(data)[None])


# -- refusals: the same words ---------------------------------------------------------------------------------------
def _words(imageprep, prep, data: bytes) -> str:
    with pytest.raises(imageprep.BadImageError) as refused:
        prep.decode(data)
    return str(refused.value)


def truncated(photos) -> dict[str, bytes]:
    """A 451x300 photo whose scan data ends early: cut short (no end marker), cut short and closed again, and whole
    but with 16 more rows declared than its data holds."""
    whole = encode(np.asarray(Image.fromarray(photos["chelsea"]).resize((451, 300))))
    taller = bytearray(whole)
    frame = taller.find(b"\xff\xc0")
    taller[frame + 5:frame + 7] = struct.pack(">H", 316)
    return {"cut short": whole[:-600], "cut short, closed again": whole[:-600] + b"\xff\xd9",
            "a few rows more declared": bytes(taller)}


def test_refused_images_get_imageprep_words_and_cost_no_device_work(imageprep, photos, monkeypatch):
    prep = prep_for(imageprep, 224)
    bad = {"not an image": b"plain text", "empty": b"", "bomb": encode(np.zeros((8, 8, 3), np.uint8), "PNG"),
           **truncated(photos)}
    small = prep_for(imageprep, 4, crop_pct=1.0)
    bomb = imageprep.Preprocess(**{**small.__dict__, "max_pixels": 32})
    calls = on_the_device(monkeypatch)
    for name, data in bad.items():
        this = bomb if name == "bomb" else prep
        [item] = ImagePath(imageprep, this, CPU).decode([data])
        assert isinstance(item, imageprep.BadImageError), name
        assert str(item) == _words(imageprep, this, data), name
    assert calls == [], "a refused image never reaches the device decoder"


def test_a_decoder_that_fills_missing_blocks_with_old_pixels_gets_no_truncated_jpeg(imageprep, photos, monkeypatch):
    """nvJPEG decodes a JPEG whose scan data ends early without a word, and leaves the missing blocks as its output
    memory held them: on an H200, the previous image's pixels. A decoder doing that stands in for it here; the images
    that end early are refused in imageprep's words all the same (the scan check runs before the device), and the
    complete image in the same batch keeps the device's pixels."""
    from torchvision import io as tvio

    real = tvio.decode_jpeg
    complete = encode(np.asarray(Image.fromarray(photos["chelsea"]).resize((451, 300))))

    def leaves_old_pixels(data, *args, **kwargs):  # what is missing comes out as the complete image's pixels
        decoded = real(data, *args, **kwargs)
        stale = real(torch.frombuffer(bytearray(complete), dtype=torch.uint8), *args, **kwargs)
        items = decoded if isinstance(decoded, list) else [decoded]
        patched = [torch.where((image == 128).all(0, keepdim=True), stale[:, :image.shape[1], :image.shape[2]],
                               image) if image.shape[1:] == stale.shape[1:] else image for image in items]
        return patched if isinstance(decoded, list) else patched[0]

    monkeypatch.setattr(tvio, "decode_jpeg", leaves_old_pixels)
    calls = on_the_device(monkeypatch)
    prep = prep_for(imageprep, 224)
    cases = truncated(photos)
    decoded = ImagePath(imageprep, prep, CPU).decode([complete, *cases.values()])
    for (name, data), item in zip(cases.items(), decoded[1:], strict=True):
        assert isinstance(item, imageprep.BadImageError), f"{name}: accepted"
        assert str(item) == _words(imageprep, prep, data), name
    assert calls == [[complete]]
    assert_pixels_close(device_pixels(ImagePath(imageprep, prep, CPU), [complete], decoded[:1]), prep(complete)[None])


@pytest.mark.parametrize("make", [lambda: np.full((300, 451, 3), 128, np.uint8),
                                  lambda: np.full((300, 451), 128, np.uint8)], ids=["colour", "grey"])
def test_complete_images_ending_in_mid_grey_are_decoded_by_imageprep_and_kept(imageprep, make, monkeypatch):
    """A last MCU of flat mid-grey makes the scan check suspect an early end: imageprep decodes the image, finds it
    complete, and its pixels are used."""
    prep = prep_for(imageprep, 224)
    data = encode(make())
    assert imageprep.scan_may_end_early(data, prep.inspect(data))
    calls = on_the_device(monkeypatch)
    pixels = device_pixels(ImagePath(imageprep, prep, CPU), [data])
    assert calls == []
    assert_pixels_close(pixels, prep(data)[None])


def test_a_scan_check_that_fails_sends_its_image_to_imageprep(imageprep, photos, monkeypatch):
    """The check raising (a MemoryError, say) fails neither the batch nor the image: imageprep decodes it."""
    prep = prep_for(imageprep, 224)
    data = [encode(photos["chelsea"]), encode(photos["coffee"])]

    def fails(item, header):
        raise MemoryError("stand-in")

    monkeypatch.setattr(imageprep, "scan_may_end_early", fails)
    calls = on_the_device(monkeypatch)
    pixels = device_pixels(ImagePath(imageprep, prep, CPU), data)
    assert calls == []
    assert_pixels_close(pixels, np.stack([prep(item) for item in data]))


def test_the_scan_check_passes_complete_photos_of_every_kind_and_size(imageprep, photos):
    """4:2:0, 4:4:4 and grey, large and a few pixels wide, with restart markers: complete, so not suspected (each
    suspect costs a CPU decode); with its scan cut to a quarter and closed again, each is (but the one-MCU image, whose
    last MCU is its first)."""
    prep = prep_for(imageprep, 224)
    chelsea = photos["chelsea"]
    kinds = {"4:2:0": encode(chelsea, quality=90), "4:4:4": encode(chelsea, subsampling=0),
             "grey": encode(chelsea[..., 0]), "restart markers": encode(chelsea, restart_marker_blocks=4),
             "2000 px": encode(np.asarray(Image.fromarray(chelsea).resize((2000, 1500)))),
             "9x7 px": encode(np.asarray(Image.fromarray(chelsea).resize((9, 7))))}
    for name, data in kinds.items():
        assert not imageprep.scan_may_end_early(data, prep.inspect(data)), name
        if name == "9x7 px":
            continue
        scan = data.rfind(b"\xff\xda")
        cut = data[:scan + (len(data) - scan) // 4] + b"\xff\xd9"
        assert imageprep.scan_may_end_early(cut, prep.inspect(cut)), f"{name}, cut short and closed again"


def test_an_image_the_device_decoder_refuses_is_decoded_by_imageprep(imageprep, photos, monkeypatch):
    """nvJPEG may refuse what libjpeg decodes (or decode what it refuses): the batched call fails as a whole, each
    image is then decoded alone, and imageprep decodes the one refused, with its pixels or its words."""
    from torchvision import io as tvio

    good, odd = encode(photos["chelsea"]), encode(photos["coffee"])
    real = tvio.decode_jpeg

    def picky(data, *args, **kwargs):  # refuses `odd`, as a GPU decoder might
        items = data if isinstance(data, list) else [data]
        if any(item.numel() == len(odd) for item in items):
            raise RuntimeError("nvjpegDecode failed: NVJPEG_STATUS_BAD_JPEG")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(tvio, "decode_jpeg", picky)
    prep = prep_for(imageprep, 224)
    path = ImagePath(imageprep, prep, CPU)
    cpu_decoded: list[bytes] = []
    real_cpu = ImagePath._cpu_decode
    monkeypatch.setattr(ImagePath, "_cpu_decode",
                        lambda self, item: cpu_decoded.append(item[0]) or real_cpu(self, item))
    pixels = device_pixels(path, [good, odd, good])
    assert cpu_decoded == [odd]  # the two others: the device's pixels
    assert_pixels_close(pixels, np.stack([prep(good), prep(odd), prep(good)]))
    [refused] = path.decode([odd[:-600]])  # no end marker: never offered to the device decoder
    assert str(refused) == _words(imageprep, prep, odd[:-600])


def test_a_large_group_runs_in_parts_with_the_same_pixels(imageprep, photos, monkeypatch):
    """Images of one size are transformed together, in parts of at most GROUP_PIXELS source pixels: a batch of phone
    photos does not ask the device for tens of GiB at once. The parts give the pixels the whole group gives."""
    prep = prep_for(imageprep, 224)
    path = ImagePath(imageprep, prep, CPU)
    data = [encode(photos["chelsea"], quality=90)] * 5 + [encode(photos["coffee"], quality=90)] * 2
    whole = device_pixels(path, data)
    calls: list[int] = []
    real = DeviceTransform.__call__
    monkeypatch.setattr(DeviceTransform, "__call__",
                        lambda self, images, *args: calls.append(len(images)) or real(self, images, *args))
    monkeypatch.setattr(torch_images, "GROUP_PIXELS", 2 * 300 * 451)  # two chelsea photos per part
    parts = device_pixels(path, data)
    assert sorted(calls) == [1, 1, 1, 2, 2]  # chelsea in 2 + 2 + 1, coffee (larger) one by one
    np.testing.assert_array_equal(parts, whole)


def test_a_lone_cpu_decode_is_not_handed_to_the_pool(imageprep, payloads):
    class Pool:
        def __init__(self) -> None:
            self.calls = 0

        def map(self, function, items):
            self.calls += 1
            return map(function, items)

    pool = Pool()
    path = ImagePath(imageprep, prep_for(imageprep, 32), CPU, pool)
    path.decode([payloads[3]])  # one PNG: decoded in the calling thread
    assert pool.calls == 0
    path.decode(payloads[3:5])  # PNG and WebP: on the pool
    assert pool.calls == 1


# -- the device part on the meta device: no host tensor -------------------------------------------------------------
@pytest.mark.parametrize("interpolation", list(DEVICE_RESIZE))
def test_the_device_part_makes_no_host_tensor(imageprep, interpolation):
    """Orientation, resize, crop and normalisation for groups of several sizes and orientations, on the meta device
    (shapes only): nothing built on the host and copied over (a CUDA stream would wait for it)."""
    prep = prep_for(imageprep, 224, interpolation)
    transform = DeviceTransform(prep, META)
    out = torch.empty(12, 3, 224, 224, device=META)
    with torch.inference_mode(), HostTensors(META) as recorder:
        for start, (height, width, orientation) in zip(range(0, 12, 3), [(300, 451, 1), (451, 300, 6),
                                                                          (224, 224, 3), (1000, 80, 8)], strict=True):
            images = torch.empty(3, 3, height, width, dtype=torch.uint8, device=META)
            transform(images, orientation, False, out[start:start + 3])
    assert recorder.found == [], f"ops that made tensors off the device: {recorder.found}"


def test_on_a_gpu_the_jpegs_go_to_the_decoder_on_the_device_and_cpu_decodes_are_pinned(imageprep, payloads,
                                                                                         monkeypatch):
    """The whole data path with the images on another device than the host (meta standing in for cuda): the batched
    JPEG decode is asked for that device (nvJPEG on a GPU), the images imageprep decodes on the CPU are pinned before
    their non-blocking copy (as `ImagePath` does on cuda), and nothing after the decode makes a host tensor."""
    from torchvision import io as tvio

    real = tvio.decode_jpeg
    asked: list[torch.device] = []

    def on_the_device(data, *args, device="cpu", **kwargs):  # decodes on the CPU, hands back tensors on `device`
        asked.append(torch.device(device))
        decoded = real(data, *args, **kwargs)
        return [image.to(device) for image in decoded] if isinstance(decoded, list) else decoded.to(device)

    pinned: list[tuple[int, ...]] = []
    monkeypatch.setattr(tvio, "decode_jpeg", on_the_device)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(tuple(self.shape)) or self)
    path = ImagePath(imageprep, prep_for(imageprep, 224), META)
    path.pin = True  # what ImagePath sets on a cuda device
    decoded = path.decode(payloads)
    assert asked == [META]  # one batched call for the three sequential JPEGs, on the device
    assert all(item.pixels.device == META for item in decoded)
    assert len(pinned) == len(payloads) - 3 and all(shape[-1] == 3 for shape in pinned)  # (h, w, 3) host uint8
    out = torch.empty(len(payloads), 3, 224, 224, device=META)
    with torch.inference_mode(), HostTensors(META) as recorder:
        order = path.transform_into(decoded, out)
    assert recorder.found == [], f"ops that made tensors off the device: {recorder.found}"
    assert sorted(order) == list(range(len(payloads)))
