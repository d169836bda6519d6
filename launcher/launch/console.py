"""What `llmtrain run` shows on its terminal while the ranks train: rank 0's log as it grows.

The ranks never write to the terminal (``launcher.train.reporting.rank_log``): rank 0 writes its log
file and this module copies each new line to the screen, without the file's ``HH:MM:SS rank0``
prefix. So a terminal that closes, or a pipe whose reader went away (``llmtrain run | head``),
can only stop the copying, never the training: the first failed write turns the screen off and
points stdout at /dev/null (so that Python's own flush at exit cannot fail either), and the log
files keep everything. A stalled terminal cannot slow the ranks down: nothing waits on it but
this copy.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

# "12:04:31 rank0 " at the start of a line of rank 0's log (launcher.train.reporting.rank_log).
_PREFIX = re.compile(r"^\d\d:\d\d:\d\d rank\d+ ")
# Errors are the launcher's to report (from the rank's error file), once.
_OFF_SCREEN = "ERROR: "
_CHUNK = 1 << 20


def screen_text(line: str) -> str | None:
    """A log line as the screen shows it: without its time and rank; None for a line the
    launcher reports itself (an ``ERROR:`` line)."""
    text = _PREFIX.sub("", line, count=1)
    return None if text.startswith(_OFF_SCREEN) else text


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null: what Python's docs advise after a BrokenPipeError,
    so that the interpreter's flush at exit does not fail (exit 120) on the closed pipe."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class Follow:
    """Copies the lines appended to `paths` (from their size when this object was made) to
    `stream`; writes that fail (EPIPE, EIO after a hang-up) switch the copy off for good."""

    def __init__(
        self,
        paths: list[Path],
        stream: TextIO | None,
        *,
        read: Callable[[Path, int], bytes] | None = None,
    ):
        self.paths = paths
        self.stream = stream
        self.read = read or _read_from
        self.offsets = {path: _size(path) for path in paths}
        self.partial = {path: b"" for path in paths}

    @property
    def on(self) -> bool:
        return self.stream is not None

    def pump(self) -> None:
        """Copy whole new lines (a line still being written waits for its end)."""
        for path in self.paths:
            data = self.read(path, self.offsets[path])
            if not data:
                continue
            self.offsets[path] += len(data)
            data = self.partial[path] + data
            complete, _, self.partial[path] = data.rpartition(b"\n")
            if complete:
                self._show(complete.decode("utf-8", "replace").split("\n"))

    def finish(self) -> None:
        """The last lines, a final unterminated one included."""
        self.pump()
        for path in self.paths:
            rest, self.partial[path] = self.partial[path], b""
            if rest:
                self._show([rest.decode("utf-8", "replace")])

    def say(self, text: str) -> None:
        """A line of the launcher's own (a stop notice), on a line of its own (a terminal has
        just echoed ^C where its cursor was)."""
        fresh = "\n" if self.stream is not None and _isatty(self.stream) else ""
        self._write(fresh + text.rstrip("\n") + "\n")

    def _show(self, lines: list[str]) -> None:
        shown = [text for text in map(screen_text, lines) if text is not None]
        if shown:
            self._write("\n".join(shown) + "\n")

    def _write(self, text: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # EPIPE (reader gone), EIO (terminal hung up), closed
            if self.stream is sys.stdout:
                silence_stdout()
            self.stream = None


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> bytes:
    """At most 1 MiB of `path` from `offset`, never through a symbolic link nor from anything
    but a regular file (a FIFO planted there is never waited on); b'' when it is missing or
    unreadable (the ranks have not created it yet)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        f.seek(offset)
        return f.read(_CHUNK)
