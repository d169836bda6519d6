"""Folders llmtrain writes as a whole (`data prepare --output`, `export --out`), and what
``--overwrite`` may remove: only files llmtrain provably wrote, and only while they are the bytes
it wrote.

- Written beside, renamed into place: the caller writes into ``temporary_sibling`` (a fresh
  hidden folder next to the target, ``.NAME.tmp-HOST-PID-RANDOM``, flock'ed by the writer for as
  long as it lives; ``discard`` removes it on failure); ``install`` writes the ownership marker
  (``MARKER``, launcher/output_marker.py: the command, every file with its size and sha256,
  signed with the user's key so that nobody else can forge it) and renames the folder to the
  target without replacing anything (``rename_noreplace``): a target that appeared meanwhile (a
  folder someone created, a concurrent prepare that finished first) makes this one fail with
  exit 2, and the target is left as it is.
- ``--overwrite`` replaces only a folder whose marker is signed by this user's llmtrain, names
  the same command, and lists exactly the files present with their sizes (a user's file put
  there is never deleted: refused). The old folder is renamed into a fresh private folder
  beside it, checked again, and removed file by file: each listed file is moved into a private
  quarantine, its bytes checked against the marker's sha256 there, and only then unlinked; a file
  that changed is put back, a file nobody listed is never touched, and folders are removed only
  when empty (never a recursive delete of whatever is there).
- A writer killed outright (SIGKILL, the OOM killer, a power cut) leaves its temporary folder
  behind: the next ``temporary_sibling`` beside the same target removes each one it can prove
  dead: written from this host (the name's HOST), by a pid that no longer exists, and whose flock
  it can take. A live writer's (its flock held) and folders of other hosts or other names are
  never touched.
- Never a run directory, a folder inside one, the current or root directory, or a folder holding
  a run directory at any depth (the whole tree is searched, links not followed; a tree too large
  or unreadable to search is refused), with or without ``--overwrite``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import secrets
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

from launcher import bounded_read, output_marker
from launcher.errors import UserError
from launcher.excerpt import name as shown
from launcher.rundir import CHECKPOINTS, CONFIG, LAUNCH_SCRIPT, LOCK, PLAN

MARKER = output_marker.MARKER
FORMAT = output_marker.FORMAT
# Entries searched for a run directory before giving up (and refusing): an export or a prepared
# dataset holds a few to a few thousand files.
_SCAN_LIMIT = 200_000
NEW, EMPTY, REPLACE = "new", "empty", "replace"  # what check_target found at the target


def is_run_dir(path: Path) -> bool:
    """A run directory: config.yaml beside checkpoints/, plan.json, launch.sh or the run lock."""
    if not (path / CONFIG).is_file():
        return False
    return any(os.path.lexists(path / name) for name in (CHECKPOINTS, PLAN, LAUNCH_SCRIPT, LOCK))


class _Unsearchable(Exception):
    """The tree could not be searched whole (too many entries, an unreadable folder)."""


def _holds_run_dir(folder: Path) -> Path | None:
    """A run directory anywhere under `folder` (links not followed); _Unsearchable when the
    tree cannot be searched whole."""
    seen = 0
    stack = [folder]
    while stack:
        parent = stack.pop()
        try:
            entries = list(os.scandir(parent))
        except OSError as exc:
            raise _Unsearchable(f"{parent} cannot be read ({exc.strerror})") from None
        for entry in entries:
            seen += 1
            if seen > _SCAN_LIMIT:
                raise _Unsearchable(f"it holds more than {_SCAN_LIMIT:,} entries")
            if entry.is_dir(follow_symlinks=False):
                child = Path(entry.path)
                if is_run_dir(child):
                    return child
                stack.append(child)
    return None


def _files(folder: Path) -> tuple[list[str], str | None]:
    """(every regular file under `folder`, relative, sorted; what is not a file or folder)."""
    found, odd = output_marker.listing(folder)
    return sorted(found), odd


def _names(names: list[str]) -> str:
    return ", ".join(shown(n) for n in names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else ""
    )


def why_not_owned(folder: Path, command: str) -> str | None:
    """None when `folder` is one `command` wrote (its marker signed by this user's llmtrain) and
    holds nothing else, each listed file of the size listed; else why not."""
    document, problem = output_marker.read(folder)
    if document is None:
        return problem
    if document.get("command") != command:
        return f"its {MARKER} is not from `{command}`"
    present, odd = output_marker.listing(folder)
    if odd is not None:
        return f"it holds {shown(odd)}, which is not a regular file"
    listed: dict[str, Any] = document["files"]
    foreign = sorted(set(present) - {*listed, MARKER})
    if foreign:
        return f"it holds files `{command}` did not write: {_names(foreign)}"
    changed = sorted(
        rel for rel in listed if rel in present and present[rel] != listed[rel]["size"]
    )
    if changed:
        return f"files changed since `{command}` wrote them: {_names(changed)}"
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
    try:
        held = _holds_run_dir(resolved)
    except _Unsearchable as exc:
        raise UserError(
            f"{option} {given}: cannot be searched whole for run directories ({exc}); llmtrain "
            "never writes over a folder it cannot prove holds no run; choose a new folder"
        ) from None
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


# Temporary folders this process writes, each with the descriptor holding its flock.
_HELD: dict[Path, int] = {}
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temporary_sibling(out: Path) -> Path:
    """A fresh hidden folder beside `out` to write the output into, held (flock) until it is
    installed or discarded; stale ones of dead writers beside it are removed first (see the
    module docstring)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    prefix = f".{out.name}.tmp-{_host_tag()}-{os.getpid()}-"
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    fd = os.open(path, _DIRECTORY | _NOFOLLOW)
    fcntl.flock(fd, fcntl.LOCK_EX)  # just made: nobody else holds it
    _HELD[path] = fd
    return path


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _release(path: Path) -> None:
    fd = _HELD.pop(path, None)
    if fd is not None:
        os.close(fd)


def discard(tmp: Path) -> None:
    """Remove a temporary folder this process made (nothing when it is gone) and let it go."""
    if os.path.lexists(tmp):
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    _release(tmp)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Remove the temporary folders beside `out` whose writers are proven dead (see the module
    docstring); the ones removed."""
    import shutil

    pattern = re.compile(rf"\.{re.escape(out.name)}\.tmp-([0-9a-f]{{8}})-(\d+)-[A-Za-z0-9_]+")
    removed: list[Path] = []
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return removed
    for entry in entries:
        found = pattern.fullmatch(entry.name)
        if found is None or found.group(1) != _host_tag():
            continue
        path = Path(entry.path)
        if path in _HELD or _pid_alive(int(found.group(2))):
            continue
        try:
            fd = os.open(path, _DIRECTORY | _NOFOLLOW)
        except OSError:
            continue  # a link, a file, or gone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live writer holds it
        try:
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, failing with FileExistsError when `dst` exists (even an empty
    folder): renameat2(RENAME_NOREPLACE) on Linux (glibc >= 2.28); elsewhere `dst` is claimed
    with mkdir first (atomic) and the rename then replaces only that empty claim (it fails if
    anything was put in meanwhile)."""
    # dlopen(NULL): the symbols this process already loaded, libc's among them (no child
    # process, unlike ctypes.util.find_library, which runs `ldconfig -p` on every call).
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
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


def _quarantined_unlink(path: Path, meta: dict[str, Any], quarantine: Path) -> bool:
    """Delete `path` only if it is the bytes `meta` (size, sha256) lists: it is first moved into
    the private `quarantine` (so nobody can swap it between the check and the unlink), checked
    there, and unlinked; otherwise it is put back (or, if its name was taken meanwhile, left in
    the quarantine). Whether it was deleted."""
    held = quarantine / secrets.token_hex(8)
    try:
        os.rename(path, held)
    except OSError:
        return False
    same = False
    try:
        fd = bounded_read.open_regular(held)
    except (OSError, ValueError):
        fd = None
    if fd is not None:
        try:
            same = (
                os.fstat(fd).st_size == meta["size"]
                and output_marker.sha256_fd(fd) == meta["sha256"]
            )
        finally:
            os.close(fd)
    if same:
        os.unlink(held)
        return True
    with contextlib.suppress(OSError):
        rename_noreplace(held, path)
    return False


def _no_link_above(folder: Path, rel: str) -> bool:
    """Whether every folder between `folder` and `folder`/`rel` is a real folder (no link)."""
    current = folder
    for part in Path(rel).parts[:-1]:
        current = current / part
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return False
        except OSError:
            return False
    return True


def _marker_bytes(folder: Path) -> bytes | None:
    try:
        return bounded_read.read_regular(folder / MARKER, output_marker.MAX_BYTES)
    except (OSError, ValueError):
        return None


def remove_owned(folder: Path) -> list[str]:
    """Delete the files `folder`'s signed marker lists, each only while it holds the bytes the
    marker lists (``_quarantined_unlink``), then the marker and the folders left empty; return
    what remains, relative (nothing, unless someone put or changed files there)."""
    document, _ = output_marker.read(folder)
    marker_bytes = _marker_bytes(folder)
    quarantine = Path(tempfile.mkdtemp(prefix=".llmtrain-delete-", dir=folder.parent))
    try:
        if document is not None:
            for rel, meta in document["files"].items():
                if _no_link_above(folder, rel):
                    _quarantined_unlink(folder / rel, meta, quarantine)
            if marker_bytes is not None and _marker_bytes(folder) == marker_bytes:
                digest = hashlib.sha256(marker_bytes).hexdigest()
                meta = {"size": len(marker_bytes), "sha256": digest}
                _quarantined_unlink(folder / MARKER, meta, quarantine)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(quarantine)
    # A changed file whose name was taken meanwhile stays in the quarantine: said, never lost.
    kept = [f"{quarantine}/{p.name}" for p in quarantine.iterdir()] if quarantine.exists() else []
    for dirpath, _, _ in sorted(os.walk(folder, topdown=False), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
    remaining, _ = _files(folder) if folder.exists() else ([], None)
    return remaining + kept


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
    output_marker.write(tmp, command, extra or {})
    try:
        _install(tmp, out, option, command, found)
    finally:
        _release(tmp)
        _release(tmp.parent)  # a folder inside the temporary one was installed


def _install(tmp: Path, out: Path, option: str, command: str, found: str) -> None:
    old = aside = None
    if found == EMPTY:
        with contextlib.suppress(OSError):
            out.rmdir()  # an empty folder made for it; filled meanwhile: kept, the rename refuses
    elif found == REPLACE:
        # Moved into a fresh private folder (mode 0700, a random name): nobody else can reach
        # what is removed from there on.
        aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        old = aside / "old"
        try:
            os.rename(out, old)
        except OSError as exc:
            with contextlib.suppress(OSError):
                aside.rmdir()
            raise UserError(
                f"{option} {out}: changed while this command ran ({exc.strerror}); left as it is"
            ) from None
        problem = why_not_owned(old, command)
        if problem is not None:  # someone wrote into it since the check: put it back untouched
            os.rename(old, out)
            with contextlib.suppress(OSError):
                aside.rmdir()
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
    if old is not None and aside is not None:
        left = remove_owned(old)
        if left:
            raise UserError(
                f"{option} {out}: written; the previous output, moved to {old}, held files "
                f"llmtrain did not write or that changed since ({_names(left)}), which were "
                "kept there"
            )
        with contextlib.suppress(OSError):
            aside.rmdir()
