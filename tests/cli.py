"""The command line as tests call it: one helper in this process, one in a child process.

`invoke` runs the console entry point (`launcher.cli.entry`, what `llmtrain` and `python -m
launcher` run) in the test's own process: the exit code, stdout and stderr come back as a user
sees them (a user error: exit 2 and one message; an escaping exception: exit 1 and its traceback
on stderr), with sys.argv, the working directory and the environment restored afterwards: no
interpreter start, no process, so unit tests can use it (integration tests too, for the commands
around a run: export, sample, status, logs).

`llmtrain` runs `python -m launcher` in a child process, for what needs one: torchrun and the
ranks, signals, a terminal, a check of what a fresh interpreter imports.

Both return a `subprocess.CompletedProcess[str]` (args, returncode, stdout, stderr); `said` and
`shown` give what a user sees of one. A test that drives the child while it runs (signals, its
output read as it comes, a pseudo-terminal) starts it with `start` (a `subprocess.Popen`), or
takes the command line itself from `command`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# A child command that hangs fails its test instead of the whole session: 10 minutes is over
# any single command of the suite (the longest, a 40-step SFT run, takes ~40 s here).
CHILD_TIMEOUT_S = 600


def command(*args: str) -> list[str]:
    """`python -m launcher ARGS` with this interpreter, as an argument list."""
    return [sys.executable, "-m", "launcher", *args]


def _changed(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """This process's environment changed by `env` (None removes a key)."""
    environment = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    return environment


def llmtrain(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout: float = CHILD_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """`python -m launcher ARGS` in a child process, with this process's environment changed
    by `env` (None removes a key)."""
    return subprocess.run(
        command(*args),
        cwd=cwd,
        env=_changed(env),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
    )


def start(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
    stdin: Any = None,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """`python -m launcher ARGS` started in a child process the test drives while it runs
    (signals, output read as it comes): stdout and stderr piped as text unless given (a file,
    subprocess.DEVNULL, a terminal's fd), the environment changed by `env` as in `llmtrain`."""
    return subprocess.Popen(
        command(*args),
        cwd=cwd,
        env=_changed(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=True,
    )


@contextlib.contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """os.environ with `changes` applied (None removes a key), restored afterwards."""
    saved = {key: os.environ.get(key) for key in changes}
    try:
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Hung(BaseException):
    """The command ran past `invoke`'s timeout (a BaseException: the command cannot catch it)."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Hung raised in this (main) thread after `seconds`, through SIGALRM; None: no limit."""
    if seconds is None:
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise Hung(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Typer builds the click command from the app on every call (twice per `entry`: its hint, then
# the call), ~10-25 ms each; the test process builds it once and reuses it, as a test's own
# CliRunner on a prebuilt command did.
_BUILT: dict[int, Any] = {}


@contextlib.contextmanager
def _command_built_once() -> Iterator[None]:
    import typer.main

    build = typer.main.get_command

    def built(app: Any) -> Any:
        if id(app) not in _BUILT:
            _BUILT[id(app)] = (app, build(app))  # the app kept alive: its id stays its own
        return _BUILT[id(app)][1]

    typer.main.get_command = built
    try:
        yield
    finally:
        typer.main.get_command = build


def invoke(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """The console entry point with ARGS in this process (see the module docstring); `env`
    changes the environment for the call only (None removes a key). With `timeout`, a command
    still running after that many seconds is stopped: exit 124, its traceback on stderr (where
    `llmtrain` raises subprocess.TimeoutExpired)."""
    from typer.testing import CliRunner

    from launcher import cli

    code = 0
    argv = sys.argv
    with (
        CliRunner().isolation() as (out, err, _),
        contextlib.chdir(cwd or os.getcwd()),
        _environment(env or {}),
        _command_built_once(),
    ):
        sys.argv = ["llmtrain", *args]
        try:
            with _deadline(timeout):
                cli.entry()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Hung:
            traceback.print_exc()
            code = 124
        except Exception:
            traceback.print_exc()
            code = 1
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        stdout = out.getvalue().decode("utf-8", "replace")
        stderr = err.getvalue().decode("utf-8", "replace")
    return subprocess.CompletedProcess(["llmtrain", *args], code, stdout, stderr)


def said(done: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    """(exit code, stdout + stderr) of a command."""
    return done.returncode, shown(done)


def shown(done: subprocess.CompletedProcess[str]) -> str:
    """What a command printed, stdout then stderr (both on a user's terminal)."""
    return done.stdout + done.stderr
