"""The demo behind a real reverse proxy that serves it under a path (nginx, `location /vit/`), in a real browser:
`hub-vit demo --root-path /vit` makes the page ask for its files, uploads and queue under /vit/. Without it the page
loaded without its styles and no upload was ever answered (its requests went to the proxy's root).

Needs Debian's Chromium and nginx (`make browser` installs both); in CI a missing one is a failure, not a skip.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub_vit.cli.explain import proxy_root_path
from hub_vit.server.runtime.launcher import free_port
from tests.test_demo import CHROMIUM, CHROMIUM_ARGS, running_demo, upload, wait_for_new_overlay

NGINX = "/usr/sbin/nginx"
SAMPLE = Path(__file__).resolve().parents[1] / "hub_vit" / "assets" / "digits" / "samples" / "3_0.png"

# what Gradio's guide gives for a Gradio app behind nginx under a path; $http_host keeps the proxy's port
NGINX_CONF = """daemon off; master_process off; worker_processes 1; pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{
  access_log {tmp}/access.log;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location /vit/ {{
      proxy_pass http://127.0.0.1:{demo_port}/;
      proxy_buffering off;
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_set_header X-Forwarded-Proto $scheme;
    }}
  }}
}}
"""


@pytest.mark.parametrize(("given", "expected"), [
    ("/vit", "/vit"), ("/vit/", "/vit"), ("/a/b", "/a/b"), ("https://example.com/vit/", "https://example.com/vit"),
])
def test_a_root_path_is_taken_without_its_trailing_slash(given: str, expected: str) -> None:
    assert proxy_root_path(given) == expected


@pytest.mark.parametrize("given", ["vit", "/vit?x=1", "/vit#top", "/my vit", "https://", "//example.com/vit"])
def test_a_root_path_that_is_no_url_path_is_refused_by_name(given: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"--root-path '{given}' is not a URL path such as /vit")):
        proxy_root_path(given)


@pytest.fixture(scope="module")
def proxied_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str, list[str]]]:
    """(page, the proxy's URL of the demo, every answer of 400 or more the page got)."""
    if not Path(NGINX).exists() or not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("nginx or chromium is missing (make browser installs both)")
        pytest.skip("nginx or Debian chromium is not installed (run `make browser`)")
    from playwright.sync_api import sync_playwright

    tmp = tmp_path_factory.mktemp("nginx")
    with running_demo(["--root-path", "/vit"], tmp_path_factory.mktemp("demo-cwd")) as (_, url, _):
        port = free_port()
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, port=port, demo_port=url.rsplit(":", 1)[1][:-1]))
        proxy = subprocess.Popen([NGINX, "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        proxied = f"http://127.0.0.1:{port}/vit/"
        try:
            for _ in range(100):
                try:
                    with urllib.request.urlopen(proxied, timeout=2):
                        break
                except OSError:
                    time.sleep(0.1)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                failed: list[str] = []
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.set_default_timeout(90_000)
                page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
                page.goto(proxied)
                page.wait_for_selector("#input-image input[type=file]", state="attached")
                yield page, proxied, failed
                browser.close()
        finally:
            proxy.terminate()
            proxy.wait(10)


@pytest.mark.browser
@pytest.mark.slow
def test_behind_a_proxy_under_a_path_the_page_answers_an_upload(proxied_page: tuple[object, str, list[str]]) -> None:
    page, proxied, failed = proxied_page
    upload(page, SAMPLE)
    overlay = wait_for_new_overlay(page, None)
    assert overlay.startswith(f"{proxied}gradio_api/file="), overlay  # asked for through the proxy
    assert page.request.get(overlay).status == 200
    labels = page.locator("#labels").inner_text().split()
    assert labels[labels.index("Top-5") + 1] == SAMPLE.name.split("_")[0], labels  # the sample's digit, by its name
    assert not [answer for answer in failed if not answer.endswith("/favicon.ico")], failed
