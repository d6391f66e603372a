"""Locating the tritonserver binary and refusing environments its Python-backend stub cannot serve from."""

from __future__ import annotations

import pytest

from hub_vit.server import launcher
from hub_vit.server.launcher import ServerError, find_triton


def test_numpy_2_is_refused_before_the_server_starts(monkeypatch):
    # Reproduced with Python 3.12: under numpy 2.5 the nvidia-pytriton stub dies on the warmup image
    # ("unpack_from requires a buffer of at least 1701143913 bytes"); the launcher must say why up front.
    monkeypatch.setattr(launcher, "installed_numpy", lambda: "2.5.2")
    with pytest.raises(ServerError, match=r"numpy 2\.5\.2 is installed.*pip install 'numpy<2'"):
        find_triton()


def test_numpy_1_finds_the_wheel_binary_and_this_interpreters_stub(monkeypatch):
    monkeypatch.setattr(launcher, "installed_numpy", lambda: "1.26.4")
    install = find_triton()
    assert install.binary.name == "tritonserver" and install.binary.is_file()
    assert install.stub is not None and install.stub.is_file()
    assert (install.python_backend / "libtriton_python.so").is_file()
