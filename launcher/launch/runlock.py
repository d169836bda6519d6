"""One `llmtrain run` per run directory: an exclusive lock held for the run's whole life.

The lock is ``flock(LOCK_EX)`` on ``RunDir.lock`` (``.llmtrain.lock``), which also records its
holder (pid, host, start time, command) as JSON. The kernel releases a flock when every process
holding the open file is gone, whatever way it died, so a lock can never outlive its holder; the
launcher hands the lock's file to torchrun, which therefore keeps it held while training processes
run. What can be left behind is the *record* of a dead holder: the next run says so ("pid P on
this host is no longer running") and takes over. A second run while the first is alive exits 2,
naming the holder. (On NFS, Linux maps flock to byte-range locks held by the server.)

A SLURM job takes the same lock from its batch script (job.sbatch, ``launcher.render.sbatch``)
on the node that runs it, with flock(1), and holds it until the job ends; ``llmtrain run`` also
refuses a run directory whose slurm.json names a job SLURM still has queued or running.

The lock protects nothing once its file is gone: deleted, a second run creates a new one and
takes it. So the holder hands the lock's identity (its inode and a random token also written in
the record, ``launcher.runfiles.LOCK_ENV``) to every rank, and each rank checks it before every
checkpoint (``launcher.runfiles.lock_problem``): deleted, replaced or rewritten, the run stops
with that error before writing anything more.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import fsio, runfiles
from launcher.errors import UserError
from launcher.rundir import RunDir


class RunDirLocked(UserError):
    """Another llmtrain holds the run directory. Exit code 2."""


def _holder_text(holder: dict[str, Any]) -> str:
    started = holder.get("time")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {when})"
    job = holder.get("slurm_job")
    return f"SLURM job {job} (batch script {who})" if job else who


_PRINTABLE = re.compile(r"[ -~]{1,255}")


def _read_holder(fd: int) -> dict[str, Any]:
    """The lock's record, read back bounded (launcher.runfiles) and with every field checked: a
    damaged or hostile record shows as '?' fields, never a crash or its raw text."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 65536)
        holder = runfiles.loads(data, max_bytes=65536, max_depth=4) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(holder, dict):
        return {}
    clean: dict[str, Any] = {}
    pid, started = holder.get("pid"), holder.get("time")
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 31:
        clean["pid"] = pid
    if isinstance(started, int | float) and not isinstance(started, bool) and 0 < started < 1e11:
        clean["time"] = float(started)
    for key in ("host", "command", "token"):
        value = holder.get(key)
        if isinstance(value, str) and _PRINTABLE.fullmatch(value):
            clean[key] = value
    job = holder.get("slurm_job")
    if isinstance(job, str) and runfiles.is_job_id(job):
        clean["slurm_job"] = job
    return clean


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
    token: str = ""
    inode: int = 0

    def identity_env(self) -> dict[str, str]:
        """What the ranks need to check, before each checkpoint, that this lock is still the
        run directory's (launcher.runfiles.lock_problem)."""
        return {runfiles.LOCK_ENV: f"{self.inode}:{self.token}"}

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
    token = secrets.token_hex(8)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": time.time(),
        # The subcommand and folder only: overrides may carry a secret's value.
        "command": f"llmtrain {sys.argv[1] if len(sys.argv) > 1 else ''}".strip(),
        "cwd": os.getcwd(),
        "token": token,
    }
    lock = RunLock(path=path, fd=fd, note=note, token=token, inode=os.fstat(fd).st_ino)
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
