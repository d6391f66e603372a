"""Server addresses the clients accept, and the ones they refuse with a message (not tritonclient's own errors: a
non-numeric port ended in an AttributeError from its destructor)."""

from __future__ import annotations

import pytest

from hub_vit.server.client.addresses import resolve_protocol, server_address
from hub_vit.server.client.classifier import Classifier


@pytest.mark.parametrize(("url", "address", "tls"), [
    ("127.0.0.1:8000", "127.0.0.1:8000", False),
    ("http://127.0.0.1:8000/", "127.0.0.1:8000", False),  # copied from a browser or from `hub-vit serve`'s output
    ("grpc://localhost:8001", "localhost:8001", False),
    ("https://triton.example.com:443", "triton.example.com:443", True),
    ("[::1]:8001", "[::1]:8001", False),
    ("HTTPS://triton.example.com:443", "triton.example.com:443", True),  # schemes are case-insensitive
])
def test_accepted_forms(url, address, tls):
    assert server_address(url) == (address, tls)


@pytest.mark.parametrize(("url", "message"), [
    ("notaurl:xx", "must be host:port"),
    ("127.0.0.1", "must be host:port"),
    ("127.0.0.1:70000", "has port 70000, out of range: a port is 1 to 65535"),  # was "must be host:port"
    ("127.0.0.1:0", "has port 0, out of range: a port is 1 to 65535"),
    (":8000", "must be host:port"),
    ("127.0.0.1:8000/v2/models/vit/infer", "has a path"),
    ("ftp://127.0.0.1:21", "unsupported scheme 'ftp'"),
    ("127.0.0.1:8000#top", "has a fragment"),  # passed, then `loadtest` got 404 from the fragment
    ("127.0.0.1:8000?model=vit", "has a query"),
    ("127.0.0.1:8000?next=/v2", "has a query"),
    ("user@127.0.0.1:8000", "holds a user name"),  # passed as a host name
])
def test_refused_forms_name_the_problem(url, message):
    with pytest.raises(ValueError, match=message):
        server_address(url)
    for protocol in ("http", "grpc"):
        with pytest.raises(ValueError, match=message):
            Classifier(url, protocol=protocol)


@pytest.mark.parametrize("concurrency", ["0", "-1", "65"])
def test_classify_refuses_a_concurrency_out_of_range_before_any_request(tmp_path, concurrency):
    from PIL import Image
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    _load_commands()
    result = CliRunner().invoke(app, ["classify", "--url", "127.0.0.1:9", "--concurrency", concurrency, str(image)])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2, flat  # a usage mistake, named before the (absent) server is asked anything
    assert f"error: --concurrency (requests in flight) must be between 1 and 64, got {concurrency}" in flat, flat


@pytest.mark.parametrize("command", ["classify", "loadtest"])
@pytest.mark.parametrize(("url", "message"), [("notaurl:xx", "must be host:port"), ("127.0.0.1", "must be host:port"),
                                              ("127.0.0.1:8000/x", "has a path")])
def test_cli_refuses_a_bad_url_as_a_usage_mistake(tmp_path, command, url, message):
    # classify exited 1 (as for a server that does not answer) and repeated the URL: "http 127.0.0.1: server URL ..."
    from PIL import Image
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    _load_commands()
    result = CliRunner().invoke(app, [command, "--url", url, str(image)])
    flat = " ".join(result.output.split())
    expected = f"server URL {url!r} {message}" if message == "has a path" else f"server URL {message}"
    assert result.exit_code == 2 and f"error: --url: {expected}" in flat, flat
    assert not isinstance(result.exception, AttributeError)


@pytest.mark.parametrize(("url", "protocol", "expected"), [
    ("127.0.0.1:8001", None, "http"),  # a bare address: the protocol asked for, HTTP by default
    ("127.0.0.1:8001", "grpc", "grpc"),
    ("grpc://127.0.0.1:8001", None, "grpc"),  # pasted with its scheme: the scheme decides
    ("GRPC://127.0.0.1:8001", None, "grpc"),
    ("grpc://127.0.0.1:8001", "grpc", "grpc"),
    ("http://127.0.0.1:8000/", None, "http"),
    ("https://triton.example.com:443", "grpc", "grpc"),  # TLS, either protocol
    ("https://triton.example.com:443", None, "http"),
])
def test_the_url_scheme_chooses_the_protocol(url, protocol, expected):
    assert resolve_protocol(url, protocol) == expected
    assert Classifier(url, protocol=protocol).protocol == expected


