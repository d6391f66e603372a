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
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hub_vit.demo.models import default_model_path
from hub_vit.server.launcher import free_port

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


@pytest.fixture(scope="module")
def demo_url(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    workdir = tmp_path_factory.mktemp("demo-cwd")  # not the repo: nothing from the cwd may be served
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    log = open(workdir / "demo.log", "w+")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "hub_vit.demo", "--port", str(port), "--model-folder", str(model_folder)]
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
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
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def page(demo_url: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.set_default_timeout(90_000)
        page.goto(demo_url)
        page.wait_for_selector("#input-image input[type=file]", state="attached")
        yield page
        browser.close()


@pytest.fixture(scope="module")
def photo_path(tmp_path_factory: pytest.TempPathFactory, photos: dict) -> Path:
    path = tmp_path_factory.mktemp("photos") / "chelsea.png"
    Image.fromarray(photos["chelsea"]).save(path)
    return path


def overlay_src(page) -> str | None:
    img = page.locator("#overlay img")
    return img.get_attribute("src") if img.count() else None


def fetch_image(page, src: str) -> np.ndarray:
    body = page.request.get(src).body()
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))


def upload(page, path: Path) -> None:
    page.locator("#input-image input[type=file]").set_input_files(str(path))


def wait_for_new_overlay(page, previous: str | None) -> str:
    page.wait_for_function(
        "prev => { const img = document.querySelector('#overlay img'); return img && img.src && img.src !== prev; }",
        arg=previous,
    )
    return overlay_src(page)


def test_upload_shows_labels_and_overlay_and_fusion_changes_it(page, photo_path: Path) -> None:
    upload(page, photo_path)
    src_mean = wait_for_new_overlay(page, None)
    labels_text = page.locator("#labels").inner_text()
    assert "%" in labels_text, f"no probabilities in the label panel: {labels_text!r}"
    overlay_mean = fetch_image(page, src_mean)
    photo = np.asarray(Image.open(photo_path))
    assert overlay_mean.shape[:2] == photo.shape[:2]  # the overlay is drawn at the uploaded image's size
    assert page.locator("#layer-view img").count() == 1 and page.locator("#class-map img").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo.png"), full_page=True)

    page.locator("#head-fusion label", has_text="max").click()
    src_max = wait_for_new_overlay(page, src_mean)
    overlay_max = fetch_image(page, src_max)
    changed = np.abs(overlay_max.astype(int) - overlay_mean.astype(int)).max(axis=2) > 8
    assert changed.mean() > 0.01, "switching head fusion mean -> max did not change the overlay"


def test_non_image_upload_shows_error_and_app_recovers(page, photo_path: Path, tmp_path: Path) -> None:
    # A file that claims to be a PNG but is text: the page must say so, in words.
    fake = tmp_path / "notes.png"
    fake.write_text("these are meeting notes, not pixels\n")
    before = overlay_src(page)
    upload(page, fake)
    error = page.locator(".toast-body", has_text="notes.png")
    error.first.wait_for(state="visible")
    assert "not an image" in error.first.inner_text()
    # A real image too thin to resize (2x200000 px would become 256x25600000 before the crop) is refused by name.
    thin = tmp_path / "thin.png"
    Image.new("RGB", (2, 200_000), (200, 10, 10)).save(thin)
    upload(page, thin)
    error = page.locator(".toast-body", has_text="thin.png")
    error.first.wait_for(state="visible")
    assert "aspect ratio too extreme" in error.first.inner_text()
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
