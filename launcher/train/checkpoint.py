"""Atomic, checksummed checkpoints, the last K kept, and the search for the latest valid one.

Layout of the run directory's ``checkpoints/``::

    step_00000100/          a complete checkpoint (only complete ones carry this name)
        manifest.json       step, time, and every file's size and sha256
        trainer_state.json  loop state: step, sampler position, losses so far
        engine/ ...         the engine's own files (DeepSpeed or torch.distributed.checkpoint)
    .tmp-step_00000200/     a checkpoint being written (removed or finished on the next save)

Writing (a collective, every rank calls ``save``): all ranks write into the temporary folder,
barrier; rank 0 writes the trainer state, fsyncs every file, writes the manifest, fsyncs it and the
folder, and renames the folder to its final name (atomic on POSIX), fsyncs the parent, then removes
all but the newest ``keep_last``; barrier. A crash at any point leaves either the previous
checkpoints untouched or a ``.tmp-`` folder that is ignored.

Reading: ``latest_valid`` walks complete checkpoints newest first and returns the first whose
manifest matches the files on disk (sizes and sha256); any other is skipped with a loud warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
ENGINE_DIR = "engine"
PREFIX = "step_"
TMP_PREFIX = ".tmp-"
# In the run directory: rank 0 writes it when a run checkpointed and stopped on SIGUSR1/SIGTERM.
PREEMPTED_MARKER = "preempted.json"


class CheckpointWarning(UserWarning):
    """A checkpoint was found damaged and skipped."""


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class Found:
    """A valid checkpoint: its folder, step and trainer state."""

    path: Path
    step: int
    trainer_state: dict[str, Any]

    @property
    def engine_dir(self) -> Path:
        return self.path / ENGINE_DIR


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete-looking checkpoint, newest first."""
    found = []
    if root.is_dir():
        for child in root.iterdir():
            if child.is_dir() and child.name.startswith(PREFIX):
                try:
                    found.append((int(child.name[len(PREFIX) :]), child))
                except ValueError:
                    continue
    return sorted(found, reverse=True)


def verify(path: Path) -> str | None:
    """None when the checkpoint's files match its manifest, else what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError) as exc:
        return f"no readable {MANIFEST} ({exc})"
    for rel, meta in files.items():
        file = path / rel
        if not file.is_file():
            return f"missing file {rel}"
        if file.stat().st_size != meta["size"]:
            return f"{rel}: {file.stat().st_size} bytes, manifest says {meta['size']}"
        if sha256_file(file) != meta["sha256"]:
            return f"{rel}: checksum differs from the manifest"
    return None


def latest_valid(root: Path, log: Callable[[str], None] | None = None) -> Found | None:
    """The newest checkpoint that passes ``verify``; damaged ones are skipped loudly."""
    for step, path in complete_checkpoints(root):
        problem = verify(path)
        if problem is None:
            state = json.loads((path / TRAINER_STATE).read_text())
            return Found(path=path, step=step, trainer_state=state)
        message = f"checkpoint {path} is damaged ({problem}); skipping it, trying an older one"
        warnings.warn(message, CheckpointWarning, stacklevel=2)
        if log is not None:
            log(f"WARNING: {message}")
    return None


class CheckpointWriter:
    """Writes checkpoints for one run; every rank holds one and calls ``save`` together."""

    def __init__(self, root: Path, rank: int, keep_last: int, barrier: Callable[[], None]):
        self.root = root
        self.rank = rank
        self.keep_last = max(1, keep_last)
        self.barrier = barrier

    def save(
        self,
        step: int,
        write_engine: Callable[[Path], object],
        trainer_state: dict[str, Any],
    ) -> Path:
        final = self.root / step_dir_name(step)
        tmp = self.root / f"{TMP_PREFIX}{step_dir_name(step)}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            (tmp / ENGINE_DIR).mkdir(parents=True)
        self.barrier()
        write_engine(tmp / ENGINE_DIR)
        self.barrier()
        if self.rank == 0:
            write_json_atomic(tmp / TRAINER_STATE, trainer_state)
            files = {}
            for file in sorted(p for p in tmp.rglob("*") if p.is_file()):
                fsync_path(file)
                rel = file.relative_to(tmp).as_posix()
                files[rel] = {"size": file.stat().st_size, "sha256": sha256_file(file)}
            write_json_atomic(tmp / MANIFEST, {"step": step, "time": time.time(), "files": files})
            for folder in sorted({p.parent for p in tmp.rglob("*")}, reverse=True):
                fsync_path(folder)
            if final.exists():  # the same step saved again (a resumed run's final save)
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_path(self.root)
            self._prune()
        self.barrier()
        return final

    def _prune(self) -> None:
        for _, path in complete_checkpoints(self.root)[self.keep_last :]:
            shutil.rmtree(path, ignore_errors=True)
        for stale in self.root.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
