"""Reading back what a run directory holds: bounded in size and nesting, never through a symlink.

A run directory is a folder anyone with write access to it may have edited (or a damaged disk may
have cut short), so every JSON document llmtrain reads back from it (slurm.json, the lock's
record, preempted.json, rank error reports, the last line of metrics.jsonl) goes through
``read_json``/``loads``: at most ``max_bytes`` read, nesting deeper than ``max_depth`` refused
before the parser sees it (a 3 MB ``[[[[...`` would otherwise raise RecursionError), and any
failure is one ``RunFileError`` (a ValueError) that callers turn into a clear message. Files are
opened through ``launcher.bounded_read``: never blocking (a FIFO in a run file's place is refused,
not waited on), regular files only. Values taken from such a document that reach a command line
are checked by their own rule (``job_id``: SLURM job ids are digits, with ``_`` for array tasks),
so a value like ``--me`` can never become an option of scancel.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.excerpt import excerpt

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
# A SLURM job id as llmtrain records and passes it: digits, or ARRAYJOB_TASK for an array task.
_JOB_ID = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,20})?")


class RunFileError(bounded_read.FileRefused):
    """A run file that is too large, too deeply nested, not JSON, not a regular file (a FIFO, a
    device, a folder), a symbolic link, or not what it should hold (a ValueError)."""


depth = bounded_read.json_depth


def loads(data: bytes | str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads with a size and a nesting bound; RunFileError for anything else."""
    if len(data) > max_bytes:
        raise RunFileError(f"larger than {max_bytes} bytes")
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    found = depth(text)
    if found > max_depth:
        raise RunFileError(f"nested {found} levels deep (at most {max_depth})")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RunFileError(f"not JSON ({str(exc)[:80]})") from None


def _open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file `path` (opened without blocking, never through
    a symbolic link: launcher.bounded_read); RunFileError for anything else; other OSErrors
    (missing, unreadable) propagate."""
    try:
        return bounded_read.open_regular(path)
    except bounded_read.FileRefused as exc:
        raise RunFileError(str(exc)) from None


def read_bytes(path: Path, max_bytes: int = MAX_BYTES) -> bytes:
    """At most `max_bytes` of the regular file `path` (RunFileError beyond, and for a FIFO, a
    device, a folder or a symbolic link at its name). Other OSErrors (missing, unreadable)
    propagate."""
    try:
        return bounded_read.read_regular(path, max_bytes)
    except RunFileError:
        raise
    except bounded_read.FileRefused as exc:
        raise RunFileError(str(exc)) from None


def read_json(path: Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    return loads(read_bytes(path, max_bytes), max_bytes=max_bytes, max_depth=max_depth)


def read_json_object(path: Path, *, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    document = read_json(path, max_bytes=max_bytes)
    if not isinstance(document, dict):
        raise RunFileError(f"a JSON {type(document).__name__}, not an object")
    return document


def last_line(path: Path, max_bytes: int = 65536) -> bytes:
    """The last complete line of `path` (at most `max_bytes` of it), never through a symlink."""
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - max_bytes))
        tail = f.read(max_bytes)
    lines = [line for line in tail.splitlines() if line.strip()]
    if not lines:
        return b""
    if size > max_bytes and len(lines) == 1 and len(tail) >= max_bytes:
        raise RunFileError(f"its last line is longer than {max_bytes} bytes")
    return lines[-1]


def job_id(value: object) -> str:
    """A SLURM job id read back from a file (or SLURM): digits, or NNN_MMM for an array task.
    RunFileError for anything else (an option such as ``--me``, spaces, a list)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RunFileError(f"job id {excerpt(value)} is not a string of digits")
    text = str(value)
    if not _JOB_ID.fullmatch(text):
        raise RunFileError(f"job id {excerpt(text)} is not digits (NNN or NNN_MMM)")
    return text


def is_job_id(text: str) -> bool:
    return _JOB_ID.fullmatch(text) is not None


# The run directory's lock as its holder took it, handed to every rank of the run:
# "INODE:TOKEN" (launcher.launch.runlock for `llmtrain run`, job.sbatch for a SLURM job). The
# device number is left out on purpose: on a shared file system each node may number the mount
# differently, while the inode and the token (also written into the lock's record) are the same.
LOCK_ENV = "LLMTRAIN_RUN_LOCK"


def keep_lock_from_children(identity: str | None) -> int | None:
    """In a rank that was handed the run directory's lock as an open file (a one-process
    `llmtrain run` starts the trainer itself and passes it, so the lock stays held while the rank
    lives): keep that file out of every process the rank starts. A forked child (a DataLoader or
    multiprocessing worker) would otherwise hold the flock after the rank and llmtrain died, and
    the folder would stay locked by a dead pid's record. Closing the child's copy releases nothing
    (a flock lasts while any descriptor of the open file does); an exec'd child gets no copy
    (close-on-exec). The descriptor is found by the lock's inode in `identity` (LOCK_ENV); returns
    it, or None where this process holds no such file (a rank under torchrun)."""
    ino_text = (identity or "").partition(":")[0]
    if not ino_text.isdigit():
        return None
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        fd = int(name)
        try:
            info = os.fstat(fd)
        except OSError:
            continue  # the listing's own descriptor, closed since
        if stat.S_ISREG(info.st_mode) and info.st_ino == int(ino_text):
            os.set_inheritable(fd, False)
            os.register_at_fork(after_in_child=functools.partial(_close_quietly, fd))
            return fd
    return None


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def lock_problem(lock: Path, identity: str | None) -> str | None:
    """Why the lock file at `lock` is no longer the one its holder took (`identity`, the value of
    LOCK_ENV), or None while it is. A deleted lock file lets another llmtrain take a new one and
    write into the same run directory: the holder checks this before each checkpoint and stops."""
    if not identity:
        return None
    ino_text, _, token = identity.partition(":")
    try:
        info = os.lstat(lock)
    except FileNotFoundError:
        return f"the run directory's lock {lock} was deleted while this run held it"
    except OSError as exc:
        return f"the run directory's lock {lock} cannot be checked: {exc.strerror}"
    if not ino_text.isdigit() or info.st_ino != int(ino_text):
        return (
            f"the run directory's lock {lock} was replaced by another file while this run held it"
        )
    try:
        holder = loads(read_bytes(lock, 65536), max_bytes=65536, max_depth=4)
    except (OSError, ValueError):
        holder = None
    if not isinstance(holder, dict) or holder.get("token") != token:
        return (
            f"the run directory's lock {lock} was rewritten by someone else while this run held it"
        )
    return None
