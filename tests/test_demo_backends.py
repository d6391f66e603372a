"""The demo's handler without a browser: model cache, label backends (an unreachable Triton server degrades)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.numpy import save_file

from hub_vit.demo.app import Demo
from hub_vit.demo.backends import IN_PROCESS, TritonLabels
from hub_vit.demo.models import ModelCache, folder_choice, resolve_choice


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.folder import save_model_folder

    torch.manual_seed(0)
    spec = ViTSpec.from_variant("mu/16", img_size=64, num_classes=3, depth=2, pool_type="map", head_zeroinit=False)
    return save_model_folder(VisionTransformer(spec), tmp_path_factory.mktemp("m") / "probe",
                             labels=["red", "green", "blue"])


@pytest.fixture()
def photo(tmp_path: Path, photos: dict) -> str:
    path = tmp_path / "astronaut.png"
    Image.fromarray(photos["astronaut"]).save(path)
    return str(path)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


def test_cache_loads_once_and_names_choices(folder: Path) -> None:
    cache = ModelCache([folder_choice(folder)])
    first = cache.get("folder: probe")
    assert cache.get("folder: probe") is first
    assert first.labels == ["red", "green", "blue"]
    with pytest.raises(ValueError, match="valid choices: folder: probe"):
        cache.get("../../etc")


def test_folder_choice_refuses_non_model_folders(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a hub-vit model folder"):
        folder_choice(tmp_path)
    with pytest.raises(ValueError, match=r"model folder '.*nowhere' does not exist"):  # was: "not a hub-vit ..."
        folder_choice(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="valid names"):
        resolve_choice("not_a_model")


def test_analyze_in_process_for_map_model(folder: Path, photo: str) -> None:
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    labels, overlay, layer_view, target, class_map, status, layer = demo.analyze(
        photo, "folder: probe", IN_PROCESS, "mean", 0.5, 1, None)
    assert set(labels) == {"red", "green", "blue"} and abs(sum(labels.values()) - 1) < 1e-5
    assert overlay.shape == (512, 512, 3) and layer_view.shape == overlay.shape and class_map.shape == overlay.shape
    assert not np.array_equal(overlay, layer_view)  # block 1 of 2 is not the full rollout
    assert target["value"] == max(labels, key=labels.get)
    assert "in-process" in status


@pytest.mark.parametrize(("switch", "sends"), [(None, False), ("False", False), ("true", False), ("True", True)])
def test_the_page_sends_gradio_usage_statistics_only_when_opted_in(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     switch: str | None, sends: bool) -> None:
    # Gradio's default is on; its own switch, exactly "True", is the only way in ("true" is off for Gradio too)
    if switch is None:
        monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    else:
        monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", switch)
    monkeypatch.setattr("gradio.analytics.version_check", lambda: None)  # no thread reaching for gradio.app
    blocks = Demo(cache=ModelCache([folder_choice(folder)]), examples=[]).build()
    assert blocks.analytics_enabled is sends


def test_unreachable_triton_degrades_with_a_message(folder: Path, photo: str) -> None:
    triton = TritonLabels(f"127.0.0.1:{closed_port()}", timeout_s=2.0)
    demo = Demo(cache=ModelCache([folder_choice(folder)]), triton=triton, examples=[])
    assert demo.backends() == [IN_PROCESS, triton.choice]
    labels, *_, status, _ = demo.analyze(photo, "folder: probe", triton.choice, "max", 0.0, 2, "green")
    assert "not reachable" in status and "in-process" in status
    assert set(labels) == {"red", "green", "blue"}


@pytest.mark.parametrize("kind", ["BMP", "GIF"])
def test_formats_the_server_does_not_decode_are_refused_by_name(folder: Path, tmp_path: Path, kind: str) -> None:
    # was: read here (and sent to the server as PNG) while `hub-vit classify` called them "not an image": one set of
    # formats everywhere now (hub_vit.image_formats)
    image = tmp_path / f"cat.{kind.lower()}"
    Image.new("RGB", (64, 64), (200, 10, 10)).save(image, format=kind)
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    _assert_refused(demo, image, rf"'cat\.{kind.lower()}' is a {kind} image, not one of the supported formats: JPEG, "
                                 "PNG or WebP")


def _assert_refused(demo: Demo, image: Path, message: str) -> None:
    """The page's answer to an upload it cannot analyse: a toast (a UserWarning outside a Gradio queue) and the status
    line say why, with the outputs cleared (was: a raised gr.Error, a red "Error" badge over every output)."""
    with pytest.warns(UserWarning, match=message):
        labels, overlay, layer_view, target, class_map, status, _ = demo.analyze(str(image), "folder: probe",
                                                                                 IN_PROCESS, "mean", 0.0, 1, None)
    assert labels is overlay is layer_view is class_map is None and target["choices"] == []
    assert status.startswith("**Not analysed:** ") and re.search(message, status), status


def test_served_labels_use_the_pages_keys_for_the_same_class() -> None:
    """timm's ImageNet-1k names two classes "crane" (134, the bird; 517, the machine). The in-process Top-5 keys them
    `crane (134)` whether or not the other crane is in it; Triton's did so only when both were (plain `crane` else)."""
    from hub_vit.class_names import default_labels
    from hub_vit.demo.backends import served_labels
    from hub_vit.explain.pipeline import distinct_labels

    page = distinct_labels(default_labels(1000))  # the in-process model's labels, as the Explainer keeps them
    assert page[134] == "crane (134)" and page[517] == "crane (517)"
    assert served_labels([("crane", 134), ("cock", 7)], page) == ["crane (134)", "cock"]
    assert served_labels([("crane", 517), ("crane", 134)], page) == ["crane (517)", "crane (134)"]
    # a server with other labels (another model): its names as served, a shared name in the top-k kept apart
    assert served_labels([("crane", 3), ("crane", 4), ("dog", 5)], page) == ["crane (3)", "crane (4)", "dog"]
    assert served_labels([("crane", 134), ("dog", 1)]) == ["crane", "dog"]  # no page labels: as served


