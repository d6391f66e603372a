"""`hub-vit convert` end to end: the folder's contents, conversion.json provenance, --verify, and the options."""

from __future__ import annotations

import errno
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import hub_vit  # noqa: F401
from hub_vit.cli import _load_commands
from hub_vit.cli.app import app
from hub_vit.folder import load_model_folder
from tests.stalled_convert import start_stalled_convert
from tests.test_cards import _card_dir_read_only

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
INDEX = json.loads((JAX / "index.json").read_text())["files"]
_load_commands()


def run(*args: str) -> str:
    result = CliRunner().invoke(app, ["convert", *args])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_convert_verify_prints_parity_and_records_provenance(tmp_path: Path) -> None:
    src = JAX / "big_vision" / "tiny_sincos2d_gap_rep.scan.npz"
    out = tmp_path / "simplevit"
    output = run(str(src), "-o", str(out), "--verify")
    assert "scan-stacked blocks" in output
    assert "logits max abs diff" in output and "top-1 agreement 100%" in output and "PASSED" in output
    info = json.loads((out / "conversion.json").read_text())
    assert info["source"]["sha256"] == INDEX["big_vision/tiny_sincos2d_gap_rep.scan.npz"]["sha256"]
    assert info["source"]["bytes"] == INDEX["big_vision/tiny_sincos2d_gap_rep.scan.npz"]["bytes"]
    assert info["layout"]["family"] == "big_vision" and info["layout"]["scan"]
    assert info["spec"]["posemb"] == "sincos2d" and info["spec"]["rep_size"] == 64
    assert info["parity"]["mode"] == "reference" and info["parity"]["passed"]
    assert max(info["parity"]["max_abs_diff"].values()) <= 1e-5 and info["parity"]["top1_agreement"] == 1.0
    assert info["parity"]["layer_norm_eps"] == 1e-6 and info["parity"]["gelu"] == "tanh"
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "preprocessor_config.json", "labels.txt", "conversion.json"} <= names
    assert "native" not in names  # SimpleViT has no native transformers ViT equivalent
    assert (out / "labels.txt").read_text().splitlines() == [f"class_{i}" for i in range(10)]
    assert "pos_embed" not in load_file(out / "model.safetensors")
    model, folder = load_model_folder(out)
    assert folder.spec.posemb == "sincos2d" and folder.read_json("conversion.json")["parity"]["passed"]


def test_self_consistency_without_reference(tmp_path: Path) -> None:
    src = tmp_path / "lonely.npz"
    shutil.copy(JAX / "vit_jax" / "tiny_token_rep.linen.npz", src)  # no .io.npz beside it
    output = run(str(src), "-o", str(tmp_path / "out"), "--verify")
    assert "parity (self-consistency)" in output and "pooled_fused_vs_explicit_rel" in output
    assert "logits_fused_vs_explicit_rel" in output and "top-1 agreement 100%" in output
    info = json.loads((tmp_path / "out" / "conversion.json").read_text())
    assert info["parity"]["mode"] == "self-consistency" and info["parity"]["passed"]
    # an explicit reference still works from anywhere
    ref = JAX / "vit_jax" / "tiny_token_rep.io.npz"
    output = run(str(src), "-o", str(tmp_path / "out2"), "--reference", str(ref))
    assert "parity (reference" in output and "PASSED" in output


@pytest.mark.parametrize(("option", "compared", "skipped"), [
    # a new head leaves the pre-logits layer before it as converted: it was skipped with the head
    (["--num-classes", "5"], "pre_logits", {"logits": "the head was replaced (--num-classes)"}),
    (["--drop-pre-logits"], "pooled", {"logits": "the pre-logits layer was dropped (--drop-pre-logits)",
                                       "pre_logits": "the pre-logits layer was dropped (--drop-pre-logits)"}),
])
def test_a_changed_head_skips_only_what_it_changes(tmp_path: Path, option: list[str], compared: str,
                                                    skipped: dict[str, str]) -> None:
    src = JAX / "vit_jax" / "tiny_token_rep.published.npz"  # with a pre-logits layer (rep_size 32)
    run(str(src), "-o", str(tmp_path / "out"), *option, "--reference", str(JAX / "vit_jax" / "tiny_token_rep.io.npz"))
    parity = json.loads((tmp_path / "out" / "conversion.json").read_text())["parity"]
    assert parity["skipped"] == skipped and parity["passed"], parity
    assert {compared, "pooled", "encoded"} <= set(parity["max_abs_diff"]), parity


