"""The Gradio demo, started as `python -m hub_vit.demo` on a free port and driven by Playwright in headless Chromium.

Needs Debian's Chromium (`make browser`); Playwright cannot download its own browser here. A screenshot of the page
after the first upload is kept in `test-artifacts/demo.png`.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.demo.models import default_model_path
from hub_vit.explain.rollout import HEAD_FUSIONS
from hub_vit.server.runtime.launcher import free_port

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    # In CI (`make test` installs Debian's chromium first) a missing browser is a failure, not a silent skip.
    pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                       reason="Debian chromium is not installed (run `make browser`)"),
]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped default model when present, else a tiny random GAP model folder (still a real folder)."""
    default = default_model_path()
    if default is not None:
        return default
    import torch

    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.folder import save_model_folder

    torch.manual_seed(0)
    spec = ViTSpec.from_variant("mu/8", img_size=64, num_classes=5, depth=3, pool_type="gap", head_zeroinit=False)
    labels = ["apple", "bicycle", "cat", "daisy", "engine"]
    return save_model_folder(VisionTransformer(spec), tmp_path_factory.mktemp("model") / "tiny", labels=labels)


@contextmanager
def running_demo(args: list[str], workdir: Path, **env: str) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`python -m hub_vit.demo ARGS` on a free port, cwd `workdir` (not the repo: nothing from the cwd may be
    served); yields (process, url, log file) once the page answers, and stops it afterwards."""
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1", **env)
    log_path = workdir / "demo.log"
    log = open(log_path, "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "hub_vit.demo", "--port", str(port), *args], cwd=workdir, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"demo exited with {proc.returncode}:\n{log.read()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"demo did not answer on {url} within 180 s:\n{log.read()[-3000:]}")
            time.sleep(0.5)
        yield proc, url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def demo_process(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(url, log file) of the demo showing `model_folder`."""
    with running_demo(["--model-folder", str(model_folder)], tmp_path_factory.mktemp("demo-cwd")) as (_, url, log):
        yield url, log


@pytest.fixture(scope="module")
def demo_url(demo_process: tuple[str, Path]) -> str:
    return demo_process[0]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium for the module (Playwright's sync API runs one instance per thread)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_page(browser, url: str, width: int = 1400, height: int = 1100) -> object:
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(90_000)
    page.goto(url)
    page.wait_for_selector("#input-image input[type=file]", state="attached")
    return page


@pytest.fixture(scope="module")
def page(browser, demo_url: str) -> Iterator[object]:
    page = open_page(browser, demo_url)
    yield page
    page.close()


@pytest.fixture(scope="module")
def photo_path(tmp_path_factory: pytest.TempPathFactory, photos: dict) -> Path:
    path = tmp_path_factory.mktemp("photos") / "chelsea.png"
    Image.fromarray(photos["chelsea"]).save(path)
    return path


def overlay_src(page) -> str | None:
    img = page.locator("#overlay img")
    return img.get_attribute("src") if img.count() else None


def fetch_image(page, src: str) -> np.ndarray:
    response = page.request.get(src)
    body = response.body()
    try:
        return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))
    except OSError as err:
        raise AssertionError(f"{src} answered HTTP {response.status} {response.headers.get('content-type')!r}, "
                             f"not an image: {body[:300]!r}") from err


def upload(page, path: Path) -> None:
    page.locator("#input-image input[type=file]").set_input_files(str(path))


def wait_for_new_overlay(page, previous: str | None) -> str:
    return wait_for_new_src(page, "overlay", previous)


def test_upload_shows_labels_and_overlay_and_fusion_changes_it(page, photo_path: Path) -> None:
    upload(page, photo_path)
    src_mean = wait_for_new_overlay(page, None)
    labels_text = page.locator("#labels").inner_text()
    assert "%" in labels_text, f"no probabilities in the label panel: {labels_text!r}"
    overlay_mean = fetch_image(page, src_mean)
    photo = np.asarray(Image.open(photo_path))
    # the photo's own size: its long side (451 px) is within the page's 384 to 1024 px (MAX_SIDE, MIN_SIDE)
    assert overlay_mean.shape[:2] == photo.shape[:2]
    assert page.locator("#layer-view img").count() == 1 and page.locator("#class-map img").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo.png"), full_page=True)

    page.locator("#head-fusion label", has_text="max").click()
    src_max = wait_for_new_overlay(page, src_mean)
    overlay_max = fetch_image(page, src_max)
    changed = np.abs(overlay_max.astype(int) - overlay_mean.astype(int)).max(axis=2) > 8
    assert changed.mean() > 0.01, "switching head fusion mean -> max did not change the overlay"


