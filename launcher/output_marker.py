"""The ownership marker of a folder llmtrain wrote as a whole (``data prepare``, ``export``): which
command wrote it and every file it holds (size and sha256), signed so that nobody else can forge it.

``.llmtrain-output.json``::

    {"format": "llmtrain-output-v2", "command": "llmtrain export", "run": ..., "step": ...,
     "files": {"config.json": {"size": 712, "sha256": "..."}, ...},
     "hmac_sha256": "<HMAC-SHA256 of the canonical JSON of everything else>"}

The key is the user's, as checkpoints are keyed (launcher/train/checkpoint/store.py signs manifests
with HMAC-SHA256 under LLMTRAIN_CHECKPOINT_KEY): ``LLMTRAIN_OUTPUT_KEY`` when set, else a random
256-bit key that llmtrain creates on first use in ``$XDG_CONFIG_HOME/llmtrain/output.key`` (default
~/.config/llmtrain/output.key; ``LLMTRAIN_OUTPUT_KEY_FILE`` names another file), mode 0600 in a
0700 folder. A key file that is a link, another user's, or readable by others is not used. Without
a usable key the marker is written unsigned, and such a folder is never replaced by --overwrite.

So a marker proves that this user's llmtrain wrote the folder and which bytes: a marker written by
hand (or by another user, or an older unsigned llmtrain) proves nothing and --overwrite refuses
it; a listed file whose bytes changed is not llmtrain's any more and is never deleted.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

from launcher import bounded_read

MARKER = ".llmtrain-output.json"
FORMAT = "llmtrain-output-v2"
KEY_ENV = "LLMTRAIN_OUTPUT_KEY"
KEY_FILE_ENV = "LLMTRAIN_OUTPUT_KEY_FILE"
MAX_BYTES = 16 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


def key_file() -> Path:
    explicit = os.environ.get(KEY_FILE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmtrain" / "output.key"


def _read_key(path: Path) -> bytes | None:
    """The key in `path` when it is this user's regular file, not readable by others."""
    try:
        fd = bounded_read.open_regular(path)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            return None
        data = f.read(4096).strip()
    return data if len(data) >= 32 else None


def signing_key(create: bool = False) -> bytes | None:
    """This user's output key (see the module docstring); with `create`, made when missing.
    None when there is none and it cannot be made (a read-only home, say)."""
    explicit = os.environ.get(KEY_ENV, "")
    if explicit:
        return explicit.encode()
    path = key_file()
    found = _read_key(path)
    if found is not None or not create:
        return found
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except FileExistsError:  # made meanwhile by another llmtrain
        return _read_key(path)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return _read_key(path)


def _canonical(document: dict[str, Any]) -> bytes:
    body = {k: v for k, v in document.items() if k != "hmac_sha256"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def signature(document: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, _canonical(document), hashlib.sha256).hexdigest()


def sha256_fd(fd: int) -> str:
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def listing(folder: Path) -> tuple[dict[str, int], str | None]:
    """({relative path: size} of every regular file under `folder`, the first entry that is
    neither a regular file nor a folder, or None). Links are never followed."""
    found: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            info = os.lstat(full)
            rel = full.relative_to(folder).as_posix()
            if stat.S_ISREG(info.st_mode):
                found[rel] = info.st_size
            elif not stat.S_ISDIR(info.st_mode):
                return found, rel
    return found, None


def write(folder: Path, command: str, extra: dict[str, Any]) -> None:
    """Write `folder`'s marker: every regular file in it with its size and sha256, signed."""
    files, odd = listing(folder)
    if odd is not None:
        raise OSError(errno.EINVAL, f"{odd} is not a regular file", str(folder / odd))
    described = {}
    for rel, size in files.items():
        fd = bounded_read.open_regular(folder / rel)
        try:
            described[rel] = {"size": size, "sha256": sha256_fd(fd)}
        finally:
            os.close(fd)
    document: dict[str, Any] = {"format": FORMAT, "command": command, **extra, "files": described}
    key = signing_key(create=True)
    if key is not None:
        document["hmac_sha256"] = signature(document, key)
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    fd = os.open(
        folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
    )
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _safe_name(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def read(folder: Path) -> tuple[dict[str, Any] | None, str]:
    """(`folder`'s marker, "") when it is one this user's llmtrain wrote and signed, else
    (None, why not). The marker is read bounded, never through a link or from a FIFO."""
    try:
        document = bounded_read.read_json(folder / MARKER, max_bytes=MAX_BYTES, max_depth=8)
    except FileNotFoundError:
        return None, f"it holds no {MARKER} (written with every folder llmtrain makes)"
    except (OSError, ValueError) as exc:
        return None, f"its {MARKER} cannot be read ({exc})"
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return None, f"its {MARKER} is not of format {FORMAT} (an older llmtrain, or not one)"
    files = document.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(rel, str)
        and _safe_name(rel)
        and isinstance(meta, dict)
        and isinstance(meta.get("size"), int)
        and isinstance(meta.get("sha256"), str)
        and _HEX64.fullmatch(meta["sha256"])
        for rel, meta in files.items()
    ):
        return None, f"its {MARKER} does not list files as llmtrain writes them"
    key = signing_key()
    given = document.get("hmac_sha256")
    if (
        key is None
        or not isinstance(given, str)
        or not hmac.compare_digest(given, signature(document, key))
    ):
        return None, (
            f"its {MARKER} is not signed with this user's llmtrain key ({key_file()} or "
            f"${KEY_ENV}): not provably written by llmtrain"
        )
    return document, ""