@pytest.mark.parametrize(("url", "protocol"), [("grpc://127.0.0.1:8001", "http"), ("http://127.0.0.1:8000", "grpc")])
def test_a_scheme_naming_the_other_protocol_is_refused(url, protocol):
    # was: spoken to in the other protocol, failing with "('Expected HTTP/, RTSP/ or ICE/', 8)"
    scheme = url.split(":")[0]
    with pytest.raises(ValueError, match=f"is a {scheme}:// address, but the protocol asked for is {protocol}"):
        Classifier(url, protocol=protocol)


def test_cli_refuses_an_http_url_with_grpc(tmp_path):
    from PIL import Image
    from typer.testing import CliRunner

    from hub_vit.cli import _load_commands, app

    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    _load_commands()
    for command in ("classify", "loadtest"):
        result = CliRunner().invoke(app, [command, "--url", "http://127.0.0.1:8000", "--grpc", str(image)])
        assert result.exit_code == 2, result.output
        assert "is an HTTP address, but --grpc is given" in " ".join(result.output.split())


@pytest.mark.parametrize(("protocol", "concurrency", "limit"), [("http", 2000, 2000), ("http", 4, 100),
                                                                 ("grpc", 2000, None)])
def test_load_test_opens_a_connection_per_worker(protocol, concurrency, limit, monkeypatch):
    # was: tritonclient's default of 100 HTTP connections; "concurrency 2000" queued 1900 requests inside the client,
    # unseen by the server, and reported no rejection where gRPC got thousands. No server here: the run stops at the
    # first request (connection refused), after the client was built.
    import asyncio

    from hub_vit.server.client import loadtest
    from hub_vit.server.runtime.launcher import free_port

    built = []

    class Recording(loadtest.AsyncClassifier):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.client)

    monkeypatch.setattr(loadtest, "AsyncClassifier", Recording)
    with pytest.raises(Exception):  # noqa: B017 (connection refused, as tritonclient reports it per protocol)
        asyncio.run(loadtest.run_load(f"127.0.0.1:{free_port()}", [b"x"], protocol=protocol,
                                      concurrency=concurrency, requests=concurrency))
    assert len(built) == 1
    if limit is not None:
        assert built[0]._conn.limit == limit  # aiohttp's connector behind tritonclient.http.aio


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_call_after_close_says_the_client_was_closed(protocol: str) -> None:
    # was: gRPC "Cannot invoke RPC on closed channel!", HTTP tritonclient's own error, and the AsyncClassifier made a
    # new client silently; no server is needed: the call is refused before any request
    import asyncio

    from hub_vit.server.client import AsyncClassifier, ClientClosed

    url = "127.0.0.1:9"  # nothing answers there: a call that reached the network would fail otherwise
    client = Classifier(url, protocol=protocol)
    client.close()
    client.close()  # a second close does nothing
    for call in (client.ready, client.statistics, lambda: client.classify([b"x"])):
        with pytest.raises(ClientClosed, match=f"this Classifier of {url} was closed .*: make a new one"):
            call()

    async def after_close() -> None:
        async with AsyncClassifier(url, protocol=protocol) as aio:
            pass
        await aio.close()
        for call in (aio.statistics, aio.config):
            with pytest.raises(ClientClosed, match=f"this AsyncClassifier of {url} was closed .*: make a new one, "
                                                   "or open it again with `async with`"):
                await call()
        async with aio:  # opened again (a module-level client, one block per event loop): the call reaches the network
            with pytest.raises(Exception) as reached:  # noqa: PT011 - nothing listens: each protocol's own error
                await aio.statistics()
            assert not isinstance(reached.value, ClientClosed)
        with pytest.raises(ClientClosed):
            await aio.statistics()

    asyncio.run(after_close())


@pytest.mark.parametrize("connections", [0, -3, "10", 2.5, True])
def test_async_client_connections_must_be_a_positive_integer(connections) -> None:
    # was: 0 and -3 silently made 1; "10" a TypeError "'>' not supported between 'str' and 'int'" at the first request
    from hub_vit.server.client import AsyncClassifier

    with pytest.raises(ValueError, match=f"connections must be an integer >= 1 .*, got {connections!r}"):
        AsyncClassifier("127.0.0.1:8000", connections=connections)
