"""Conversion speed and peak memory next to a bare `np.load` of the same file (issue #3 targets).

For a synthetic ViT-B/16- and ViT-L/16-shaped checkpoint (exact keys and shapes of Google's published
`ViT-{B,L}_16` i21k->i1k 224 files, from tests/fixtures/jax/manifests; random float32 values), measure in fresh
subprocesses, side by side in one run:

* read:    `np.load(path)` and read every array (what any npz consumer must at least do);
* convert: `hub_vit.conversion.convert_npz_file(path)` -> the complete hub-vit state dict.

Each is run `--repeats` times (best time, largest peak RSS kept). Peak RSS is the subprocess's high-water mark
(`VmHWM`) from the end of its imports to the end of the work: the child resets it after the imports, so neither a
transient import peak nor the benchmark process's own peak (which Linux hands down through fork/exec in
`ru_maxrss`) is counted. It includes what the imports keep resident; that RSS after imports (numpy; torch and
hub_vit for convert) is reported too, since torch alone costs a few hundred MB. Targets: convert <= 3x read time,
and peak RSS <= 2.5x the file size. Results go to bench/results/convert_cpu.json (or --out), rewritten after each
size with "complete": false until the last one is done.

    .venv/bin/python bench/bench_convert.py [--sizes B_16 L_16] [--repeats 2] [--workdir /tmp/hub_vit_bench]
                                            [--out bench/results/convert_cpu.json] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from run_info import add_note_option, check_writable, run_info, write_json

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "tests" / "fixtures" / "jax" / "manifests" / "vit_jax"
RESULTS = REPO / "bench" / "results"
TIME_TARGET, RSS_TARGET = 3.0, 2.5

# ru_maxrss would be wrong here: Linux carries the parent's high-water mark through fork/exec into it, so a bare
# read reported the benchmark process's peak. VmHWM belongs to the child's own address space, and writing "5" to
# clear_refs resets it to the current RSS, so after the imports it tracks the measured work alone.
_CHILD = r"""
import json, sys, time
mode, path = sys.argv[1], sys.argv[2]
import numpy as np
if mode == "convert":
    import torch  # noqa: F401
    from hub_vit.conversion import convert_npz_file


def status_bytes(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    raise RuntimeError(f"no {field} in /proc/self/status")


with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
rss_after_imports = status_bytes("VmRSS")
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
peak = status_bytes("VmHWM")
print(json.dumps({"seconds": seconds, "peak_rss": peak, "rss_after_imports": rss_after_imports, "numel": n}))
"""


def write_synthetic(manifest: Path, path: Path) -> int:
    """Stream a random float32 checkpoint with the manifest's keys and shapes into an uncompressed npz (as
    np.savez writes), one array at a time so the generator never holds the whole model."""
    params = json.loads(manifest.read_text())["params"]
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".part")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key, meta in params.items():
                array = rng.standard_normal(meta["shape"], dtype=np.float32)
                with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, array, allow_pickle=False)
        os.replace(tmp, path)
    finally:  # Ctrl-C or a full disk midway: an L_16 .part is 1.2 GB
        tmp.unlink(missing_ok=True)
    return path.stat().st_size


def measure(mode: str, path: Path, repeats: int) -> dict[str, Any]:
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
    parser.add_argument("--out", type=Path, default=RESULTS / "convert_cpu.json", help="results JSON")
    add_note_option(parser)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    check_writable(args.out.parent)  # before minutes of measuring, not after
    results: dict[str, Any] = {
        "run": run_info(args), "complete": False, "load_avg_at_start": os.getloadavg(),
        "targets": {"convert_over_read_time": TIME_TARGET, "peak_rss_over_file_size": RSS_TARGET},
        "models": {}}
    for size in args.sizes:
        manifest = MANIFESTS / f"ViT-{size}_i21k_ft_i1k_224.json"
        path = args.workdir / f"synthetic_{size}.npz"
        try:
            t0 = time.perf_counter()
            file_bytes = write_synthetic(manifest, path)
            print(f"{size}: wrote {file_bytes / 2**20:.1f} MiB synthetic checkpoint in "
                  f"{time.perf_counter() - t0:.1f}s")
            read = measure("read", path, args.repeats)
            conv = measure("convert", path, args.repeats)
        finally:  # also on Ctrl-C or a failed child: synthetic files are up to 1.2 GB
            if not args.keep:
                path.unlink(missing_ok=True)
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
        write_json(args.out, results)  # keep the finished sizes if a later one fails or is interrupted
        mib = 2**20
        print(f"  read    {read['seconds']:.2f}s  peak RSS {read['peak_rss'] / mib:.0f} MiB "
              f"(after imports {read['rss_after_imports'] / mib:.0f} MiB)")
        print(f"  convert {conv['seconds']:.2f}s  peak RSS {conv['peak_rss'] / mib:.0f} MiB "
              f"(after imports {conv['rss_after_imports'] / mib:.0f} MiB)")
        print(f"  convert/read time {row['convert_over_read_time']:.2f}x (target <= {TIME_TARGET}x)  "
              f"peak RSS/file {row['peak_rss_over_file_size']:.2f}x (target <= {RSS_TARGET}x; "
              f"{row['peak_rss_above_imports_over_file_size']:.2f}x above the imports)")
    results["complete"] = True
    write_json(args.out, results)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
