"""Folders llmtrain writes as a whole (`data prepare --output`, `export --out`), and what
``--overwrite`` may remove: only a folder llmtrain wrote, and only the files it wrote there.

- Written beside, renamed into place: the caller writes into ``temporary_sibling`` (a fresh
  hidden folder next to the target); ``install`` writes the ownership marker (``MARKER``: which
  command wrote the folder and every file it holds) and renames the folder to the target without
  replacing anything (``rename_noreplace``): a target that appeared meanwhile (a folder someone
  created, a concurrent prepare that finished first) makes this one fail with exit 2, and the
  target is left as it is.
- ``--overwrite`` replaces only a folder whose marker names the same command and whose files are
  exactly the ones the marker lists (a user's file put there later is never deleted: refused).
  The old folder is renamed aside first, checked again, and removed file by file as its marker
  lists them (never a recursive delete of whatever is there).
- Never a run directory, a folder inside one, the current or root directory, or a folder holding a
  run directory (``--out runs``, ``--out .``), with or without ``--overwrite``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from launcher.errors import UserError
from launcher.rundir import CHECKPOINTS, CONFIG, LAUNCH_SCRIPT, LOCK, PLAN

MARKER = ".llmtrain-output.json"
FORMAT = "llmtrain-output-v1"
_SCAN_DEPTH = 3  # runs/NAME-HASH/checkpoints: a run directory this deep under --out is found
_SCAN_LIMIT = 20_000  # entries looked at before giving up (the marker check still applies)
NEW, EMPTY, REPLACE = "new", "empty", "replace"  # what check_target found at the target


def is_run_dir(path: Path) -> bool:
    """A run directory: config.yaml beside checkpoints/, plan.json, launch.sh or the run lock."""
    if not (path / CONFIG).is_file():
        return False
    return any(os.path.lexists(path / name) for name in (CHECKPOINTS, PLAN, LAUNCH_SCRIPT, LOCK))


def _holds_run_dir(folder: Path) -> Path | None:
    """A run directory at most ``_SCAN_DEPTH`` levels under `folder` (links not followed)."""
    seen = 0
    level = [folder]
    for _ in range(_SCAN_DEPTH):
        deeper = []
        for parent in level:
            try:
                entries = list(os.scandir(parent))
            except OSError:
                continue
            for entry in entries:
                seen += 1
                if seen > _SCAN_LIMIT:
                    return None
                if entry.is_dir(follow_symlinks=False):
                    child = Path(entry.path)
                    if is_run_dir(child):
                        return child
                    deeper.append(child)
        level = deeper
    return None


def _files(folder: Path) -> tuple[list[str], str | None]:
    """(every regular file under `folder`, relative, sorted; what is not a file or folder)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            mode = os.lstat(full).st_mode
            rel = full.relative_to(folder).as_posix()
            if stat.S_ISREG(mode):
                found.append(rel)
            elif not stat.S_ISDIR(mode):
                return sorted(found), rel
    return sorted(found), None


def _marker(folder: Path) -> dict[str, Any] | None:
    path = folder / MARKER
    try:
        if path.is_symlink() or not path.is_file():
            return None
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(document, dict)
        or document.get("format") != FORMAT
        or not isinstance(document.get("files"), list)
        or not all(isinstance(f, str) for f in document["files"])
    ):
        return None
    return document


def why_not_owned(folder: Path, command: str) -> str | None:
    """None when `folder` is one `command` wrote and holds nothing else, else why not."""
    document = _marker(folder)
    if document is None:
        return f"it holds no {MARKER} (written with every folder `{command}` makes)"
    if document.get("command") != command:
        return f"its {MARKER} is not from `{command}`"
    present, odd = _files(folder)
    if odd is not None:
        return f"it holds {odd}, which is not a regular file"
    foreign = sorted(set(present) - {*document["files"], MARKER})
    if foreign:
        shown = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        return f"it holds files `{command}` did not write: {shown}"
    return None


def refuse_cwd(out: Path, option: str, example: str) -> None:
    """Refuse the current or root directory (an output is renamed into place: never those)."""
    resolved = out.expanduser().resolve()
    if resolved == Path.cwd().resolve() or resolved == Path(resolved.anchor) or not out.name:
        raise UserError(
            f"{option} {out}: is the current (or root) directory; name a new folder, e.g. "
            f"{option} {example}"
        )


