"""One `llmtrain run` per run directory: an exclusive lock held for the run's whole life.

The lock is ``flock(LOCK_EX)`` on ``RunDir.lock`` (``.llmtrain.lock``), which also records its
holder (pid, host, start time, command) as JSON. The kernel releases a flock when every process
holding the open file is gone, whatever way it died, so a lock can never outlive its holder; the
launcher hands the lock's file to torchrun, which therefore keeps it held while training processes
run. What can be left behind is the *record* of a dead holder: the next run says so ("pid P on
this host is no longer running") and takes over. A second run while the first is alive exits 2,
naming the holder. (On NFS, Linux maps flock to byte-range locks held by the server.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import fsio
from launcher.errors import UserError
from launcher.rundir import RunDir


class RunDirLocked(UserError):
    """Another llmtrain holds the run directory. Exit code 2."""


def _holder_text(holder: dict[str, Any]) -> str:
    started = holder.get("time")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {when})"


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 65536)
        holder = json.loads(data) if data.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_note(holder: dict[str, Any]) -> str | None:
    """What to say about a recorded holder whose lock was free (it died without cleaning up)."""
    if not holder:
        return None
    host, pid = holder.get("host"), holder.get("pid")
    here = socket.gethostname()
    if host == here and isinstance(pid, int):
        state = "still exists (a reused pid?)" if _pid_alive(pid) else "is no longer running"
        return (
            f"the previous run in this directory ({_holder_text(holder)}) ended without releasing "
            f"its lock record; pid {pid} {state}, so its lock was free; taking over"
        )
    return (
        f"the previous run in this directory ({_holder_text(holder)}) left its lock record; its "
        "lock is free (that process is gone), so taking over"
    )


@dataclass
class RunLock:
    path: Path
    fd: int
    note: str | None = None

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def acquire(run_dir: Path) -> RunLock:
    """Take the run directory's lock or raise RunDirLocked naming its holder (never waits)."""
    path = RunDir(Path(run_dir)).lock
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(
                f"{path} is a symbolic link; remove it (llmtrain never follows it)"
            ) from None
        raise UserError(f"cannot open the run directory's lock {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        command = holder.get("command")
        raise RunDirLocked(
            f"run directory {run_dir} is in use by another llmtrain run: "
            f"{_holder_text(holder)}" + (f", `{command}`" if command else "") + "; wait for it to "
            "finish, stop it (llmtrain forwards SIGTERM: it checkpoints and exits), or start a "
            "separate run with --fresh or run.name=OTHER"
        ) from None
    note = stale_note(_read_holder(fd))
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": time.time(),
        # The subcommand and folder only: overrides may carry a secret's value.
        "command": f"llmtrain {sys.argv[1] if len(sys.argv) > 1 else ''}".strip(),
        "cwd": os.getcwd(),
    }
    lock = RunLock(path=path, fd=fd, note=note)
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    except OSError as exc:  # a full disk: say so (the lock itself is held, and is released)
        lock.release()
        raise UserError(
            fsio.describe_write_error(exc, path) or f"cannot write {path}: {exc.strerror}"
        ) from None
    return lock


@contextlib.contextmanager
def holding(run_dir: Path) -> Iterator[RunLock]:
    lock = acquire(run_dir)
    try:
        yield lock
    finally:
        lock.release()
