"""Conversion speed and peak memory next to a bare `np.load` of the same file (issue #3 targets).

For a synthetic ViT-B/16- and ViT-L/16-shaped checkpoint (exact keys and shapes of Google's published
`ViT-{B,L}_16` i21k->i1k 224 files, from tests/fixtures/jax/manifests; random float32 values), measure in fresh
subprocesses, side by side in one run:

* read:    `np.load(path)` and read every array (what any npz consumer must at least do);
* convert: `hub_vit.conversion.convert_npz_file(path)` -> the complete hub-vit state dict.

Each is run `--repeats` times (best time, largest peak RSS kept). Peak RSS is the subprocess's `ru_maxrss`; the
RSS after imports (numpy, torch, hub_vit) is reported too, since torch alone costs a few hundred MB. Targets:
convert <= 3x read time, and peak RSS <= 2.5x the file size. Results go to bench/results/bench_convert.json.

    .venv/bin/python bench/bench_convert.py [--sizes B_16 L_16] [--repeats 2] [--workdir /tmp/hub_vit_bench]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "tests" / "fixtures" / "jax" / "manifests" / "vit_jax"
RESULTS = REPO / "bench" / "results"
TIME_TARGET, RSS_TARGET = 3.0, 2.5

_CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
import numpy as np
if mode == "convert":
    import torch  # noqa: F401
    from hub_vit.conversion import convert_npz_file
rss_after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
if mode == "read":
    with np.load(path, allow_pickle=False) as z:
        n = 0
        for key in z.files:
            n += z[key].size
else:
    state_dict = convert_npz_file(path)
    n = sum(t.numel() for t in state_dict.values())
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "peak_rss": peak, "rss_after_imports": rss_after_imports, "numel": n}))
"""


def write_synthetic(manifest: Path, path: Path) -> int:
    """Stream a random float32 checkpoint with the manifest's keys and shapes into an uncompressed npz (as
    np.savez writes), one array at a time so the generator never holds the whole model."""
    params = json.loads(manifest.read_text())["params"]
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, meta in params.items():
            array = rng.standard_normal(meta["shape"], dtype=np.float32)
            with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)
    os.replace(tmp, path)
    return path.stat().st_size


def measure(mode: str, path: Path, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path)], check=True, capture_output=True,
                             text=True, cwd=REPO)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        "seconds": min(r["seconds"] for r in runs),
        "seconds_all": [round(r["seconds"], 3) for r in runs],
        "peak_rss": max(r["peak_rss"] for r in runs),
        "rss_after_imports": max(r["rss_after_imports"] for r in runs),
        "numel": runs[0]["numel"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["B_16", "L_16"], help="manifest model names (ViT-<size>)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "hub_vit_bench")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic checkpoints")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = {"machine": {"python": platform.python_version(), "platform": platform.platform(),
                           "cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()},
               "targets": {"convert_over_read_time": TIME_TARGET, "peak_rss_over_file_size": RSS_TARGET},
               "models": {}}
    for size in args.sizes:
        manifest = MANIFESTS / f"ViT-{size}_i21k_ft_i1k_224.json"
        path = args.workdir / f"synthetic_{size}.npz"
        t0 = time.perf_counter()
        file_bytes = write_synthetic(manifest, path)
        print(f"{size}: wrote {file_bytes / 2**20:.1f} MiB synthetic checkpoint in {time.perf_counter() - t0:.1f}s")
        read = measure("read", path, args.repeats)
        conv = measure("convert", path, args.repeats)
        assert read["numel"] == conv["numel"] == json.loads(manifest.read_text())["total_params"]
        row = {
            "manifest": manifest.name, "file_bytes": file_bytes, "read": read, "convert": conv,
            "convert_over_read_time": conv["seconds"] / read["seconds"],
            "peak_rss_over_file_size": conv["peak_rss"] / file_bytes,
            "peak_rss_above_imports_over_file_size": (conv["peak_rss"] - conv["rss_after_imports"]) / file_bytes,
        }
        row["meets_time_target"] = row["convert_over_read_time"] <= TIME_TARGET
        row["meets_rss_target"] = row["peak_rss_over_file_size"] <= RSS_TARGET
        results["models"][size] = row
        mib = 2**20
        print(f"  read    {read['seconds']:.2f}s  peak RSS {read['peak_rss'] / mib:.0f} MiB")
        print(f"  convert {conv['seconds']:.2f}s  peak RSS {conv['peak_rss'] / mib:.0f} MiB "
              f"(after imports {conv['rss_after_imports'] / mib:.0f} MiB)")
        print(f"  convert/read time {row['convert_over_read_time']:.2f}x (target <= {TIME_TARGET}x)  "
              f"peak RSS/file {row['peak_rss_over_file_size']:.2f}x (target <= {RSS_TARGET}x; "
              f"{row['peak_rss_above_imports_over_file_size']:.2f}x above the imports)")
        if not args.keep:
            path.unlink()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_convert.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