def test_non_image_upload_shows_error_and_app_recovers(page, photo_path: Path, tmp_path: Path,
                                                      demo_process: tuple[str, Path]) -> None:
    # A file that claims to be a PNG but is text: the page must say so, in words.
    fake = tmp_path / "notes.png"
    fake.write_text("these are meeting notes, not pixels\n")
    before = overlay_src(page)
    upload(page, fake)
    error = page.locator(".toast-body", has_text="notes.png")
    error.first.wait_for(state="visible")
    assert "cannot read 'notes.png' as an image" in error.first.inner_text()
    # A real image too thin to resize (2x200000 px would become 256x25600000 before the crop) is refused by name.
    thin = tmp_path / "thin.png"
    Image.new("RGB", (2, 200_000), (200, 10, 10)).save(thin)
    upload(page, thin)
    error = page.locator(".toast-body", has_text="thin.png")
    error.first.wait_for(state="visible")
    assert "aspect ratio too extreme" in error.first.inner_text()
    # ... and the status line keeps saying so once the toast is gone, with the previous results cleared and no red
    # "Error" badge over the outputs (was: a badge on each, over the previous image's status, blocking the controls)
    page.wait_for_function("text => document.querySelector('#status').innerText.includes(text)",
                           arg="Not analysed: 'thin.png'")
    assert overlay_src(page) is None and page.locator("#labels span.error, #overlay span.error").count() == 0
    # A plain text file is refused too (by the upload widget itself).
    text = tmp_path / "readme.txt"
    text.write_text("hello\n")
    upload(page, text)
    page.locator(".toast-body", has_text="readme.txt").first.wait_for(state="visible")
    # ... and the next real image is analysed as usual.
    other = tmp_path / "coffee.jpg"
    shutil.copy(REPO / "hub_vit" / "demo" / "examples" / "coffee.jpg", other)
    upload(page, other)
    src = wait_for_new_overlay(page, before)
    assert fetch_image(page, src).shape[:2] == Image.open(other).size[::-1]
    assert "%" in page.locator("#labels").inner_text()
    # Expected refusals are one log line each, not a 30-40 line traceback per bad upload
    log = demo_process[1].read_text()
    assert "refused: cannot read 'notes.png' as an image" in log and "refused: 'thin.png'" in log
    assert "Traceback" not in log, log[-3000:]


OUTPUT_BADGES = ", ".join(f"#{elem_id} span.error" for elem_id in ("status", "labels", "overlay", "layer-view",
                                                                       "class-map"))


def notes_file(folder: Path) -> Path:
    """A text file named like a PNG."""
    fake = folder / "notes.png"
    fake.write_text("these are meeting notes, not pixels\n")
    return fake


def wait_for_status(page, text: str) -> None:
    page.wait_for_function("text => document.querySelector('#status').innerText.includes(text)", arg=text,
                           timeout=30_000)


def log_since(log: Path, start: int, needle: str, count: int) -> str:
    """The demo's log written after character `start`, once it holds `needle` `count` times (at most 30 s)."""
    deadline = time.monotonic() + 30
    while (new := log.read_text()[start:]).count(needle) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return new


def assert_refused_in_words(page, log: Path, start: int, name: str, actions: int) -> None:
    """The page's answer to an upload it cannot analyse (docs/explain.md, "Hardening"): the status line names the file
    and no result is left standing, without a red "Error" badge; one `refused:` log line per action, no traceback."""
    wait_for_status(page, "Not analysed: ")
    assert repr(name) in page.locator("#status").inner_text()
    assert overlay_src(page) is None and "%" not in page.locator("#labels").inner_text()
    # the box emptied (test_a_refused_upload_leaves_the_image_box_empty)
    page.locator("#input-image img").wait_for(state="detached", timeout=10_000)
    assert page.locator(OUTPUT_BADGES).count() == 0
    new = log_since(log, start, "refused: ", actions)
    assert [line for line in new.splitlines() if "refused: " in line and name in line] and \
        new.count("refused: ") == actions, new[-3000:]
    assert "Traceback" not in new and "ComponentProcessingError" not in new, new[-3000:]


def show_a_dot(page, tmp_path: Path) -> Path:
    """Upload a 1x1 image and wait for its analysis: results on the page that a refused upload must clear. Returns the
    image's file."""
    dot = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), (40, 40, 40)).save(dot)
    upload(page, dot)
    wait_for_new_overlay(page, None)
    return dot


