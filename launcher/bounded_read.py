"""The one reader for files llmtrain reads back: regular files only, never blocking, bounded.

Every file the CLI reads that someone else may have made (run files: config.yaml, slurm.json,
metrics.jsonl, the lock's record, rank error reports; operator profiles; a model's config.json;
output markers) goes through ``read_regular``:

- opened with O_NONBLOCK (a FIFO put in a file's place would otherwise block the open, and every
  command reading it, forever) and, for files inside a run directory, O_NOFOLLOW;
- then ``fstat`` of the open descriptor (not of the name, which may change meanwhile): anything
  but a regular file (a FIFO, /dev/zero, a socket, a folder) is refused;
- at most ``max_bytes`` read: a larger file is refused from its size before anything is read (a
  sparse 100 MB file costs nothing), and a file that grows while it is read is cut at the bound.

A refusal is ``FileRefused`` (a ValueError) whose message says what the file is and why it was not
read, never what it holds; a missing or unreadable file is the OSError the system gave (callers
tell "absent" from "refused"). ``read_json`` adds a nesting bound checked before the parser runs.

A file read line by line (a user's JSON Lines records, ``lines``) is opened the same way and each
line is bounded: a line longer than the bound is ``LineTooLong`` once that many bytes are read,
never read whole (a 200 MB line costs the bound, not 200 MB).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class FileRefused(ValueError):
    """A file that is not read: not a regular file, a symbolic link where none is allowed, or
    larger than the bound. The message says which, never what it holds."""


def kind(mode: int) -> str:
    """What a file of `mode` is, in words ("a FIFO (named pipe)", "a folder", ...)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def not_regular(path: Path) -> str | None:
    """Why `path` (followed through links) is there but is no regular file ("is a FIFO (named
    pipe), not a regular file"); None when it is a regular file or is not there. Only stat(2):
    nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else f"is {kind(mode)}, not a regular file"


def open_regular(path: Path, *, follow_symlinks: bool = False) -> int:
    """A blocking read-only descriptor of the regular file `path`, opened without blocking
    (O_NONBLOCK, cleared once the file is known to be regular). FileRefused for a symbolic link
    (unless `follow_symlinks`) or anything not a regular file; OSError when it is missing or
    cannot be opened."""
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow_symlinks else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise FileRefused(
                "is a symbolic link (llmtrain does not read this file through one)"
            ) from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing
            raise FileRefused("is not a regular file (a socket or FIFO)") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(f"is {kind(mode)}, not a regular file")
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, max_bytes: int, *, follow_symlinks: bool = False) -> bytes:
    """At most `max_bytes` of the regular file `path` (see the module docstring)."""
    fd = open_regular(path, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise FileRefused(f"is larger than {max_bytes:,} bytes ({size:,} bytes)")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileRefused(f"is larger than {max_bytes:,} bytes (it grew while it was read)")
    return data


class LineTooLong(FileRefused):
    """A line longer than the bound; `number` is its line number (from 1)."""

    def __init__(self, number: int, max_bytes: int):
        super().__init__(f"line {number} is longer than {max_bytes:,} bytes")
        self.number = number
        self.max_bytes = max_bytes


def lines(
    path: Path, max_line_bytes: int, *, follow_symlinks: bool = True
) -> Iterator[tuple[int, bytes]]:
    """(number, line) of each line of the regular file `path` (numbered from 1, the line end
    kept), none longer than `max_line_bytes` bytes before its end: LineTooLong, raised once
    that many bytes of it are read."""
    fd = open_regular(path, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb", buffering=1 << 20) as f:
        number = 0
        while True:
            line = f.readline(max_line_bytes + 1)
            if not line:
                return
            number += 1
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                raise LineTooLong(number, max_line_bytes)
            yield number, line


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON `text` (strings skipped)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub('""', text))
    if not brackets:
        return 0
    return max(accumulate(1 if ch in "[{" else -1 for ch in brackets))


def loads_json(data: bytes, *, max_depth: int) -> Any:
    """JSON from `data` (UTF-8), nested at most `max_depth` deep; FileRefused otherwise (the
    message names the problem and the line, never the content)."""
    import json

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(f"is not UTF-8 text (byte {exc.start})") from None
    found = json_depth(text)
    if found > max_depth:
        raise FileRefused(f"is JSON nested {found} levels deep (at most {max_depth})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileRefused(f"is not JSON ({exc.msg}, line {exc.lineno})") from None
    except (ValueError, RecursionError):
        raise FileRefused("is not JSON") from None


def read_json(
    path: Path, *, max_bytes: int, max_depth: int = 32, follow_symlinks: bool = False
) -> Any:
    """A JSON document from `path`, bounded in bytes and nesting (FileRefused otherwise)."""
    return loads_json(
        read_regular(path, max_bytes, follow_symlinks=follow_symlinks), max_depth=max_depth
    )