def test_self_consistency_with_a_fresh_zero_head_compares_pooled_features(tmp_path: Path) -> None:
    # Comparing the logits of an all-zero head was 0 vs 0: "100% agreement" whatever the backbone computed
    src = tmp_path / "lonely.npz"
    shutil.copy(JAX / "vit_jax" / "tiny_token.published.npz", src)  # no .io.npz beside it
    output = run(str(src), "-o", str(tmp_path / "out"), "--num-classes", "5", "--img-size", "96", "--verify")
    parity = json.loads((tmp_path / "out" / "conversion.json").read_text())["parity"]
    assert list(parity["max_abs_diff"]) == ["pooled_fused_vs_explicit_rel"] and parity["top1_agreement"] is None
    assert "all zero" in parity["skipped"]["logits"] and "top-1 agreement" not in output
    assert "PASSED for the compared outputs only (pooled_fused_vs_explicit_rel); not compared: logits" in output


def test_zero_head_self_consistency_fails_when_the_fused_attention_is_wrong(monkeypatch) -> None:
    from hub_vit import layers
    from hub_vit.conversion.verify import self_consistency
    from hub_vit.model import VisionTransformer
    from hub_vit.variants import ViTSpec

    model = VisionTransformer(ViTSpec(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=16, img_size=(32, 32),
                                      num_classes=10, head_zeroinit=True))
    assert not model.head.weight.any()
    assert self_consistency(model).passed
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", lambda q, k, v, **kw: 2 * sdpa(q, k, v, **kw))
    report = self_consistency(model)  # only the fused path is broken; the logits are 0 on both paths
    assert not report.passed and report.max_abs_diff["pooled_fused_vs_explicit_rel"] > 1e-2


def test_reference_with_img_size_says_which_outputs_were_skipped(tmp_path: Path) -> None:
    output = run(str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(tmp_path / "out"), "--img-size", "96",
                 "--verify")
    assert "PASSED for the compared outputs only (patch_embeddings); not compared: logits" in output
    assert "position embedding resampled" in output


def test_new_class_count_reinitialises_head(tmp_path: Path) -> None:
    out = tmp_path / "five"
    output = run(str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(out), "--num-classes", "5")
    assert "head re-initialised" in output
    weights = load_file(out / "model.safetensors")
    assert weights["head.weight"].shape == (5, 64) and not weights["head.weight"].any()  # zero-init (big_vision)
    info = json.loads((out / "conversion.json").read_text())
    assert "logits" in info["parity"]["skipped"] and info["parity"]["max_abs_diff"]["pooled"] <= 1e-5


def test_the_checkpoints_own_class_count_keeps_its_head_and_says_so(tmp_path: Path) -> None:
    # as timm keeps a pretrained head whose count is asked for; was kept without a word, the help saying "dropped"
    source = JAX / "vit_jax" / "tiny_token.published.npz"
    classes = int(np.load(source)["head/kernel"].shape[1])
    output = run(str(source), "-o", str(tmp_path / "same"), "--num-classes", str(classes))
    assert f"head kept: --num-classes {classes} is the checkpoint's own class count" in " ".join(output.split())
    kept = load_file(tmp_path / "same" / "model.safetensors")["head.weight"]
    assert torch.equal(kept, torch.from_numpy(np.load(source)["head/kernel"].T.copy()))


def test_drop_pre_logits_only_when_asked(tmp_path: Path) -> None:
    src = str(JAX / "vit_jax" / "tiny_token_rep.published.npz")
    run(src, "-o", str(tmp_path / "keep"))
    assert "pre_logits.fc.weight" in load_file(tmp_path / "keep" / "model.safetensors")
    output = run(src, "-o", str(tmp_path / "drop"), "--drop-pre-logits")
    assert "pre-logits layer dropped" in output
    weights = load_file(tmp_path / "drop" / "model.safetensors")
    assert not any(k.startswith("pre_logits") for k in weights) and weights["head.weight"].shape == (10, 64)
    info = json.loads((tmp_path / "drop" / "conversion.json").read_text())
    assert info["spec"]["rep_size"] is None and info["checkpoint_spec"]["rep_size"] == 32
    assert info["parity"]["max_abs_diff"]["pooled"] <= 1e-5  # everything before the dropped layer is unchanged


def test_classic_vit_gets_native_folder_and_registered_name(tmp_path: Path) -> None:
    out = tmp_path / "vit"
    run(str(JAX / "vit_jax" / "tiny_token.linen.npz"), "-o", str(out))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "hub_vit"  # 64-wide: not a size-table variant
    assert (out / "native" / "config.json").is_file()
    with np.load(JAX / "vit_jax" / "tiny_token.io.npz") as io:
        x, logits = torch.from_numpy(io["inputs"]).permute(0, 3, 1, 2), io["logits"]
    model, _ = load_model_folder(out)
    with torch.no_grad():
        assert np.abs(model(x).numpy() - logits).max() <= 1e-5