def test_a_non_image_after_a_picked_example_is_refused_in_words(browser, demo_process: tuple[str, Path],
                                                                  tmp_path: Path) -> None:
    # was: once an example had set the image, Gradio preprocessed uploads with a per-session copy of the component
    # that lacked the upload guard: bare "Error" badges, no toast, the example's results kept, and two chained
    # tracebacks in the log for that upload and for every control changed after it
    url, log = demo_process
    page = open_page(browser, url)
    try:
        page.locator("[id^='examples-'] img").locator("visible=true").first.click()
        wait_for_new_overlay(page, None)
        start = len(log.read_text())
        upload(page, notes_file(tmp_path))
        page.locator(".toast-body", has_text="notes.png").first.wait_for(state="visible", timeout=30_000)
        assert_refused_in_words(page, log, start, "notes.png", 1)
        page.locator("#head-fusion label", has_text="max").click()  # a control changed after it: no image to refuse
        wait_for_status(page, "Upload an image or pick an example.")
        new = log_since(log, start, "refused: ", 2)
        assert new.count("refused: ") == 1 and "Traceback" not in new, new[-3000:]
    finally:
        page.close()


def test_a_non_image_in_place_of_an_image_clears_its_results(browser, demo_process: tuple[str, Path],
                                                             tmp_path: Path) -> None:
    # was: the toast, but an "Error" badge over every output with the previous image's status and results under it
    url, log = demo_process
    page = open_page(browser, url)
    try:
        show_a_dot(page, tmp_path)
        start = len(log.read_text())
        upload(page, notes_file(tmp_path))
        page.locator(".toast-body", has_text="notes.png").first.wait_for(state="visible", timeout=30_000)
        assert_refused_in_words(page, log, start, "notes.png", 1)
    finally:
        page.close()


def test_a_refused_upload_leaves_the_image_box_empty(browser, demo_process: tuple[str, Path], tmp_path: Path) -> None:
    # was: the refused file stayed in the box, and one the browser cannot draw either (text named .png) showed the
    # browser's broken-image icon there
    url, log = demo_process
    page = open_page(browser, url)
    try:
        show_a_dot(page, tmp_path)
        runs = count_runs(page)
        start = len(log.read_text())
        upload(page, notes_file(tmp_path))
        wait_for_status(page, "Not analysed: cannot read 'notes.png'")
        page.wait_for_timeout(1000)  # the box's images load, or fail to, by now
        broken = page.locator("#input-image img").evaluate_all("imgs => imgs.map(i => [i.complete, i.naturalWidth])")
        assert broken == [], f"the box still shows the refused file: {broken} ([loaded, natural width])"
        assert page.locator("#input-image input[type=file]").count() == 1  # ready for the next upload
        # emptying the box is not taken for a file over the size limit: the refusal stays in the status line
        assert_runs(page, runs, 2, "a refused upload")  # its analysis, and the no-op run the emptied box asks for
        assert "Not analysed: cannot read 'notes.png'" in page.locator("#status").inner_text()
        new = log_since(log, start, "refused: ", 1)
        assert new.count("refused: ") == 1 and "not uploaded" not in new, new[-3000:]
        upload(page, REPO / "hub_vit" / "demo" / "examples" / "coffee.jpg")  # and the next upload is analysed
        wait_for_new_overlay(page, None)
    finally:
        page.close()


def test_an_upload_over_the_size_limit_clears_the_results(browser, demo_process: tuple[str, Path],
                                                          tmp_path: Path) -> None:
    # was: Gradio's toast and an empty image box, with the previous image's Top-5, maps and status left beside it
    url, log = demo_process
    page = open_page(browser, url)
    try:
        runs = count_runs(page)
        dot = show_a_dot(page, tmp_path)
        assert_runs(page, runs, 1, "the page's first upload")  # its `change` is not taken for an emptied box
        big = tmp_path / "big.png"
        big.write_bytes(np.random.default_rng(0).bytes(11 * 1024 * 1024))  # over the demo's 10 MB
        start = len(log.read_text())
        upload(page, big)
        page.locator(".toast-body", has_text="exceed the maximum allowed size").first.wait_for(state="visible")
        wait_for_status(page, "Not analysed: the file was not uploaded (the page takes files up to 10 MB)")
        assert overlay_src(page) is None and "%" not in page.locator("#labels").inner_text()
        assert page.locator("#input-image img").count() == 0  # the box is empty, without a broken-image icon
        assert page.locator(OUTPUT_BADGES).count() == 0
        assert log_since(log, start, "refused: ", 1).count("refused: the file was not uploaded") == 1
        assert_runs(page, runs, 1, "an upload over the limit")
        # "Remove Image" empties the box too, and is not taken for a refused upload
        upload(page, dot)
        wait_for_new_overlay(page, None)
        runs.clear()
        page.locator("#input-image button[aria-label='Remove Image']").click()
        wait_for_status(page, "Upload an image or pick an example.")
        assert_runs(page, runs, 1, "removing the image")
    finally:
        page.close()


