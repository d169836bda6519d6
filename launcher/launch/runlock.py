"""One `llmtrain run` per run directory: an exclusive lock held for the run's whole life.

The lock is ``flock(LOCK_EX)`` on ``RunDir.lock`` (``.llmtrain.lock``), which also records its
holder (pid, host, start time, command) as JSON. The kernel releases a flock when every process
holding the open file is gone, whatever way it died, so a lock can never outlive its holder; the
launcher hands the lock's file to torchrun (or to a one-process run's rank, which keeps it from the
processes it starts: ``launcher.runfiles.keep_lock_from_children``), which therefore keeps it held
while training processes run. What can be left behind is the *record* of a dead holder: the next run
says so ("pid P on this host is no longer running") and takes over. A second run while the first is
alive exits 2, naming the holder. (On NFS, Linux maps flock to byte-range locks held by the server.)

A SLURM job takes the same lock from its batch script (job.sbatch, ``launcher.render.sbatch``)
on the node that runs it, with flock(1), and holds it until the job ends; ``llmtrain run`` also
refuses a run directory whose slurm.json names a job SLURM still has queued or running.

The record also proves who the launcher is, for ``llmtrain cancel``, which signals only a process
proven to be this run's launcher (``why_not_launcher``): the process holding the flock (the kernel's
/proc/locks) must be the recorded pid, with the recorded start time (/proc/PID/stat, field 22,
clock ticks after boot) on the recorded boot (/proc/sys/kernel/random/boot_id), and must itself
hold the token of the record: the launcher keeps an anonymous file (memfd) named after it open for
the lock's life, which /proc/PID/fd shows. Any other process that takes the flock (``flock LOCK
sleep 1000``, a script), or a recorded pid reused by another process, is never signalled. And the
process must hold the run folder asked for: the launcher keeps its run directory open (O_DIRECTORY)
for the lock's life, and cancel looks for that folder (its device and inode) among /proc/PID/fd.
A lock file is one inode, so a copy of a run folder made with hard links (``cp -al``, ``rsync
--link-dest``) shares the live run's lock, its record and its holder: only the folder held open
tells the two folders apart (the record's ``dir_id`` says the same for `status`).

The lock protects nothing once its file is gone: deleted, a second run creates a new one and
takes it. So the holder hands the lock's identity (its inode and a random token also written in
the record, ``launcher.runfiles.LOCK_ENV``) to every rank, and each rank checks it before every
checkpoint (``launcher.runfiles.lock_problem``): deleted, replaced or rewritten, the run stops
with that error before writing anything more.
"""

from __future__ import annotations

import contextlib
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

from launcher import bounded_read, file_lock, fsio, runfiles
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
    start = holder.get("start")
    if isinstance(start, int) and not isinstance(start, bool) and 0 <= start < 1 << 62:
        clean["start"] = start
    for key in ("host", "command", "token", "boot", "dir_id"):
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


def read_record(lock: Path) -> dict[str, Any]:
    """The lock file's record (bounded, never blocking or through a link; fields checked as
    ``_read_holder`` does), {} when it cannot be read."""
    try:
        fd = bounded_read.open_regular(lock)
    except (OSError, ValueError):
        return {}
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


def process_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks after boot (/proc/PID/stat field 22; proc(5)),
    or None when it cannot be read (gone, not Linux)."""
    try:
        data = bounded_read.read_regular(Path(f"/proc/{pid}/stat"), 4096, follow_symlinks=True)
    except (OSError, ValueError):
        return None
    # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses; fields restart after
    # the last ")", where field 3 (state) is index 0, so field 22 is index 19.
    fields = data.rpartition(b")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    """This boot's id (/proc/sys/kernel/random/boot_id): start times count from this boot."""
    try:
        data = bounded_read.read_regular(
            Path("/proc/sys/kernel/random/boot_id"), 256, follow_symlinks=True
        )
    except (OSError, ValueError):
        return None
    return data.decode("ascii", "replace").strip() or None


_PROOF_PREFIX = "llmtrain-lock-"