def test_imagenet_label_names() -> None:
    from hub_vit.conversion.writer import class_names

    names = class_names(1000)
    assert len(names) == 1000 == len(set(names))
    assert names[0] == "tench, Tinca tinca" and names[1] == "goldfish, Carassius auratus"
    assert sum("crane" in n for n in names) == 2 and all(n.strip() for n in names)
    assert class_names(3) == ["class_0", "class_1", "class_2"] and class_names(0) is None


def test_overwrite_never_deletes_the_checkpoint_or_other_files(tmp_path: Path) -> None:
    # `convert work/my.npz -o work --overwrite` used to replace `work` (checkpoint, notes and all) by the model folder
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JAX / "vit_jax" / "tiny_token.published.npz", work / "my.npz")
    (work / "notes.txt").write_text("important")
    result = CliRunner().invoke(app, ["convert", str(work / "my.npz"), "-o", str(work), "--overwrite"])
    assert result.exit_code == 2 and "not a hub-vit model folder" in " ".join(result.output.split())
    assert sorted(p.name for p in work.iterdir()) == ["my.npz", "notes.txt"]
    model = tmp_path / "model"
    run(str(work / "my.npz"), "-o", str(model))
    shutil.move(work / "my.npz", model / "my.npz")  # the checkpoint now sits inside a model folder
    result = CliRunner().invoke(app, ["convert", str(model / "my.npz"), "-o", str(model), "--overwrite"])
    assert result.exit_code == 2 and "which replacing it would delete" in " ".join(result.output.split())
    assert (model / "my.npz").is_file()


