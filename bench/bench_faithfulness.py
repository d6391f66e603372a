"""How much are the maps worth? Deletion / insertion scores (Petsiuk et al. 2018, RISE) of attention rollout, the
class-specific (gradient-weighted) map and a random map, on the shipped digits model's held-out split.

    .venv/bin/python bench/bench_faithfulness.py [--images 360] [--seed 0] [--out bench/results]

Per image and map: patches are ranked by the map (most relevant first). Deletion replaces them one by one with the
baseline (value 0 after normalisation: mid-grey) and records the probability of the class the model predicted on
the intact image; insertion starts from the all-baseline image and puts them back in the same order. The score is
the area under that curve (mean over the 0..N patch steps): low is good for deletion (the class vanishes fast when
the patches the map points at go), high is good for insertion. The random map is the baseline a useful map must
beat; the same seed gives the same random maps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from run_info import add_note_option, check_writable, run_info, write_json

from hub_vit.demo.models import load_explainer, resolve_choice
from hub_vit.explain import attention_rollout, gradient_rollout
from hub_vit.train.digits import load_digits_split

MAPS = ("rollout", "class_map", "random")


def curves(model: torch.nn.Module, x: torch.Tensor, order: torch.Tensor, label: int, patch: int) -> tuple[float, float]:
    """(deletion AUC, insertion AUC) for one image `x` (C, H, W) and its patch ranking `order` (N,), best first."""
    grid_w = x.shape[-1] // patch
    n = order.numel()
    masks = torch.zeros(n + 1, n)  # step k: the first k ranked patches are "on"
    for k in range(1, n + 1):
        masks[k] = masks[k - 1]
        masks[k, order[k - 1]] = 1.0
    pixel_masks = masks.view(n + 1, 1, -1, grid_w).repeat_interleave(patch, 2).repeat_interleave(patch, 3)
    with torch.inference_mode():
        deleted = model(x[None] * (1 - pixel_masks)).softmax(-1)[:, label]  # step k: k patches removed
        inserted = model(x[None] * pixel_masks).softmax(-1)[:, label]  # step k: k patches present
    return float(deleted.mean()), float(inserted.mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=360, help="held-out images to score (the split has 360)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random maps")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny batches: 1 is fastest)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                        help="folder for the results JSON")
    add_note_option(parser)
    args = parser.parse_args()
    check_writable(args.out)
    torch.set_num_threads(args.threads)
    explainer = load_explainer(resolve_choice(None))
    model, patch = explainer.model.eval(), explainer.model.spec.patch_size
    images, _ = load_digits_split("val")
    from PIL import Image

    x = torch.stack([explainer.prepare(Image.fromarray(im)).tensor for im in images[: args.images]])
    with torch.inference_mode():
        predicted = model(x).argmax(-1)
    rng = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    maps = {"rollout": attention_rollout(model, x).maps.flatten(1),
            "class_map": gradient_rollout(model, x, predicted.tolist()).maps.flatten(1)}
    maps["random"] = torch.rand(maps["rollout"].shape, generator=rng)
    scores: dict[str, dict[str, list[float]]] = {name: {"deletion": [], "insertion": []} for name in MAPS}
    for i in range(len(x)):
        for name in MAPS:
            order = torch.argsort(maps[name][i], descending=True, stable=True)
            deletion, insertion = curves(model, x[i], order, int(predicted[i]), patch)
            scores[name]["deletion"].append(deletion)
            scores[name]["insertion"].append(insertion)
    summary = {name: {test: round(statistics.fmean(values), 4) for test, values in tests.items()}
               for name, tests in scores.items()}
    result = {
        "run": run_info(args),
        "benchmark": "deletion / insertion AUC of the maps (probability of the predicted class)",
        "model": explainer.name, "images": len(x), "patches": int(maps["rollout"].shape[1]),
        "baseline": "0 after normalisation (mid-grey)", "seed": args.seed,
        "mean_auc": summary,
        "std_auc": {name: {test: round(float(np.std(values)), 4) for test, values in tests.items()}
                    for name, tests in scores.items()},
        "seconds": round(time.perf_counter() - start, 1),
    }
    path = args.out / "faithfulness_digits.json"
    write_json(path, result)
    print(f"{len(x)} held-out digits, {result['patches']} patches each; mean AUC of the predicted class's probability")
    print(f"{'map':<10} {'deletion (lower is better)':>28} {'insertion (higher is better)':>30}")
    for name in MAPS:
        print(f"{name:<10} {summary[name]['deletion']:>28.4f} {summary[name]['insertion']:>30.4f}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