def _token_proof(token: str) -> int | None:
    """An anonymous file named after `token`, held open by the lock's holder (memfd_create(2));
    /proc/PID/fd of the holder shows it as "/memfd:llmtrain-lock-TOKEN (deleted)"."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd: int = create(_PROOF_PREFIX + token, getattr(os, "MFD_CLOEXEC", 1))
    except OSError:
        return None
    return fd


def holds_token(pid: int, token: str) -> bool:
    """Whether process `pid` holds the token proof of `token` open (its /proc/PID/fd)."""
    wanted = f"/memfd:{_PROOF_PREFIX}{token} (deleted)"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                return True
    return False


def folder_id(folder: Path) -> str | None:
    """ "DEVICE:INODE" of the folder `folder` (followed if a link), None when it cannot be read."""
    try:
        info = os.stat(folder)
    except OSError:
        return None
    return f"{info.st_dev}:{info.st_ino}"


def holds_folder(pid: int, folder: Path) -> bool:
    """Whether process `pid` holds the folder `folder` open (one of /proc/PID/fd is it)."""
    wanted = folder_id(folder)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if folder_id(Path(f"/proc/{pid}/fd/{fd}")) == wanted and os.path.isdir(
                f"/proc/{pid}/fd/{fd}"
            ):
                return True
    return False


def _shared_lock_note(folder: Path) -> str:
    try:
        links = os.lstat(RunDir(folder).lock).st_nlink
    except OSError:
        return ""
    if links < 2:
        return ""
    return (
        f"; its lock file has {links} hard links, so it is shared with another folder (a copy "
        "made with cp -al or rsync --link-dest?)"
    )


def why_not_launcher(pid: int, record: dict[str, Any], folder: Path) -> str | None:
    """None when process `pid`, which holds the run's flock, is proven to be the launcher the
    lock's `record` names, training in `folder` (see the module docstring), else why not."""
    if record.get("pid") != pid:
        recorded = record.get("pid")
        return f"the lock's record names pid {recorded if recorded else '(none)'}, not {pid}"
    if record.get("host") != socket.gethostname():
        return "the lock's record names another host"
    if "start" not in record or "token" not in record:
        return "the lock's record has no start time and token (written by another program?)"
    here = boot_id()
    if here is None or record.get("boot") != here:
        return "the lock's record is from another boot of this machine"
    if process_start(pid) != record["start"]:
        return f"pid {pid} started at another time than the recorded launcher (a reused pid)"
    if not holds_token(pid, record["token"]):
        return f"pid {pid} does not hold the token of the lock's record"
    if not holds_folder(pid, folder):
        return (
            f"pid {pid} is not training in {folder}: it does not hold that folder open"
            + _shared_lock_note(folder)
        )
    return None


@dataclass
class RunLock:
    path: Path
    fd: int
    note: str | None = None
    token: str = ""
    inode: int = 0
    # The token's proof (``_token_proof``), open for the lock's life.
    proof_fd: int | None = None
    # The run directory, open for the lock's life: what proves to `cancel` which folder this
    # process trains in (``holds_folder``).
    dir_fd: int | None = None

    def identity_env(self) -> dict[str, str]:
        """What the ranks need to check, before each checkpoint, that this lock is still the
        run directory's (launcher.runfiles.lock_problem)."""
        return {runfiles.LOCK_ENV: f"{self.inode}:{self.token}"}

    def release(self) -> None:
        for fd in (self.proof_fd, self.dir_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.proof_fd = self.dir_fd = None
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        file_lock.unlock(self.fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _open_folder(folder: Path) -> int | None:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def acquire(run_dir: Path) -> RunLock:
    """Take the run directory's lock or raise RunDirLocked naming its holder (never waits)."""
    path = RunDir(Path(run_dir)).lock
    fd = file_lock.open_lock_file(path, "the run directory's lock")
    if not file_lock.try_lock(fd):
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
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": time.time(),
        # Who the launcher is, for `llmtrain cancel` (why_not_launcher).
        "start": process_start(os.getpid()),
        "boot": boot_id(),
        # The subcommand and folder only: overrides may carry a secret's value.
        "command": f"llmtrain {sys.argv[1] if len(sys.argv) > 1 else ''}".strip(),
        "cwd": os.getcwd(),
        "token": token,
        # The folder this lock was taken for (a hard-linked copy's lock names the original).
        "dir": str(Path(run_dir).resolve()),
        "dir_id": folder_id(Path(run_dir)),
    }
    lock = RunLock(
        path=path,
        fd=fd,
        note=note,
        token=token,
        inode=os.fstat(fd).st_ino,
        proof_fd=_token_proof(token),
        dir_fd=_open_folder(Path(run_dir)),
    )
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
