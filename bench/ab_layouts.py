"""The CPU flavour's two repository layouts side by side: one Python step that decodes, runs ONNX Runtime and ranks
(the current default) against the previous layout, a Python preprocessing step feeding a Python ORT + top-k step.

The previous layout is rebuilt from the current repository's pieces plus the two templates as they were at commit
PREVIOUS (git show), with the same defaults (two instances per step, ORT settings per model, the same batching and
queue settings), so the only difference is the extra stub hop. Both servers run at once on the same cores and are
measured alternately, one image per request: in-process throughput (batch 16) or latency (batch 1), then each layout
in turn, ROUNDS times; `--reverse` swaps the order of the two layouts. Printed and saved: every measurement and the
median ratio one step / two steps per row.

    .venv/bin/python bench/ab_layouts.py                       # digits, 4 s per measurement, 3 rounds
    .venv/bin/python bench/ab_layouts.py --models ti16 --reverse
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_serve import CASES, RESULTS, InProcess
from google.protobuf import text_format
from run_info import check_writable, file_at, run_info, side_by_side_parser, write_json
from tritonclient.grpc import model_config_pb2 as mc

from hub_vit.server.client.loadtest import load_test
from hub_vit.server.repository.config import cpu_classifier_config, render
from hub_vit.server.repository.metadata import ServingMetadata, serving_metadata
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import MANIFEST, write_repository
from hub_vit.server.runtime.launcher import TritonServer, free_port

PREVIOUS = "5b17ea8"  # the last commit with the two-step CPU layout
MAX_BATCH = 16


def _parse(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def two_step_repository(meta: ServingMetadata, opts: ServingOptions, cpu: Path, gpu: Path, out: Path) -> Path:
    """The previous CPU layout: `vit` -> `vit_preprocess` (the GPU flavour's step, today's config, PREVIOUS's
    template) -> `vit_classifier` (today's CPU step fed `pixel_values`, PREVIOUS's template). `cpu` and `gpu`: the
    repositories written for `meta` with `opts` in each flavour."""
    shutil.copytree(gpu, out)
    shutil.rmtree(out / "vit_postprocess")
    shutil.rmtree(out / "vit_classifier")
    shutil.copytree(cpu / "vit_classifier", out / "vit_classifier")
    shutil.rmtree(out / "vit_classifier" / "warmup")
    for stale in ("vit_classifier/1/imageprep.py", "vit_classifier/1/triton_errors.py",
                  "vit_preprocess/1/triton_errors.py"):
        (out / stale).unlink()
    for target, source in (("vit_classifier/1/model.py", "server/templates/classifier_ort/model.py"),
                           ("vit_preprocess/1/model.py", "server/templates/preprocess/model.py"),
                           ("vit_preprocess/1/imageprep.py", "server/templates/preprocess/imageprep.py")):
        (out / target).write_text(file_at(PREVIOUS, source), encoding="utf-8")
    compute_bound = json.loads((cpu / MANIFEST).read_text())["compute_bound"]
    classifier = cpu_classifier_config(meta, opts, "model.onnx", compute_bound=compute_bound, decodes=False)
    (out / "vit_classifier/config.pbtxt").write_text(render(classifier), encoding="utf-8")
    ensemble = _parse(cpu / "vit/config.pbtxt")
    del ensemble.ensemble_scheduling.step[:]
    pre = ensemble.ensemble_scheduling.step.add(model_name="vit_preprocess", model_version=-1)
    pre.input_map["image"] = "image"
    pre.output_map["pixel_values"] = "pixel_values"
    cls = ensemble.ensemble_scheduling.step.add(model_name="vit_classifier", model_version=-1)
    cls.input_map["pixel_values"] = "pixel_values"
    for output in ensemble.output:
        cls.output_map[output.name] = output.name
    (out / "vit/config.pbtxt").write_text(text_format.MessageToString(ensemble), encoding="utf-8")
    return out


def run_case(case: str, seconds: float, rounds: int, reverse: bool) -> dict[str, Any]:
    source, payloads = CASES[case]()
    with tempfile.TemporaryDirectory(prefix="ab-layouts-") as tmp:
        opts = ServingOptions(max_batch_size=MAX_BATCH)
        one = write_repository(source, Path(tmp) / "one_step", opts)
        gpu = write_repository(source, Path(tmp) / "gpu", ServingOptions(max_batch_size=MAX_BATCH, flavour="gpu"))
        two = two_step_repository(serving_metadata(source), opts, one, gpu, Path(tmp) / "two_steps")
        local = InProcess(one / "vit_classifier" / "1" / "model.onnx", serving_metadata(source), payloads)
        ports = {name: {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
                 for name in ("one_step", "two_steps")}
        rows: dict[str, dict[str, list[float]]] = {}
        with TritonServer(one, **ports["one_step"]) as one_srv, TritonServer(two, **ports["two_steps"]) as two_srv:
            order = [("one_step", one_srv), ("two_steps", two_srv)]
            if not reverse:
                order.reverse()
            for _ in range(rounds):
                for conc in (16, 1):
                    for protocol in ("grpc", "http"):
                        row = rows.setdefault(f"{protocol}_c{conc}", {})
                        base = local.throughput(seconds)[0] if conc > 1 else local.latency(seconds)["p50"]
                        row.setdefault("in_process", []).append(base)
                        for name, server in order:
                            url = server.grpc_url if protocol == "grpc" else server.http_url
                            result = load_test(url, payloads, protocol=protocol, concurrency=conc, duration_s=seconds,
                                               warmup=4)
                            if result.errors:
                                raise SystemExit(f"{name} {protocol} c{conc}: {result.errors} errors: "
                                                 f"{result.error_messages}")
                            row.setdefault(name, []).append(result.images_per_s if conc > 1
                                                            else result.latency_ms["p50"])
    summary = {}
    for key, row in rows.items():
        ratio = float(np.median(np.array(row["one_step"]) / np.array(row["two_steps"])))
        summary[key] = {"one_step_over_two_steps_median": ratio,
                        **{name: [round(v, 3) for v in values] for name, values in row.items()}}
        unit = "images/s" if key.endswith("c16") else "ms p50"
        print(f"[{case}] {key} ({unit}): one step {np.median(row['one_step']):.2f}, two steps "
              f"{np.median(row['two_steps']):.2f}, in-process {np.median(row['in_process']):.2f}; one/two per round "
              f"median {ratio:.2f}", flush=True)
    return summary


def main() -> None:
    parser = side_by_side_parser(__doc__, seconds=4.0, reverse_help="measure the one-step layout first in each round",
                                 out=RESULTS / "ab_layouts.json")
    parser.add_argument("--models", nargs="+", default=["digits"], choices=list(CASES))
    args = parser.parse_args()
    check_writable(args.out.parent)
    file_at(PREVIOUS, "server/templates/preprocess/model.py")  # before the run: git and the commit are there
    report = {"run": run_info(args, packages=("nvidia-pytriton", "tritonclient")), "previous_commit": PREVIOUS,
              "cases": {case: run_case(case, args.seconds, args.rounds, args.reverse) for case in args.models}}
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