def check_target(out: Path, option: str, command: str, overwrite: bool, what: str) -> str:
    """Refuse an output folder llmtrain must not write or replace (see the module docstring);
    else say what is there now: NEW (nothing), EMPTY (an empty folder) or REPLACE (an earlier
    output of `command`, with `overwrite`), for ``install``.
    `what` names such an output in messages ("a prepared dataset")."""
    given = out
    if out.is_symlink():
        raise UserError(f"{option} {given}: is a symbolic link; give a real folder path")
    refuse_cwd(out, option, "data/tokens" if "data" in command else "exports/model")
    resolved = out.expanduser().resolve()
    for above in [resolved, *resolved.parents]:
        if is_run_dir(above):
            raise UserError(
                f"{option} {given}: lies inside (or is) the run directory {above}, which llmtrain "
                "manages; write to a folder outside it"
            )
    if resolved.exists() and not resolved.is_dir():
        raise UserError(f"{option} {given}: exists and is not a folder")
    if not resolved.is_dir():
        return NEW
    if not any(resolved.iterdir()):
        return EMPTY
    held = _holds_run_dir(resolved)
    if held is not None:
        raise UserError(
            f"{option} {given}: holds the run directory {held}; llmtrain never writes over a "
            "folder holding runs; choose a new folder"
        )
    if not overwrite:
        raise UserError(
            f"{option} {given}: already exists and is not empty; pass --overwrite to replace an "
            f"earlier `{command}` output there, or choose a new folder"
        )
    problem = why_not_owned(resolved, command)
    if problem is not None:
        raise UserError(
            f"{option} {given}: not {what} that `{command}` wrote ({problem}); --overwrite "
            "replaces only those; nothing was deleted; choose a new folder or remove it yourself"
        )
    return REPLACE


def temporary_sibling(out: Path) -> Path:
    """A fresh hidden folder beside `out` to write the output into."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, failing with FileExistsError when `dst` exists (even an empty
    folder): renameat2(RENAME_NOREPLACE) on Linux (glibc >= 2.28); elsewhere `dst` is claimed
    with mkdir first (atomic) and the rename then replaces only that empty claim (it fails if
    anything was put in meanwhile)."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        result = renameat2(
            _AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE
        )
        if result == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), str(dst))
        if code not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(code, os.strerror(code), str(dst))
    os.mkdir(dst)  # FileExistsError when it is there
    try:
        os.rename(src, dst)
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(dst)
        raise


def _write_marker(folder: Path, command: str, extra: dict[str, Any]) -> None:
    files, odd = _files(folder)
    assert odd is None, f"{folder}: {odd}"
    document = {"format": FORMAT, "command": command, **extra, "files": files}
    (folder / MARKER).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def remove_owned(folder: Path) -> list[str]:
    """Delete the files `folder`'s marker lists, the marker, and the folders left empty; return
    what remains (nothing, unless someone put files there)."""
    document = _marker(folder)
    listed = document["files"] if document is not None else []
    for rel in listed:
        path = folder / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            continue
        with contextlib.suppress(FileNotFoundError):
            if not path.is_symlink() and path.is_file():
                path.unlink()
    with contextlib.suppress(FileNotFoundError):
        (folder / MARKER).unlink()
    for dirpath, _, _ in sorted(os.walk(folder, topdown=False), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
    remaining, _ = _files(folder) if folder.exists() else ([], None)
    return remaining


def install(
    tmp: Path,
    out: Path,
    option: str,
    command: str,
    found: str,
    extra: dict[str, Any] | None = None,
) -> None:
    """Mark `tmp` as `command`'s and rename it to `out` (see the module docstring). `found`:
    what ``check_target`` found there (EMPTY: the empty folder is taken; REPLACE: an earlier
    output it accepted for --overwrite). Raises UserError, with `out` as it was, when `out`
    appeared meanwhile or changed since it was checked."""
    _write_marker(tmp, command, extra or {})
    old = None
    if found == EMPTY:
        with contextlib.suppress(OSError):
            out.rmdir()  # an empty folder made for it; filled meanwhile: kept, the rename refuses
    elif found == REPLACE:
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        try:
            os.rename(out, old)
        except OSError as exc:
            raise UserError(
                f"{option} {out}: changed while this command ran ({exc.strerror}); left as it is"
            ) from None
        problem = why_not_owned(old, command)
        if problem is not None:  # someone wrote into it since the check: put it back untouched
            os.rename(old, out)
            raise UserError(
                f"{option} {out}: changed while this command ran ({problem}); left as it is"
            )
    try:
        rename_noreplace(tmp, out)
    except OSError as exc:
        if old is not None:
            with contextlib.suppress(OSError):
                rename_noreplace(old, out)
        raise UserError(
            f"{option} {out}: appeared while this command ran (another command wrote it?); it "
            f"was left as it is and nothing was written there ({exc.strerror or exc})"
        ) from None
    with contextlib.suppress(OSError):
        fd = os.open(out.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if old is not None:
        left = remove_owned(old)
        if left:
            raise UserError(
                f"{option} {out}: written; the previous output, moved to {old}, held files it "
                f"did not write ({', '.join(left[:3])}), which were kept there"
            )
