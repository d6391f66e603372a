"""`hub-vit serve`'s repository, built in a child process, so the serving process never holds what building takes.

Loading and exporting a model imports torch, onnx and ONNX Runtime: serve stayed at 800 MB resident for the shipped
2-layer model, more for a ViT-B, for as long as it served, while it only supervises (the allocator returns little of
it). The child loads the model, writes the repository into a temporary folder the parent made, and exits; the parent
never imports torch unless the demo runs in it (`--demo`).

The two speak over a socket pair (`multiprocessing.connection`, pickled dataclasses; the same program on both ends):
parent -> child `BuildRequest`; child -> parent `Loaded` once the model is loaded, then `Built` or `Refused`. A child
that ends without either (a crash, the OOM killer) is named by its exit status; its output is on serve's stderr.

Stopping: Ctrl-C and a closed terminal's SIGHUP reach both (one process group); a SIGTERM to serve alone (`docker
stop`) is passed on; a serve killed outright sends its child SIGTERM (PR_SET_PDEATHSIG). A child that did not hand
a repository over removes the temporary folder as it exits, whatever ended it; serve removes it too (after SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hub_vit.child_python import python_command
from hub_vit.cli.stop_signals import cleaning_up, raise_on

if TYPE_CHECKING:
    from hub_vit.resolve import ModelRef, ResolvedModel
    from hub_vit.server.repository.options import ServingOptions

# What ends the child after it removed its folder: SIGTERM (passed on by serve, or sent at serve's death) and SIGHUP
# (the terminal closed: it reaches the whole process group, and serve does not catch it before it serves)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
CHILD_STOP_GRACE_S = 30  # what a stopped child gets to remove its folder before SIGKILL (an export step may not yield)


@dataclass(frozen=True)
class BuildRequest:
    model: str | None  # what the user named (None: the shipped model)
    options: ServingOptions
    workdir: Path  # the temporary folder the repository goes into (`serving.temporary_workdir`)
    ref: ModelRef | None = None  # `model` as serve located it (a Hub model: fetched), so the child does not again


@dataclass(frozen=True)
class Loaded:
    """The model is loaded: what serve shows while the repository is written."""

    name: str
    origin: str
    builds_variants: bool  # the CPU flavour's variants of a compute-bound model are built and timed: minutes
    example: str  # a sample image of the model for the `try:` line, or a placeholder


@dataclass(frozen=True)
class Built:
    repository: Path


@dataclass(frozen=True)
class Refused:
    """The model or the folder was refused: the whole message and serve's exit status."""

    message: str
    code: int


class BuildFailed(Exception):
    """The child ended without an answer (a crash, a signal): `exit_description`'s words."""


