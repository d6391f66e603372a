"""Where a checkpoint comes from: a local path, a URL (`gs://` or `https://`), a big_vision vanity name, or a
hub-vit catalog name (`vit_b16.augreg_in21k_ft_in1k`). Downloads go over HTTPS into a cache, with a progress bar.

Cache: `$HUB_VIT_CACHE`, else `$XDG_CACHE_HOME/hub_vit` (`~/.cache/hub_vit` when XDG_CACHE_HOME is unset, as for
huggingface_hub and torch), under `downloads/<first 32 hex digits of the URL's sha256>/<file name>`, plus a
`<file name>.sha256` sidecar holding the content hash (computed while downloading; checked against the catalog's
hash when it has one). A download is written to a hidden file of its own beside its place (`hub_vit.atomic`:
`.<file name>.tmp-<host>-<pid>-n<PID namespace>-<random>`, so two processes fetching the same URL never write into
one file) and renamed when complete, so the cache never holds a half file: a connection that closes before the
Content-Length the server announced is a failed download, not a shorter file. With no network (or `HUB_VIT_OFFLINE` /
`HF_HUB_OFFLINE` set to 1, true, yes or on) a download fails at once and says which URL to fetch by hand and where to
put it; an HTTP error status (404: a wrong URL) is named as the server's answer, and only a 5xx, which may pass, keeps
that help. A cache that cannot be written (read-only
home, full disk) is one error naming the folder and HUB_VIT_CACHE; a failed download removes the folders it created.

The sidecar is the evidence that a cached file is what hub-vit fetched from its URL: a file placed in the cache by
hand has none, so it converts the same but its model card cannot claim the published checkpoint's results (the
catalog records no hashes yet that it could be compared with).
"""

from __future__ import annotations

import hashlib
import math
import os
import shlex
import urllib.error
import urllib.request
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from hub_vit.atomic import missing_folders, remove_empty_folders, staging_file
from hub_vit.file_hash import sha256_file
from hub_vit.network import offline_switch

GCS_HTTPS = "https://storage.googleapis.com"
DEFAULT_TIMEOUT_S = 15.0
CHUNK = 1 << 20

# big_vision models/vit.py VANITY_NAMES (the names big_vision's own loader accepts), gs:// locations as listed there.
_HOWTO = "gs://vit_models/augreg"
VANITY_NAMES: dict[str, str] = {
    "howto-i21k-Ti/16": f"{_HOWTO}/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz",
    "howto-i21k-S/32": f"{_HOWTO}/S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-S/16": f"{_HOWTO}/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz",
    "howto-i21k-B/32": f"{_HOWTO}/B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-B/16": f"{_HOWTO}/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-B/8": f"{_HOWTO}/B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-L/16": f"{_HOWTO}/L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0.npz",
    "i1k-s16-90ep": "gs://big_vision/vit_s16_i1k_90ep.npz",
    "i1k-s16-150ep": "gs://big_vision/vit_s16_i1k_150ep.npz",
    "i1k-s16-300ep": "gs://big_vision/vit_s16_i1k_300ep.npz",
}


class DownloadError(RuntimeError):
    """A checkpoint could not be fetched; the message says what to download by hand and where to put it."""


@dataclass(frozen=True)
class Source:
    """A resolved checkpoint: the local file, where it came from, and its sha256."""

    path: Path
    origin: str  # the local path as given, or the URL
    url: str | None  # HTTPS URL when downloaded or known
    sha256: str  # of the file's content, computed when resolved
    catalog_name: str | None = None  # `vit_b16.augreg_in21k_ft_in1k` when the source is a catalog weight
    # What hub-vit's downloader recorded (the `.sha256` sidecar) while fetching `url`; None for a local path or a
    # file placed in the cache by hand. Equal to `sha256` only if the file is the one fetched from `url`.
    downloaded_sha256: str | None = None


