"""serve's public metrics port: Triton's own metrics, relayed, and serve's families after them.

Triton's metrics port is bound privately (loopback, a port serve picks, as its HTTP and gRPC are), and this front, in
the serve process, holds the public one for the whole run: a scrape during a restart finds the port there and
`hub_vit_server_ready 0` rather than a refused connection, and the counts that only serve has are on it too
(`own()`: what the front answered itself, restarts). A scrape of `GET /metrics` fetches Triton's text (up to
`UPSTREAM_TIMEOUT_S`; without an answer the scrape carries serve's families alone, with a comment line saying why).

It is a `runtime.supervisor.Front` of protocol "metrics": pointed at each new tritonserver's metrics endpoint once that
is ready, at nothing while one is replaced; its drain holds nothing (a scrape is no request of a client's) and only
turns `hub_vit_server_ready` to 0.

Scrapes are rare, so this is Python's own `http.server`, hardened for a port that may face a network: a thread per
connection up to `MAX_CONNECTIONS` (others are closed at once), each cut when its request (head and body) has not
arrived within `head_timeout_s` (10 s: a client trickling a byte at a time holds no slot for longer),
request lines up to 64 KiB and 100 header fields (http.server's own limits, answered 414 / 431), HTTP/1.0 (one request
per connection). Other paths get a 404 tagged `protocol.port_speaks("metrics")` naming the HTTP port (clients pointed
here by mistake say so), other methods a 405.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hub_vit.server import protocol
from hub_vit.server.front.exposition import CONTENT_TYPE, Family, render

PATH = "/metrics"
MAX_CONNECTIONS = 16
HEAD_TIMEOUT_S = 10.0  # a connection's whole request, as the HTTP front's head timeout
UPSTREAM_TIMEOUT_S = 5.0
MAX_UPSTREAM_BYTES = 16 << 20  # Triton's text is a few KiB a model
MAX_DISCARDED_BODY = 8 << 20  # a request body read (and dropped) before its 404 / 405: an image or a few


class MetricsFront:
    """The public metrics port at host:port; `own()` gives serve's families at each scrape; `http_port` is named to a
    client that asks it for anything but the metrics."""

    protocol = "metrics"

    def __init__(self, host: str, port: int, http_port: int, own: Callable[[], list[Family]],
                 head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self.host, self.port, self.http_port, self.own = host, port, http_port, own
        self.head_timeout_s = head_timeout_s
        self.target: tuple[str, int] | None = None  # Triton's private metrics endpoint; None: no server
        self.draining = False  # serve is stopping: the server behind takes no new requests
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsFront:
        """Bind and serve; OSError naming host:port when it is taken."""
        try:
            self._server = _Server((self.host, self.port), _handler(self))
        except OSError:
            raise OSError(f"{self.host}:{self.port} is already in use (another server?); choose another port") \
                from None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="hub-vit-metrics", daemon=True)
        self._thread.start()
        return self

    @property
    def ready(self) -> bool:
        """A server is behind the front and takes new requests."""
        return self.target is not None and not self.draining

    # -- runtime.supervisor.Front -------------------------------------------------------------------------------------
    def upstream(self, host: str | None, port: int | None = None) -> None:
        self.target = (host, port) if host is not None and port is not None else None

    def drain(self) -> None:
        """Nothing to drain (scrapes go on answering until `close`); the server is no longer ready."""
        self.draining = True

    def drained(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- a scrape -----------------------------------------------------------------------------------------------------
    def scrape(self) -> str:
        """Triton's metrics text, then serve's families."""
        triton, missing = "", ""
        target = self.target
        if target is None:
            missing = "no tritonserver is serving (starting, restarting or stopping)"
        else:
            try:
                triton = _fetch(*target)
            except (OSError, http.client.HTTPException, UnicodeDecodeError) as err:
                missing = f"no answer from it ({type(err).__name__}: {err})"
        if triton and not triton.endswith("\n"):
            triton += "\n"
        note = f"# tritonserver's own metrics are missing: {missing}\n" if missing else ""
        return triton + note + render(self.own())


def _fetch(host: str, port: int) -> str:
    connection = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_S)
    try:
        connection.request("GET", PATH)
        answer = connection.getresponse()
        body = answer.read(MAX_UPSTREAM_BYTES + 1)
        if answer.status != 200:
            raise OSError(f"HTTP {answer.status}")
        if len(body) > MAX_UPSTREAM_BYTES:
            raise OSError(f"over {MAX_UPSTREAM_BYTES} bytes")
        return body.decode()
    finally:
        connection.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stalled client does not hold serve's exit (it is cut at the head timeout anyway)

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer's own also looks the host's name up (socket.getfqdn), which waits on DNS on a host without one.
        # SO_REUSEADDR (allow_reuse_address) lets a port in TIME_WAIT be bound, not one another process listens on
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address) -> None:  # noqa: ANN001
        if not self._slots.acquire(blocking=False):  # over the cap: closed at once, as the other fronts do
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _handler(front: MetricsFront) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = front.head_timeout_s  # the socket's, for each read: the cut below bounds them all together

        def setup(self) -> None:
            super().setup()
            self._cut = threading.Timer(front.head_timeout_s, self._cut_connection)
            self._cut.daemon = True
            self._cut.start()

        def _cut_connection(self) -> None:
            with contextlib.suppress(OSError):  # the blocked read returns at once, and the handler ends
                self.connection.shutdown(socket.SHUT_RDWR)

        def send_response(self, code: int, message: str | None = None) -> None:
            self._cut.cancel()  # the request is in (or refused): its answer, a scrape's included, is not cut
            super().send_response(code, message)

        def finish(self) -> None:
            self._cut.cancel()
            super().finish()
        server_version = "hub-vit-metrics"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._answer()

        def _answer(self) -> None:
            with_body = self.command != "HEAD"
            if self.path.split("?", 1)[0] != PATH:  # an inference or health client pointed here by mistake
                self._discard_body()
                sentence = (f"this is hub-vit serve's metrics port: it answers GET {PATH} only; send inference and "
                            f"health requests to its HTTP port {front.http_port}")
                error = protocol.port_speaks("metrics", sentence, http_port=front.http_port)
                self._send(404, json.dumps({"error": error}).encode(), "application/json", with_body)
            elif self.command not in ("GET", "HEAD"):
                self._discard_body()
                body = json.dumps({"error": f"method {self.command} not allowed: the metrics port answers GET and "
                                            f"HEAD {PATH}"}).encode()
                self._send(405, body, "application/json", with_body, {"Allow": "GET, HEAD"})
            else:
                self._send(200, front.scrape().encode(), CONTENT_TYPE, with_body)

        do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer  # noqa: N815

        def _discard_body(self) -> None:
            """Read a small body before answering: closing a socket with unread bytes resets it, and the client
            would lose the answer. A larger one is left (its client may see a reset instead of the 404)."""
            length = self.headers.get("Content-Length", "")
            if length.isdigit() and int(length) <= MAX_DISCARDED_BODY:
                self.rfile.read(int(length))

        def _send(self, status: int, body: bytes, content_type: str, with_body: bool,
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
            pass  # scrapes are not news; refusals of malformed requests are the client's to read

    return Handler
