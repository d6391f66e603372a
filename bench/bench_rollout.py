"""Attention-rollout latency vs a plain forward pass, measured side by side in one run (CPU by default).

    .venv/bin/python bench/bench_rollout.py                       # ViT-S/16 at 224 (class token), batch 1
    .venv/bin/python bench/bench_rollout.py --model simplevit_s16 --batch 4 --device cuda

Target (issue 7): rollout <= 1.5x the plain forward. The two are timed interleaved (forward, rollout, forward, ...)
so load from other processes hits both alike. The headline ratio is the median of per-round ratios (each rollout
over the forward timed just before it); the ratio of the medians is reported too, labelled as such. Random weights:
the cost does not depend on the values. Writes <--out>/rollout_<model>_<device>_b<batch>_t<threads>.json (--out
defaults to bench/results).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from run_info import add_note_option, check_writable, run_info, write_json

from hub_vit import VisionTransformer, get_entry
from hub_vit.explain import attention_rollout, gradient_rollout

TARGET_RATIO = 1.5


def timed(fn: Callable[[], None], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_s16", help="registered hub-vit name (default: vit_s16)")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                        help="folder for the results JSON")
    add_note_option(parser)
    args = parser.parse_args()
    check_writable(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)

    spec = get_entry(args.model).spec.replace(img_size=args.img_size)
    model = VisionTransformer(spec).eval().to(args.device)
    x = torch.randn(args.batch, spec.in_chans, args.img_size, args.img_size, device=args.device)

    def forward() -> None:
        with torch.inference_mode():
            model(x)

    def rollout() -> None:
        attention_rollout(model, x, head_fusion="mean")

    def grad_rollout() -> None:
        gradient_rollout(model, x)

    for _ in range(args.warmup):
        forward(), rollout(), grad_rollout()
    times: dict[str, list[float]] = {"forward": [], "rollout": [], "grad_rollout": []}
    for _ in range(args.repeats):  # interleaved, so background load affects all three alike
        times["forward"].append(timed(forward, args.device))
        times["rollout"].append(timed(rollout, args.device))
        times["grad_rollout"].append(timed(grad_rollout, args.device))
    med = {k: statistics.median(v) for k, v in times.items()}
    # Headline: the median of per-round ratios (rollout over the forward timed right before it). On a shared machine
    # the load drifts between rounds; a ratio within one round cancels most of that drift.
    ratio = statistics.median(r / f for f, r in zip(times["forward"], times["rollout"], strict=True))
    grad_ratio = statistics.median(g / f for f, g in zip(times["forward"], times["grad_rollout"], strict=True))
    result = {
        "run": run_info(args),
        "benchmark": "attention rollout vs plain forward",
        "model": args.model, "variant": spec.variant, "pool_type": spec.pool_type, "img_size": args.img_size,
        "tokens": spec.num_patches + spec.num_prefix_tokens, "batch": args.batch, "device": args.device,
        "torch_threads": torch.get_num_threads(), "repeats": args.repeats, "warmup": args.warmup,
        "torch": torch.__version__,
        "median_s": med, "min_s": {k: min(v) for k, v in times.items()},
        "rollout_over_forward": ratio, "grad_rollout_over_forward": grad_ratio,
        "ratio_of_medians": {"rollout": med["rollout"] / med["forward"],
                             "grad_rollout": med["grad_rollout"] / med["forward"]},
        "load_average": os.getloadavg(),
        "target_rollout_over_forward": TARGET_RATIO, "meets_target": ratio <= TARGET_RATIO,
        "note": "forward = model(x) (fused SDPA, inference_mode); rollout = forward_all(output_attentions=True) "
                "+ head fusion + layer products + readout; grad_rollout = forward + backward to the attentions",
    }
    path = args.out / f"rollout_{args.model}_{args.device}_b{args.batch}_t{torch.get_num_threads()}.json"
    write_json(path, result)
    print(f"{args.model} @ {args.img_size} batch {args.batch} on {args.device} ({torch.get_num_threads()} threads)")
    # two statistics, both named: the ratio of the medians (per line) and the median of per-round ratios (headline)
    for key, value in med.items():
        print(f"  {key:13s} median {value * 1000:8.1f} ms  (ratio of medians: {value / med['forward']:.2f}x forward)")
    verdict = "OK" if ratio <= TARGET_RATIO else "MISS"
    print(f"  rollout / forward, median of per-round ratios = {ratio:.2f} (target <= {TARGET_RATIO}) -> {verdict}")
    print(f"  grad_rollout / forward, median of per-round ratios = {grad_ratio:.2f}")
    print(f"  saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
