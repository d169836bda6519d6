"""The one place that writes run-directory files: atomically, durably, never through a symlink.

Every write into a run directory goes through here:

- ``write_atomic`` / ``write_text_atomic`` / ``write_json_atomic``: a temporary file in the same
  folder (created with O_CREAT|O_EXCL|O_NOFOLLOW), fsync'd, renamed over the target (rename
  replaces a symlink's directory entry, never its target), then the folder is fsync'd.
- ``open_append``: logs and metrics, opened with O_APPEND|O_NOFOLLOW.
- ``check_inside``: every folder between the run directory and the file is lstat'd; a symlink
  planted there is refused (``UnsafePathError``) instead of followed.
- ``sha256_file`` (opened with O_NOFOLLOW) and ``fsync_path``.
- ``describe_write_error``: disk full (ENOSPC, EDQUOT) and read-only (EROFS, EACCES, EPERM)
  errors said plainly, with the path and the free space left; ``disk_full_is_user_error`` makes a
  full disk inside a command's writing function (``data prepare``) that sentence, exit 2.

Fault injection (tests only): ``LLMTRAIN_FAULT_DISK_FULL=1`` makes every write through this
module fail with ENOSPC, as a full disk would; it is the test hook named as such, nothing else
reads it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import inspect
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar, cast

FAULT_DISK_FULL_ENV = "LLMTRAIN_FAULT_DISK_FULL"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafePathError(OSError):
    """A path inside a run directory is (or passes through) a symlink."""


def _inject_fault(path: Path) -> None:
    if os.environ.get(FAULT_DISK_FULL_ENV, "") not in ("", "0"):
        raise OSError(errno.ENOSPC, f"No space left on device ({FAULT_DISK_FULL_ENV})", str(path))


def check_inside(path: Path, root: Path | None) -> None:
    """Refuse `path` when any folder between `root` and it, or `path` itself, is a symlink.

    `root` itself may be a symlink (the user chose it); what lies inside it may not."""
    if root is None:
        return
    path, root = Path(path), Path(root)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise UnsafePathError(errno.EPERM, f"{path} is outside {root}", str(path)) from None
    current = root
    for part in rel.parts:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode):
            raise UnsafePathError(
                errno.ELOOP,
                f"{current} is a symbolic link inside the run directory {root}; llmtrain never "
                "writes through links there (remove it)",
                str(current),
            )


def remove_tree(path: Path) -> None:
    """Remove a folder (or a link or file in its place) without following links."""
    if os.path.islink(path) or not os.path.isdir(path):
        Path(path).unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a folder (its entries: a rename into it is durable after this)."""
    try:
        fsync_path(path)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):  # file systems without dir fsync
            raise


def write_atomic(path: Path, data: bytes, root: Path | None = None, mode: int = 0o644) -> None:
    """Replace `path` with `data`: all or nothing, durable, never following a symlink."""
    path = Path(path)
    check_inside(path.parent, root)
    _inject_fault(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str, root: Path | None = None, mode: int = 0o644) -> None:
    write_atomic(path, text.encode("utf-8"), root=root, mode=mode)


def write_json_atomic(path: Path, document: Any, root: Path | None = None) -> None:
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    write_atomic(path, text.encode("utf-8"), root=root)


