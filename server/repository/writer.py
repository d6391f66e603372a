"""Write a Triton model repository for one hub-vit classifier (`hub-vit repository`).

Layout (`<name>` defaults to `vit`; clients call the ensemble `<name>`: image -> labels, scores, class_ids, logits):

    <out>/<name>/config.pbtxt                      the ensemble: CPU one step, GPU three
    CPU flavour: one Python-backend step decodes, runs ONNX Runtime and ranks (one stub hop per request)
    <out>/<name>_classifier/{config.pbtxt, 1/model.py, 1/imageprep.py, 1/image_modes.py, 1/topk.py,
                             1/triton_errors.py, 1/protocol.py, 1/domain_outputs.py, 1/domain_score.py,
                             1/stub_gc.py, 1/model.onnx, 1/labels.txt, warmup/image}
        + 1/explained.py, 1/served_rollout.py, 1/model_attentions.onnx when it serves rollout (options.explain)
        + 1/domain.safetensors when the model folder's out-of-domain score is calibrated for its weights (the
          graphs then also write `token_means`)
    GPU flavour: the classifier runs in Triton's own ORT / TensorRT backend on the GPU
    <out>/<name>_preprocess/{config.pbtxt, 1/model.py, 1/imageprep.py, 1/image_modes.py, 1/triton_errors.py,
                             1/stub_gc.py, warmup/image}
    <out>/<name>_classifier/{config.pbtxt, 1/model.onnx | 1/model.plan}
    <out>/<name>_postprocess/{config.pbtxt, 1/model.py, 1/topk.py, 1/protocol.py, 1/domain_outputs.py,
                              1/stub_gc.py, 1/labels.txt}: logits -> top-k (domain: unknown)

    torch flavour: one Python-backend step decodes, runs the hub-vit model in PyTorch (cuda or cpu) and ranks
    <out>/<name>_classifier/{config.pbtxt, 1/model.py, 1/imageprep.py, 1/image_modes.py, 1/topk.py,
                             1/triton_errors.py, 1/protocol.py, 1/domain_outputs.py, 1/domain_score.py,
                             1/stub_gc.py, 1/model/{config.json, model.safetensors}, 1/labels.txt, warmup/image}
        + 1/domain.safetensors, as the CPU flavour

    <out>/hub_vit_repository.json                  what was generated from what (Triton ignores plain files)

The repository is written to a temporary sibling folder and renamed into place at the end, so a failed export never
leaves a half-written repository behind.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import struct
from importlib import resources
from pathlib import Path
from typing import Any

from hub_vit import __version__
from hub_vit.atomic import file_in_the_way, holds_cwd, remove_empty_folders, replace_dir, staging_dir
from hub_vit.domain import STATISTICS_FILE, read_domain
from hub_vit.resolve import ResolvedModel
from hub_vit.server.repository.config import (
    ATTENTIONS_FILE,
    GENERATED_HEADER,
    SPIN_MIN_GMACS,
    WARMUP_IMAGE_FILE,
    RolloutLayout,
    cpu_classifier_config,
    ensemble_config,
    gpu_classifier_config,
    postprocess_config,
    preprocess_config,
    render,
    torch_classifier_config,
)
from hub_vit.server.repository.cpu_variant import place
from hub_vit.server.repository.metadata import ServingMetadata, serving_metadata
from hub_vit.server.repository.options import ServingOptions

MANIFEST = "hub_vit_repository.json"
# `_templates` sources besides the template folders: modules of the hub_vit package, copied as they are
PACKAGE, SERVER_PACKAGE = "hub_vit", "hub_vit.server"
TORCH_MODEL_DIR = "model"  # the torch flavour's hub-vit model folder, in the classifier's version folder


def template_dir(name: str) -> Path:
    """Folder of one packaged Python-backend template (`preprocess`, `classifier_ort`, `postprocess`, `common`)."""
    return Path(str(resources.files("hub_vit.server.repository") / "templates" / name))


def write_repository(source: ResolvedModel, out_dir: str | Path, options: ServingOptions | None = None, *,
                     overwrite: bool = False) -> Path:
    """Generate the repository for `source` under `out_dir`; returns `out_dir`."""
    opts = options or ServingOptions()
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{str(out)!r} is a file; give a folder for the repository")
    blocking = file_in_the_way(out)  # a parent, `out` itself was checked above
    if blocking is not None:  # mkdir would say only "[Errno 17] File exists"
        raise NotADirectoryError(f"{str(blocking)!r} is a file, so the repository {str(out)!r} cannot be made in it")
    if holds_cwd(out):
        raise FileExistsError(f"{str(out)!r} is the current directory (or holds it); replacing it would leave the "
                              "shell in a deleted folder: choose another folder")
    occupied = out.exists() and any(out.iterdir())  # an empty folder (mkdir first) is taken as is
    if occupied and not _is_generated_repository(out):  # said first: --overwrite would not help
        raise FileExistsError(f"{str(out)!r} is not a repository written by `hub-vit repository` (no generated "
                              "config.pbtxt); replacing it would delete everything in it: choose another folder")
    if occupied and not overwrite:
        raise FileExistsError(f"{str(out)!r} already exists; pass overwrite=True (--overwrite) to replace it")
    foreign = _not_generated(out) if occupied else []
    if foreign:  # models added by hand beside hub-vit's in one Triton repository: replacing would delete them
        shown = ", ".join(repr(name) for name in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                                                 else "")
        raise FileExistsError(f"{str(out)!r} also holds what `hub-vit repository` did not write ({shown}); "
                              "replacing it would delete them: move them out first, or choose another folder")
    created = [folder for folder in out.parents if not folder.exists()]  # deepest first: removed again on failure
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_dir(out)  # also removes what a killed writer of `out` left
    except OSError as err:  # named by the folder asked for, not by the hidden staging folder beside it
        remove_empty_folders(created)
        raise OSError(err.errno, err.strerror, str(out)) from None
    try:
        _fill(staging, source, opts)
        replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty_folders(created)  # a refused model leaves no trace, not even the folders made for it
        raise
    return out


def _not_generated(folder: Path) -> list[str]:
    """The entries of a generated repository `folder` that the writer did not make: anything but its manifest and
    model folders whose config.pbtxt carries the generated header (sorted names, a folder with a trailing /)."""
    return sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir()
                  if entry.name != MANIFEST and not _generated_model(entry))


def _generated_model(entry: Path) -> bool:
    config = entry / "config.pbtxt"
    try:
        with config.open(encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(GENERATED_HEADER)
    except OSError:  # no such file (not a model folder, or a plain file), or unreadable: not one we wrote
        return False


def _is_generated_repository(folder: Path) -> bool:
    """Some `<model>/config.pbtxt` in `folder` starts with the header `config.render` writes."""
    return any(_generated_model(entry) for entry in folder.iterdir())


def compute_bound_model(source: ResolvedModel) -> bool:
    """Whether the classifier needs at least SPIN_MIN_GMACS per image (unknown, e.g. a bare ONNX file: assume yes)."""
    spec = getattr(source.module, "spec", None)
    if spec is None:
        return True
    from hub_vit.model_cards.macs import gmacs

    return gmacs(spec) >= SPIN_MIN_GMACS


def _server_files(meta: ServingMetadata, opts: ServingOptions, model_file: str,
                  compute_bound: bool, rollout: RolloutLayout | None = None) -> dict[str, str | Path]:
    """Repository-relative path -> what hub-vit's own code puts there: a config's text, or the packaged template file
    copied beside it (the Python-backend `model.py` and the modules it imports). The rest of a repository (weights,
    labels, warm-up image) comes from the model. `outdated_files` compares a repository with this."""
    decoding = {"imageprep.py": "preprocess", "triton_errors.py": "common", "image_modes.py": PACKAGE,
                "image_formats.py": PACKAGE, "protocol.py": SERVER_PACKAGE, "stub_gc.py": "common"}
    domain = {"domain_outputs.py": "common", "domain_score.py": PACKAGE}  # the answers' out-of-domain outputs
    cls = opts.step("classifier")
    files: dict[str, str | Path] = {f"{opts.name}/config.pbtxt": render(ensemble_config(meta, opts, rollout))}
    if opts.flavour == "cpu":
        files[f"{cls}/config.pbtxt"] = render(cpu_classifier_config(meta, opts, model_file,
                                                                    compute_bound=compute_bound, rollout=rollout))
        explaining = {"explained.py": "classifier_ort", "served_rollout.py": "common"} if rollout is not None else {}
        return files | _templates(cls, {"model.py": "classifier_ort", "topk.py": "common", "cgroup_limits.py": PACKAGE,
                                        "openvino_runtime.py": PACKAGE, **decoding, **domain, **explaining})
    if opts.flavour == "torch":
        files[f"{cls}/config.pbtxt"] = render(torch_classifier_config(meta, opts, model_file, rollout=rollout))
        explaining = {"served_rollout.py": "common"} if rollout is not None else {}
        return files | _templates(cls, {"model.py": "classifier_torch", "topk.py": "common",
                                        "cgroup_limits.py": PACKAGE, **decoding, **domain, **explaining})
    pre, post = opts.step("preprocess"), opts.step("postprocess")
    files[f"{pre}/config.pbtxt"] = render(preprocess_config(meta, opts))
    files |= _templates(pre, {"model.py": "preprocess", **decoding})
    files[f"{cls}/config.pbtxt"] = render(gpu_classifier_config(meta, opts, model_file))
    files[f"{post}/config.pbtxt"] = render(postprocess_config(meta, opts))
    return files | _templates(post, {"model.py": "postprocess", "topk.py": "common", "protocol.py": SERVER_PACKAGE,
                                     "domain_outputs.py": "common", "stub_gc.py": "common"})


def _templates(step: str, files: dict[str, str]) -> dict[str, Path]:
    """{file: template} -> {`<step>/1/<file>`: the packaged template file}, where the Python backend imports it;
    templates PACKAGE and SERVER_PACKAGE are hub_vit's own modules of that name (`protocol.py`: the facts the steps
    write and clients read; `image_modes.py`, `image_formats.py`: one copy of the image-mode rules and of the formats
    decoded; `cgroup_limits.py`: the cores a step's thread pools may keep busy; `openvino_runtime.py`: the session that
    verified and timed an OpenVINO variant is the one that serves it; `domain_score.py`: the out-of-domain score the
    folder's statistics were fitted for)."""
    return {f"{step}/1/{file}": (_package_dir(template) if template in (PACKAGE, SERVER_PACKAGE)
                                 else template_dir(template)) / file
            for file, template in files.items()}


