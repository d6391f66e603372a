"""The demo on a real server, in a real browser: `python -m hub_vit.demo --triton-url` next to tritonserver serving
the shipped digits model (CPU flavour, rollout served), driven by Playwright in headless Chromium.

Switching "Labels from" to the server changes where the page's map comes from (the status names it, the overlay is
redrawn from the server's map) and names the model and version that answered; the digits model is offered digits
only, says what it knows, and marks a photo as not the kind of image it knows (its out-of-domain score), in-process
and from the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from hub_vit.demo.models import default_model_path
from hub_vit.resolve import resolve_model
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository
from hub_vit.server.runtime.launcher import TritonServer
from tests.served import start_server
from tests.test_demo import CHROMIUM, CHROMIUM_ARGS, open_page, overlay_src, running_demo, upload, wait_for_new_overlay

pytestmark = [
    pytest.mark.browser,
    pytest.mark.triton,
    pytest.mark.slow,
    pytest.mark.skipif(default_model_path() is None, reason="the default (digits) model is not shipped"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed (run `make browser`)"),
]
PHOTOS = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TritonServer]:
    repo = write_repository(resolve_model(None), tmp_path_factory.mktemp("repo") / "repository", ServingOptions())
    with start_server(repo) as server:
        yield server


@pytest.fixture(scope="module")
def page(server, tmp_path_factory) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    args = ["--triton-url", server.http_url]
    with running_demo(args, tmp_path_factory.mktemp("demo-cwd")) as (_, url, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = open_page(browser, url)
        yield page
        browser.close()


def status(page) -> str:
    return page.locator("#status").inner_text()


def test_the_digits_model_is_offered_digits_only_and_says_what_it_knows(page):
    assert "This model knows the handwritten digits 0-9" in page.locator("#domain").inner_text()
    page.locator("img[src$='/3_0.png']").first.wait_for(state="visible")  # the digits gallery has loaded
    shown = page.locator("img:visible").evaluate_all("imgs => imgs.map(i => i.getAttribute('src') || '')")
    assert not [src for src in shown if src.endswith(PHOTOS)], shown  # was: astronaut, cat and coffee offered


def test_a_photo_is_marked_as_not_the_kind_of_image_the_model_knows(page, tmp_path, photos):
    path = tmp_path / "chelsea.png"
    Image.fromarray(photos["chelsea"]).save(path)
    before = overlay_src(page)
    upload(page, path)
    wait_for_new_overlay(page, before)
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('in-process')")
    text = status(page)
    assert "Not the kind of image this model knows" in text and "handwritten digits 0-9" in text, text
    assert "out of domain (score" in text
    page.locator("#backend label").filter(has_text="triton").click()  # the server's own verdict says the same
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Triton')")
    assert "Not the kind of image this model knows" in status(page) and "out of domain (score" in status(page)
    page.locator("#backend label").filter(has_text="in-process").click()
    page.wait_for_function("() => !document.querySelector('#status').innerText.includes('Triton')")


def test_server_labels_bring_the_servers_map_and_name_the_served_model(page, repo_root):
    before = overlay_src(page)
    upload(page, repo_root / "hub_vit" / "assets" / "digits" / "samples" / "7_0.png")
    before = wait_for_new_overlay(page, before)
    assert "in-process" in status(page) and "Triton" not in status(page)
    page.locator("#backend label").filter(has_text="triton").click()
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Triton')")
    text = status(page)
    assert "labels from Triton (Triton model 'vit' v1 (digits))" in text, text
    assert "the rollout map from the server too" in text, text
    assert "Not the kind of image" not in text and "in domain (score" in text  # a held-out digit is one
    wait_for_new_overlay(page, before)  # redrawn from the server's map