def open_append(path: Path, root: Path | None = None, binary: bool = False) -> IO[Any]:
    """Open a log for appending; a symlink at `path` or above it (inside `root`) is refused, and
    so is anything but a regular file there (a FIFO, a device: opened without blocking, so a FIFO
    nobody reads never blocks the writer, and one somebody reads is refused by its kind)."""
    from launcher import bounded_read

    path = Path(path)
    check_inside(path, root)
    _inject_fault(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(
                errno.ELOOP,
                f"{path} is a symbolic link; llmtrain never writes through it",
                str(path),
            ) from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader (or a socket)
            raise UnsafePathError(
                errno.ENXIO, f"{path} is not a regular file (a FIFO or socket)", str(path)
            ) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePathError(
                errno.EINVAL, f"{path} is {bounded_read.kind(mode)}, not a regular file", str(path)
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    if binary:
        return os.fdopen(fd, "ab")
    return os.fdopen(fd, "a", encoding="utf-8")


def open_regular(path: Path) -> int:
    """A descriptor of the regular file `path`, opened without blocking and without following a
    symlink at its name (launcher.bounded_read); anything else is an UnsafePathError (an
    OSError, as callers of these readers expect)."""
    from launcher import bounded_read

    try:
        return bounded_read.open_regular(path)
    except bounded_read.FileRefused as exc:
        raise UnsafePathError(errno.EINVAL, f"{path} {exc}", str(path)) from None


def read_bytes(path: Path) -> bytes:
    """Read a regular file without following a symlink at its name (a FIFO or device there is
    refused, never waited on)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def free_bytes(path: Path) -> int | None:
    """Free space on the file system holding `path` (its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


# torch.save's zip writer (PyTorchStreamWriter, caffe2/serialize/inline_container.cc) reports a
# short write, what a full disk or quota gives it, as a RuntimeError "... unexpected pos N vs M";
# torch.distributed.checkpoint passes it on to every rank inside its own exception.
_SHORT_WRITE = "unexpected pos"
# Its other write failures ("basic_ios::clear: iostream error", "file write failed") name no
# cause: they count as a full disk only when the file system is in fact nearly full.
_WRITER_IO_ERRORS = ("iostream error", "file write failed")
# Free space below which a failed write is put down to a full disk: by the ranks (a torch writer's
# error with no errno) and by the launcher (a rank that died without an error report, because
# the disk had no room left even for that). One threshold, so the two agree.
LOW_SPACE_BYTES = 64 << 20


def low_on_space(path: Path, need: int = 0) -> bool:
    """The file system holding `path` has less than max(LOW_SPACE_BYTES, need) bytes free."""
    free = free_bytes(path)
    return free is not None and free < max(LOW_SPACE_BYTES, need)


def disk_full_error(exc: BaseException, path: Path) -> OSError | None:
    """`exc` as the OSError(ENOSPC) it stands for when it is a disk-full write error (an errno
    ENOSPC/EDQUOT, torch's short write, or another torch writer I/O error on a nearly full disk),
    else None. Raise the result outside the `except` block that caught `exc`: its traceback holds
    the failed writer's open file, whose space is only freed once it is gone."""
    if isinstance(exc, OSError):
        return exc if exc.errno in DISK_FULL_ERRNOS else None
    text = str(exc)
    if isinstance(exc, RuntimeError) and (
        _SHORT_WRITE in text or (any(e in text for e in _WRITER_IO_ERRORS) and low_on_space(path))
    ):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


_RESUME = "run the same command again to resume from the last good checkpoint"


def describe_write_error(
    exc: BaseException, path: Path, then: str = _RESUME, where_to: str = "run.root_dir"
) -> str | None:
    """A plain sentence for a disk-full or read-only write error (None for any other error).
    `then`: what to do once there is room; `where_to`: the option that moves the output."""
    short_write = isinstance(exc, RuntimeError) and _SHORT_WRITE in str(exc)
    if not (isinstance(exc, OSError) or short_write) or isinstance(exc, UnsafePathError):
        return None
    filename = getattr(exc, "filename", None)
    where = Path(filename) if filename else Path(path)
    free = free_bytes(where)
    free_text = f"{free / 2**30:.2f} GiB free" if free is not None else "free space unknown"
    if short_write or (isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS):
        return (
            f"disk full writing {where} ({free_text} on its file system); free space there or "
            f"move {where_to}, then {then}"
        )
    if isinstance(exc, OSError) and exc.errno in READ_ONLY_ERRNOS:
        return (
            f"cannot write {where}: {os.strerror(exc.errno or 0)} (read-only or not permitted; "
            f"{free_text}); make it writable or set {where_to} to a writable folder"
        )
    return None


_F = TypeVar("_F", bound=Callable[..., Any])


def disk_full_is_user_error(path_argument: str, option: str) -> Callable[[_F], _F]:
    """Decorate a command's writing function so that a full disk (ENOSPC, EDQUOT) anywhere inside
    it is a UserError saying "disk full writing PATH" (``describe_write_error``; PATH the file
    that failed, else the function's `path_argument`), exit 2, never a traceback. `option` names
    the command-line option that moves the output."""

    def decorate(function: _F) -> _F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except OSError as exc:
                if exc.errno not in DISK_FULL_ERRNOS:
                    raise
                target = signature.bind(*args, **kwargs).arguments.get(path_argument, ".")
                message = describe_write_error(
                    exc, Path(target), then="run the same command again", where_to=option
                )
                from launcher.errors import UserError

                raise UserError(f"{message}; nothing was written to {option} {target}") from None

        return cast(_F, wrapper)

    return decorate