def _package_dir(package: str) -> Path:
    return Path(str(resources.files(package)))


def _write_labels(folder: Path, meta: ServingMetadata) -> None:
    (folder / "1" / "labels.txt").write_text("\n".join(meta.labels) + "\n", encoding="utf-8")


def _write_warmup_image(folder: Path, meta: ServingMetadata) -> None:
    (folder / "warmup").mkdir()
    (folder / "warmup" / WARMUP_IMAGE_FILE).write_bytes(_warmup_element(meta))


def _fill(root: Path, source: ResolvedModel, opts: ServingOptions) -> None:
    meta = serving_metadata(source)
    # --top-k past the model's classes answers them all: the manifest records that, as the configs serve it
    opts = dataclasses.replace(opts, top_k=min(opts.top_k, meta.num_classes))
    scale_h, scale_w = meta.scale_size
    if opts.max_pixels < scale_h * scale_w:  # every image, the warm-up's first, would be refused as too large
        raise ValueError(f"max_pixels (--max-pixels) {opts.max_pixels} is less than the model's own resize before "
                         f"the crop ({scale_h}x{scale_w} = {scale_h * scale_w} pixels), so every image would be "
                         f"refused; give at least {scale_h * scale_w} (photos need millions; the default is "
                         f"{ServingOptions.max_pixels})")
    model_file = _model_file(source, opts)
    compute_bound = compute_bound_model(source)
    rollout = rollout_layout(source, opts)
    statistics = domain_statistics(source, opts)
    for relative, content in _server_files(meta, opts, model_file, compute_bound, rollout).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, path)
        else:
            path.write_text(content, encoding="utf-8")
    (root / opts.name / "1").mkdir()  # Triton wants the ensemble's version folder, though it holds nothing
    cls = root / opts.step("classifier")
    (cls / "1").mkdir(exist_ok=True)  # the GPU classifier has no template: its folder holds only the weights
    selection = None
    if opts.flavour == "torch":
        _place_model_folder(source, cls / "1" / model_file)
    else:
        _place_weights(source, cls / "1" / model_file, opts, rollout, token_means=statistics is not None)
    if opts.flavour == "cpu":  # the fastest verified graph on this host, or the one asked for (cpu_variant.py)
        selection = place(source, cls / "1" / model_file, opts.cpu_variant, batch=min(8, opts.max_batch_size),
                          compute_bound=compute_bound, with_token_means=statistics is not None)
    if statistics is not None:  # the classifier step scores what its graph / model writes (domain_outputs.py)
        shutil.copyfile(statistics, cls / "1" / STATISTICS_FILE)
    if opts.flavour in ("cpu", "torch"):
        _write_warmup_image(cls, meta)
        _write_labels(cls, meta)
    else:
        _write_warmup_image(root / opts.step("preprocess"), meta)
        _write_labels(root / opts.step("postprocess"), meta)
    manifest = {
        "generated_by": "hub-vit repository",
        "hub_vit_version": __version__,
        "origin": source.origin,
        "model": opts.name,
        "metadata": dataclasses.asdict(meta) | {"labels": len(meta.labels)},
        "options": dataclasses.asdict(opts),
        "compute_bound": compute_bound,  # decides the ORT thread settings of the CPU classifier
        "rollout": None if rollout is None else dataclasses.asdict(rollout),  # served attention rollout, if any
        # the out-of-domain score the answers carry: the model folder's statistics file, or none (unknown)
        "domain_statistics": None if statistics is None else str(statistics),
    }
    if selection is not None:  # the CPU flavour's graph: which variant, why, the candidates' numbers, ISA flags
        manifest["cpu_variant"] = selection.to_dict()
    if source.engine_info:  # a prebuilt engine's precision, TensorRT version and GPU were fixed when it was built
        manifest["engine"] = {k: source.engine_info.get(k) for k in ("precision", "tensorrt", "gpu", "profile")}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def outdated_files(root: str | Path) -> list[str] | None:
    """The configs and server code of repository `root` that this hub-vit would write differently for the model and
    options its manifest records (repository-relative paths, missing ones included): a repository written by an
    earlier hub-vit (or edited since) serves what it holds until it is rebuilt, e.g. without a later fix. [] when
    everything matches; None when there is no readable manifest to compare with."""
    root = Path(root)
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        meta, opts = _manifest_settings(manifest)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, not JSON, or not a manifest we know
        return None
    model_file = _model_file_name(opts)
    outdated = []
    written = manifest.get("rollout")
    rollout = None if not written else RolloutLayout(grid=tuple(written["grid"]), readout=written["readout"],
                                                     num_prefix_tokens=int(written["num_prefix_tokens"]))
    for relative, content in _server_files(meta, opts, model_file, bool(manifest.get("compute_bound", True)),
                                           rollout).items():
        expected = content.read_bytes() if isinstance(content, Path) else content.encode("utf-8")
        try:
            same = (root / relative).read_bytes() == expected
        except OSError:
            same = False
        if not same:
            outdated.append(relative)
    return outdated


