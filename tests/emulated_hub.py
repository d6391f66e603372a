"""A Hugging Face Hub emulated on a loopback port, for the download paths that cannot reach the real one here: the
endpoints huggingface_hub's `hf_hub_download` and `snapshot_download` call (a repository's revision info, a file's
HEAD and GET under `resolve/`), with the Hub's error codes (`X-Error-Code`: RepoNotFound, RevisionNotFound,
EntryNotFound), and every path asked for recorded. Point huggingface_hub at it with HF_ENDPOINT=`hub.endpoint`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "c0ffee" + "0" * 34
    branches: tuple[str, ...] = ("main",)


@dataclass
class EmulatedHub:
    repos: dict[str, Repo]
    endpoint: str = ""
    asked: list[str] = field(default_factory=list)  # "GET /org/name/resolve/<commit>/config.json", ...

    def fetched(self, repo_id: str) -> list[str]:
        """The files of `repo_id` whose bytes were sent (GET under resolve/)."""
        marker = f"GET /{repo_id}/resolve/"
        return [line[len(marker):].partition("/")[2] for line in self.asked if line.startswith(marker)]


def repo_of_folder(folder: Path) -> Repo:
    """A repository holding the files of `folder` (subfolders too) as `hub-vit push` would upload them."""
    return Repo({p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
                 and "__pycache__" not in p.parts})


@contextmanager
def emulated_hub(repos: dict[str, Repo]) -> Iterator[EmulatedHub]:
    hub = EmulatedHub(repos)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            self._answer(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.asked.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:  # /api/models/ORG/NAME[/revision|tree/REV]
                repo_id, rest = "/".join(parts[2:4]), parts[4:]
                revision = rest[1] if rest[:1] in (["revision"], ["tree"]) and len(rest) > 1 else "main"
                repo = self._repo(repo_id, revision)
                if repo is None:
                    return
                if rest[:1] == ["tree"]:  # the whole listing, one page: files only (folders are implied)
                    info: object = [{"type": "file", "path": name, "size": len(data),
                                     "oid": hashlib.sha1(data).hexdigest()} for name, data in repo.files.items()]
                else:
                    info = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                            "siblings": [{"rfilename": name} for name in repo.files]}
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
                return
            if len(parts) >= 5 and parts[2] == "resolve":  # /ORG/NAME/resolve/REV/PATH
                repo_id, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                repo = self._repo(repo_id, revision)
                if repo is None:
                    return
                if name not in repo.files:
                    self._error(404, "EntryNotFound", f"{name} does not exist", body)
                    return
                data = repo.files[name]
                self._send(200, data, {"X-Repo-Commit": repo.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                                       "Content-Type": "application/octet-stream"}, body)
                return
            self._error(404, "RepoNotFound", "not found", body)

        def _repo(self, repo_id: str, revision: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", True)
                return None
            if revision not in repo.branches and revision != repo.commit:
                self._error(404, "RevisionNotFound", "Invalid rev id", True)
                return None
            return repo

        def _error(self, status: int, code: str, message: str, body: bool) -> None:
            self._send(status, json.dumps({"error": message}).encode(),
                       {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}, body)

        def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body and self.command == "GET":
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