def test_catalog_name_with_another_model_in_the_cache_is_refused(tmp_path: Path, monkeypatch) -> None:
    # Following the offline message by hand with the wrong file used to write a 2-layer model under the Ti/16
    # catalog name and data config (timm's loader refuses the same file).
    from hub_vit.catalog import MODELS
    from hub_vit.conversion.download import cached_path

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    dest = cached_path(MODELS["vit_ti16"].weight("augreg_in21k_ft_in1k").url)
    dest.parent.mkdir(parents=True)
    shutil.copy(JAX / "vit_jax" / "tiny_token.published.npz", dest)
    result = CliRunner().invoke(app, ["convert", "vit_ti16.augreg_in21k_ft_in1k", "-o", str(tmp_path / "out")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "is not the catalog's vit_ti16.augreg_in21k_ft_in1k (Ti/16)" in text
    assert "width 64 (checkpoint) vs 192 (model)" in text and not (tmp_path / "out").exists()


def test_non_finite_weights_are_refused(tmp_path: Path) -> None:
    with np.load(JAX / "vit_jax" / "tiny_token.published.npz") as npz:
        arrays = dict(npz)
    key = next(k for k in arrays if k.endswith("kernel") and arrays[k].ndim == 2)
    arrays[key] = arrays[key].copy()
    arrays[key][0, :3] = np.nan
    np.savez(tmp_path / "nan.npz", **arrays)
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "nan.npz"), "-o", str(tmp_path / "out")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "holds NaN or inf values in 1 tensor(s)" in text and "(3 of " in text
    assert not (tmp_path / "out").exists()


def test_reference_that_is_not_reference_outputs_is_named(tmp_path: Path) -> None:
    ckpt = JAX / "vit_jax" / "tiny_token.published.npz"
    (tmp_path / "notes.txt").write_text("not an npz")
    (tmp_path / "outputs").mkdir()
    for reference, needle in [(ckpt, "have no 'inputs' array"), (tmp_path / "notes.txt", "not a readable .npz"),
                              # was "do not exist"
                              (tmp_path / "outputs", "outputs' are a folder; give the .npz file of reference outputs")]:
        result = CliRunner().invoke(app, ["convert", str(ckpt), "-o", str(tmp_path / "out"), "--reference",
                                          str(reference)])
        assert result.exit_code == 2 and needle in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists()



def test_reference_of_another_model_names_the_array_whose_shape_differs(tmp_path: Path) -> None:
    """was `error: output shape (2, 17, 64) differs from the reference (2, 16, 64)`: which array, of which file?"""
    reference = JAX / "big_vision" / "tiny_learn_map.io.npz"  # a MAP-head model's: no class token
    result = CliRunner().invoke(app, ["convert", str(JAX / "big_vision" / "tiny_learn_tok.npz"), "-o",
                                      str(tmp_path / "out"), "--reference", str(reference)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert (f"reference outputs {str(reference)!r}: their 'encoded' array has shape (2, 16, 64), the converted "
            "model's (2, 17, 64); are they the outputs of this checkpoint?") in text
    assert not (tmp_path / "out").exists()


def _damaged_reference(kind: str, path: Path) -> None:
    """Write a real damaged copy of a valid reference file to `path`."""
    data = bytearray((JAX / "big_vision" / "tiny_learn_tok.io.npz").read_bytes())
    if kind == "truncated":  # a download cut off half way: the zip's end record is missing
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif kind == "text":
        path.write_text("<html>Sign in to continue</html>\n")
    else:  # a whole zip with one flipped byte inside its first (stored, uncompressed) member
        with zipfile.ZipFile(JAX / "big_vision" / "tiny_learn_tok.io.npz") as archive:
            first = archive.infolist()[0]
        data[first.header_offset + 30 + len(first.filename) + len(first.extra) + 200] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize(("kind", "why"), [
    ("truncated", "truncated or damaged (zip header present, end of archive missing)"),  # was: BadZipFile traceback
    ("text", "not a zip archive"),  # was: "Cannot load file containing pickled data when allow_pickle=False"
    ("damaged", "damaged (Bad CRC-32 for file 'inputs.npy')"),  # was: BadZipFile traceback
])
def test_an_unreadable_reference_is_one_line_and_writes_nothing(kind: str, why: str, tmp_path: Path) -> None:
    reference = tmp_path / "ref.io.npz"
    _damaged_reference(kind, reference)
    result = CliRunner().invoke(app, ["convert", str(JAX / "big_vision" / "tiny_learn_tok.npz"), "-o",
                                      str(tmp_path / "out"), "--reference", str(reference)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text  # a traceback exits 1
    assert text.startswith(f"error: reference outputs {str(reference)!r} are not a readable .npz archive: {why}")
    assert text.endswith("download it again or pass another reference file (--reference)"), text
    assert not (tmp_path / "out").exists()


def test_an_unreadable_reference_beside_the_checkpoint_is_named_and_the_output_kept(tmp_path: Path) -> None:
    # the automatically found `<name>.io.npz`, cut off: a BadZipFile traceback, even without --reference
    src = tmp_path / "tiny_learn_tok.npz"
    shutil.copy(JAX / "big_vision" / "tiny_learn_tok.npz", src)
    out = tmp_path / "out"
    run(str(src), "-o", str(out))  # no reference beside it yet
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    _damaged_reference("truncated", tmp_path / "tiny_learn_tok.io.npz")
    result = CliRunner().invoke(app, ["convert", str(src), "-o", str(out), "--overwrite"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert text.startswith(f"error: reference outputs {str(tmp_path / 'tiny_learn_tok.io.npz')!r} are not a "
                           "readable .npz archive: truncated"), text
    assert "lies beside the checkpoint; move it away to convert without reference outputs" in text
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # the old model, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny_learn_tok.io.npz", "tiny_learn_tok.npz"]

def test_sigterm_mid_write_leaves_no_staging_folder(tmp_path: Path) -> None:
    # Python's default SIGTERM skipped the cleanup: a killed convert left `.out.tmp-*` with a full copy of the weights
    import signal
    import time

    proc = start_stalled_convert(JAX / "vit_jax" / "tiny_token.published.npz", tmp_path / "out")
    try:  # the staging folder is complete, the rename not done
        assert any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.stdout.close()
    time.sleep(0.1)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ unwritable destinations, printed paths
def _mkdtemp_on_read_only(monkeypatch, root: Path) -> None:
    import tempfile

    real = tempfile.mkdtemp

    def mkdtemp(*args, dir=None, **kwargs):  # noqa: A002 (tempfile's own parameter name)
        if dir is not None and (Path(dir) == root or root in Path(dir).parents):
            raise OSError(errno.EROFS, "Read-only file system", str(Path(dir) / ".out.tmp-x"))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)


def _safetensors_disk_full(monkeypatch, root: Path) -> None:
    import safetensors
    import transformers.modeling_utils

    def save_file(*args, **kwargs) -> None:  # what safetensors raises on a full disk (no OSError)
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save_file)


def _card_disk_full(monkeypatch, root: Path) -> None:
    import hub_vit.model_cards.render as render

    def write_text_atomic(path: Path, text: str) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(render, "write_text_atomic", write_text_atomic)


def _card_read_only(monkeypatch, root: Path) -> None:  # atomic_path's own PermissionError, wrapping EROFS
    _card_dir_read_only(monkeypatch)


def test_a_read_only_destination_is_refused_before_the_conversion(tmp_path: Path, monkeypatch) -> None:
    # was found when the converted model was written (exit 1), after a download of up to a few GB and the conversion
    import hub_vit.conversion.writer as writer

    out = tmp_path / "new" / "out"
    _mkdtemp_on_read_only(monkeypatch, tmp_path)
    monkeypatch.setattr(writer, "convert_file", lambda *a, **k: pytest.fail("converted"))
    result = CliRunner().invoke(app, ["convert", str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(out)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert f"error: output folder '{out}' cannot be written: Read-only file system in '{tmp_path}'" in said, said
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("break_disk", "reason"), [
    (_safetensors_disk_full, "No space left on device"),
    (_card_disk_full, "No space left on device"),
    (_card_read_only, "Read-only file system"),
])
def test_read_only_or_full_destination_is_one_line_and_leaves_nothing(break_disk, reason: str, tmp_path: Path,
                                                                      monkeypatch) -> None:
    # EROFS / ENOSPC were tracebacks (only PermissionError was caught), and the parent folders stayed behind
    out = tmp_path / "new" / "out"
    break_disk(monkeypatch, tmp_path)
    result = CliRunner().invoke(app, ["convert", str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(out)])
    lines = result.output.splitlines()
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write output folder {str(out)!r}: "), lines
    assert reason in lines[0] and "nothing was written" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_bug_while_writing_is_not_reported_as_a_disk_problem(tmp_path: Path, monkeypatch) -> None:
    import hub_vit.model_cards.render as render

    def write_text_atomic(path: Path, text: str) -> Path:
        raise ZeroDivisionError("a bug, not the disk")

    monkeypatch.setattr(render, "write_text_atomic", write_text_atomic)
    result = CliRunner().invoke(app, ["convert", str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o",
                                      str(tmp_path / "out")])
    assert isinstance(result.exception, ZeroDivisionError)  # still a traceback
    assert not (tmp_path / "out").exists()


def test_wrote_line_keeps_the_whole_path_on_one_line(tmp_path: Path, monkeypatch) -> None:
    # piped output (80 columns) hard-wrapped the path: a script reading `wrote (.*)` got half of it. "[draft]" is
    # rich markup that must print as it is.
    from hub_vit.cli.app import console

    monkeypatch.setattr(console, "width", 80)
    out = tmp_path / "a rather long output folder name" / "for a converted checkpoint ü [draft] (v2)"
    result = CliRunner().invoke(app, ["convert", str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output.splitlines()


def test_layout_description_is_printed_as_it_is(tmp_path: Path, monkeypatch) -> None:
    # the layout names the checkpoint's own key prefix: "[/x]" in it was a MarkupError after the folder was written
    from hub_vit.conversion.layouts import Layout

    describe = Layout.describe
    monkeypatch.setattr(Layout, "describe", lambda self: describe(self) + ", prefix '[/x] [draft]'")
    output = run(str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(tmp_path / "out"))
    assert "prefix '[/x] [draft]'" in output


def test_an_existing_output_names_the_flag_not_the_keyword(tmp_path: Path) -> None:
    out = tmp_path / "model"
    run(str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(out))
    result = CliRunner().invoke(app, ["convert", str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(out)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert "already exists; choose another or pass --overwrite to replace it" in output, output
    # a folder of other files: --overwrite would be refused too, so it is not offered (it was, then refused)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["convert", str(JAX / "vit_jax" / "tiny_token.published.npz"), "-o", str(notes)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "is not a hub-vit model folder" in output and "pass --overwrite" not in output, \
        output
    assert [p.name for p in notes.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("source", ["i1k-s16-300ep", "simplevit_s16.i1k_300ep"])  # vanity name, catalog name
@pytest.mark.parametrize(("args", "said"), [
    (("--img-size", "17"), "image size 17x17 is not divisible by the patch size 16"),
    (("--variant", "B/16"), "variant 'B/16' means width 768"),
])
def test_a_catalog_weights_options_are_checked_before_its_download(tmp_path: Path, monkeypatch, source, args, said):
    # the catalog knows the architecture: these went straight to a download of the checkpoint (offline here, so the
    # download's refusal would be what is printed)
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["convert", source, "-o", str(tmp_path / "out"), *args])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and said in text and "cannot download" not in text, text
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_an_empty_source_is_named_as_empty(tmp_path: Path) -> None:
    # was "checkpoint source '' is a directory": Path("") is the current folder
    result = CliRunner().invoke(app, ["convert", "", "-o", str(tmp_path / "out")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "checkpoint source is empty; give an .npz file" in text, text
    assert not (tmp_path / "out").exists()