def _manifest_settings(manifest: dict[str, Any]) -> tuple[ServingMetadata, ServingOptions]:
    """The metadata and options a manifest records, as this hub-vit's types: fields it does not know are left out and
    fields it lacks take their defaults (so a repository written before an option existed compares with that
    option's default). The configs need only the number of labels, which is what the manifest keeps."""
    def known(cls: type, values: dict[str, Any]) -> dict[str, Any]:
        names = {field.name for field in dataclasses.fields(cls)} - {"labels"}
        return {key: tuple(value) if isinstance(value, list) else value
                for key, value in values.items() if key in names}

    written = manifest["metadata"]
    labels = tuple(f"class {index}" for index in range(int(written["labels"])))
    return ServingMetadata(labels=labels, **known(ServingMetadata, written)), \
        ServingOptions(**known(ServingOptions, manifest["options"]))


def _model_file_name(opts: ServingOptions) -> str:
    """What the classifier step loads, beside its model.py: a TensorRT plan, an ONNX graph, or (torch) a model
    folder."""
    if opts.flavour == "torch":
        return TORCH_MODEL_DIR
    return "model.plan" if opts.flavour == "gpu" and opts.gpu_backend == "tensorrt" else "model.onnx"


def _model_file(source: ResolvedModel, opts: ServingOptions) -> str:
    if opts.flavour == "torch":
        if source.module is None:
            what = "a TensorRT engine" if source.engine_path is not None else "an exported ONNX file"
            raise ValueError(f"flavour 'torch' runs the hub-vit model itself in PyTorch, but {source.origin!r} is "
                             f"{what}; give a registered model name or a hub-vit model folder, or serve the file "
                             "with flavour 'cpu' (ONNX) or 'gpu'")
        return TORCH_MODEL_DIR
    if opts.flavour == "gpu" and opts.gpu_backend == "tensorrt":
        if source.engine_path is None:
            raise ValueError("gpu_backend 'tensorrt' serves a prebuilt engine: pass a .plan/.engine file "
                             "(hub-vit export), or use gpu_backend 'onnxruntime' (TensorRT accelerator) with ONNX")
        _check_engine(source, opts)
        return "model.plan"
    if source.engine_path is not None:
        raise ValueError(f"a TensorRT engine ({source.engine_path}) can only be served with flavour 'gpu' and "
                         "gpu_backend 'tensorrt'; valid inputs for other setups: a model name, folder or .onnx")
    return "model.onnx"


