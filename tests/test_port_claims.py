"""`free_port` across processes (server/runtime/port_claims.py): a port one process was handed is not handed to
another while its server may still be about to bind it. The kernel's bind to port 0 is stood in by a fixed sequence,
so the collision the claims prevent happens every time; the processes and the claims file are real.

was: each process knew only its own ports, so two processes picking ports at once (two `hub-vit serve`, or the test
suite in two processes) could be handed the same one, and the second server to bind it failed to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_vit.server.runtime import launcher, port_claims

# Another process, as a second `hub-vit serve` would be: its own interpreter, the same temporary folder
OTHER_PROCESS = """
import sys
from hub_vit.server.runtime import launcher
given = iter(int(p) for p in sys.argv[1:])
launcher._kernel_port = lambda: next(given)
print(launcher.free_port())
"""


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's claims file in `tmp_path` (a fresh temporary folder), and no port handed out in it yet."""
    monkeypatch.setattr(port_claims.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(launcher, "_HANDED_OUT", set())
    return port_claims.claims_file()


def _kernel_gives(monkeypatch: pytest.MonkeyPatch, *ports: int) -> None:
    given = iter(ports)
    monkeypatch.setattr(launcher, "_kernel_port", lambda: next(given))


def _other_process(tmp_path: Path, *kernel_ports: int) -> int:
    done = subprocess.run([sys.executable, "-c", OTHER_PROCESS, *map(str, kernel_ports)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_a_port_another_process_was_handed_is_not_handed_again(claims: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _kernel_gives(monkeypatch, 50001)
    assert launcher.free_port() == 50001
    assert _other_process(tmp_path, 50001, 50002) == 50002  # the kernel offered it 50001 first
    _kernel_gives(monkeypatch, 50002, 50003)
    assert launcher.free_port() == 50003  # and the other way round
    assert sorted(port_claims._read(claims.read_text(), now=time.time())) == [50001, 50002, 50003]


def test_claims_expire_and_a_damaged_file_is_read_past(claims: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    claims.write_text(f"50001 {now - port_claims.CLAIM_S - 1:.0f}\n"  # expired
                      f"50002 {now:.0f}\n"
                      "50003 not-a-time\n"
                      "5000")  # a write cut short
    _kernel_gives(monkeypatch, 50002, 50001)
    assert launcher.free_port() == 50001
    assert sorted(port_claims._read(claims.read_text(), now=time.time())) == [50001, 50002]


def test_a_link_or_another_users_file_in_its_place_is_not_used(claims: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("kept\n")
    claims.symlink_to(target)
    _kernel_gives(monkeypatch, 50001)
    assert launcher.free_port() == 50001
    assert target.read_text() == "kept\n" and claims.is_symlink()  # not followed, not written through
    if os.getuid() != 0:
        return  # only root can hand a file to another user
    claims.unlink()
    claims.write_text(f"50002 {time.time():.0f}\n")
    os.chown(claims, 65534, 65534)
    _kernel_gives(monkeypatch, 50002)
    assert launcher.free_port() == 50002  # its claims are not trusted ...
    assert claims.read_text().split()[0] == "50002" and len(claims.read_text().split()) == 2  # ... nor written


def test_without_a_usable_temporary_folder_free_port_still_works(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(port_claims.tempfile, "tempdir", str(tmp_path / "missing"))
    monkeypatch.setattr(launcher, "_HANDED_OUT", set())
    _kernel_gives(monkeypatch, 50001, 50001, 50002)
    assert [launcher.free_port(), launcher.free_port()] == [50001, 50002]  # the in-process rule still holds
