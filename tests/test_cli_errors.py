"""The `hub-vit` entry point's safety net: a read-only, full or forbidden destination that a command does not catch
itself is one line (`error: <OS reason>: '<path>'`, exit 1) instead of a traceback; every other exception (a bug)
keeps its traceback, and Ctrl-C keeps its own handling."""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Callable, Iterator

import pytest

import hub_vit.cli as cli
from hub_vit.cli.app import app


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[BaseException], None]]:
    """Register `hub-vit boom` raising the given exception (removed again after the test), and restore SIGTERM."""
    # The real commands first: `cli.main()` imports their modules, which would register them on the copy below and
    # lose them with it at teardown (a later test in the same process then finds no `serve` command).
    cli._load_commands()
    monkeypatch.setattr(app, "registered_commands", list(app.registered_commands))
    monkeypatch.setattr(sys, "argv", ["hub-vit", "boom"])
    sigterm = signal.getsignal(signal.SIGTERM)

    def register(exc: BaseException) -> None:
        @app.command("boom")
        def boom() -> None:
            raise exc

    yield register
    signal.signal(signal.SIGTERM, sigterm)


@pytest.mark.parametrize(("code", "reason"), [(errno.EROFS, "Read-only file system"),
                                              (errno.ENOSPC, "No space left on device"),
                                              (errno.EACCES, "Permission denied")])
def test_environment_os_error_is_one_line(code: int, reason: str, command, capsys: pytest.CaptureFixture) -> None:
    command(OSError(code, reason, "out dir/[draft] x"))
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"error: {reason}: 'out dir/[draft] x'"] and captured.out == ""


def test_disk_full_without_a_path_still_says_why(command, capsys: pytest.CaptureFixture) -> None:
    command(OSError(errno.ENOSPC, "No space left on device"))  # what a failed write() raises: no file name
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 1 and capsys.readouterr().err.splitlines() == ["error: No space left on device"]


@pytest.mark.parametrize("exc", [FileNotFoundError(errno.ENOENT, "No such file or directory", "templates/x.pbtxt"),
                                 OSError("no errno"), ValueError("a bug"), KeyboardInterrupt()])
def test_other_errors_are_not_hidden(exc: BaseException, command) -> None:
    # a missing packaged file or any non-OSError is a bug: its traceback must reach the user (and the tests)
    command(exc)
    if isinstance(exc, KeyboardInterrupt):  # typer turns Ctrl-C into "Aborted." and exit 130, as before
        with pytest.raises(SystemExit) as exit_:
            cli.main()
        assert exit_.value.code == 130
        return
    with pytest.raises(type(exc)):
        cli.main()


def test_an_error_naming_two_files_names_the_destination_first(tmp_path) -> None:
    # a copy onto a full disk named only the cache file it copied from (filename), not the destination (filename2)
    import os
    from pathlib import Path

    from hub_vit.cli.app import os_error_text

    source, destination = tmp_path / "staged.onnx", tmp_path / "out" / "model.onnx"
    source.write_bytes(b"graph")
    destination.mkdir(parents=True)  # a folder in the way: the OS names both files
    (destination / "x").touch()
    with pytest.raises(OSError) as raised:
        os.replace(source, destination)
    assert os_error_text(raised.value) == f"Is a directory: {str(destination)!r} (from {str(source)!r})"
    assert os_error_text(FileNotFoundError(errno.ENOENT, "No such file or directory", "a")) == \
        f"No such file or directory: {str(Path('a'))!r}"


def test_the_program_exits_without_teardown_yet_does_what_an_exit_must(tmp_path) -> None:
    # `hub-vit` (`cli.run`) ends with os._exit, skipping the 1-3 s teardown of torch & co.: the exit code, all of the
    # output, other threads' work and the atexit handlers (logging, multiprocessing, registered cleanup) must survive,
    # and an idle thread pool must not hold the exit (joining its workers alone waited forever: `export onnx`)
    import subprocess

    marks = tmp_path / "atexit", tmp_path / "thread"
    script = f"""
import atexit, concurrent.futures, sys, threading, time
from pathlib import Path
import typer
from hub_vit.cli import app, run

POOLS = []

@app.command("probe")
def probe() -> None:
    atexit.register(Path({str(marks[0])!r}).write_text, "ran")
    threading.Thread(target=lambda: (time.sleep(0.5), Path({str(marks[1])!r}).write_text("done"))).start()
    sys.stdout.write("x" * 1_000_000)  # still in the buffer when the command returns
    POOLS.append(concurrent.futures.ThreadPoolExecutor(1))  # kept, as a library keeps its pool: its idle worker
    POOLS[0].submit(print, end="")  # (a non-daemon thread) waits for more work until told to stop
    raise typer.Exit(7)

sys.argv = ["hub-vit", "probe"]
run()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "x" * 1_000_000
    assert [mark.read_text() for mark in marks] == ["ran", "done"]