def cache_dir() -> Path:
    """`$HUB_VIT_CACHE`, else `$XDG_CACHE_HOME/hub_vit`, else `~/.cache/hub_vit`: a user who moved every cache with
    XDG_CACHE_HOME (off a small or read-only home) finds hub-vit's beside huggingface_hub's and torch's. An existing
    `~/.cache/hub_vit` is kept while `$XDG_CACHE_HOME/hub_vit` does not exist."""
    explicit = os.environ.get("HUB_VIT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home_cache = Path.home() / ".cache" / "hub_vit"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if not xdg:
        return home_cache
    chosen = Path(xdg).expanduser() / "hub_vit"
    # a cache filled before hub-vit followed XDG_CACHE_HOME stays in use (offline, its checkpoints are all there is)
    # until the XDG one exists
    return home_cache if not chosen.exists() and home_cache.is_dir() else chosen


def gs_to_https(url: str) -> str:
    """`gs://bucket/path` -> `https://storage.googleapis.com/bucket/path` (public GCS objects)."""
    return f"{GCS_HTTPS}/{url.removeprefix('gs://')}" if url.startswith("gs://") else url


def _catalog_lookup(name: str) -> tuple[str, str | None] | None:
    """`vit_b16.augreg_in21k_ft_in1k` (or a bare registered name: its first tag) -> (https URL, sha256)."""
    from hub_vit.catalog import MODELS

    base, _, tag = name.partition(".")
    entry = MODELS.get(base)
    if entry is None or not entry.weights:
        return None
    weight = entry.weight(tag) if tag else entry.weights[0]
    if not weight.url:  # shipped inside the package as a model folder: an empty URL read "unknown url type: ''"
        raise ValueError(f"{base}.{weight.tag} is not a Google checkpoint: it ships with hub-vit as the model folder "
                         f"{str(Path(weight.file).parent)!r}, so there is nothing to convert; timm, transformers and "
                         f"every hub-vit command load it by name ({base!r})")
    return weight.url, weight.sha256


class NetworkUnavailableError(DownloadError):
    """The file cannot be fetched now: offline mode, no network, a timeout, or the server's own failure (HTTP 5xx).
    Nothing is wrong with what was asked: it may pass, or the file can be downloaded by hand (the message says how)."""


class CacheNotWritableError(DownloadError):
    """The download cache (or a file in it) cannot be created or written: read-only file system, full disk, no
    permission. Not a network problem, so the hand-download help (which puts the file in that cache) does not apply."""


def _cache_error(url: str, exc: OSError) -> CacheNotWritableError:
    where = f"{exc.strerror}: {str(exc.filename)!r}" if exc.strerror and exc.filename else str(exc)
    return CacheNotWritableError(
        f"cannot download {url}: the download cache {str(cache_dir())!r} is not writable ({where}); set "
        "HUB_VIT_CACHE to a writable folder, or download the file by hand and pass its local path instead")


def _make_cache_folder(url: str, folder: Path) -> list[Path]:
    """Create `folder`; return the folders created, for cleanup. An unwritable cache is a one-line error."""
    missing = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # read-only HOME or HUB_VIT_CACHE, no permission, full disk, a file in the way
        remove_empty_folders(missing)  # the parents mkdir managed to create before it failed
        raise _cache_error(url, exc) from exc
    return missing


class _LocalWriteError(Exception):
    """Wraps an OSError from writing the `.part` file, so a full disk is not reported as a network error."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class _CutShort(ConnectionError):
    """The connection closed before the body's announced length: http.client's `read(n)` returns what came without
    an error (a short file would have been cached as the whole one)."""

    def __init__(self, received: int, total: int) -> None:
        super().__init__(f"the connection closed after {received:,} of {total:,} bytes; running the command again "
                         "downloads the file anew")


def _fetch(url: str, part: Path, *, timeout: float, progress: bool, name: str) -> str:
    """Stream `url` into `part`; return the content's sha256. Local write failures raise `_LocalWriteError`, a body
    shorter than its Content-Length `_CutShort`."""
    digest = hashlib.sha256()
    received = 0
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
        total = int(response.headers.get("Content-Length") or 0) or None
        try:
            out = open(part, "wb")  # not in the `with` below: its OSError is the cache's, not the network's
        except OSError as exc:
            raise _LocalWriteError(exc) from exc
        with out, _progress(progress, total, name) as advance:
            while chunk := response.read(CHUNK):
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise _LocalWriteError(exc) from exc
                digest.update(chunk)
                received += len(chunk)
                advance(len(chunk))
    if total is not None and received != total:
        raise _CutShort(received, total)
    return digest.hexdigest()


def cached_path(url: str) -> Path:
    """Where `url` is (or would be) cached."""
    key = hashlib.sha256(url.encode()).hexdigest()[:32]
    return cache_dir() / "downloads" / key / (url.rstrip("/").rsplit("/", 1)[-1] or "checkpoint.npz")


def hand_download_commands(url: str, dest: Path) -> tuple[str, str]:
    """Shell commands (curl, wget) that fetch `url` to `dest` as pasted: the cache folder is created first, since a
    failed download leaves none behind and neither tool creates missing folders for `-o` / `-O` by itself."""
    folder, target, source = (shlex.quote(str(p)) for p in (dest.parent, dest, url))
    return (f"mkdir -p {folder} && curl -L -o {target} {source}",
            f"mkdir -p {folder} && wget -O {target} {source}")


def _offline_message(url: str, dest: Path, reason: str) -> str:
    curl, wget = hand_download_commands(url, dest)
    return (f"cannot download {url} ({reason}). Download it by hand, e.g. `{curl}` (or `{wget}`), and run again: "
            f"the file is then taken from the cache at {dest}. "
            "Alternatively pass the local .npz path to `hub-vit convert`, or to timm as "
            "`timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=PATH))`. "
            "A file downloaded by hand converts the same, but hub-vit cannot tell it is the published file, so its "
            "model card does not claim the published checkpoint's results.")


def _http_error_message(url: str, dest: Path, exc: urllib.error.HTTPError, catalog_name: str | None = None) -> str:
    """An error status is the server's answer, not a network failure. A 4xx means the URL is wrong (or the file is not
    public): fetching the same URL by hand gets the same answer, so no hand-download help; for a catalog name the
    user gave no URL: the catalog's is out of date. A 5xx may pass: it keeps the help, as a network failure does."""
    try:
        status = f"HTTP {exc.code} {HTTPStatus(exc.code).phrase}"  # the standard phrase, not the server's wording
    except ValueError:  # a status code outside the standard list
        status = f"HTTP {exc.code} {exc.reason or ''}".rstrip()
    if exc.code >= 500:
        return _offline_message(url, dest, f"the server answered {status}; this may pass, try again later")
    if catalog_name is not None:
        return (f"cannot download {catalog_name}: its published file {url} answered {status}: the file has moved "
                "or is no longer public, so hub-vit's catalog is out of date; if you have the .npz, pass its path "
                "instead")
    hint = "is the URL right, and is the file public?" if exc.code in (401, 403) else "is the URL right?"
    return f"cannot download {url}: the server answered {status} ({hint})"