def test_bad_inputs_raise_gradio_errors(folder: Path, tmp_path: Path, photo: str) -> None:
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    fake = tmp_path / "fake.jpg"
    fake.write_bytes(b"\x00" * 100)
    _assert_refused(demo, fake, r"fake\.jpg")
    with pytest.raises(gr.Error, match="valid choices"):
        demo.analyze(photo, "folder: probe", IN_PROCESS, "median", 0.0, 1, None)
    with pytest.raises(gr.Error, match="unknown model"):
        demo.analyze(photo, "nope", IN_PROCESS, "mean", 0.0, 1, None)
    with pytest.raises(ValueError, match="host:port"):
        TritonLabels("http://example.com/x")


def test_large_upload_is_shown_scaled_down(folder: Path, tmp_path: Path, photos: dict) -> None:
    big = tmp_path / "big_cat.jpg"
    Image.fromarray(photos["chelsea"]).resize((1804, 1200)).save(big, quality=85)
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    _, overlay, *_ = demo.analyze(str(big), "folder: probe", IN_PROCESS, "mean", 0.0, 2, None)
    assert overlay.shape == (681, 1024, 3)  # long side capped at 1024, aspect kept (1200 * 1024 / 1804 = 681.2)


def test_small_upload_is_shown_scaled_up_with_sharp_pixels(folder: Path, tmp_path: Path) -> None:
    # docs/explain.md: a long side under 384 px is brought up to 384 by nearest neighbour (the photo's own size was
    # promised for every picture); the short side follows the aspect ratio, it is not brought up to 384 too
    small = tmp_path / "small.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 128, 3), dtype=np.uint8)).save(small)
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    _, overlay, *_ = demo.analyze(str(small), "folder: probe", IN_PROCESS, "mean", 0.0, 2, None)
    assert overlay.shape == (192, 384, 3)
    outside = overlay[:, :96].astype(int).reshape(64, 3, 32, 3, 3)  # left of the model's centre crop: dimmed only
    assert (outside == outside[:, :1, :, :1]).all()  # each pixel of the upload a 3x3 square, not blurred


def test_a_decompression_bomb_upload_is_called_too_large(folder: Path, tmp_path: Path) -> None:
    # gradio decodes the upload before the handler; a 50000x50000 PNG header was "not an image this demo can read"
    import base64

    from gradio.data_classes import ImageData

    from hub_vit.demo.app import UploadImage

    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_header(50_000, 50_000))
    component = UploadImage(type="filepath", image_mode=None, render=False)
    # an uploaded file reaches the analysis undecoded, which refuses it on its header
    assert component.preprocess(ImageData(path=str(bomb), orig_name="bomb.png")) == str(bomb)
    _assert_refused(Demo(cache=ModelCache([folder_choice(folder)]), examples=[]), bomb,
                    r"'bomb\.png' is too large to decode safely \(Image size \(2500000000 pixels")
    # an API caller's inline image is still decoded by Gradio: its failure is said in words too
    inline = ImageData(url=f"data:image/png;base64,{base64.b64encode(bomb.read_bytes()).decode()}",
                       orig_name="bomb.png")
    with pytest.raises(gr.Error, match=r"'bomb\.png' is too large to decode safely \(Image size \(2500000000 pixels"):
        component.preprocess(inline)


