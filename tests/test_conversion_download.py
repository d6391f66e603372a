"""The download cache as the docs describe it: the offline message's commands work as pasted, the cache folder is
named as documented, vanity names record their catalog name, and only hub-vit's own download counts as evidence that
a cached file is the published one.

Golden values come from outside hub-vit: the bytes of a fixture file served over a real local HTTP server and
fetched by the system's curl / wget, hashlib's sha256, and big_vision's VANITY_NAMES table (models/vit.py), which
names `gs://big_vision/vit_s16_i1k_300ep.npz` as `i1k-s16-300ep`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import http.server
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hub_vit.conversion.download import DownloadError, cached_path, download, resolve_source

REPO = Path(__file__).resolve().parents[1]
JAX = REPO / "tests" / "fixtures" / "jax"
FIXTURE = JAX / "vit_jax" / "tiny_token.published.npz"
S16_300EP_URL = "https://storage.googleapis.com/big_vision/vit_s16_i1k_300ep.npz"  # big_vision README


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[str]:
    """A real HTTP server over `folder` on a free local port; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    with _running(handler) as base:
        yield base


@contextlib.contextmanager
def _running(handler: Any) -> Iterator[str]:
    """`handler` served by a real HTTP server on a free local port; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def offline_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    with pytest.raises(DownloadError) as err:
        resolve_source(source, progress=False)
    return str(err.value)


def hand_commands(message: str) -> dict[str, str]:
    """The curl and wget commands the message quotes in backticks."""
    quoted = re.findall(r"`([^`]+)`", message)
    return {tool: next(q for q in quoted if f"{tool} " in q) for tool in ("curl", "wget")}


@pytest.mark.parametrize("tool", ["curl", "wget"])
def test_offline_message_commands_work_as_pasted(tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The old `curl -L -o <cache path> URL` failed with curl error 23: the cache folder does not exist
    message = offline_message(tmp_path, monkeypatch, "i1k-s16-300ep")
    dest = cached_path(S16_300EP_URL)
    assert str(dest) in message and not dest.parent.exists()
    command = hand_commands(message)[tool]
    assert command.startswith(f"mkdir -p {dest.parent} && ") and command.endswith(S16_300EP_URL)
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed; the command's form was checked above")
    served = tmp_path / "served"
    (served / "big_vision").mkdir(parents=True)
    shutil.copy(FIXTURE, served / "big_vision" / dest.name)
    with serving(served) as base:
        local = command.replace(S16_300EP_URL, f"{base}/big_vision/{dest.name}")
        proc = subprocess.run(["bash", "-c", local], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == FIXTURE.read_bytes()
    again = resolve_source("i1k-s16-300ep", progress=False)  # still offline: taken from the cache
    assert again.path == dest and again.sha256 == hashlib.sha256(FIXTURE.read_bytes()).hexdigest()


def test_offline_message_says_a_hand_download_cannot_claim_published_results(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = " ".join(offline_message(tmp_path, monkeypatch, "simplevit_s16.i1k_300ep").split())
    assert "A file downloaded by hand converts the same" in message
    assert "model card does not claim the published checkpoint's results" in message


def test_cache_folder_is_the_first_32_hex_digits_of_the_url_sha256(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path))
    digest = hashlib.sha256(S16_300EP_URL.encode()).hexdigest()
    assert cached_path(S16_300EP_URL) == tmp_path / "downloads" / digest[:32] / "vit_s16_i1k_300ep.npz"
    doc = " ".join((REPO / "docs" / "conversion.md").read_text().split())
    assert "downloads/<first 32 hex digits of the URL's sha256>/<name>" in doc


def test_vanity_name_records_its_catalog_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path))
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    dest = cached_path(S16_300EP_URL)
    dest.parent.mkdir(parents=True)
    shutil.copy(FIXTURE, dest)
    for source in ("i1k-s16-300ep", "gs://big_vision/vit_s16_i1k_300ep.npz", "simplevit_s16.i1k_300ep"):
        resolved = resolve_source(source, progress=False)
        assert resolved.url == S16_300EP_URL and resolved.catalog_name == "simplevit_s16.i1k_300ep", source


def test_only_hub_vits_own_download_is_evidence_of_the_published_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A file placed at the cache path by hand has no sidecar, and a file swapped in after a download does not
    inherit the sidecar's hash: neither is recorded as the published file."""
    from hub_vit import catalog
    from hub_vit.conversion import download
    from hub_vit.conversion.writer import source_record

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    dest = cached_path(S16_300EP_URL)
    dest.parent.mkdir(parents=True)
    shutil.copy(FIXTURE, dest)
    monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
    by_hand = resolve_source("simplevit_s16.i1k_300ep", progress=False)
    assert by_hand.downloaded_sha256 is None and source_record(by_hand)["content_verified"] is None
    shutil.rmtree(tmp_path / "cache")
    monkeypatch.delenv("HUB_VIT_OFFLINE")

    served = tmp_path / "served"
    (served / "big_vision").mkdir(parents=True)
    shutil.copy(FIXTURE, served / "big_vision" / "vit_s16_i1k_300ep.npz")
    with serving(served) as base:  # the local server stands in for storage.googleapis.com
        monkeypatch.setattr(catalog, "GCS", base)
        monkeypatch.setattr(download, "GCS_HTTPS", base)
        fetched = resolve_source("i1k-s16-300ep", progress=False)
    sha = hashlib.sha256(FIXTURE.read_bytes()).hexdigest()
    assert fetched.url == f"{base}/big_vision/vit_s16_i1k_300ep.npz"
    assert fetched.downloaded_sha256 == sha == fetched.sha256
    record = source_record(fetched)
    assert record["catalog_name"] == "simplevit_s16.i1k_300ep"
    assert record["content_verified"]["catalog_name"] == "simplevit_s16.i1k_300ep"

    shutil.copy(JAX / "vit_jax" / "tiny_gap.published.npz", fetched.path)  # swapped after the download
    swapped = resolve_source(f"{base}/big_vision/vit_s16_i1k_300ep.npz", progress=False)  # served from the cache
    assert swapped.sha256 != swapped.downloaded_sha256 == sha
    assert source_record(swapped)["content_verified"] is None


