"""A small on-disk cache of composed configurations, so repeated commands skip Hydra.

Composing with Hydra costs about 0.25 s (importing Hydra and composing its own config tree), half of
the start-up budget of `show`/`plan`. The composed values are a pure function of the overrides and
of the files they are composed from, so a result is cached under a key made of: the llmtrain
version, the override strings, the (path, size, mtime) of every file under conf/ and recipes/
plus the schema's modules as this process imported them, and the value of every environment
variable that an ``${oc.env:NAME}`` in those files or the overrides may resolve (so a changed
variable is never served stale). Any edit to those files changes the key. An entry that cannot
be read or has the wrong shape is removed and composed again. Only successful compositions are
cached; errors always go through Hydra again, and so does a composition holding a secret's value
(``launcher.config.secrets``): it is never written to disk. A composition that reads the
environment (``${oc.env:...}`` in an override, a --config file or a recipe given by path) is never
cached either: a resolved environment value (a token, a password) is never written to disk,
whatever its name. Set LLMTRAIN_NO_CACHE=1 to bypass the cache.
Location: compose/ under llmtrain's cache folder (launcher.cache_dir: $LLMTRAIN_CACHE, else
$XDG_CACHE_HOME/llmtrain, else ~/.cache/llmtrain), a folder of mode
0700 (with its llmtrain parent) holding files of mode 0600; a folder there that is a symlink or
another user's is not used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from launcher import __version__, bounded_read, fsio, resources
from launcher.cache_dir import cache_root
from launcher.config import schema
from launcher.config.secrets import has_secret_values

_MAX_ENTRIES = 256
_MAX_ENTRY_BYTES = 8 << 20


def cache_dir() -> Path:
    return cache_root() / "compose"


def enabled() -> bool:
    return os.environ.get("LLMTRAIN_NO_CACHE", "") in ("", "0")


_ENV_REFERENCE = re.compile(r"oc\.env\s*:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")


def env_references(texts: list[str]) -> list[str]:
    """Names of the environment variables ``${oc.env:NAME[,default]}`` reads in `texts`."""
    return sorted({name for text in texts for name in _ENV_REFERENCE.findall(text)})


def _code_stamp() -> str:
    """(path, size, mtime) of the code that composes: the schema's modules (one per config
    group), compose.py (its rules too) and compose_messages.py (the keys' index rule), read once,
    when this process imported them. Read at every call instead, a process that imported the old
    schema before an upgrade would store its compositions under the new code's key: served to
    every later command, they lack the new keys (seen: KeyError 'packed_attention')."""
    files = sorted(Path(schema.__file__).parent.glob("*.py"))
    files.append(Path(__file__).with_name("compose.py"))
    files.append(Path(__file__).with_name("compose_messages.py"))
    stamp = ""
    for path in files:
        stat = path.stat()
        stamp += f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
    return stamp


_CODE_STAMP = _code_stamp()


def key(overrides: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([__version__, list(overrides)]).encode())
    digest.update(_CODE_STAMP.encode())
    texts = list(overrides)
    for path in resources.config_files():
        info = os.stat(path)
        digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
        texts.append(Path(path).read_text(encoding="utf-8", errors="replace"))
    for name in env_references(texts):
        # The value is hashed into the key (never stored): unset and empty differ.
        value = os.environ.get(name)
        digest.update(f"env\0{name}\0{'unset' if value is None else 'set:' + value}\n".encode())
    return digest.hexdigest()


def reads_environment(overrides: tuple[str, ...]) -> bool:
    """Whether composing `overrides` resolves an environment variable: ``oc.env`` in an override
    (a --config file's values arrive as overrides) or in a recipe file given by path."""
    from launcher.config.composition import config_file

    texts = [*overrides, *(text for _, text in config_file.FILE_RECIPES.values())]
    return any("oc.env" in text for text in texts)


def _well_formed(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("values"), dict)
        and isinstance(entry.get("choices"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in entry["choices"].items())
    )


def load(overrides: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(values, choices) composed earlier for exactly these overrides and files, or None."""
    if not enabled() or reads_environment(overrides):
        return None
    path = cache_dir() / f"{key(overrides)}.json"
    try:
        entry = bounded_read.read_json(path, max_bytes=_MAX_ENTRY_BYTES, max_depth=64)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        entry = None
    if not _well_formed(entry):
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return entry["values"], entry["choices"]


def store(overrides: tuple[str, ...], values: dict[str, Any], choices: dict[str, str]) -> None:
    """Remember a composition (atomically; a cache that cannot be written is skipped)."""
    if not enabled() or has_secret_values(values) or reads_environment(overrides):
        return
    try:
        directory = private_dir()
        if directory is None:
            return
        entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[: max(0, len(entries) - _MAX_ENTRIES + 1)]:
            old.unlink(missing_ok=True)
        # Keys in composition order (not sorted): `show` prints the cached values as they are.
        text = json.dumps({"values": values, "choices": choices}, indent=1) + "\n"
        fsio.write_atomic(directory / f"{key(overrides)}.json", text.encode("utf-8"), mode=0o600)
    except OSError:
        return


def private_dir() -> Path | None:
    """The cache folder, made (or narrowed to) mode 0700 with its llmtrain parent, or None when
    it is not a folder of this user's (a symlink, someone else's): then nothing is cached."""
    directory = cache_dir()
    for folder in (directory.parent, directory):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return None
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(folder, 0o700)
    return directory
