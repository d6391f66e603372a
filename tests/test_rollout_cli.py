"""`hub-vit rollout IMAGE... -o out/` on real photos, and the helpers under it (image reading, crop box, overlay)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from hub_vit.explain import DataConfig, ImageReadError, blend, load_image, prepare_image
from hub_vit.explain.overlay import colormap_table, normalize_map


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.folder import save_model_folder

    torch.manual_seed(0)
    spec = ViTSpec.from_variant("mu/16", img_size=64, num_classes=4, depth=2, head_zeroinit=False)  # class token
    return save_model_folder(VisionTransformer(spec), tmp_path_factory.mktemp("m") / "tiny",
                             labels=["north", "east", "south", "west"])


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory: pytest.TempPathFactory, photos: dict) -> list[Path]:
    folder = tmp_path_factory.mktemp("photos")
    astronaut, coffee = folder / "astronaut.png", folder / "coffee.jpg"
    Image.fromarray(photos["astronaut"]).save(astronaut)
    Image.fromarray(photos["coffee"]).save(coffee, quality=90)
    return [astronaut, coffee]


def test_cli_writes_png_of_the_image_size(model_folder: Path, photo_files: list[Path], tmp_path: Path) -> None:
    # The real console entry point, in a fresh process.
    out = tmp_path / "out"
    exe = Path(sys.executable).with_name("hub-vit")
    cmd = [str(exe), "rollout", *map(str, photo_files), "-o", str(out), "--model", str(model_folder), "--class-map"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for photo in photo_files:
        written = out / f"{photo.stem}_rollout.png"
        with Image.open(written) as im:
            assert im.format == "PNG"
            im.verify()
        with Image.open(written) as im, Image.open(photo) as src:
            assert im.size == src.size
        assert photo.name in proc.stdout
    assert len(list(out.glob("*_class_*.png"))) == 2
    assert "north" in proc.stdout or "south" in proc.stdout  # the top-5 table names the labels


def test_cli_prints_a_file_name_that_is_not_utf8(model_folder: Path, photo_files: list[Path], tmp_path: Path) -> None:
    # was: under a strict locale (en_US.UTF-8) a latin-1 name from an old zip ended the run with a UnicodeEncodeError
    # traceback after its first overlay
    folder = tmp_path / "zip"
    folder.mkdir()
    name = os.fsdecode(b"caf\xe9.png")  # 'caf\udce9.png': the byte that is not UTF-8, as Python holds it
    shutil.copy(photo_files[0], folder / name)
    exe = Path(sys.executable).with_name("hub-vit")
    proc = subprocess.run([str(exe), "rollout", str(folder), "-o", str(tmp_path / "out"), "--model", str(model_folder)],
                          capture_output=True, timeout=300, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"caf\\udce9.png -> " in proc.stdout, proc.stdout  # escaped
    assert (tmp_path / "out" / os.fsdecode(b"caf\xe9_rollout.png")).is_file()  # written under the file's own bytes


def _runner_app():
    import hub_vit.cli.explain  # noqa: F401  (registers rollout / demo)
    from hub_vit.cli.app import app

    return app


def _text_posing_as_png(path: Path) -> None:
    path.write_text("not an image")


def _thin_png(path: Path) -> None:  # 2x200000 px would become 256x25600000 before the crop
    Image.new("RGB", (2, 200_000), (200, 10, 10)).save(path)


def _bmp(path: Path) -> None:  # a real image, in a format the server does not decode (was: read here, not served)
    Image.new("RGB", (64, 64), (200, 10, 10)).save(path, format="BMP")


def _gif(path: Path) -> None:
    Image.new("P", (64, 64)).save(path, format="GIF")


def _empty(path: Path) -> None:  # was: "cannot read ... as an image (UnidentifiedImageError)"
    path.write_bytes(b"")


@pytest.mark.parametrize(("make", "message"), [(_text_posing_as_png, "supported formats: JPEG, PNG or WebP"),
                                               (_thin_png, "aspect ratio too extreme"),
                                               (_bmp, "is a BMP image, not one of the supported formats: JPEG, PNG "
                                                      "or WebP (convert it to one of them)"),
                                               (_gif, "is a GIF image, not one of the supported formats: JPEG, PNG "
                                                      "or WebP (convert it to one of them)"),
                                               (_empty, "is empty (0 bytes); supported formats: JPEG, PNG or WebP")])
def test_cli_bad_image_writes_nothing(model_folder: Path, photo_files: list[Path], tmp_path: Path, make,
                                      message: str) -> None:
    bad = tmp_path / "bad.png"
    make(bad)
    out = tmp_path / "out"
    result = CliRunner().invoke(_runner_app(), ["rollout", str(photo_files[0]), str(bad), "-o", str(out),
                                                "--model", str(model_folder)])
    assert result.exit_code == 2
    assert "bad.png" in result.output and message in " ".join(result.output.split())
    assert not out.exists()


@pytest.mark.parametrize(("given", "said"), [
    ("ORG/NAME", "model path 'ORG/NAME' does not exist (expected a model folder); a model on the Hugging Face Hub is "
                 "named hf-hub:ORG/NAME"),
    ("{tmp}/picture.png", "'{tmp}/picture.png' is a file but not a model: give a model folder"),
    ("{tmp}/w.safetensors", "'{tmp}/w.safetensors' is a weights file; give a model folder (of a Google .npz: "
                            "`hub-vit convert FILE -o FOLDER`"),
])
def test_cli_a_model_that_is_no_folder_is_told_what_rollout_takes(photo_files: list[Path], tmp_path: Path,
                                                                  given: str, said: str) -> None:
    # was: "expected a model folder, an .onnx file, a TensorRT engine or a weights file", and for a weights file
    # "pass --model NAME": rollout's --model is the model itself, and it takes neither graphs nor weights files
    shutil.copy(photo_files[0], tmp_path / "picture.png")
    (tmp_path / "w.safetensors").write_bytes(b"")
    out = tmp_path / "out"
    result = CliRunner().invoke(_runner_app(), ["rollout", str(photo_files[0]), "-o", str(out),
                                                "--model", given.format(tmp=tmp_path)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert f"error: {said.format(tmp=tmp_path)}" in text, text
    assert "TensorRT" not in text and not out.exists()


def test_cli_a_folder_of_images_is_every_image_in_it(model_folder: Path, photo_files: list[Path],
                                                    tmp_path: Path) -> None:
    # was: "'imgs' is a folder, not an image file"; a folder without images is still named
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    result = CliRunner().invoke(_runner_app(), ["rollout", str(folder), "-o", str(tmp_path / "out"), "--model",
                                                str(model_folder)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and f"image folder {str(folder)!r} has no .jpg/.jpeg/.png/.webp files" in text, text
    (folder / "sub" / "IMG_0001.heic").write_bytes(b"\x00\x00\x00\x18ftypheic")
    result = CliRunner().invoke(_runner_app(), ["rollout", str(folder), "-o", str(tmp_path / "out"), "--model",
                                                str(model_folder)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and text.endswith("files; it holds 1 HEIC image (convert it to one of these)"), text
    (folder / "sub" / "IMG_0001.heic").unlink()
    assert not (tmp_path / "out").exists()
    shutil.copy(photo_files[0], folder / "sub" / "x.png")  # subfolders too; the same name twice stays apart
    shutil.copy(photo_files[1], folder / "x.png")
    (folder / "notes.txt").write_text("not an image")  # not an image file by its name: left out
    Image.new("RGB", (8, 8)).save(folder / "sub" / "scan.tiff")  # an image of another format: left out, named
    result = CliRunner().invoke(_runner_app(), ["rollout", str(folder), str(photo_files[0]), "-o",
                                                str(tmp_path / "out"), "--model", str(model_folder)])
    assert result.exit_code == 0, result.output
    assert (f"note: left out 1 TIFF image: {folder / 'sub' / 'scan.tiff'}; convert it to JPEG, PNG or WebP to "
            "include it") in " ".join(result.output.split()), result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["x_rollout.png", "x-2_rollout.png", f"{photo_files[0].stem}_rollout.png"])


def test_cli_a_folder_leaves_out_hidden_files_and_its_own_overlays(model_folder: Path, photo_files: list[Path],
                                                                   tmp_path: Path) -> None:
    # was: `hub-vit rollout .` run twice took the first run's overlays in ./out for photos (x_rollout_rollout.png),
    # and the `__MACOSX/._x.png` a zip made on a Mac holds beside each photo failed as "cannot read ... as an image"
    folder = tmp_path / "imgs"
    (folder / "__MACOSX").mkdir(parents=True)
    (folder / ".ipynb_checkpoints").mkdir()
    shutil.copy(photo_files[0], folder / "x.png")
    (folder / "__MACOSX" / "._x.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble resource fork")
    shutil.copy(photo_files[1], folder / ".ipynb_checkpoints" / "y.png")
    out = folder / "out"
    for _ in range(2):
        result = CliRunner().invoke(_runner_app(), ["rollout", str(folder), "-o", str(out), "--model",
                                                    str(model_folder)])
        assert result.exit_code == 0, result.output
        assert sorted(p.name for p in out.iterdir()) == ["x_rollout.png"]
    result = CliRunner().invoke(_runner_app(), ["rollout", str(out), "-o", str(tmp_path / "again"), "--model",
                                                str(model_folder)])  # named itself, the output folder is input
    assert result.exit_code == 0, result.output
    (folder / "x.png").unlink()
    result = CliRunner().invoke(_runner_app(), ["rollout", str(folder), "-o", str(out), "--model", str(model_folder)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert (f"image folder {str(folder)!r} has no .jpg/.jpeg/.png/.webp files besides 3 hidden or in the output "
            "folder") in text, text


@pytest.mark.parametrize(("args", "message"), [
    (["--head-fusion", "median"], "mean, max, min"),
    (["--discard-ratio", "1.5"], "--discard-ratio must be a number in [0, 1), got 1.5"),
    (["--colormap", "rainbow"], "jet, inferno, gray"),
])
def test_cli_rejects_bad_options(model_folder: Path, photo_files: list[Path], tmp_path: Path, args: list[str],
                                 message: str) -> None:
    result = CliRunner().invoke(_runner_app(), ["rollout", str(photo_files[0]), "-o", str(tmp_path / "o"),
                                                "--model", str(model_folder), *args])
    assert result.exit_code == 2 and message in result.output


def test_cli_prints_bracketed_names_as_they_are(model_folder: Path, photos: dict, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # rich markup: "cat [edited].png" used to be reported as "cat _rollout.png", not the file actually written
    from hub_vit.cli.app import console

    monkeypatch.setattr(console, "width", 400)  # the whole path on one line
    photo = tmp_path / "cat [edited].png"
    Image.fromarray(photos["coffee"]).save(photo)
    out = tmp_path / "out"
    result = CliRunner().invoke(_runner_app(), ["rollout", str(photo), "-o", str(out), "--model", str(model_folder)])
    assert result.exit_code == 0, result.output
    assert (out / "cat [edited]_rollout.png").is_file() and "cat [edited]_rollout.png" in result.output
    (tmp_path / "afile").write_text("")
    for bad in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        result = CliRunner().invoke(_runner_app(), ["rollout", str(photo), "-o", str(bad), "--model",
                                                    str(model_folder)])
        assert result.exit_code == 2 and "is a file" in result.output


def test_cli_unknown_model(photo_files: list[Path], tmp_path: Path) -> None:
    result = CliRunner().invoke(_runner_app(), ["rollout", str(photo_files[0]), "--model", "vit_nope"])
    assert result.exit_code == 2 and "valid names" in result.output



@pytest.mark.parametrize(("code", "reason"), [(errno.EROFS, "Read-only file system"),
                                              (errno.ENOSPC, "No space left on device")])
def test_cli_read_only_or_full_disk_is_one_line(code: int, reason: str, model_folder: Path, photo_files: list[Path],
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # only the mkdir of --out was caught: a PNG that could not be written was a traceback
    import hub_vit.explain.overlay as overlay

    def save_png(array, path: str) -> None:
        raise OSError(code, reason)

    monkeypatch.setattr(overlay, "save_png", save_png)
    out = tmp_path / "new" / "out"
    result = CliRunner().invoke(_runner_app(), ["rollout", *map(str, photo_files), "-o", str(out), "--model",
                                                str(model_folder)])
    target = out / f"{photo_files[0].stem}_rollout.png"
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.splitlines() == [f"error: cannot write to {str(target)!r}: {reason}"]
    assert not (tmp_path / "new").exists()  # the folders this run created, empty, are gone


def test_cli_full_disk_after_some_overlays_keeps_them(model_folder: Path, photo_files: list[Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import hub_vit.explain.overlay as overlay

    real = overlay.save_png

    def save_png(array, path: str) -> None:
        if Path(path).stem.startswith(photo_files[1].stem):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(array, path)

    monkeypatch.setattr(overlay, "save_png", save_png)
    out = tmp_path / "out"
    result = CliRunner().invoke(_runner_app(), ["rollout", *map(str, photo_files), "-o", str(out), "--model",
                                                str(model_folder)])
    assert result.exit_code == 1 and "No space left on device" in result.output
    assert sorted(p.name for p in out.iterdir()) == [f"{photo_files[0].stem}_rollout.png"]  # complete, and printed


def _in_the_way(path: Path, where: str = "the overlay is written") -> str:
    return f"error: {str(path)!r} is a folder where {where}: remove or rename it, or choose another --out"


def test_cli_a_folder_where_an_overlay_goes_is_refused_before_anything_is_written(model_folder: Path,
                                                                                  photo_files: list[Path],
                                                                                  tmp_path: Path) -> None:
    # was: the first image's overlay written and printed, then "output path '.../coffee_rollout.png' is a directory;
    # give a file name such as model.png" (exit 1): rollout takes no file name, and the model had run for nothing
    out = tmp_path / "out"
    blocked = out / f"{photo_files[1].stem}_rollout.png"
    blocked.mkdir(parents=True)
    result = CliRunner().invoke(_runner_app(), ["rollout", *map(str, photo_files), "-o", str(out), "--model",
                                                str(model_folder)])
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()) == _in_the_way(blocked)
    assert [p.name for p in out.iterdir()] == [blocked.name] and list(blocked.iterdir()) == []  # nothing written


def test_cli_a_folder_where_a_class_map_may_go_is_refused_with_class_map(model_folder: Path, photo_files: list[Path],
                                                                          tmp_path: Path) -> None:
    # the class of a map is known only once the model has run: a folder named for any class is in the way up front
    out = tmp_path / "out"
    blocked = [out / f"{photo_files[0].stem}_class_{index}.png" for index in range(4)]  # whichever is the top-1
    for folder in blocked:
        folder.mkdir(parents=True)
    args = ["rollout", *map(str, photo_files), "-o", str(out), "--model", str(model_folder)]
    result = CliRunner().invoke(_runner_app(), [*args, "--class-map"])
    assert result.exit_code == 2, result.output
    where = "--class-map writes the image's map when class 0 is its top-1"
    assert " ".join(result.output.split()) == _in_the_way(blocked[0], where)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in blocked)  # nothing written
    result = CliRunner().invoke(_runner_app(), args)  # without --class-map they are not in its way
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == sorted(f"{p.stem}_rollout.png" for p in photo_files)


def test_cli_a_folder_made_where_an_overlay_goes_while_it_runs_is_named(model_folder: Path, photo_files: list[Path],
                                                                       tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # after the check, another program makes the folder: the write's own refusal, in the same words (was: "give a
    # file name such as model.png", exit 1)
    import hub_vit.explain.overlay as overlay

    out = tmp_path / "out"
    blocked = out / f"{photo_files[1].stem}_rollout.png"
    real = overlay.save_png

    def save_png(array, path: str) -> None:
        real(array, path)
        blocked.mkdir(exist_ok=True)

    monkeypatch.setattr(overlay, "save_png", save_png)
    result = CliRunner().invoke(_runner_app(), ["rollout", *map(str, photo_files), "-o", str(out), "--model",
                                                str(model_folder)])
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()).endswith(_in_the_way(blocked)), result.output
    assert (out / f"{photo_files[0].stem}_rollout.png").is_file()  # written (and printed) before: kept


@pytest.mark.parametrize("held_pixels", [0, None], ids=["none-held", "default"])
def test_rollout_holds_at_most_a_batch_of_images_past_its_pixel_budget(model_folder: Path, photo_files: list[Path],
                                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       held_pixels: int | None) -> None:
    # was: every image was decoded and kept until the last overlay was written: a folder of phone photos (36 MB each,
    # decoded) ran out of memory. Past the budget an image is decoded again when its batch comes, and no more than a
    # batch is alive then; within it (these photos are far below the default) each is decoded once.
    import weakref

    import hub_vit.cli.explain as explain_cli
    from hub_vit.explain import pipeline

    files = []
    for index in range(2 * explain_cli.BATCH + 3):
        source = photo_files[index % len(photo_files)]
        files.append(tmp_path / f"photo{index}{source.suffix}")
        files[-1].write_bytes(source.read_bytes())
    made: list[weakref.ref] = []  # each PreparedImage made (not hashable: a WeakSet cannot hold them)
    most_alive = [0]
    real_prepare = pipeline.Explainer.prepare

    def counted(self: object, image: Image.Image) -> object:
        result = real_prepare(self, image)
        made.append(weakref.ref(result))
        most_alive[0] = max(most_alive[0], sum(ref() is not None for ref in made))
        return result

    monkeypatch.setattr(pipeline.Explainer, "prepare", counted)
    if held_pixels is not None:
        monkeypatch.setattr(explain_cli, "HELD_PIXELS", held_pixels)
    out = tmp_path / "out"
    result = CliRunner().invoke(_runner_app(), ["rollout", *map(str, files), "-o", str(out), "--model",
                                                str(model_folder)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{f.stem}_rollout.png" for f in files)
    if held_pixels == 0:
        assert len(made) == 2 * len(files)  # checked first, then read again for writing
        assert most_alive[0] <= explain_cli.BATCH + 1, most_alive[0]
    else:
        assert len(made) == len(files)


def test_cli_arrow_line_keeps_the_whole_path_on_one_line(model_folder: Path, photos: dict, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # piped output (80 columns) hard-wrapped "IMAGE -> OUT": a script reading `-> (.*)` got half the path
    from hub_vit.cli.app import console

    monkeypatch.setattr(console, "width", 80)
    photo = tmp_path / "imgs dir" / "ünï cødé" / "three 3 (copy) ü.png"
    photo.parent.mkdir(parents=True)
    Image.fromarray(photos["coffee"]).save(photo)
    out = tmp_path / "röllout out" / "a b"
    result = CliRunner().invoke(_runner_app(), ["rollout", str(photo), "-o", str(out), "--model", str(model_folder),
                                                "--class-map"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"{photo} -> {out / 'three 3 (copy) ü_rollout.png'}" in lines
    class_lines = [line for line in lines if line.startswith("class-specific map for ")]
    assert len(class_lines) == 1 and f": {out / 'three 3 (copy) ü_class_'}" in class_lines[0]
    assert class_lines[0].endswith(".png")


# ---------------------------------------------------------------------------------------------- helpers
def test_prepare_matches_timm_eval_transform(photos: dict) -> None:
    # timm's own eval transform (resize shorter side to size / crop_pct, centre crop, normalise) is the reference.
    from timm.data import create_transform

    image = Image.fromarray(photos["coffee"])  # 600x400, not square
    data = DataConfig(img_size=(224, 224), crop_pct=0.875, interpolation="bilinear")
    reference = create_transform(input_size=(3, 224, 224), crop_pct=0.875, interpolation="bilinear",
                                 mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))(image)
    prepared = prepare_image(image, data)
    torch.testing.assert_close(prepared.tensor, reference, atol=1e-6, rtol=0)
    # 600x400 -> shorter side 256: 384x256; crop 224 at (80, 16) -> in original pixels x 400/256 = 1.5625
    torch.testing.assert_close(torch.tensor(prepared.box), torch.tensor([125.0, 25.0, 475.0, 375.0]))


@pytest.mark.parametrize("img_size, crop_pct", [((48, 64), 1.0), ((64, 48), 0.9), ((48, 64), 0.875)])
@pytest.mark.parametrize("photo_size", [(600, 400), (100, 300), (64, 48)])
def test_prepare_matches_timm_for_non_square_models(photos: dict, img_size: tuple, crop_pct: float,
                                                    photo_size: tuple) -> None:
    # A non-square input makes timm resize with ResizeKeepRatio (both sides at least their scale size), not by the
    # shorter side; the rollout used to squash such crops (max |diff| 1.2-1.9 against timm).
    from timm.data import create_transform

    image = Image.fromarray(photos["coffee"]).resize(photo_size)
    reference = create_transform(input_size=(3, *img_size), crop_pct=crop_pct, interpolation="bilinear",
                                 mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))(image)
    prepared = prepare_image(image, DataConfig(img_size=img_size, crop_pct=crop_pct, interpolation="bilinear"))
    torch.testing.assert_close(prepared.tensor, reference, atol=1e-6, rtol=0)


def test_prepare_refuses_extreme_aspect_ratios(photos: dict) -> None:
    # The shorter side is resized first: 2x200000 px would become 256x25600000 (20 GB) before the crop.
    data = DataConfig(img_size=(224, 224), crop_pct=0.875)
    assert prepare_image(Image.fromarray(photos["coffee"]).resize((2000, 200)), data).tensor.shape == (3, 224, 224)
    with pytest.raises(ImageReadError, match=r"aspect ratio too extreme: a 2x200000 image .* 256x25600000"):
        prepare_image(Image.new("RGB", (2, 200_000)), data)


def test_load_image_rejects_non_images_and_bombs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 photos: dict) -> None:
    text = tmp_path / "report.png"
    text.write_text("hello")
    with pytest.raises(ImageReadError, match=r"report\.png.*JPEG, PNG or WebP"):
        load_image(text)
    with pytest.raises(ImageReadError, match="does not exist"):
        load_image(tmp_path / "missing.png")
    ok = tmp_path / "cat.png"
    Image.fromarray(photos["chelsea"]).save(ok)
    assert load_image(ok).size == (451, 300)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # pretend the cat is a decompression bomb
    with pytest.raises(ImageReadError, match="too large"):
        load_image(ok)


def test_blend_places_heat_in_the_crop_box() -> None:
    image = np.full((40, 60, 3), 200, np.uint8)
    relevance = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    out = blend(image, relevance, box=(10, 0, 50, 40), alpha=1.0)
    assert out.shape == (40, 60, 3) and out.dtype == np.uint8
    assert (out[:, :10] == 70).all() and (out[:, 50:] == 70).all()  # outside the crop: dimmed to 35 %
    jet = colormap_table("jet")
    assert tuple(jet[0]) == (0, 0, 128) and tuple(jet[-1]) == (128, 0, 0)  # jet's published endpoints
    assert tuple(out[0, 49]) == tuple(jet[255]) and tuple(out[39, 10]) == tuple(jet[0])  # hot corner top-right


def test_blend_in_bands_is_the_whole_image_formula() -> None:
    # blend works one band of rows at a time (a 40 MP photo peaked at ~59 bytes a pixel in float temporaries, ~14 now);
    # a crop box that starts and ends inside bands must give the one-pass formula's picture exactly
    from hub_vit.explain.overlay import BAND_ROWS, colorize, normalize_map, upsample_map

    rng = np.random.default_rng(0)
    height = 2 * BAND_ROWS + 37
    image = rng.integers(0, 256, (height, 45, 3), dtype=np.uint8)
    relevance = torch.rand(5, 5, generator=torch.Generator().manual_seed(0))
    box = (3, BAND_ROWS - 11, 40, 2 * BAND_ROWS + 5)
    rgb = image.astype(np.float32)
    expected = rgb * 0.35
    heat = colorize(upsample_map(normalize_map(relevance), (box[3] - box[1], box[2] - box[0]))).astype(np.float32)
    expected[box[1]:box[3], box[0]:box[2]] = 0.3 * rgb[box[1]:box[3], box[0]:box[2]] + 0.7 * heat
    expected = np.clip(np.round(expected), 0, 255).astype(np.uint8)
    assert np.array_equal(blend(image, relevance, box=box, alpha=0.7), expected)


def test_normalize_constant_map_is_zero_not_nan() -> None:
    assert (normalize_map(np.full((3, 3), 0.25)) == 0).all()
    np.testing.assert_allclose(normalize_map(np.array([[1.0, 3.0]])), [[0.0, 1.0]])


@pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")  # taken quietly, not with Pillow's alarm
def test_cli_takes_large_local_photos_the_demo_refuses(model_folder: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Between Pillow's warning limit (89 MP) and its hard limit (twice that): a 108 MP phone photo, scaled down here
    # by lowering the limit (above the model's own 64 x 64 images). Refused for uploads, taken from the command line.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4500)
    photo = tmp_path / "big.png"
    Image.new("RGB", (70, 70), (200, 30, 30)).save(photo)  # 4,900 pixels: over the limit, under twice it
    with pytest.raises(ImageReadError, match="too large to decode safely"):
        load_image(photo)
    assert load_image(photo, large=True).size == (70, 70)
    result = CliRunner().invoke(_runner_app(), ["rollout", str(photo), "-o", str(tmp_path / "out"), "--model",
                                                str(model_folder)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "big_rollout.png").is_file()


def test_cli_says_whether_each_image_is_what_the_model_knows(photo_files: list[Path], model_folder: Path,
                                                             tmp_path: Path) -> None:
    # was: labels alone, "9 0.9608" for the astronaut, while classify and the demo marked it out of domain
    from hub_vit.catalog import default_model_folder

    app = _runner_app()
    digit = default_model_folder() / "samples" / "3_0.png"
    result = CliRunner().invoke(app, ["rollout", str(photo_files[0]), str(digit), "-o", str(tmp_path / "a")])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    photo_part, digit_part = text.split("3_0.png ->")
    assert "domain: out-of-domain (" in photo_part and "not the kind of image this model knows" in photo_part, text
    assert "domain: in-domain (" in digit_part and "out-of-domain" not in digit_part, text
    # a model folder without a calibrated score: nobody can tell, and it says so
    result = CliRunner().invoke(app, ["rollout", str(digit), "-o", str(tmp_path / "b"), "--model", str(model_folder)])
    text = " ".join(result.output.split())
    assert result.exit_code == 0 and "domain: unknown (no out-of-domain score is calibrated for this model: hub-vit " \
        "calibrate-domain FOLDER --images DIR)" in text, text


@pytest.mark.parametrize("record", ["{", '{"knows": "digits", "examples": "sketches"}'])
def test_cli_a_damaged_domain_record_is_one_error_line(record: str, tmp_path: Path) -> None:
    # was: a traceback (ValueError from read_domain, outside the model's try), exit 1; `hub-vit card` gave exit 2
    from hub_vit.catalog import default_model_folder

    folder = Path(shutil.copytree(default_model_folder(), tmp_path / "digits"))
    (folder / "domain.json").write_text(record)
    result = CliRunner().invoke(_runner_app(), ["rollout", str(folder / "samples" / "3_0.png"), "-o",
                                                str(tmp_path / "out"), "--model", str(folder)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert text.startswith("error: ") and "domain.json" in text and "delete it" in text, text
    assert "Traceback" not in result.output and lines[0].startswith("error: "), text
    assert not (tmp_path / "out").exists()