# ------------------------------------------------------------------------------- unwritable cache, failed downloads
def _refuse_mkdir_under(monkeypatch: pytest.MonkeyPatch, root: Path, code: int, reason: str) -> None:
    """Make every folder under `root` uncreatable, as on a read-only (EROFS) or full (ENOSPC) file system."""
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args, **kwargs) -> None:
        if self == root or root in self.parents:
            raise OSError(code, reason, str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)


@pytest.mark.parametrize(("code", "reason"), [(errno.EROFS, "Read-only file system"),
                                              (errno.ENOSPC, "No space left on device")])
def test_unwritable_cache_is_one_error_naming_the_folder_and_hub_vit_cache(
        code: int, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # HOME or HUB_VIT_CACHE on a read-only or full file system was an OSError traceback from mkdir, before the
    # network was even tried
    cache = tmp_path / "ro" / "cache"
    monkeypatch.setenv("HUB_VIT_CACHE", str(cache))
    _refuse_mkdir_under(monkeypatch, tmp_path / "ro", code, reason)
    with pytest.raises(DownloadError) as err:
        resolve_source("http://127.0.0.1:9/vit.npz", progress=False)  # mkdir fails first: no connection is made
    message = str(err.value)
    assert repr(str(cache)) in message and reason in message and "HUB_VIT_CACHE" in message
    assert "\n" not in message

    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    _load_commands()
    result = CliRunner().invoke(app, ["convert", "simplevit_s16.i1k_90ep", "-o", str(tmp_path / "cv")])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output  # the disk refused (README, "Exit codes"); was 2, as for bad input
    assert text.startswith("error: cannot download") and "HUB_VIT_CACHE" in text and reason in text


def test_failed_download_leaves_no_folder_it_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # HUB_VIT_CACHE=/nonexistent/deep plus a failed download left the empty /nonexistent/deep behind
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "new" / "deep"))
    (tmp_path / "served").mkdir()
    with serving(tmp_path / "served") as base, pytest.raises(DownloadError, match="HTTP 404 Not Found"):
        resolve_source(f"{base}/missing.npz", progress=False)
    assert list(tmp_path.iterdir()) == [tmp_path / "served"]



