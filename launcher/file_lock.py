"""flock(2) on a lock file: the one implementation behind the run directory's lock
(``launcher.launch.runlock``, which refuses at once) and the built-in datasets' (``prepared_once``
in ``launcher.data.builtin_corpus``, which waits for the process preparing them).

An exclusive flock belongs to the open file: the kernel releases it when the last descriptor of
that file is closed, whatever way the holder died (kill -9 included), so a lock never outlives its
holder. A lock file is never opened through a symbolic link (O_NOFOLLOW), and its descriptor is
not inherited across exec unless the caller hands it on on purpose.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import UserError

# How often a waiting process tries the lock again: a tenth of a second is unnoticeable beside a
# dataset preparation (seconds) and costs nothing to poll.
POLL_S = 0.1


def open_lock_file(path: Path, what: str = "the lock") -> int:
    """A descriptor of `path` to flock (created mode 0644 when missing, close-on-exec); a
    UserError naming `what` and `path` when it cannot be opened, a symbolic link included."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(
                f"{path} is a symbolic link; remove it (llmtrain never follows it)"
            ) from None
        raise UserError(f"cannot open {what} {path}: {exc.strerror}") from None


def try_lock(fd: int) -> bool:
    """Take the exclusive flock of `fd` without waiting; False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    """Release the flock of `fd` (closing the last descriptor of its file does that too)."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def waiting(path: Path, timeout_s: float, *, busy: str) -> Iterator[int]:
    """Hold the exclusive flock of `path` for the block, first waiting up to `timeout_s` for
    another holder; past that a TimeoutError naming `path` and `busy` (who holds it, what to do)."""
    fd = open_lock_file(path)
    try:
        deadline = time.monotonic() + timeout_s
        while not try_lock(fd):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {path}; {busy}")
            time.sleep(POLL_S)
        try:
            yield fd
        finally:
            unlock(fd)
    finally:
        os.close(fd)
