"""Atomic, checksummed (optionally signed) checkpoints, pruning that counts only verified ones, and
the search for valid checkpoints newest first.

Layout of the run directory's ``checkpoints/``::

    step_00000100/          a complete checkpoint (only complete ones carry this name)
        manifest.json       format, step, total bytes, every file's size and sha256 [, hmac]
        trainer_state.json  loop state: step, sampler position, losses so far
        engine/ ...         the engine's own files (tensors only; non-tensor state as JSON)
    .tmp-step_00000200/     a checkpoint being written (removed or finished on the next save)

Writing (a collective, every rank calls ``save``): all ranks write into the temporary folder,
barrier; rank 0 writes the trainer state, fsyncs every file, writes the manifest, fsyncs it and the
folder, and renames the folder to its final name (atomic on POSIX), fsyncs the parent, then prunes
to the newest ``keep_last`` *verified* checkpoints (never the one just written; damaged folders
are left alone and never counted); barrier. A crash or a full disk at any point leaves either the
previous checkpoints untouched or a ``.tmp-`` folder that is ignored.

Verifying (``verify``): the manifest names the folder's step (a folder renamed to another step is
rejected), lists at least the trainer state and one engine file, and exactly the files present
(nothing extra, no symbolic links); each file's size and sha256 match. With
``LLMTRAIN_CHECKPOINT_KEY`` set, manifests are signed on save (HMAC-SHA256 of the manifest) and a
manifest without a valid signature is rejected on load: the sha256 values alone only catch
accidents, the signature also catches someone who rewrote files and manifest together.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import bounded_read, fsio
from launcher.rundir import (
    CHECKPOINT_PREFIX,
    UNFINISHED_PREFIX,
    step_dir_name,
    unfinished_checkpoints,
)

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
ENGINE_DIR = "engine"
FORMAT = "llmtrain-checkpoint-v2"
# HMAC-SHA256 key for signing and verifying manifests (any non-empty string; keep it secret).
KEY_ENV = "LLMTRAIN_CHECKPOINT_KEY"


class CheckpointWarning(UserWarning):
    """A checkpoint was found damaged and skipped."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, read-only, ...); the message says which,
    with the path and the free space. The previous checkpoints are untouched."""

    def __init__(self, message: str, errno: int | None):
        super().__init__(message)
        self.errno = errno


def signing_key() -> bytes | None:
    key = os.environ.get(KEY_ENV, "")
    return key.encode() if key else None


def _signature(manifest: dict[str, Any], key: bytes) -> str:
    body = {k: v for k, v in manifest.items() if k != "hmac_sha256"}
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()


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
    """(step, folder) of every complete-looking checkpoint, newest first (links skipped)."""
    found = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(CHECKPOINT_PREFIX) and stat.S_ISDIR(os.lstat(child).st_mode):
                try:
                    found.append((int(child.name[len(CHECKPOINT_PREFIX) :]), child))
                except ValueError:
                    continue
    return sorted(found, reverse=True)


def _listing(path: Path) -> tuple[dict[str, int], str | None]:
    """{relative path: size} of the regular files under `path`, or what is wrong (a link...)."""
    files: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            info = os.lstat(full)
            rel = full.relative_to(path).as_posix()
            if stat.S_ISLNK(info.st_mode):
                return files, f"{rel} is a symbolic link"
            if stat.S_ISREG(info.st_mode):
                files[rel] = info.st_size
            elif not stat.S_ISDIR(info.st_mode):
                return files, f"{rel} is not a regular file"
    return files, None


def checked_manifest(path: Path) -> tuple[dict[str, Any], str | None]:
    """(the manifest, None) when the checkpoint in `path` is complete and its manifest is
    signed (with the key set), of this format and step, and lists exactly the files present with
    their sizes; else ({}, what is wrong). The data's sha256 are not read here: ``verify`` reads
    them, and ``launcher.train.checkpoint.safe_load.CheckpointFiles`` checks each file's bytes
    against this manifest as it reads them for loading (the bytes checked are the bytes loaded)."""
    try:  # bounded: a regular file, no blocking, 64 MiB, nesting 8 (launcher/bounded_read.py)
        manifest = bounded_read.read_json(path / MANIFEST, max_bytes=64 << 20, max_depth=8)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            return {}, f"{MANIFEST} is not a checkpoint manifest"
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return {}, f"no readable {MANIFEST} ({reason})"
    key = signing_key()
    if key is not None:
        signature = manifest.get("hmac_sha256")
        if not isinstance(signature, str):
            return {}, f"{MANIFEST} is not signed and {KEY_ENV} is set"
        if not hmac.compare_digest(signature, _signature(manifest, key)):
            return {}, f"{MANIFEST}: signature does not match (wrong {KEY_ENV}, or tampered)"
    if manifest.get("format") != FORMAT:
        return {}, f"{MANIFEST}: not of format {FORMAT!r}"
    expected_name = (
        step_dir_name(manifest.get("step", -1)) if isinstance(manifest.get("step"), int) else None
    )
    if expected_name != path.name:
        said = manifest.get("step") if isinstance(manifest.get("step"), int) else "no step"
        return {}, f"{MANIFEST} says step {said}, the folder is named {path.name}"
    files: dict[str, Any] = manifest["files"]
    if TRAINER_STATE not in files or not any(f.startswith(f"{ENGINE_DIR}/") for f in files):
        return {}, f"{MANIFEST} does not list {TRAINER_STATE} and the engine's files"
    present, problem = _listing(path)
    if problem is not None:
        return {}, problem
    present.pop(MANIFEST, None)
    extra = sorted(set(present) - set(files))
    if extra:
        return {}, f"files not in {MANIFEST}: {', '.join(extra[:3])}"
    total = 0
    for rel, meta in files.items():
        if rel not in present:
            return {}, f"missing file {rel}"
        if not isinstance(meta, dict) or present[rel] != meta.get("size"):
            size = meta.get("size") if isinstance(meta, dict) else None
            said = size if isinstance(size, int) else "no size"
            return {}, f"{rel}: {present[rel]} bytes, manifest says {said}"
        if not isinstance(meta.get("sha256"), str):
            return {}, f"{rel}: {MANIFEST} gives no sha256"
        total += present[rel]
    if manifest.get("total_bytes") != total:
        return {}, f"{MANIFEST}: total_bytes differs from the {total} bytes the files hold"
    return manifest, None


def checked_bytes(path: Path, rel: str, manifest: dict[str, Any]) -> bytes | None:
    """The bytes of `path`/`rel`, read once (never through a symbolic link), when they are the
    size and sha256 that `manifest` (from ``checked_manifest``) lists; None otherwise."""
    meta = manifest.get("files", {}).get(rel)
    if not isinstance(meta, dict):
        return None
    data = fsio.read_bytes(path / rel)
    if len(data) != meta.get("size") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        return None
    return data


def verify(path: Path, deep: bool = True) -> str | None:
    """None when the checkpoint in `path` is complete and matches its manifest, else what is
    wrong. `deep=False` skips the sha256 of the data (sizes and the signature still checked)."""
    manifest, problem = checked_manifest(path)
    if problem is not None:
        return problem
    if deep:
        for rel, meta in manifest["files"].items():
            if fsio.sha256_file(path / rel) != meta.get("sha256"):
                return f"{rel}: checksum differs from the manifest"
    return None


def read_found(path: Path, step: int) -> Found:
    """The checkpoint's trainer state, read once and checked against its manifest."""
    manifest, problem = checked_manifest(path)
    data = None if problem else checked_bytes(path, TRAINER_STATE, manifest)
    if data is None:
        raise ValueError(problem or "changed since it was verified")
    state = json.loads(data)
    if not isinstance(state, dict):
        raise ValueError("not a JSON object")
    return Found(path=path, step=step, trainer_state=state)


