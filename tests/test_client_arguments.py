"""The Python clients' arguments are checked before any connection: a bad one is a ValueError / TypeError naming the
argument, the value and the valid choices, not the connection error of a server that never saw it (nothing listens
where these clients point; their network side fails the test if it is reached). `hub-vit classify` refuses an empty
file up front as `hub-vit rollout` does (exit 2, naming the file)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from hub_vit.image_formats import NAMES
from hub_vit.server.client import AsyncClassifier, Classifier
from hub_vit.server.client.images import check_images, encode
from hub_vit.server.client.messages import check_flag, explain_parameters
from hub_vit.server.runtime.launcher import free_port

SAMPLE = Path(__file__).resolve().parents[1] / "hub_vit" / "assets" / "digits" / "samples" / "3_0.png"
PNG = SAMPLE.read_bytes()

# (images, keywords) -> (error type, what its message says)
BAD: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
    (b"", {}, ValueError, rf"empty image bytes \(b'', 0 bytes\); send an encoded image \({NAMES}\)"),
    ([b""], {}, ValueError, r"^empty image bytes \(b'', 0 bytes\)"),
    (bytearray(), {}, ValueError, r"^empty image bytes"),
    ([PNG, memoryview(b"")], {}, ValueError, r"^image 1: empty image bytes \(b'', 0 bytes\)"),
    (PNG, {"with_logits": "yes"}, TypeError, r"^with_logits must be True or False, got 'yes'$"),
    (PNG, {"with_logits": 1}, TypeError, r"^with_logits must be True or False, got 1$"),
    (PNG, {"explain": "yes"}, TypeError, r"^explain must be True or False, got 'yes'$"),
    (PNG, {"explain": 1}, TypeError, r"^explain must be True or False, got 1$"),
    (PNG, {"explain": True, "head_fusion": "bogus"}, ValueError,
     r"^unknown head_fusion 'bogus'; valid choices: 'mean', 'max', 'min'$"),
    (PNG, {"explain": True, "discard_ratio": 1.0}, ValueError,
     r"^discard_ratio must be a number in \[0, 1\), got 1.0$"),
    (PNG, {"explain": True, "discard_ratio": -0.1}, ValueError, r"discard_ratio must be a number in \[0, 1\)"),
    (PNG, {"explain": True, "discard_ratio": "0.5"}, ValueError, r"discard_ratio must be a number in \[0, 1\)"),
    (PNG, {"head_fusion": "max"}, ValueError, r"pass explain=True with them"),
    # a list's images are checked before the model's config is read (its batch limit): that was a round trip first
    ([PNG, "no-such-photo.png"], {}, ValueError, r"^image file 'no-such-photo.png' does not exist$"),
    ([PNG, np.zeros((4, 4, 3), np.uint8)], {}, ValueError, r"^image 1: cannot send a numpy array"),
    ([PNG, Image.new("F", (4, 4))], {}, ValueError, r"^image 1: cannot send a mode 'F' \(32-bit float\) PIL image"),
    ([PNG, io.StringIO("text")], {}, ValueError, r"^image 1: StringIO .* is open in text mode"),
]
IDS = ["empty-bytes", "empty-bytes-list", "empty-bytearray", "empty-memoryview-second", "logits-str", "logits-int",
       "explain-str", "explain-int", "head-fusion", "discard-ratio-1", "discard-ratio-negative", "discard-ratio-str",
       "settings-without-explain", "missing-file-second", "numpy-second", "float-image-second", "text-file-second"]


def _unused_url() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens: a call that reached the network would fail differently


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both clients' tritonclient clients fail the test when used: no request, no config round trip."""

    def connected(self: Any) -> Any:
        raise AssertionError("the client reached the network before refusing the arguments")

    monkeypatch.setattr(Classifier, "client", property(connected))
    monkeypatch.setattr(AsyncClassifier, "client", property(connected))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("images", "keywords", "error", "message"), BAD, ids=IDS)