def _check_engine(source: ResolvedModel, opts: ServingOptions) -> None:
    """An engine's optimization profile must take every batch Triton sends it (1 .. max_batch_size, warmup included)
    and the served image size; Triton's TensorRT backend would otherwise refuse to load it, or fail its warmup."""
    profile = (source.engine_info or {}).get("profile")
    if not profile:
        return  # an engine from elsewhere: Triton checks it at load
    lo, hi = int(profile["min"][0]), int(profile["max"][0])
    rebuild = "rebuild it with `hub-vit export tensorrt --min-batch 1 --max-batch N`"
    if lo > 1:
        raise ValueError(f"TensorRT engine {source.engine_path} takes batches of {lo} to {hi} images; Triton sends "
                         f"batches from 1 image up: {rebuild}")
    if hi < opts.max_batch_size:
        raise ValueError(f"TensorRT engine {source.engine_path} takes at most {hi} images per batch, less than "
                         f"max_batch_size {opts.max_batch_size}: pass --max-batch-size {hi}, or {rebuild} "
                         f"(N >= {opts.max_batch_size})")
    size = tuple(int(v) for v in profile["max"][-2:])
    if size != source.data.img_size:
        raise ValueError(f"TensorRT engine {source.engine_path} takes {size[0]}x{size[1]} images, but the model's "
                         f"metadata says {source.data.img_size[0]}x{source.data.img_size[1]}")


