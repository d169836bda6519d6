"""The built-in corpus of recipe=tiny: a capped, sorted selection of the Python standard library's
own ``*.py`` sources as byte tokens, prepared once under llmtrain's cache folder
(``launcher.cache_dir``), never downloaded; and ``prepared_once``, which the built-in chat data
shares: one process prepares under a file lock while the others wait.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from launcher import file_lock
from launcher.data.prepare import prepare
from launcher.data.token_index import INDEX_FILE
from launcher.errors import UserError

BUILTIN_CORPUS = "corpus-stdlib-v1"
# The built-in corpus: at most this many bytes of stdlib source (~4.2M byte tokens, ten times what
# recipe=tiny's 200 steps x 8 x 257 tokens read), skipping files larger than _STDLIB_MAX_FILE.
_STDLIB_MAX_BYTES = 4 * 2**20
_STDLIB_MAX_FILE = 200_000
_STDLIB_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


def stdlib_source_files() -> list[Path]:
    """The built-in corpus's files: a sorted, capped selection of the stdlib's *.py sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    budget = _STDLIB_MAX_BYTES
    # Walk in sorted order (files of a directory before its subdirectories), pruning skipped
    # directories, and stop once the budget is spent: site-packages is never listed.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            size = path.stat().st_size
            if size == 0 or size > _STDLIB_MAX_FILE or size > budget:
                continue
            chosen.append(path)
            budget -= size
            if budget < 1024:
                return chosen
    return chosen


def prepared_once(
    cache_root: Path, name: str, make: Callable[[Path], object], timeout_s: float = 600.0
) -> Path:
    """`cache_root/name`, a prepared dataset `make(target)` writes once.

    Safe when several ranks call it at once: one prepares under an exclusive file lock, the others
    wait on the lock and then find index.json."""
    cache_root = Path(cache_root)
    target = cache_root / name
    if (target / INDEX_FILE).is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    busy = "another process is preparing that dataset (delete the lock file if none is)"
    with file_lock.waiting(cache_root / f"{name}.lock", timeout_s, busy=busy):
        if not (target / INDEX_FILE).is_file():
            make(target)
    return target


def builtin_corpus_dir(cache_root: Path, timeout_s: float = 600.0) -> Path:
    """The tiny recipe's offline corpus (byte tokens), prepared once under `cache_root`."""

    def make(target: Path) -> None:
        files = stdlib_source_files()
        if not files:
            raise UserError(
                f"the built-in corpus needs the Python standard library's *.py sources, and "
                f"{sysconfig.get_paths()['stdlib']} has none; prepare your own text with "
                "`llmtrain data prepare --input DIR --output DATA` and pass data.path=DATA"
            )
        source = {
            "kind": "python-stdlib",
            "python": sys.version.split()[0],
            "root": sysconfig.get_paths()["stdlib"],
        }
        prepare(files, target, tokenizer="byte", overwrite=True, source=source)

    return prepared_once(cache_root, BUILTIN_CORPUS, make, timeout_s)