class RepositoryBuild:
    """One child building one repository: `loaded()`, then `result()`; `stop()` ends it (always call it)."""

    def __init__(self, request: BuildRequest) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(python_command("-m", "hub_vit.cli.serve_build", str(theirs.fileno()),
                                                           str(os.getpid())),
                                            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.channel = Connection(ours.detach())
        self.answered = False  # the last answer (`Built` or `Refused`) came: the child is exiting by itself
        self.channel.send(request)

    def loaded(self) -> Loaded | Refused:
        answer = self._receive()
        assert isinstance(answer, (Loaded, Refused)), answer
        self.answered = isinstance(answer, Refused)
        return answer

    def result(self) -> Built | Refused:
        answer = self._receive()
        assert isinstance(answer, (Built, Refused)), answer
        self.answered = True
        return answer

    def _receive(self) -> Any:
        try:
            return self.channel.recv()
        except (EOFError, OSError):
            from hub_vit.server.runtime.processes import exit_description

            code = self.process.wait()
            raise BuildFailed(exit_description(code)) from None

    def stop(self) -> None:
        """Wait for a child that answered to exit; end one still working (a stop signal reached serve while it
        builds) with SIGTERM, after which it removes its folder, or SIGKILL after CHILD_STOP_GRACE_S."""
        self.channel.close()
        if not self.answered and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(CHILD_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def repository_build(request: BuildRequest) -> Iterator[RepositoryBuild]:
    build = RepositoryBuild(request)
    try:
        yield build
    finally:
        build.stop()


def build(request: BuildRequest, loaded: Callable[[Loaded], None]) -> Built | Refused:
    """The child's work: load the model, tell `loaded`, write the repository; returns the last answer."""
    from hub_vit.cli.app import DISK_REFUSED_ERRNOS
    from hub_vit.cli.serve_screen import example_image
    from hub_vit.cli.serving_options import load_refusal
    from hub_vit.resolve import resolve_model
    from hub_vit.server.runtime.launcher import ServerError
    from hub_vit.server.serving import write_temporary_repository

    opts = request.options
    try:
        source = resolve_model(request.ref if request.ref is not None else request.model)
    except Exception as err:
        refusal = load_refusal(err, request.model)
        if refusal is None:
            raise
        return Refused(*refusal)
    loaded(Loaded(source.name, source.origin, builds_variants(source, opts), example_image(source.origin)))
    try:
        return Built(write_temporary_repository(source, opts, request.workdir))
    except (ServerError, ValueError) as err:  # a bad model
        return Refused(str(err), 2)
    except OSError as err:  # the temporary folder's disk refused the repository: named by write_temporary_repository
        if err.errno not in DISK_REFUSED_ERRNOS:
            raise
        return Refused(f"cannot write the Triton repository in the temporary folder {err.filename!r}: {err.strerror}; "
                       "make room there, or set TMPDIR to a folder on a disk with room", 1)


def builds_variants(source: ResolvedModel, opts: ServingOptions) -> bool:
    """Whether writing `source`'s repository builds, verifies and times the CPU flavour's variants: minutes for a
    compute-bound model (`cpu_variant.place`), which serve says so that the wait does not look like a hang."""
    from hub_vit.server.repository.writer import compute_bound_model

    return opts.flavour == "cpu" and opts.cpu_variant != "fp32" and source.module is not None \
        and compute_bound_model(source)


def _child(fd: int, parent: int) -> NoReturn:
    from hub_vit.server.runtime.processes import die_with_parent

    # SIGTERM from serve (passed on, or at its death), SIGHUP: clean up; a second one must not cut that short
    raise_on(STOP_SIGNALS, once=True)
    die_with_parent()
    code: Any = 0
    if os.getppid() == parent:  # else serve died before the line above: nobody waits for this build
        channel = Connection(fd)
        request, handed_over = None, False
        try:
            request = channel.recv()
            answer = build(request, channel.send)
            channel.send(answer)
            handed_over = isinstance(answer, Built)  # serve owns the repository now
        except KeyboardInterrupt:  # Ctrl-C reached the whole process group: serve says it stopped
            code = 128 + signal.SIGINT
        except SystemExit as stopped:
            code = stopped.code
        except BaseException as err:
            stop = _stop_behind(err)
            if stop is not None:  # the stop landed inside a library that wrapped it in its own error
                code = stop
            else:  # a bug: its traceback on serve's stderr, serve names the exit status
                traceback.print_exc()
                code = 1
        finally:  # whatever ended the build (a refusal, a stop, serve's death): nothing of it is left
            cleaning_up()  # Ctrl-C's SIGINT and serve's SIGTERM both come: the second must not cut this short
            if request is not None and not handed_over:
                from hub_vit.server.serving import remove_workdir

                remove_workdir(request.workdir)
    # without the interpreter's teardown: torch's takes seconds, and its atexit hooks have nothing to keep
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code if isinstance(code, int) else 1)


def _stop_behind(err: BaseException) -> int | None:
    """The exit status of a stop (Ctrl-C's KeyboardInterrupt, a stop signal's `StopRequested`) that `err` was raised
    on top of, else None: one landing inside torch.export is re-raised as torch's "Attempted to unset
    ProxyTorchDispatchMode" and then as torch.onnx's ConversionError, which is the stop, not a bug to print."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, KeyboardInterrupt):
            return 128 + signal.SIGINT
        if isinstance(cause, SystemExit) and isinstance(cause.code, int):
            return cause.code
        cause = cause.__cause__ or cause.__context__
    return None


if __name__ == "__main__":  # run by module name, so what it pickles names this module, not `__main__`
    from hub_vit.cli.serve_build import _child as child

    child(int(sys.argv[1]), int(sys.argv[2]))
