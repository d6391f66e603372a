"""The client's requests fit the server's size limit (`hub-vit serve --max-request-mb`) as well as its batch limit:
images are split by bytes once the server refused a request as too large, the limit read from the front's fact
(protocol.py's `too-large`), or halved where the answer carries none (grpc's own words). Without a server; the real
gates are in tests/test_serve_limits.py."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from hub_vit.server import protocol
from hub_vit.server.client.classifier import requests, smaller_requests
from hub_vit.server.client.errors import ImageTooLarge
from hub_vit.server.client.messages import REQUEST_OVERHEAD_BYTES, RequestLimit, request_bytes, split

MB = 1 << 16  # sizes in units of 64 KiB, not MiB: the same arithmetic with less memory (64 * MB is 4 MiB)


def _images(*sizes: int) -> list[bytes]:
    return [bytes([index]) * size for index, size in enumerate(sizes)]


def test_split_by_count_alone_is_unchanged() -> None:
    assert split(list("abcde"), 2) == [(0, ["a", "b"]), (2, ["c", "d"]), (4, ["e"])]
    assert split(list("abc"), 0) == [(0, ["a", "b", "c"])]


def test_split_by_bytes_keeps_the_order_and_each_request_within_the_limit() -> None:
    images = _images(40 * MB, 40 * MB, 10 * MB, 10 * MB, 70 * MB, 1)
    chunks = split(images, 16, max_bytes=64 * MB)
    assert [offset for offset, _ in chunks] == [0, 1, 4, 5]
    assert [len(chunk) for _, chunk in chunks] == [1, 3, 1, 1]  # 40 | 40 + 10 + 10 | 70 (alone: the server decides) | 1
    assert [image for _, chunk in chunks for image in chunk] == images
    assert all(request_bytes(chunk) <= 64 * MB for _, chunk in chunks if len(chunk) > 1)
    assert split(images, 2, max_bytes=64 * MB)[1] == (1, images[1:3])  # the count limit still holds


def test_the_limit_is_learned_from_the_fact_and_halved_without_one() -> None:
    limit, sent = RequestLimit(), _images(42 * MB, 42 * MB)
    limit.refused(None, sent)  # grpc's "Received message larger than max": no number to trust
    assert not limit.known and limit.max_bytes == request_bytes(sent) // 2
    assert not limit.never_fits(bytes(100 * MB))  # an estimate never refuses an image by itself
    limit.refused(64 * MB, sent)
    assert limit.known and limit.max_bytes == 64 * MB
    limit.refused(None, _images(10, 10))  # a later answer without the fact does not forget it
    assert limit.max_bytes == 64 * MB
    assert limit.never_fits(bytes(64 * MB)) and not limit.never_fits(bytes(64 * MB - 4))


def _refusal(status: str, limit: int | None) -> InferenceServerException:
    words = "Received message larger than max (5505052 vs. 4194304)"
    return InferenceServerException(protocol.too_large(limit, words) if limit else words, status=status)


@pytest.mark.parametrize("status", ["413", "StatusCode.RESOURCE_EXHAUSTED"])
def test_two_images_refused_together_are_sent_apart(status: str) -> None:
    sent = _images(42 * MB, 42 * MB)
    for fact in (64 * MB, None):
        limit = RequestLimit()
        assert list(smaller_requests(_refusal(status, fact), 10, sent, limit)) == [(10, sent[:1]), (11, sent[1:])]


def test_an_image_that_never_fits_is_named_with_the_limit_and_the_flag() -> None:
    limit = RequestLimit()
    with pytest.raises(ImageTooLarge) as refused:  # refused alone, the front's fact: its limit
        smaller_requests(_refusal("413", 64 * MB), 3, _images(70 * MB), limit)
    assert refused.value.index == 3 and refused.value.limit == 64 * MB
    assert refused.value.reason == (f"too large to send: {70 * MB} bytes, over the server's request limit of "
                                    f"{64 * MB} bytes (4 MiB; hub-vit serve --max-request-mb)")
    with pytest.raises(ImageTooLarge, match=r"^image 1: too large to send: .* refused alone as over the server's "
                                            r"request limit \(hub-vit serve --max-request-mb\); the server said: "
                                            r"\[StatusCode.RESOURCE_EXHAUSTED\] Received message larger than max"):
        smaller_requests(_refusal("StatusCode.RESOURCE_EXHAUSTED", None), 1, _images(70 * MB), limit)
    # once the limit is known, such an image is named before anything is sent, whatever its place in the list
    limit.refused(64 * MB, [])
    with pytest.raises(ImageTooLarge) as refused:
        requests(_images(1, 70 * MB, 1), 16, limit)
    assert refused.value.index == 17


def test_other_refusals_are_raised_as_the_server_gave_them() -> None:
    bad = InferenceServerException(protocol.image_refused(1, "not an image"), status="400")
    with pytest.raises(InferenceServerException, match=r"image 6: not an image"):  # renumbered to the caller's list
        smaller_requests(bad, 5, _images(10, 10), RequestLimit())
    assert REQUEST_OVERHEAD_BYTES <= 4096  # the margin is small next to any limit serve takes (>= 1 MiB)