def _place_model_folder(source: ResolvedModel, target: Path) -> None:
    """The torch flavour's model: a hub-vit model folder (config.json + model.safetensors). A source that is a model
    folder gives its own two files, byte for byte (the weights every other path loads); an in-memory or registered
    model is saved as one (hub_vit.folder, the one writer of model folders)."""
    if source.folder is not None:
        target.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(source.folder / name, target / name)
        return
    from hub_vit.folder import save_model_folder

    try:
        save_model_folder(source.module, target, labels=list(source.labels))
    except TypeError as err:  # a module that is not hub-vit's VisionTransformer
        raise ValueError(f"flavour 'torch' serves hub-vit models: {err}") from None


def domain_statistics(source: ResolvedModel, opts: ServingOptions) -> Path | None:
    """The model folder's out-of-domain statistics (`domain.safetensors`) where the CPU or torch flavour serves them:
    calibrated for the weights the folder holds (`hub_vit.domain.read_domain`). None for the GPU flavour (Triton's
    ORT / TensorRT classifier returns only the logits), a source that is not a model folder (an .onnx file or
    engine, a module) and an uncalibrated folder: the answers then say `unknown`."""
    if opts.flavour not in ("cpu", "torch") or source.folder is None or source.module is None:
        return None
    if read_domain(source.folder, list(source.labels)).statistics is None:
        return None
    return source.folder / STATISTICS_FILE


