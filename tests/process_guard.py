"""Unit tests start no process: while one runs, every way this interpreter starts a child
(subprocess, multiprocessing, `os.fork`, `os.forkpty`, `os.system`, `os.posix_spawn*`) raises
`ProcessStarted` and is recorded, and the test fails (tests/conftest.py). A test that needs a
process is marked integration instead."""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

# The functions through which CPython 3.11 starts a child process on Linux: subprocess.Popen
# calls the fork_exec it imported as subprocess._fork_exec (or os.posix_spawn), multiprocessing's
# spawn and forkserver call _posixsubprocess.fork_exec; fork (multiprocessing's "fork" context,
# pty.fork) and os.system start one directly.
SPAWNERS: tuple[tuple[Any, str], ...] = (
    (subprocess, "_fork_exec"),
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "system"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
)


class ProcessStarted(BaseException):
    """A unit test tried to start a process. A BaseException, so that code under test catching
    Exception (or OSError, as for a missing executable) cannot hide it."""


@contextlib.contextmanager
def no_processes(nodeid: str) -> Iterator[list[str]]:
    """Within: starting a process raises ProcessStarted; yields the list of attempts (what was
    called), which the caller checks afterwards in case the exception was swallowed."""
    attempts: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for owner, name in SPAWNERS:
            if hasattr(owner, name):
                patch.setattr(owner, name, _refusal(nodeid, owner.__name__, name, attempts))
        yield attempts


def _refusal(nodeid: str, module: str, name: str, attempts: list[str]) -> Any:
    what = f"{module}.{name}"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(what)
        raise ProcessStarted(
            f"{nodeid} is marked unit but started a process ({what}): make it in-process "
            "(tests/cli.py invoke) or mark the test integration"
        )

    # Named as what it stands in for: pickle (which stores a function by module and name, as a
    # test of hostile checkpoint payloads does with os.system) finds it there and stores that.
    refuse.__module__, refuse.__name__, refuse.__qualname__ = module, name, name
    refuse.refuses_processes = True  # type: ignore[attr-defined]
    return refuse