class _Answering(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the status in its `status` attribute, as a server with no such file (404) or one in
    trouble (503) does."""

    status = 404

    def do_GET(self) -> None:
        self.send_error(self.status)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def answering(status: int) -> Iterator[str]:
    """A real HTTP server on a free local port answering `status` to every request; yields its base URL."""
    with _running(type("Handler", (_Answering,), {"status": status})) as base:
        yield base


def test_http_404_says_the_url_is_wrong_not_that_the_network_failed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # was: "(network error: Not Found). Download it by hand, e.g. curl ...": the same URL by hand is the same 404
    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    _load_commands()
    with answering(404) as base:
        result = CliRunner().invoke(app, ["convert", f"{base}/x.npz", "-o", str(tmp_path / "out")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert text == f"error: cannot download {base}/x.npz: the server answered HTTP 404 Not Found (is the URL right?)"
    assert list(tmp_path.iterdir()) == []  # neither the cache folders nor the output


def test_http_404_for_a_catalog_name_says_the_catalog_is_out_of_date(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # was: "(is the URL right?)" to a user who gave a catalog name, no URL
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    with answering(404) as base, pytest.raises(DownloadError) as err:
        download(f"{base}/x.npz", catalog_name="vit_s16.augreg_in21k_ft_in1k", progress=False)
    assert str(err.value) == (f"cannot download vit_s16.augreg_in21k_ft_in1k: its published file {base}/x.npz "
                              "answered HTTP 404 Not Found: the file has moved or is no longer public, so hub-vit's "
                              "catalog is out of date; if you have the .npz, pass its path instead")


def test_http_503_may_pass_so_the_hand_download_help_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    with answering(503) as base, pytest.raises(DownloadError) as err:
        resolve_source(f"{base}/x.npz", progress=False)
    message = str(err.value)
    assert message.startswith(f"cannot download {base}/x.npz (the server answered HTTP 503 Service Unavailable; "
                              "this may pass, try again later). Download it by hand"), message
    assert "network error" not in message and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("status", "code"), [(None, 3), (503, 3), (404, 2)])
def test_convert_exits_3_when_it_cannot_download_now_and_2_for_a_wrong_url(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         status: int | None, code: int) -> None:
    # README, "Exit codes": offline or a server's 5xx may pass (3: retry, or download by hand); a 404 will not (2).
    # Was 2 for all three.
    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    _load_commands()
    if status is None:
        monkeypatch.setenv("HUB_VIT_OFFLINE", "1")
        result = CliRunner().invoke(app, ["convert", "simplevit_s16.i1k_90ep", "-o", str(tmp_path / "out")])
    else:
        with answering(status) as base:
            result = CliRunner().invoke(app, ["convert", f"{base}/x.npz", "-o", str(tmp_path / "out")])
    assert result.exit_code == code and "error: cannot download" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_existing_cache_folders_are_kept_after_a_failed_download(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "downloads").mkdir(parents=True)
    (tmp_path / "served").mkdir()
    with serving(tmp_path / "served") as base, pytest.raises(DownloadError):
        resolve_source(f"{base}/missing.npz", progress=False)
    assert (tmp_path / "cache" / "downloads").is_dir() and not any((tmp_path / "cache" / "downloads").iterdir())


def test_full_disk_while_downloading_is_a_cache_error_not_a_network_error(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from hub_vit.conversion import download

    class FullDisk:  # the download's own file: opens, then the first write fails as on a full disk
        def __init__(self, path: Path, mode: str) -> None:
            self.path = Path(path)
            self.path.write_bytes(b"")

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(download, "open", FullDisk, raising=False)
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(FIXTURE, served / "x.npz")
    with serving(served) as base, pytest.raises(DownloadError) as err:
        resolve_source(f"{base}/x.npz", progress=False)
    message = str(err.value)
    assert "No space left on device" in message and "HUB_VIT_CACHE" in message and "network error" not in message
    assert not (tmp_path / "cache").exists()  # neither the half file nor the folders made for it


class _Streaming(http.server.BaseHTTPRequestHandler):
    """Announces the fixture's whole length and sends it in 64 KiB pieces, `pause_s` apart (two downloads overlap);
    with `cut`, only its first half, then closes: a connection lost mid-download."""

    cut, pause_s = False, 0.0

    def do_GET(self) -> None:
        data = FIXTURE.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        sent = data[:len(data) // 2] if self.cut else data
        for start in range(0, len(sent), 1 << 16):
            self.wfile.write(sent[start:start + (1 << 16)])
            self.wfile.flush()
            time.sleep(self.pause_s)
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *args: object) -> None:
        pass


def streaming(**behaviour: object) -> contextlib.AbstractContextManager[str]:
    """A real HTTP server on a free local port sending the fixture as `_Streaming` says; yields its base URL."""
    return _running(type("Handler", (_Streaming,), behaviour))


def test_a_download_cut_short_is_a_failed_download_not_a_cached_half_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # was: the first half of the file cached, with a sidecar claiming it was hub-vit's own download of the URL; every
    # later run converted from it (and failed on a broken zip) until the cache was deleted by hand
    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    _load_commands()
    half, whole = FIXTURE.stat().st_size // 2, FIXTURE.stat().st_size
    with streaming(cut=True) as base:
        result = CliRunner().invoke(app, ["convert", f"{base}/x.npz", "-o", str(tmp_path / "out")])
    text = " ".join(result.output.split())
    assert result.exit_code == 3, text  # the network failed: it may work on the next try
    assert (f"error: cannot download {base}/x.npz (network error: the connection closed after {half:,} of {whole:,} "
            "bytes; running the command again downloads the file anew)") in text, text
    assert list(tmp_path.iterdir()) == []  # nothing cached, no half file, no folders, no output


def test_two_downloads_of_one_url_at_once_each_write_their_own_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # was: both wrote one `<name>.part`: the first to finish renamed it into place while the other still wrote into
    # it, which then failed as "the download cache is not writable"
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    outcomes: list[object] = []
    with streaming(pause_s=0.05) as base:
        def fetch() -> None:
            try:
                outcomes.append(download(f"{base}/x.npz", progress=False))
            except Exception as err:  # noqa: BLE001 (the test reports it)
                outcomes.append(err)

        threads = [threading.Thread(target=fetch) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    dest = cached_path(f"{base}/x.npz")
    assert outcomes == [dest, dest], outcomes
    assert dest.read_bytes() == FIXTURE.read_bytes()
    assert dest.with_name(dest.name + ".sha256").read_text().strip() == hashlib.sha256(FIXTURE.read_bytes()).hexdigest()
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name, dest.name + ".sha256"]  # no staging left


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "On"])
def test_hf_hub_offline_is_read_as_huggingface_hub_reads_it(value: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # only HF_HUB_OFFLINE=1 counted: =true tried the network (a 15 s wait on a slow one)
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES

    assert value.upper() in ENV_VARS_TRUE_VALUES  # huggingface_hub's own list of "on" values
    monkeypatch.delenv("HUB_VIT_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DownloadError, match="offline mode"):
        resolve_source("http://127.0.0.1:9/vit.npz", progress=False)


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_offline_switches_that_are_off(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from hub_vit.network import offline_mode

    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for name in ("HUB_VIT_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv("HUB_VIT_OFFLINE", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv(name, value)
        assert not offline_mode(), name
        monkeypatch.setenv(name, "yes")
        assert offline_mode(), name


def test_cache_follows_xdg_cache_home_unless_hub_vit_cache_is_set(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub and torch put their caches under $XDG_CACHE_HOME; hub-vit ignored it
    from hub_vit.conversion.download import cache_dir

    monkeypatch.delenv("HUB_VIT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "hub_vit"
    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("HUB_VIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_dir() == tmp_path / "home" / ".cache" / "hub_vit"
    # a cache filled before XDG_CACHE_HOME was followed keeps its checkpoints in use (offline they are all there is)
    (tmp_path / "home" / ".cache" / "hub_vit").mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "hub_vit"
    (tmp_path / "xdg" / "hub_vit").mkdir(parents=True)
    assert cache_dir() == tmp_path / "xdg" / "hub_vit"  # once the XDG one exists, it is the cache


@pytest.mark.parametrize(("flags", "named"), [
    ([], None),  # the control: the same command downloads and converts
    (["--variant", "Q/16"], "unknown model size 'Q' in 'Q/16'; valid sizes: mu, Ti, S"),
    (["--variant", "S16"], "variant must look like 'S/16'"),
    (["--reference", "missing.io.npz"], "reference outputs 'missing.io.npz' do not exist"),
    (["--timeout", "0"], "--timeout must be a finite number of seconds > 0, got 0.0"),
    (["--timeout", "nan"], "--timeout must be a finite number of seconds > 0, got nan"),
])
def test_what_the_user_typed_is_checked_before_the_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            flags: list[str], named: str | None) -> None:
    """was: a mistyped --variant or --reference was named only after the download (a few GB for the large models),
    and a --timeout of 0 or nan was taken as is."""
    from hub_vit.cli import _load_commands
    from hub_vit.cli.app import app

    monkeypatch.setenv("HUB_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "served").mkdir()
    shutil.copy(FIXTURE, tmp_path / "served" / "tiny.npz")
    asked: list[str] = []

    class Recording(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            super().do_GET()

    monkeypatch.setattr(http.server, "SimpleHTTPRequestHandler", Recording)
    _load_commands()
    with serving(tmp_path / "served") as base:
        result = CliRunner().invoke(app, ["convert", f"{base}/tiny.npz", "-o", str(tmp_path / "out"), *flags])
    said = " ".join(result.output.split())
    if named is None:
        assert result.exit_code == 0 and asked == ["/tiny.npz"] and (tmp_path / "out").is_dir(), said
        return
    assert result.exit_code == 2 and named in said, said
    assert asked == [] and not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), True, "15"])
def test_the_library_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(timeout: object) -> None:
    with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds > 0, got "):
        resolve_source("http://127.0.0.1:9/vit.npz", timeout=timeout, progress=False)  # type: ignore[arg-type]