def test_the_start_is_calm(demo_process: tuple[str, Path]) -> None:
    # was: Gradio's "* To create a public link, set `share=True` in `launch()`." under hub-vit's own URL line: the demo
    # listens on 127.0.0.1 on purpose (docs/explain.md, "Hardening")
    log = demo_process[1].read_text()
    assert "demo on http://127.0.0.1:" in log, log
    assert "share=True" not in log and "Running on" not in log, log


def test_only_the_apps_own_files_are_served(demo_url: str, model_folder: Path) -> None:
    # Gradio serves uploads, its cache and `allowed_paths` (our example folders) at /gradio_api/file=...; nothing
    # else on disk, not the model's weights and not system files.
    for path in ("/etc/passwd", str(model_folder / "config.json"), str(REPO / "pyproject.toml")):
        try:
            with urllib.request.urlopen(f"{demo_url}gradio_api/file={path}", timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as err:
            status = err.code
        assert status in (403, 404), f"{path} was served (HTTP {status})"


def test_picking_an_example_digit_shows_its_label(page, model_folder: Path) -> None:
    # The examples are the default model's held-out digit samples (plus photos); the model must read them right.
    if model_folder != default_model_path():
        pytest.skip("the default model is not shipped; the examples are photos only")
    before = overlay_src(page)
    page.locator("img[src$='/3_0.png']").first.click()
    wait_for_new_overlay(page, before)
    page.wait_for_function("() => document.querySelector('#labels').innerText.includes('%')")
    lines = [line.strip() for line in page.locator("#labels").inner_text().splitlines() if line.strip()]
    assert lines[1] == "3", f"top-1 for the held-out digit 3 sample: {lines[:4]}"


# -- controls -----------------------------------------------------------------------------------------------------
def wait_for_new_src(page, elem_id: str, previous: str | None) -> str:
    """The `src` attribute of the image in `#elem_id` once it differs from `previous` and the browser has decoded it.
    An empty `src` attribute reads back as the page's own URL (`img.src`), so "changed" alone can name the page."""
    page.wait_for_function(
        "([id, prev]) => { const img = document.querySelector(`#${id} img`); "
        "return img && img.getAttribute('src') && img.getAttribute('src') !== prev && img.complete "
        "&& img.naturalWidth > 0; }",
        arg=[elem_id, previous],
    )
    return page.locator(f"#{elem_id} img").get_attribute("src")


def src_of(page, elem_id: str) -> str | None:
    img = page.locator(f"#{elem_id} img")
    return img.get_attribute("src") if img.count() else None


def top1(page) -> str:
    page.wait_for_function("() => document.querySelector('#labels').innerText.includes('%')")
    return [line.strip() for line in page.locator("#labels").inner_text().splitlines() if line.strip()][1]


def count_runs(page) -> list[int]:
    """Every analysis run the page asks for from now on (one `queue/join` request each)."""
    runs: list[int] = []
    page.on("request", lambda r: runs.append(1) if "/queue/join" in r.url else None)
    return runs


def assert_runs(page, runs: list[int], expected: int, action: str) -> None:
    """`action` asked for `expected` analysis runs (`count_runs`); counts afresh from here. A doubled run is asked for
    at once, so a second one would be in after a second."""
    page.wait_for_timeout(1000)
    assert len(runs) == expected, f"{action} ran the analysis {len(runs)} times"
    runs.clear()


def pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.locator(f"li[role=option][aria-label='{option}']").first.click()


def keyboard_pick(page, elem_id: str, option: str | None = None) -> str:
    """Pick `option` in a dropdown with the keyboard alone (None: the option after the current one): the arrow key
    through the list, then Enter. Returns the option picked."""
    box = page.locator(f"#{elem_id} input")
    box.focus()
    active = None
    for _ in range(100):
        page.keyboard.press("ArrowDown")  # opens the list on the current option's successor, then moves on
        page.wait_for_function("([box, previous]) => { const id = box.getAttribute('aria-activedescendant'); "
                               "return id && id !== previous; }", arg=[box.element_handle(), active])
        active = box.get_attribute("aria-activedescendant")
        label = page.locator(f"[id='{active}']").get_attribute("aria-label")
        if option is None or label == option:
            break
    else:
        raise AssertionError(f"no option {option!r} in #{elem_id}")
    page.keyboard.press("Enter")
    page.wait_for_function("([box, label]) => box.value === label", arg=[box.element_handle(), label])
    return label


def test_the_class_map_follows_each_new_images_top1(page, photo_path: Path, tmp_path: Path) -> None:
    # was: the label the app had filled in for the previous image stayed, so a new image's "class-specific" map was
    # for a class the model did not predict (and "Remove Image" kept it too)
    before = overlay_src(page)
    upload(page, photo_path)
    wait_for_new_overlay(page, before)
    first = top1(page)
    assert page.locator("#target input").input_value() == first
    runs = count_runs(page)
    options = page.locator("#target input")
    options.click()
    other = next(o for o in page.locator("li[role=option]").all_inner_texts() if o.strip() != first).strip()
    class_map = src_of(page, "class-map")
    page.locator(f"li[role=option][aria-label='{other}']").first.click()
    wait_for_new_src(page, "class-map", class_map)
    assert page.locator("#target input").input_value() == other  # the user's pick, for this image
    assert_runs(page, runs, 1, "one pick in the label list")  # was twice
    class_map = src_of(page, "class-map")
    picked = keyboard_pick(page, "target")  # was: a pick with the keyboard was not analysed (no `select` event)
    wait_for_new_src(page, "class-map", class_map)
    assert picked != other and page.locator("#target input").input_value() == picked
    assert_runs(page, runs, 1, "one keyboard pick in the label list")
    page.locator("#input-image button[aria-label='Remove Image']").click()
    page.wait_for_function("() => !document.querySelector('#labels').innerText.includes('%')")
    assert page.locator("#target input").input_value() == ""
    coffee = tmp_path / "coffee.jpg"
    shutil.copy(REPO / "hub_vit" / "demo" / "examples" / "coffee.jpg", coffee)
    upload(page, coffee)
    wait_for_new_overlay(page, None)
    assert page.locator("#target input").input_value() == top1(page)


def test_each_new_image_is_analysed_once(page, photo_path: Path, tmp_path: Path) -> None:
    # was: twice for an upload that replaced an image and for a picked example (Gradio's `change` fired twice), a
    # doubled cost that also raced the browser's reads of the first run's result files (the second run rewrote them)
    before = overlay_src(page)
    upload(page, photo_path)
    before = wait_for_new_overlay(page, before)
    photo = tmp_path / "astronaut.jpg"
    shutil.copy(REPO / "hub_vit" / "demo" / "examples" / "astronaut.jpg", photo)
    runs = count_runs(page)
    upload(page, photo)  # in place of the image shown
    before = wait_for_new_overlay(page, before)
    assert_runs(page, runs, 1, "one upload")
    page.locator("[id^='examples-'] img").locator("visible=true").last.click()
    wait_for_new_overlay(page, before)
    assert_runs(page, runs, 1, "one picked example")
    fusion = next(f for f in HEAD_FUSIONS if not page.locator(f"#head-fusion input[value='{f}']").is_checked())
    page.locator("#head-fusion label", has_text=fusion).click()
    before = wait_for_new_overlay(page, before)
    assert_runs(page, runs, 1, "one head-fusion pick")
    page.locator("#input-image button[aria-label='Remove Image']").click()
    page.wait_for_function("() => !document.querySelector('#overlay img')")
    assert_runs(page, runs, 1, "removing the image")


def test_an_earlier_slower_run_does_not_overwrite_the_newer_one(page, tmp_path: Path) -> None:
    # was: an upload that finished after the example picked next put its labels and maps beside the example's picture
    y, x = np.mgrid[0:2500, 0:6000]  # 15 MP: slower than an example to decode and resize, and 2.4:1 as no example is
    pattern = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    timed, raced = tmp_path / "wide.jpg", tmp_path / "wide_flipped.jpg"
    Image.fromarray(pattern).save(timed)
    Image.fromarray(pattern[::-1]).save(raced)
    start = time.monotonic()
    upload(page, timed)
    wait_for_new_overlay(page, overlay_src(page))
    alone = time.monotonic() - start  # how long such an upload takes on this host
    runs = count_runs(page)
    upload(page, raced)
    while not runs:  # its analysis is asked for: now an example, picked while it computes
        page.wait_for_timeout(10)
    page.locator("[id^='examples-'] img").locator("visible=true").last.click()
    # the input shows the example (not 2.4:1) and the overlay has the input's shape
    example_shown = (
        "() => { const [o, i] = ['overlay', 'input-image'].map(id => document.querySelector(`#${id} img`)); "
        "if (!(o && i && o.complete && i.complete && o.naturalWidth && i.naturalWidth)) return false; "
        "const [a, b] = [o.naturalWidth / o.naturalHeight, i.naturalWidth / i.naturalHeight]; "
        "return Math.abs(b - 2.4) > 0.1 && Math.abs(a - b) < 0.05; }")
    page.wait_for_function(example_shown)
    page.wait_for_timeout(int(2000 * alone) + 1000)  # the upload's run has ended too
    assert page.evaluate(example_shown), "the overlay is not the picked example's"


def test_sliders_recompute_on_keyboard_changes(page) -> None:
    # was: `.release` only, so arrow keys and typing + Enter changed the shown value but not the maps
    if overlay_src(page) is None:
        upload(page, REPO / "hub_vit" / "demo" / "examples" / "chelsea.jpg")
        wait_for_new_overlay(page, None)
    before = overlay_src(page)
    runs = count_runs(page)
    discard = page.locator("#discard-ratio input[type=number]")
    # From 0.04 one step (0.01) is 0.05: on the model's 8x8 patch grid 2 and 3 patches a row discarded, another map
    # (from 0, 0.01 discards none, the same map)
    discard.fill("0.04")
    discard.press("Enter")
    before = wait_for_new_overlay(page, before)
    page.locator("#discard-ratio input[type=range]").focus()
    page.keyboard.press("ArrowRight")
    wait_for_new_overlay(page, before)
    assert discard.input_value() == "0.05"
    layer_view = src_of(page, "layer-view")
    box = page.locator("#layer input[type=number]")
    box.fill("1")
    box.press("Enter")
    wait_for_new_src(page, "layer-view", layer_view)
    assert box.input_value() == "1"
    assert_runs(page, runs, 3, "three slider changes")


def test_a_value_typed_outside_a_sliders_range_is_used_at_its_end_and_shown(browser, demo_process: tuple[str, Path],
                                                                            model_folder: Path) -> None:
    # was: Gradio's slider refused it before the demo's handler ran: a toast "Error: Value 1.5 is greater than maximum
    # value", red "Error" badges over the results and the sliders, the label list unclickable under Gradio's status
    # overlay, the box keeping the typed value beside the previous value's results, and a traceback in the log; an
    # emptied box (a keystroke on the way to another value) did the same with a TypeError
    from hub_vit.demo.app import Demo
    from hub_vit.demo.backends import IN_PROCESS
    from hub_vit.demo.models import ModelCache, folder_choice

    url, log = demo_process
    start = len(log.read_text())
    page = analysed_page(browser, url)
    try:
        discard, layer = (page.locator(f"#{elem_id} input[type=number]") for elem_id in ("discard-ratio", "layer"))
        at_zero = overlay_src(page)
        discard.fill("0.5")
        at_half = wait_for_new_overlay(page, at_zero)
        discard.fill("1.5")
        discard.press("Enter")
        at_end = wait_for_new_overlay(page, at_half)
        page.locator(".toast-body", has_text="Discard ratio 1.5 is outside 0 to 0.99: 0.99 is used.").first.wait_for()
        page.wait_for_function("box => box.value === '0.99'", arg=discard.element_handle())
        # the results are those of the value the box shows
        choice = folder_choice(model_folder)
        expected = Demo(cache=ModelCache([choice]), examples=[]).analyze(
            str(REPO / "hub_vit" / "demo" / "examples" / "chelsea.jpg"), choice.key, IN_PROCESS, "mean", 0.99, None,
            None)[1]
        assert np.abs(fetch_image(page, at_end).astype(int) - expected.astype(int)).max() <= 1
        discard.fill("")  # the box emptied: the slider's minimum, which the page shows once the box loses focus
        wait_for_new_src(page, "overlay", at_end)
        assert overlay_src(page) == at_zero and discard.input_value() == ""  # not written back while typing there
        discard.press("Tab")
        assert discard.input_value() == "0"
        depth = layer.input_value()
        for typed, shown in (("0", "1"), ("9", depth)):  # the default model: 4 blocks (a stand-in: 3)
            layer_view = src_of(page, "layer-view")
            layer.fill(typed)
            layer.press("Enter")
            layer_view = wait_for_new_src(page, "layer-view", layer_view)
            page.locator(".toast-body", has_text=f"Block {typed} is outside 1 to {depth}: {shown} is used.").first \
                .wait_for()
            page.wait_for_function("([box, shown]) => box.value === shown", arg=[layer.element_handle(), shown])
        # through the last block: the full rollout, the overlay's (the same picture, or a rounding apart)
        full = fetch_image(page, overlay_src(page)).astype(int)
        assert np.abs(fetch_image(page, layer_view).astype(int) - full).max() <= 1
        layer.fill("")  # block 1, not written back either
        wait_for_new_src(page, "layer-view", layer_view)
        assert layer.input_value() == ""
        layer.press("Tab")
        assert layer.input_value() == "1"
        assert page.locator("span.error").count() == 0  # no "Error" badge anywhere
        page.locator("#target input").click(timeout=5_000)  # not covered by Gradio's status overlay
        page.keyboard.press("Escape")
    finally:
        page.close()
    new = log.read_text()[start:]
    assert "Traceback" not in new and "refused: " not in new, new[-3000:]


def test_examples_and_results_have_accessible_names(page) -> None:
    # was: 23 image-only example buttons with alt="", and alt="" on every result image
    names = page.locator("[id^=examples-] button:has(img)").evaluate_all(
        "buttons => buttons.map(b => [b.getAttribute('aria-label'), b.querySelector('img').alt])")
    assert names and all(label and label.startswith("Example: ") and alt for label, alt in names), names
    if (REPO / "hub_vit" / "assets" / "digits" / "samples" / "3_0.png").exists():
        assert ["Example: digit 3 (held-out sample 3_0.png)", "digit 3 (held-out sample 3_0.png)"] in names
    else:  # a photo model's gallery
        assert "Example: photo: chelsea" in [label for label, _ in names]
    if overlay_src(page) is None:
        upload(page, REPO / "hub_vit" / "demo" / "examples" / "chelsea.jpg")
        wait_for_new_overlay(page, None)
    for elem_id in ("overlay", "layer-view", "class-map"):
        page.wait_for_function(f"() => document.querySelector('#{elem_id} img')?.alt")
    # the status line is announced (was silent: the result, or why there is none, was seen only)
    assert page.locator("#status").evaluate("e => [e.getAttribute('role'), e.getAttribute('aria-live')]") == \
        ["status", "polite"]


def analysed_page(browser, url: str) -> object:
    """A new page with the bundled cat photo analysed."""
    page = open_page(browser, url)
    upload(page, REPO / "hub_vit" / "demo" / "examples" / "chelsea.jpg")
    wait_for_new_overlay(page, None)
    return page


# Per result image: [its id, how many of its title's text lines its corner buttons cover, whether the title overflows
# its box (an ellipsis or a clipped end)]
COVERED_TITLES_JS = """ids => ids.map(id => {
  const title = document.querySelector(`#${id} > label[data-testid=block-label]`);
  const buttons = document.querySelector(`#${id} .icon-button-wrapper`).getBoundingClientRect();
  const text = document.createRange();
  text.selectNodeContents(title);
  const covered = [...text.getClientRects()].filter(r => r.width && r.right > buttons.left &&
    r.left < buttons.right && r.bottom > buttons.top && r.top < buttons.bottom);
  return [id, covered.length, title.scrollWidth > title.clientWidth];
})"""


def test_result_titles_are_not_cut_at_laptop_widths(browser, demo_url: str) -> None:
    # was: from about 1024 to 1400 px wide, the download / full-screen buttons of a shown result covered the end of
    # its title: "Attention rollout (all bloc", "Rollout through the chos"
    page = analysed_page(browser, demo_url)
    try:
        for width in (1024, 1100, 1200, 1280, 1400):
            page.set_viewport_size({"width": width, "height": 1100})
            page.wait_for_timeout(300)  # laid out again
            titles = page.evaluate(COVERED_TITLES_JS, ["overlay", "layer-view", "class-map"])
            assert all(covered == 0 and not overflows for _, covered, overflows in titles), (width, titles)
            headings = page.locator("h1, h2, h3").evaluate_all(  # the page's own headings are not cut either
                "hs => hs.filter(h => h.offsetParent && h.scrollWidth > h.clientWidth).map(h => h.innerText)")
            assert headings == [], (width, headings)
    finally:
        page.close()


def test_on_a_phone_the_status_line_comes_before_the_examples(browser, demo_url: str) -> None:
    # was: at 390 px the columns stack and the status line came after the whole example gallery (about 1900 px down,
    # below 23 digit thumbnails), out of sight of the image box and controls it reports on
    page = open_page(browser, demo_url, 390, 844)
    try:
        gallery = page.locator("[id^=examples-][id$=-gallery]").locator("visible=true").first.bounding_box()
        status, image = page.locator("#status").bounding_box(), page.locator("#input-image").bounding_box()
        assert image["y"] < status["y"] < gallery["y"], (image, status, gallery)
    finally:
        page.close()


# -- several models -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_folders(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """`model_folder`, a one-block model and a copy of it, whose weights file the test damages once the demo runs (a
    folder damaged before start-up is refused then: test_demo_models.py)."""
    import torch

    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.folder import save_model_folder

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    spec = ViTSpec.from_variant("mu/8", img_size=32, num_classes=3, depth=1, pool_type="gap", head_zeroinit=False)
    one_block = save_model_folder(VisionTransformer(spec), root / "one_block", labels=["x", "y", "z"])
    corrupt = shutil.copytree(one_block, root / "corrupt")
    return [model_folder, one_block, corrupt]


@pytest.fixture(scope="module")
def models_page(browser, model_folders: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    args = [arg for folder in model_folders for arg in ("--model-folder", str(folder))]
    with running_demo(args, tmp_path_factory.mktemp("demo-models-cwd")) as (_, url, _):
        page = open_page(browser, url)
        yield page
        page.close()


def test_switching_models_resets_the_block_and_a_failed_load_says_why(models_page, model_folders: list[Path],
                                                                      photo_path: Path) -> None:
    from hub_vit.demo.models import discover_choices

    page = models_page
    first = page.locator("#model input").input_value()
    depth = page.locator("#layer input[type=number]").input_value()
    upload(page, photo_path)
    wait_for_new_overlay(page, None)
    runs = count_runs(page)
    before = overlay_src(page)
    pick(page, "model", "folder: one_block")
    wait_for_new_overlay(page, before)
    assert page.locator("#layer input[type=number]").input_value() == "1"
    assert_runs(page, runs, 1, "one pick in the model list")  # was twice
    before = overlay_src(page)
    keyboard_pick(page, "model", first)  # was: a pick with the keyboard was not analysed (no `select` event)
    wait_for_new_overlay(page, before)
    assert_runs(page, runs, 1, "one keyboard pick in the model list")
    # was: block 1 of the one-block model stayed selected for every model after it
    assert page.locator("#layer input[type=number]").input_value() == depth != "1"
    assert "folder: corrupt" in [c.key for c in discover_choices(model_folders)]
    weights = model_folders[2] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # damaged on disk while the demo runs
    pick(page, "model", "folder: corrupt")
    toast = page.locator(".toast-body", has_text="folder: corrupt")
    toast.first.wait_for(state="visible")
    assert "is not a safetensors file" in toast.first.inner_text()  # was a bare red "Error" on every output
    page.wait_for_function("text => document.querySelector('#status').innerText.includes(text)",
                           arg="Cannot load model 'folder: corrupt'")
    assert "%" not in page.locator("#labels").inner_text()  # the previous model's labels are not left standing
    assert overlay_src(page) is None
    pick(page, "model", first)  # and the page recovers
    wait_for_new_overlay(page, None)
    assert "%" in page.locator("#labels").inner_text()


def test_uploads_and_results_are_deleted_when_the_demo_stops(browser, model_folder: Path, tmp_path: Path) -> None:
    # was: every upload and 3 overlay PNGs per analysis stayed in Gradio's cache (/tmp/gradio) for good
    from hub_vit.demo.app import example_images

    cache = tmp_path / "gradio-cache"
    private = tmp_path / "private_photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(private)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    with running_demo(["--model-folder", str(model_folder)], workdir, GRADIO_TEMP_DIR=str(cache)) as (proc, url, _):
        page = open_page(browser, url)
        upload(page, private)
        wait_for_new_overlay(page, None)
        page.close()
        stored = [f for f in cache.rglob("*") if f.is_file()]
        assert any(f.name == private.name for f in stored) and any(f.name == "image.png" for f in stored)
        proc.terminate()  # SIGTERM, as `docker stop` or systemd sends it
        proc.wait(timeout=30)
    left = sorted(f.name for f in cache.rglob("*") if f.is_file())
    examples = {p.name for p in example_images()}  # Gradio's copies of the bundled examples may stay
    assert not [name for name in left if name not in examples], left


def test_results_after_a_refused_upload_are_deleted_too(browser, model_folder: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # was: after a refused upload, the results of the page's later uploads (overlays of the user's photo) were missing
    # from every file set Gradio's cache cleanups delete, on schedule and when the demo stops: they stayed for good
    from hub_vit.demo.app import Demo, example_images, launch
    from hub_vit.demo.models import ModelCache, folder_choice

    cache = tmp_path / "gradio-cache"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    animated = tmp_path / "animated.gif"
    frames = [Image.new("RGB", (64, 64), colour) for colour in ("red", "blue")]
    frames[0].save(animated, save_all=True, append_images=frames[1:])
    private = tmp_path / "private_photo.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(private)
    examples = {p.name for p in example_images()}  # Gradio's copies of the bundled examples may stay
    port = free_port()
    blocks = launch(Demo(cache=ModelCache([folder_choice(model_folder)])), port=port, block=False)
    try:
        page = open_page(browser, f"http://127.0.0.1:{port}/")
        runs = count_runs(page)
        upload(page, animated)
        wait_for_status(page, "Not analysed: 'animated.gif' is a GIF image")
        assert_runs(page, runs, 2, "a refused upload")  # its analysis, and the emptied box's, where the refusal stands
        upload(page, private)
        wait_for_new_overlay(page, None)
        page.close()
        stored = [f for f in cache.rglob("*") if f.is_file()]
        assert any(f.name == private.name for f in stored) and any(f.name == "image.png" for f in stored)
        tracked = set().union(*blocks.temp_file_sets)  # all that Gradio's cleanups look at
        assert [f.name for f in stored if str(f) not in tracked and f.name not in examples] == []
    finally:
        blocks.close()  # the demo stops: its cache is emptied
    deadline = time.monotonic() + 10
    while (left := sorted(f.name for f in cache.rglob("*") if f.is_file() and f.name not in examples)) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], left