def check_timeout(timeout: float) -> None:
    """A network timeout is a finite number of seconds > 0: urllib takes 0 as "never wait" and refuses a negative one
    only once it connects, and NaN or infinity would wait forever."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


def download(url: str, *, expected_sha256: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
             progress: bool = True, catalog_name: str | None = None) -> Path:
    """Fetch `url` (gs:// or https://) into the cache unless it is there; return the cached path. `catalog_name`: the
    catalog entry `url` came from (`name.tag`), which an error names instead of asking whether the URL is right."""
    check_timeout(timeout)
    url = gs_to_https(url)
    dest = cached_path(url)
    sidecar = dest.with_name(dest.name + ".sha256")
    if dest.is_file():
        if expected_sha256:  # also for a file placed in the cache by hand (no sidecar): hash it
            got = sidecar.read_text().strip() if sidecar.is_file() else sha256_file(dest)
            if got != expected_sha256:
                raise DownloadError(f"cached {dest} has sha256 {got}, the catalog says {expected_sha256}; delete "
                                    "it and download again")
        return dest
    switch = offline_switch()
    if switch is not None:
        raise NetworkUnavailableError(_offline_message(url, dest, f"offline mode: {switch} is set"))
    created = _make_cache_folder(url, dest.parent)  # before the network: an unwritable cache is the error to report
    try:
        part = staging_file(dest)
    except OSError as exc:
        remove_empty_folders(created)
        raise _cache_error(url, exc) from exc
    try:
        got = _fetch(url, part, timeout=timeout, progress=progress, name=dest.name)
        if expected_sha256 and got != expected_sha256:
            raise DownloadError(f"{url} downloaded with sha256 {got}, expected {expected_sha256}; not cached")
        _store(part, dest, sidecar, got)
    except _LocalWriteError as exc:
        _discard(part, dest, sidecar, created)
        raise _cache_error(url, exc.error) from exc.error
    except urllib.error.HTTPError as exc:  # before URLError, its base class: the server answered, the network works
        _discard(part, dest, sidecar, created)
        exc.close()  # the error response's connection
        error = NetworkUnavailableError if exc.code >= 500 else DownloadError  # a 5xx may pass, a 4xx will not
        raise error(_http_error_message(url, dest, exc, catalog_name)) from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        _discard(part, dest, sidecar, created)  # no empty `downloads/<hash>/` left behind by a failed fetch
        reason = getattr(exc, "reason", None) or exc
        raise NetworkUnavailableError(_offline_message(url, dest, f"network error: {reason}")) from exc
    except BaseException:
        _discard(part, dest, sidecar, created)
        raise
    return dest


def _store(part: Path, dest: Path, sidecar: Path, sha256: str) -> None:
    """Sidecar first, then the rename: a cached file without its sidecar would look like a hand download."""
    try:
        sidecar.write_text(sha256 + "\n")
        os.replace(part, dest)
    except OSError as exc:  # a full disk can strike at the sidecar too
        raise _LocalWriteError(exc) from exc


def _discard(part: Path, dest: Path, sidecar: Path, created: list[Path]) -> None:
    """Undo a failed fetch: the half file, a sidecar whose file never arrived, the folders made for them."""
    part.unlink(missing_ok=True)
    if not dest.exists():
        sidecar.unlink(missing_ok=True)
    remove_empty_folders(created)


class _progress:
    """A rich progress bar as a context manager yielding `advance(n_bytes)`; a no-op when disabled."""

    def __init__(self, enabled: bool, total: int | None, name: str) -> None:
        self.enabled, self.total, self.name = enabled, total, name

    def __enter__(self):  # noqa: ANN204
        if not self.enabled:
            return lambda n: None
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            TimeRemainingColumn(), transient=True)
        self.bar.start()
        task = self.bar.add_task(f"downloading {self.name}", total=self.total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()


def _remote(source: str) -> tuple[str, str | None, str | None] | None:
    """(https URL, catalog name `name.tag`, its sha256) of a URL, big_vision vanity name or catalog name; the name and
    sha256 are None for a file the catalog does not list. None for anything else. No network."""
    if source.startswith(("gs://", "http://", "https://")) or source in VANITY_NAMES:
        url = gs_to_https(VANITY_NAMES.get(source, source))
        # a URL or vanity name of a published file names a catalog weight just as its catalog name does
        from hub_vit.catalog import weights_at_url

        found_at = weights_at_url(url)
        return (url, None, None) if found_at is None else (url, f"{found_at[0].name}.{found_at[1].tag}",
                                                           found_at[1].sha256)
    found = _catalog_lookup(source)
    return None if found is None else (found[0], source, found[1])


def catalog_weight(source: str) -> tuple[str | None, str | None]:
    """(catalog name `name.tag`, its sha256) of the catalog weight `source` names (its catalog name, or the URL or
    big_vision vanity name of its published file), else (None, None). No network: what is known before a download."""
    remote = None if Path(source).expanduser().exists() else _remote(source)
    return (None, None) if remote is None else remote[1:]


def resolve_source(source: str | Path, *, timeout: float = DEFAULT_TIMEOUT_S, progress: bool = True) -> Source:
    """Turn what the user typed into a local file (downloading if needed) with its sha256.

    Accepted, in this order: an existing local path; `gs://...` / `http(s)://...`; a big_vision vanity name
    (`i1k-s16-300ep`, `howto-i21k-B/16`); a hub-vit catalog name (`vit_b16.augreg_in21k_ft_in1k`).
    """
    check_timeout(timeout)
    text = str(source)
    if not text.strip():  # Path("") is the current folder: it was called "a directory"
        raise ValueError("checkpoint source is empty; give an .npz file, a gs:// or https:// URL, a big_vision vanity "
                         "name or a hub-vit catalog name")
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_file():
            raise ValueError(f"checkpoint source {text!r} is a directory; pass an .npz file")
        return Source(path=path, origin=text, url=None, sha256=sha256_file(path))
    remote = _remote(text)
    if remote is None:
        from hub_vit.catalog import MODELS

        tags = [f"{name}.{w.tag}" for name, e in MODELS.items() for w in e.weights]
        raise ValueError(
            f"checkpoint source {text!r} is not an existing file, a gs:// or https:// URL, a big_vision vanity name "
            f"({', '.join(VANITY_NAMES)}) or a hub-vit catalog name (e.g. {', '.join(tags[:4])}, ...; "
            "`hub-vit models` lists them all)"
        )
    url, catalog_name, expected = remote
    local = download(url, expected_sha256=expected, timeout=timeout, progress=progress, catalog_name=catalog_name)
    sidecar = local.with_name(local.name + ".sha256")
    # The content is hashed even when a sidecar exists: a file swapped in after the download must not inherit it
    recorded = sidecar.read_text().strip() if sidecar.is_file() else None
    return Source(path=local, origin=text, url=url, sha256=sha256_file(local), catalog_name=catalog_name,
                  downloaded_sha256=recorded)


__all__ = ["CacheNotWritableError", "DownloadError", "NetworkUnavailableError", "Source", "VANITY_NAMES", "cache_dir",
           "cached_path", "catalog_weight", "download", "gs_to_https", "hand_download_commands", "resolve_source",
           "sha256_file"]