def test_classify_refuses_bad_arguments_before_connecting(offline, protocol: str, images: Any,
                                                          keywords: dict[str, Any], error: type[Exception],
                                                          message: str) -> None:
    # was: each of these reached the network (ConnectionRefusedError, gRPC UNAVAILABLE where no server listened)
    client = Classifier(_unused_url(), protocol=protocol, timeout_s=5)
    with pytest.raises(error, match=message):
        client.classify(images, **keywords)


@pytest.mark.parametrize(("images", "keywords", "error", "message"), BAD, ids=IDS)
def test_async_classify_refuses_bad_arguments_before_connecting(offline, images: Any, keywords: dict[str, Any],
                                                                error: type[Exception], message: str) -> None:
    # was: aiohttp's ClientConnectorError where no server listened
    async def run() -> None:
        async with AsyncClassifier(_unused_url(), protocol="http", timeout_s=5) as client:
            await client.classify(images, **keywords)

    with pytest.raises(error, match=message):
        asyncio.run(run())


@pytest.mark.parametrize("client", ["sync", "async"])
def test_an_empty_file_is_refused_before_connecting(offline, tmp_path: Path, client: str) -> None:
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    said = rf"^'{empty}' is empty \(0 bytes\); supported formats: {NAMES}$"
    if client == "sync":
        with pytest.raises(ValueError, match=said):
            Classifier(_unused_url(), timeout_s=5).classify([SAMPLE, empty])
        return

    async def run() -> None:
        async with AsyncClassifier(_unused_url(), timeout_s=5) as aio:
            await aio.classify([SAMPLE, empty])

    with pytest.raises(ValueError, match=said):
        asyncio.run(run())


def test_a_file_object_with_nothing_left_to_read_is_named() -> None:
    # its bytes are known only once read, when it is sent: empty then, it is refused rather than sent as b""
    spent = io.BytesIO(PNG)
    spent.read()
    with pytest.raises(ValueError, match=r"^BytesIO gave 0 bytes: it is empty, or was read to its end already .*"
                                         r"seek\(0\) first"):
        encode(spent)


def test_good_arguments_pass_the_checks() -> None:
    assert check_flag(np.bool_(True), "explain") is True and check_flag(False, "with_logits") is False
    assert explain_parameters(True, "max", 0) == {"explain": True, "head_fusion": "max", "discard_ratio": 0.0}
    assert explain_parameters(False, None, None) == {}
    check_images([SAMPLE, str(SAMPLE), PNG, bytearray(PNG), io.BytesIO(PNG), Image.new("RGB", (4, 4))])


def test_prepare_refuses_an_empty_image_by_its_index() -> None:
    client = AsyncClassifier(_unused_url(), timeout_s=5)
    with pytest.raises(ValueError, match=r"^image 2: empty image bytes"):
        client.prepare([PNG, PNG, b""])


def _app() -> Any:
    from hub_vit.cli import _load_commands, app

    _load_commands()
    return app


def test_cli_classify_refuses_an_empty_file_as_rollout_does(tmp_path: Path) -> None:
    # was: sent to the server (and exit 1 on the connection where none listened); rollout said exit 2, naming it
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    result = CliRunner().invoke(_app(), ["classify", "--url", _unused_url(), str(SAMPLE), str(empty)])
    assert result.exit_code == 2, result.output
    assert f"'{empty}' is empty (0 bytes); supported formats: {NAMES}" in " ".join(result.output.split())
    assert "Connection refused" not in result.output


@pytest.mark.parametrize(("flags", "said"), [
    (["--explain", "--head-fusion", "avg"], "unknown --head-fusion 'avg'; valid choices: mean, max, min"),
    (["--explain", "--discard-ratio", "1"], "--discard-ratio must be a number in [0, 1), got 1.0"),
    (["--head-fusion", "max"], "--head-fusion and --discard-ratio set the server's rollout map: add --explain"),
])
def test_cli_classify_checks_explain_flags_by_the_clients_rules(tmp_path: Path, flags: list[str], said: str) -> None:
    result = CliRunner().invoke(_app(), ["classify", "--url", _unused_url(), "-o", str(tmp_path / "out"), *flags,
                                         str(SAMPLE)])
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists()