def test_every_copy_of_the_upload_box_lets_the_analysis_refuse_a_non_image(folder: Path, tmp_path: Path) -> None:
    # was: once an example had set the image, Gradio preprocessed uploads with a per-session copy of the component
    # (`block.__class__(**kwargs)`, blocks.py) that lacked the guard patched onto the page's instance: a traceback
    # and a bare "Error" in the page
    from gradio.data_classes import ImageData

    fake = tmp_path / "notes.png"
    fake.write_text("these are meeting notes, not pixels\n")
    page = Demo(cache=ModelCache([folder_choice(folder)]), examples=[]).build()
    box = next(block for block in page.blocks.values() if getattr(block, "elem_id", None) == "input-image")
    copy = box.__class__(**{**box.constructor_args, "render": False})  # as Gradio's per-session copy is made
    for component in (box, copy):
        assert component.preprocess(ImageData(path=str(fake), orig_name="notes.png")) == str(fake)


@pytest.mark.parametrize("stem", ["class_", "LABEL_", None])
def test_a_model_whose_classes_are_only_numbered_is_offered_no_examples(tmp_path: Path, stem: str | None) -> None:
    # was: `guess_domain` makes every head without a domain.json a photo model, so a head converted without class
    # names (class_0..class_N: `default_labels`; LABEL_i: saved without labels) was offered the cat and coffee photos
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.domain import Domain, write_domain
    from hub_vit.folder import save_model_folder

    spec = ViTSpec.from_variant("mu/16", img_size=32, num_classes=3, depth=1, pool_type="gap", head_zeroinit=False)
    labels = None if stem == "LABEL_" else [f"{stem}{i}" for i in range(3)] if stem else ["red", "green", "blue"]
    model = save_model_folder(VisionTransformer(spec), tmp_path / "model", labels=labels)

    def offered() -> tuple[list[str], list[str], str]:
        """(the galleries the page opens with, those the picked model shows, its domain line)."""
        demo = Demo(cache=ModelCache([folder_choice(model)]))
        page = demo.build()
        opened = [kind for kind in ("digits", "photos") if next(
            block for block in page.blocks.values() if getattr(block, "elem_id", None) == f"examples-{kind}").visible]
        note, *galleries = demo.domain_view("folder: model")
        return opened, [kind for kind, update in zip(("digits", "photos"), galleries, strict=True)
                        if update["visible"]], note["value"]

    opened, picked, note = offered()
    if stem is None:  # named classes: photos, as before
        assert opened == picked == ["photos"] and "numbered" not in note
        return
    assert opened == picked == [], (opened, picked)
    assert "numbered, not named, so no example images are offered" in note
    write_domain(model, Domain(knows="photos of three things", examples="photos"))  # the folder's own word counts
    assert offered()[:2] == (["photos"], ["photos"])


def test_folders_with_the_same_name_are_told_apart_the_same_way(tmp_path: Path) -> None:
    # was: "folder: model" for the first and the full path for the second of two training runs' model folders
    from hub_vit.demo.models import DEFAULT_KEY, discover_choices
    from hub_vit.paths import distinct_names

    folders = [tmp_path / "runs" / "d2" / "model", tmp_path / "runs" / "ft" / "model", tmp_path / "flowers"]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "hub_vit"}')
        save_file({"x": np.zeros(1, np.float32)}, folder / "model.safetensors")  # a header the demo checks
    keys = [c.key for c in discover_choices([*folders, folders[0]]) if c.key != DEFAULT_KEY and c.kind == "folder"]
    assert keys == ["folder: d2/model", "folder: ft/model", "folder: flowers"]  # the repeated folder offered once
    assert distinct_names([Path("/x/model"), Path("/model")]) == ["x/model", "/model"]  # was "//model"
    assert distinct_names([Path("/a/x.png"), Path("/b/x.png"), Path("/a/x.png")]) == ["a/x.png", "b/x.png", "a/x.png"]


