"""`hub_vit.claim`: a second claimant learns the holder's pid, however many ask (a training run's folder, a serve
port)."""

from __future__ import annotations

import os
import time

import pytest

from hub_vit.claim import Claim, Claimed


def test_every_claimant_learns_the_holders_pid() -> None:
    """The holder never accepted the probes' connections: they filled its backlog, and from the third attempt on a
    probe waited its 1 s timeout and said "unknown"."""
    name = f"hub-vit-test-claim-{os.getpid()}-{time.monotonic_ns()}"
    with Claim(name):
        started = time.monotonic()
        for _ in range(6):
            with pytest.raises(Claimed) as caught:
                Claim(name)
            assert caught.value.holder == str(os.getpid())
        assert time.monotonic() - started < 3  # no probe waited for its timeout
    Claim(name).release()  # released: free again


def test_a_released_claim_stops_answering_and_frees_its_name() -> None:
    name = f"hub-vit-test-claim-{os.getpid()}-{time.monotonic_ns()}"
    claim = Claim(name)
    claim.release()
    assert not claim._answering.is_alive()
    claim.release()  # twice: nothing to do
    with Claim(name) as again:
        assert again.socket is not None