def valid_checkpoints(root: Path, log: Callable[[str], None] | None = None) -> Iterator[Found]:
    """Checkpoints passing ``verify``, newest first; damaged ones are skipped loudly."""
    for step, path in complete_checkpoints(root):
        problem = verify(path)
        if problem is None:
            try:
                yield read_found(path, step)
                continue
            except (OSError, ValueError) as exc:
                problem = f"{TRAINER_STATE} unreadable ({exc})"
        message = f"checkpoint {path} is damaged ({problem}); skipping it, trying an older one"
        warnings.warn(message, CheckpointWarning, stacklevel=2)
        if log is not None:
            log(f"WARNING: {message}")


def latest_valid(root: Path, log: Callable[[str], None] | None = None) -> Found | None:
    """The newest checkpoint that passes ``verify``."""
    return next(valid_checkpoints(root, log), None)


class CheckpointWriter:
    """Writes checkpoints for one run; every rank holds one and calls ``save`` together."""

    def __init__(self, root: Path, rank: int, keep_last: int, barrier: Callable[[], None]):
        self.root = root
        self.rank = rank
        self.keep_last = max(1, keep_last)
        self.barrier = barrier
        # Folders known good in this process: (path, manifest mtime) -> verified.
        self._verified: dict[tuple[Path, int], bool] = {}

    def save(
        self,
        step: int,
        write_engine: Callable[[Path], object],
        trainer_state: dict[str, Any],
    ) -> Path:
        final = self.root / step_dir_name(step)
        tmp = self.root / f"{UNFINISHED_PREFIX}{step_dir_name(step)}"
        try:
            if self.rank == 0:
                fsio.check_inside(self.root, self.root.parent)
                self.root.mkdir(parents=True, exist_ok=True)
                if os.path.lexists(tmp):
                    fsio.remove_tree(tmp)
                (tmp / ENGINE_DIR).mkdir(parents=True)
            self.barrier()
            write_engine(tmp / ENGINE_DIR)
            self.barrier()
            if self.rank == 0:
                self._finish(step, tmp, final, trainer_state)
        except BaseException as exc:
            # Any failure (a full disk here, a peer that died at the barrier, Ctrl-C): the
            # half-written folder goes; the previous checkpoints were never touched.
            if self.rank == 0 and os.path.lexists(tmp):
                fsio.remove_tree(tmp)
            if not isinstance(exc, OSError):
                raise
            reason = fsio.describe_write_error(exc, tmp)
            if reason is None:
                raise
            raise CheckpointWriteError(
                f"checkpoint at step {step} not written: {reason}", exc.errno
            ) from exc
        self.barrier()
        return final

    def _finish(self, step: int, tmp: Path, final: Path, trainer_state: dict[str, Any]) -> None:
        fsio.write_json_atomic(tmp / TRAINER_STATE, trainer_state, root=self.root)
        present, problem = _listing(tmp)
        assert problem is None, f"{tmp}: {problem}"
        files = {}
        for rel in sorted(present):
            fsio.fsync_path(tmp / rel)
            files[rel] = {"size": present[rel], "sha256": fsio.sha256_file(tmp / rel)}
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "step": step,
            "time": time.time(),
            "total_bytes": sum(present.values()),
            "files": files,
        }
        key = signing_key()
        if key is not None:
            manifest["hmac_sha256"] = _signature(manifest, key)
        fsio.write_json_atomic(tmp / MANIFEST, manifest, root=self.root)
        for folder in sorted({(tmp / rel).parent for rel in present}, reverse=True):
            fsio.fsync_dir(folder)
        old = None
        if os.path.lexists(final):  # the same step saved again (a resumed run's final save)
            old = self.root / f"{UNFINISHED_PREFIX}old-{final.name}"
            if os.path.lexists(old):
                fsio.remove_tree(old)
            os.replace(final, old)
        os.replace(tmp, final)
        fsio.fsync_dir(self.root)
        if old is not None:
            fsio.remove_tree(old)
        self._verified[(final, (final / MANIFEST).stat().st_mtime_ns)] = True
        self._prune(keep=final)

    def _is_verified(self, path: Path) -> bool:
        try:
            mark = (path, (path / MANIFEST).stat().st_mtime_ns)
        except OSError:
            return False
        if mark not in self._verified:
            self._verified[mark] = verify(path) is None
        return self._verified[mark]

    def _prune(self, keep: Path) -> None:
        """Keep the newest `keep_last` verified checkpoints (always `keep`); remove older verified
        ones and stale temporary folders; leave damaged folders alone (never counted)."""
        verified = [p for _, p in complete_checkpoints(self.root) if self._is_verified(p)]
        kept = [keep, *[p for p in verified if p != keep]][: self.keep_last]
        for path in verified:
            if path not in kept:
                fsio.remove_tree(path)
        for stale in unfinished_checkpoints(self.root):
            fsio.remove_tree(stale)