def test_registered_name_of_the_shipped_model_resolves_to_its_folder() -> None:
    # simplevit_digits' weights ship in the package: no download cache is involved, with or without the tag
    from hub_vit.catalog import default_model_folder

    for name in ("simplevit_digits", "simplevit_digits.sklearn_digits"):
        choice = resolve_choice(name)
        assert choice.kind == "folder" and Path(choice.target) == default_model_folder().resolve()
        assert choice.key == "simplevit_digits.sklearn_digits"


def test_a_new_image_or_model_resets_the_class_map_target_and_block(folder: Path, photo: str, tmp_path: Path,
                                                                     photos: dict) -> None:
    # was: the label the app itself had filled in for the previous image was kept for the next one, so a
    # "class-specific" map showed a class the model did not predict; the block slider kept the previous model's block
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    labels, *_ = demo.analyze(photo, "folder: probe", IN_PROCESS, "mean", 0.0, 1, None)
    other = next(name for name in ("red", "green", "blue") if name != max(labels, key=labels.get))
    *_, target, _, _, layer = demo.analyze(photo, "folder: probe", IN_PROCESS, "mean", 0.0, 1, other)
    assert target["value"] == other  # picked by the user for this image: kept while the controls change
    coffee = tmp_path / "coffee.png"
    Image.fromarray(photos["coffee"]).save(coffee)
    labels, *_, target, _, _, layer = demo.analyze_new_image(str(coffee), "folder: probe", IN_PROCESS, "mean", 0.0,
                                                             1, other)
    assert target["value"] == max(labels, key=labels.get)  # the new image's own top-1
    *_, target, _, _, layer = demo.analyze_new_model(str(coffee), "folder: probe", IN_PROCESS, "mean", 0.0, 1, other)
    assert layer["value"] == 2 and target["value"] == max(labels, key=labels.get)  # the model's depth and top-1
    cleared = demo.analyze_new_image(None, "folder: probe", IN_PROCESS, "mean", 0.0, 1, other)  # "Remove Image"
    assert cleared[3] == gr.update(choices=[], value=None)


def test_the_pages_one_analysis_resets_what_changed_since_its_last(folder: Path, photo: str, tmp_path: Path,
                                                                    photos: dict) -> None:
    # Every control asks the one listener (`analyze_latest`), so what a run resets follows from what changed since the
    # page's last analysis (`shown`), not from which control was used
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    labels, *_, shown = demo.analyze_latest(photo, "folder: probe", IN_PROCESS, "mean", 0.0, 1, None, None)
    assert shown == (photo, "folder: probe")
    other = next(name for name in ("red", "green", "blue") if name != max(labels, key=labels.get))
    *_, target, _, _, layer, shown = demo.analyze_latest(photo, "folder: probe", IN_PROCESS, "max", 0.0, 1, other,
                                                         shown)
    assert target["value"] == other and layer["value"] == 1  # same image and model: the user's choices stand
    coffee = tmp_path / "coffee.png"
    Image.fromarray(photos["coffee"]).save(coffee)
    labels, *_, target, _, _, layer, shown = demo.analyze_latest(str(coffee), "folder: probe", IN_PROCESS, "max",
                                                                 0.0, 1, other, shown)
    assert target["value"] == max(labels, key=labels.get) and layer["value"] == 1  # another image: its own top-1
    *_, target, _, _, layer, _ = demo.analyze_latest(str(coffee), "folder: probe", IN_PROCESS, "max", 0.0, 1, other,
                                                     (str(coffee), "folder: another"))
    assert layer["value"] == 2 and target["value"] == max(labels, key=labels.get)  # another model: its depth, top-1


def test_slider_values_outside_their_range_are_used_at_its_end(folder: Path, photo: str) -> None:
    # A slider's number box takes any value (`TypedSlider`); the page's answer uses the nearest end of the range and
    # shows it (outputs: the discard ratio's box third, the block slider last before `shown`). test_demo.py drives it
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    key, shown = "folder: probe", (photo, "folder: probe")
    at_end = demo.analyze(photo, key, IN_PROCESS, "mean", 0.99, 2, None)
    with pytest.warns(UserWarning, match=r"Discard ratio 1\.5 is outside 0 to 0\.99: 0\.99 is used\."):
        answer = demo.analyze_latest(photo, key, IN_PROCESS, "mean", 1.5, 2, None, shown)
    assert answer[2] == gr.update(value=0.99) and np.array_equal(answer[3], at_end[1])
    with pytest.warns(UserWarning, match=r"Block 7 is outside 1 to 2: 2 is used\."):
        answer = demo.analyze_latest(photo, key, IN_PROCESS, "mean", 0.99, 7, None, shown)
    assert answer[2] == gr.update() and answer[-2]["value"] == 2 and np.array_equal(answer[4], at_end[2])
    # emptied boxes: the minimums (0, block 1), not written back into the boxes while the user types there
    at_start = demo.analyze(photo, key, IN_PROCESS, "mean", 0.0, 1, None)
    answer = demo.analyze_latest(photo, key, IN_PROCESS, "mean", None, None, None, shown)
    assert answer[2] == gr.update() and "value" not in answer[-2]
    assert np.array_equal(answer[3], at_start[1]) and np.array_equal(answer[4], at_start[2])
    for value in ("abc", float("nan")):  # an API caller's value that is no number: refused in the demo's words
        with pytest.raises(gr.Error, match="discard ratio must be a number from 0 to 0.99, got"):
            demo.analyze_latest(photo, key, IN_PROCESS, "mean", value, 2, None, shown)


