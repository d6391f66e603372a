"""What a device JPEG decoder makes of a sequential JPEG whose scan data ends early: for each way of cutting a photo
short, the decoder's error or pixels, where they part from libjpeg's (Pillow's) decode, and what the rows after the
data's end hold (flat? which colour? the same on a second call, after other images?).

    python bench/nvjpeg_truncation_probe.py --device cuda --out probe.json   # bench/ on sys.path (gpu_check)

libjpeg fills the missing MCUs with mid-grey, which imageprep's `ends_early` looks for; this probe says whether the
device decoder leaves something that can be told apart as cheaply.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np


def encode(array: np.ndarray, **options: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", **options)
    return buffer.getvalue()


def cases() -> dict[str, bytes]:
    from PIL import Image
    from skimage import data

    photo = np.asarray(Image.fromarray(data.chelsea()).resize((451, 300)))
    whole = encode(photo)
    taller = bytearray(whole)
    frame = taller.find(b"\xff\xc0")
    taller[frame + 5:frame + 7] = struct.pack(">H", 316)
    found = {"complete": whole, "cut 600 bytes, closed again": whole[:-600] + b"\xff\xd9",
             "16 rows more declared": bytes(taller)}
    for share in (0.5, 0.9):
        found[f"cut at {share:.0%}, closed again"] = whole[:int(len(whole) * share)] + b"\xff\xd9"
    restart = encode(photo, quality=90, restart_marker_blocks=4) if _has_restart_option() else None
    if restart is not None:
        found["restart markers, cut 600 bytes, closed again"] = restart[:-600] + b"\xff\xd9"
    found["grey 4:4:4 cut, closed again"] = encode(photo, subsampling=0)[:-600] + b"\xff\xd9"
    return found


def _has_restart_option() -> bool:
    try:
        encode(np.zeros((16, 16, 3), np.uint8), restart_marker_blocks=4)
    except (TypeError, ValueError, OSError):
        return False
    return True


def last_block(data: bytes) -> tuple[int, int, int, int]:
    """The (left, top, right, bottom) of a baseline JPEG's last MCU, from its SOF0 (as imageprep's `last_block`)."""
    at = data.find(b"\xff\xc0")
    height, width = struct.unpack(">HH", data[at + 5:at + 9])
    count = data[at + 9]
    factors = [data[at + 11 + 3 * i] for i in range(count)]
    mcu_w, mcu_h = 8 * max(f >> 4 for f in factors), 8 * max(f & 15 for f in factors)
    return ((width - 1) // mcu_w * mcu_w, (height - 1) // mcu_h * mcu_h, width, height)


def region(pixels: np.ndarray, rows: slice) -> dict[str, Any]:
    part = pixels[rows].reshape(-1, 3).astype(np.float64)
    if not len(part):
        return {}
    return {"mean": part.mean(0).round(2).tolist(), "min": part.min(0).tolist(), "max": part.max(0).tolist(),
            "std": part.std(0).round(2).tolist()}


def probe(device_name: str) -> dict[str, Any]:
    import torch
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg

    device = torch.device(device_name)
    out: dict[str, Any] = {"device": device_name, "torch": torch.__version__, "cases": {}}
    found = cases()
    noise = [encode(np.random.default_rng(i).integers(0, 256, (300, 451, 3), dtype=np.uint8)) for i in range(4)]
    for name, data in found.items():
        entry: dict[str, Any] = {"bytes": len(data)}
        box = last_block(data)
        entry["last_block"] = box
        try:
            reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            entry["pillow"] = "decoded"
        except Exception as err:  # noqa: BLE001 - Pillow's words for it
            reference = None
            entry["pillow"] = f"{type(err).__name__}: {err}"
        runs = []
        for attempt in range(3):
            if attempt:  # other images through the decoder first: does leftover memory show through?
                decode_jpeg([torch.frombuffer(n, dtype=torch.uint8) for n in noise], mode=ImageReadMode.RGB,
                            device=device)
            try:
                single = decode_jpeg(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB,
                                     device=device)
                batched = decode_jpeg([torch.frombuffer(data, dtype=torch.uint8)] + [
                    torch.frombuffer(noise[0], dtype=torch.uint8)], mode=ImageReadMode.RGB, device=device)[0]
            except Exception as err:  # noqa: BLE001 - the decoder's refusal
                runs.append({"error": f"{type(err).__name__}: {err}"[:500]})
                continue
            pixels = single.permute(1, 2, 0).cpu().numpy()
            run: dict[str, Any] = {"shape": list(pixels.shape),
                                   "batched_equals_single": bool((batched.permute(1, 2, 0).cpu().numpy()
                                                                  == pixels).all())}
            if reference is not None and reference.shape == pixels.shape:
                diff = np.abs(reference.astype(np.int16) - pixels.astype(np.int16)).max(axis=(1, 2))
                bad_rows = np.nonzero(diff > 24)[0]
                run["first_row_far_from_pillow"] = int(bad_rows[0]) if len(bad_rows) else None
                run["rows_far_from_pillow"] = int(len(bad_rows))
                if len(bad_rows):
                    run["device_after"] = region(pixels, slice(int(bad_rows[0]), None))
                    run["pillow_after"] = region(reference, slice(int(bad_rows[0]), None))
            run["last_16_rows"] = region(pixels, slice(-16, None))
            if box is not None:
                left, top, right, bottom = box
                run["last_block"] = region(pixels[top:bottom, left:right], slice(None))
                if reference is not None and reference.shape == pixels.shape:
                    run["pillow_last_block"] = region(reference[top:bottom, left:right], slice(None))
            runs.append(run)
        entry["runs"] = runs
        entry["same_each_run"] = len({json.dumps(r, sort_keys=True) for r in runs}) == 1
        out["cases"][name] = entry
        print(name, json.dumps(entry)[:600], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.write_text(json.dumps(probe(args.device), indent=1))


if __name__ == "__main__":
    main()