def rollout_layout(source: ResolvedModel, opts: ServingOptions) -> RolloutLayout | None:
    """How the served model's attentions read as rollout maps, or None where the repository cannot serve rollout:
    `opts.explain` off; the GPU flavour (its classifier runs in Triton's ORT / TensorRT backend, which returns only
    `logits`: an explained request would need the attention graph and the rollout in a Python step); or a source
    without a hub-vit model (an .onnx file or engine: no attention graph to export, no spec to read it with).
    The CPU flavour reads the attentions from an ONNX attention graph, the torch flavour from the model itself."""
    spec = getattr(source.module, "spec", None)
    if not opts.explain or opts.flavour not in ("cpu", "torch") or spec is None:
        return None
    height, width = source.data.img_size
    return RolloutLayout(grid=(height // spec.patch_size, width // spec.patch_size), readout=spec.pool_type,
                         num_prefix_tokens=int(spec.num_prefix_tokens))


def _place_weights(source: ResolvedModel, target: Path, opts: ServingOptions,
                   rollout: RolloutLayout | None = None, token_means: bool = False) -> None:
    """The classifier's graph at `target` (+ the attention graph beside it with `rollout`); `token_means`: exported
    graphs also write the out-of-domain score's features."""
    if rollout is not None:  # the CPU flavour's attention graph (the torch flavour runs the model folder itself)
        from hub_vit.server.repository.variant_cache import exported_graphs

        # One export: the attention graph, and the plain graph cut from it (the same nodes, less the attention
        # outputs' stacking), so the plain requests run what they ran before at half the export time; the variant
        # cache keeps both for the next build of the same weights
        exported_graphs(source.module.eval(), target, target.with_name(ATTENTIONS_FILE), token_means,
                        weights=source.weights_digest)  # the CPU variant's cache key reads the same digest
        return
    if source.engine_path is not None:
        shutil.copyfile(source.engine_path, target)
    elif source.onnx_path is not None:
        check_graph(source.onnx_path, opts.max_batch_size, serving_metadata(source))
        shutil.copyfile(source.onnx_path, target)
        external = source.onnx_path.with_name(source.onnx_path.name + ".data")  # external weights, if any
        if external.is_file():
            shutil.copyfile(external, target.with_name(external.name))
    elif source.module is not None:
        from hub_vit.export import export_onnx  # the one ONNX exporter of the project

        export_onnx(source.module.eval(), target, dynamic_batch=True, with_token_means=token_means)
    else:
        raise ValueError("model source has no module, ONNX file or engine to serve")


def check_graph(onnx_path: Path, max_batch_size: int, meta: ServingMetadata | None = None) -> None:
    """Triton's ORT/TensorRT backends bind tensors by name: the graph must read `pixel_values`, write `logits`. Its
    batch dimension must take every batch Triton forms (1 .. max_batch_size, warmup included): a graph exported with
    a fixed batch failed the warmup at max_batch_size and took tritonserver down (SIGSEGV), the reason only in a log.
    Its fixed image size and class count must be the metadata's: a graph of another model (one left beside a newer
    export's report) crashed the warmup too, or would have answered with the wrong labels."""
    from hub_vit.exported import load_onnx_graph

    graph = load_onnx_graph(onnx_path)
    inputs, outputs = [t.name for t in graph.input], [t.name for t in graph.output]
    if inputs[:1] != ["pixel_values"] or "logits" not in outputs:
        raise ValueError(f"{onnx_path}: graph reads {inputs} and writes {outputs}; the served graph must read "
                         "'pixel_values' and write 'logits' (export it with hub-vit export / hub_vit.export)")
    batch = graph.input[0].type.tensor_type.shape.dim[0].dim_value  # 0 for a symbolic (dynamic) dimension
    if batch and not batch == max_batch_size == 1:
        way_out = "pass --max-batch-size 1, or " if batch == 1 else ""
        raise ValueError(f"{onnx_path}: the graph takes batches of exactly {batch} image(s) (exported with "
                         f"--no-dynamic-batch?), but Triton sends batches of 1 to max_batch_size {max_batch_size}: "
                         f"{way_out}export it again without --no-dynamic-batch")
    if meta is not None:
        _check_graph_matches(onnx_path, graph, meta)


def _check_graph_matches(onnx_path: Path, graph: Any, meta: ServingMetadata) -> None:
    """Fixed dims of `pixel_values` (N, C, H, W) and `logits` (N, classes) against the metadata; symbolic ones
    (a --dynamic-size export) take anything."""
    size = tuple(d.dim_value for d in graph.input[0].type.tensor_type.shape.dim[2:4])
    logits = next(t for t in graph.output if t.name == "logits")
    classes = [d.dim_value for d in logits.type.tensor_type.shape.dim][-1:]
    found = []
    if len(size) == 2 and all(size) and size != tuple(meta.input_size):
        found.append(f"takes {size[0]}x{size[1]} images, the metadata says {meta.input_size[0]}x{meta.input_size[1]}")
    if classes and classes[0] and classes[0] != meta.num_classes:
        found.append(f"has {classes[0]} classes, the metadata {meta.num_classes} labels")
    if found:
        raise ValueError(f"{onnx_path}: the graph {' and '.join(found)}: they describe different models (a graph "
                         "left from an earlier export?); export the model again, or serve its folder")


def _warmup_element(meta: ServingMetadata) -> bytes:
    """One TYPE_STRING element as Triton's warmup reads it: 4-byte little-endian length, then a PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (meta.scale_size[1], meta.scale_size[0]), (124, 116, 104)).save(buffer, format="PNG")
    data = buffer.getvalue()
    return struct.pack("<I", len(data)) + data