def _png_header(width: int, height: int) -> bytes:
    """A small PNG whose header declares width x height pixels (its data is one empty zlib stream)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_uploads_above_the_servers_pixel_limit_are_refused_on_the_header(folder: Path, tmp_path: Path) -> None:
    # was: an 88 MP PNG of 277 kB (under Pillow's 89 MP warning) was decoded, about 1 GB per request
    from hub_vit.demo.app import MAX_PIXELS
    from hub_vit.server.repository.options import ServingOptions

    assert MAX_PIXELS == ServingOptions().max_pixels  # the same bound as `hub-vit serve`'s default --max-pixels
    near = tmp_path / "near_limit.png"
    near.write_bytes(_png_header(9400, 9400))  # 88.4 MP; nothing to decode, which would fail if it were tried
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    _assert_refused(demo, near, r"'near_limit\.png' is too large: it declares 9400x9400 = 88\.4 MP, more than the "
                                r"limit of 40\.0 MP; refused before decoding")


def test_a_truncated_upload_is_called_damaged_with_pillows_reason(folder: Path, tmp_path: Path,
                                                                  photos: dict) -> None:
    # was: "cannot read 'truncated.jpg' as an image (OSError); supported formats: PNG, JPEG, ..." (JPEG is one)
    whole = tmp_path / "whole.jpg"
    Image.fromarray(photos["chelsea"]).save(whole, quality=90)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(whole.read_bytes()[:5000])
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    _assert_refused(demo, truncated, r"'truncated\.jpg' is a damaged or incomplete JPEG image \(image file is "
                                     r"truncated")


def test_a_transparent_upload_is_analysed_as_shown_on_white(folder: Path, tmp_path: Path, photos: dict) -> None:
    # was: the hidden half of a cut-out photo was classified and coloured in the overlay
    rgb = photos["chelsea"]
    alpha = np.zeros(rgb.shape[:2], np.uint8)
    alpha[:, rgb.shape[1] // 2:] = 255
    cutout, shown = tmp_path / "cutout.png", tmp_path / "shown.png"
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(cutout)
    Image.fromarray(np.where(alpha[..., None] == 255, rgb, 255).astype(np.uint8)).save(shown)
    demo = Demo(cache=ModelCache([folder_choice(folder)]), examples=[])
    got = demo.analyze(str(cutout), "folder: probe", IN_PROCESS, "mean", 0.0, 1, None)
    want = demo.analyze(str(shown), "folder: probe", IN_PROCESS, "mean", 0.0, 1, None)
    assert got[0] == want[0]
    for a, b in zip(got[1:3], want[1:3], strict=True):
        np.testing.assert_array_equal(a, b)


# -- a real tritonserver ------------------------------------------------------------------------------------------
SERVED_MAX_PIXELS = 200_000  # low, so a small photo is over it


@pytest.fixture(scope="module")
def served(folder: Path, tmp_path_factory: pytest.TempPathFactory):
    """`folder` served by the real tritonserver with a low --max-pixels."""
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.options import ServingOptions
    from hub_vit.server.repository.writer import write_repository
    from tests.served import start_server

    repo = write_repository(resolve_model(folder), tmp_path_factory.mktemp("repo") / "repository",
                            ServingOptions(max_pixels=SERVED_MAX_PIXELS))
    with start_server(repo) as server:
        yield server


@pytest.mark.triton
@pytest.mark.slow
def test_triton_gets_the_uploaded_files_own_bytes(served, folder: Path, tmp_path: Path, photos: dict,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # was: every upload decoded and re-encoded as lossless PNG (a 1.3 MB JPEG became 7.1 MB, 2.1 s) before sending
    from hub_vit.server.client import messages as client  # build_request encodes each image

    sent: list[bytes] = []
    encode = client.encode
    monkeypatch.setattr(client, "encode", lambda image: sent.append(encode(image)) or sent[-1])
    demo = Demo(cache=ModelCache([folder_choice(folder)]), triton=TritonLabels(served.http_url), examples=[])
    jpeg = tmp_path / "cat.jpg"
    Image.fromarray(photos["chelsea"][::2, ::2]).save(jpeg, quality=90)
    labels, *_, status, _ = demo.analyze(str(jpeg), "folder: probe", demo.triton.choice, "mean", 0.0, 1, None)
    assert "labels from **Triton**" in status and set(labels) <= {"red", "green", "blue"}
    assert "**note**" not in status  # the server's labels are the page's model's
    assert sent == [jpeg.read_bytes()]


@pytest.mark.triton
@pytest.mark.slow
def test_a_triton_refusal_is_reported_as_one_with_its_whole_reason(served, folder: Path, tmp_path: Path,
                                                                  photos: dict) -> None:
    # was: "Triton server at ... not reachable or failed ([400] ... as a decompression b)": reachable, and cut off
    big = tmp_path / "big.png"
    Image.fromarray(photos["chelsea"]).resize((600, 400)).save(big)  # 240,000 pixels: over the server's limit
    demo = Demo(cache=ModelCache([folder_choice(folder)]), triton=TritonLabels(served.http_url), examples=[])
    labels, *_, status, _ = demo.analyze(str(big), "folder: probe", demo.triton.choice, "mean", 0.0, 1, None)
    assert status.startswith(f"Triton server at {served.http_url} refused the image: image too large: it declares "
                             "600x400 = 0.2 MP"), status
    assert "refused before decoding, as a decompression bomb guard; labels shown from the in-process model" in status
    assert "not reachable" not in status
    assert set(labels) == {"red", "green", "blue"}  # the in-process labels instead


@pytest.mark.triton
@pytest.mark.slow
def test_a_server_of_another_model_is_noted_by_its_labels(served, tmp_path: Path, photos: dict) -> None:
    # was: `hub-vit demo --triton-url` (nothing known of the served model) showed another model's labels beside the
    # in-process model's maps without a word
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.folder import save_model_folder

    torch.manual_seed(1)
    spec = ViTSpec.from_variant("mu/16", img_size=64, num_classes=3, depth=1, pool_type="gap", head_zeroinit=False)
    other = save_model_folder(VisionTransformer(spec), tmp_path / "other", labels=["x", "y", "z"])
    photo = tmp_path / "cat.jpg"
    Image.fromarray(photos["chelsea"][::2, ::2]).save(photo)  # under the server's pixel limit
    demo = Demo(cache=ModelCache([folder_choice(other)]), triton=TritonLabels(served.http_url), examples=[])
    labels, *_, status, _ = demo.analyze(str(photo), "folder: other", demo.triton.choice, "mean", 0.0, 1, None)
    assert set(labels) <= {"red", "green", "blue"}, labels  # the server's
    assert "**note**: the server's labels are not those of the in-process model 'folder: other'" in status, status


def test_the_servers_round_trip_is_timed_apart_from_the_in_process_maps(folder: Path, photo: str, monkeypatch) -> None:
    # was: "rollout + class map 5.00 s" counted the server's round trip (request, queue, its model) as the maps' time
    import hub_vit.demo.app as app

    now = [0.0]  # a clock only the server's answer moves: the in-process work takes no time on it
    monkeypatch.setattr(app.time, "perf_counter", lambda: now[0])

    class SlowServer(TritonLabels):
        def explain(self, *args, **kwargs):
            now[0] += 5.0
            return super().explain(*args, **kwargs)

    triton = SlowServer(f"127.0.0.1:{closed_port()}", timeout_s=2.0)
    demo = Demo(cache=ModelCache([folder_choice(folder)]), triton=triton, examples=[])
    *_, status, _ = demo.analyze(photo, "folder: probe", triton.choice, "mean", 0.0, 2, None)
    assert "rollout + class map 0.00 s · server's answer 5.00 s" in status, status
    *_, status, _ = demo.analyze(photo, "folder: probe", IN_PROCESS, "mean", 0.0, 2, None)
    assert "rollout + class map 0.00 s · crop" in status and "server's answer" not in status, status
