"""A run's logs read back and followed, for `llmtrain logs` of a local run and of a SLURM job
alike: never through a symbolic link inside the run directory, never blocking on a FIFO, and from
at most the last LOG_TAIL_BYTES of a local run's log."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from launcher.errors import UserError
from launcher.rundir import RunDir

# `logs` shows at most the last LOG_TAIL_BYTES of each log of a local run (a note says what was
# left out and where the whole log is): a 100 GB log, or a sparse file in a log's place, is never
# read whole.
LOG_TAIL_BYTES = 8 << 20


def read_log(path: Path, run_dir: Path | None, offset: int = 0) -> bytes | None:
    """A log's bytes from `offset` (None when it does not exist). A log inside the run directory
    is never read through a symbolic link (UserError, exit 2): its content is not the run's."""
    inside = run_dir is not None and Path(path).parent == RunDir(run_dir).logs
    # O_NONBLOCK: a FIFO in a log's place is refused below instead of blocking the open.
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_NOFOLLOW if inside else 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(
                f"{path} is a symbolic link inside the run directory; llmtrain does not read run "
                "logs through links (remove it)"
            ) from None
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a regular file; remove it")
    with os.fdopen(fd, "rb") as f:
        os.set_blocking(f.fileno(), True)
        f.seek(offset)
        return f.read()


def tail_start(path: Path) -> int:
    """Where to start showing `path`: its last LOG_TAIL_BYTES."""
    try:
        size = os.lstat(path).st_size
    except OSError:
        return 0
    return max(0, size - LOG_TAIL_BYTES)


def skipped(path: Path, start: int) -> bytes:
    """The note standing for the first `start` bytes of `path` that are not shown."""
    return (
        f"[llmtrain: the first {start:,} bytes of {path} are not shown; the whole log is "
        "there]\n".encode()
        if start
        else b""
    )


def log_texts(
    files: list[Path], run_dir: Path | None, *, tail: bool
) -> list[tuple[Path, bytes | None]]:
    """(path, its text or None when absent) of each log; with `tail`, the end of each (its last
    LOG_TAIL_BYTES, after the note saying what was left out)."""
    texts = []
    for path in files:
        start = tail_start(path) if tail else 0
        data = read_log(path, run_dir, start)
        texts.append((path, None if data is None else skipped(path, start) + data))
    return texts


def follow_logs(
    files: Callable[[], list[Path]],
    run_dir: Path | None,
    write: Callable[[str], None],
    *,
    follow: bool,
    going: Callable[[], bool],
    tail: bool,
    poll_s: float = 0.5,
) -> None:
    """Print each log of `files()` (asked again each round: a job's logs appear when it starts);
    with `follow`, what they gain until `going()` turns false, and then what they gained last.
    With `tail`, each log from its last LOG_TAIL_BYTES."""
    offsets: dict[Path, int] = {}
    for path in files() if tail else []:
        start = tail_start(path)
        if start:
            offsets[path] = start
            write(skipped(path, start).decode())

    def drain() -> None:
        for path in files():
            data = read_log(path, run_dir, offsets.get(path, 0))
            if data:
                offsets[path] = offsets.get(path, 0) + len(data)
                write(data.decode("utf-8", "replace"))

    drain()
    while follow and going():
        time.sleep(poll_s)
        drain()
    if follow:
        drain()
