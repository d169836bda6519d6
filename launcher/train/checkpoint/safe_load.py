"""Loading checkpoints safely, for both engines: the bytes checked are the bytes loaded, and
nothing in a checkpoint ever runs code. Every refusal is an ``UnsafeCheckpointError``.

Checked bytes (``CheckpointFiles``): a checkpoint folder's manifest (signed with
``LLMTRAIN_CHECKPOINT_KEY`` when set; ``launcher.train.checkpoint.store.checked_manifest``) lists
each file's size and sha256. ``CheckpointFiles.read`` reads a file once into memory, compares that
buffer with the manifest and hands out the same buffer; everything below deserializes from it,
never from the path. A file swapped after ``verify`` read it (the window a verify-then-load
design leaves open) fails the comparison and is refused; one swapped after this read is never
read again. ``CheckpointFiles.unchecked`` (no manifest) serves the engines' own tests, which load
folders an engine wrote outside a checkpoint. Cost: a file is held in memory while it is
deserialized (at most about twice the largest file at once) and hashed once more than before
(the verifier that picks the checkpoint hashed it already).

Streamed (``CheckpointFiles.open``, what DCP's tensor files are read through, so that a rank's
file of shards is never in memory whole): the file is opened once without following a link, its
bytes hashed through that descriptor in bounded chunks and compared with the manifest, then read
by ``os.preadv`` at the offsets asked for. What was hashed is what is read: the descriptor keeps
the inode hashed even if the name is swapped, and the inode's change time (``st_ctime``, which
every write moves and no caller but root can set back) is checked after every read, so a file
rewritten in place after it was hashed is refused. A file reopened later with the same inode,
size and times is not hashed again.

No code from checkpoints:

- torch engine (DCP, torch 2.13): tensors sit in ``*.distcp`` files read back with
  ``weights_only=True``, but the ``.metadata`` file is a plain pickle DCP reads with
  ``pickle.load``, and non-tensor ("bytes") entries are ``torch.load(weights_only=False)``
  payloads. ``SafeFileSystemReader`` serves every file from ``CheckpointFiles`` and reads
  ``.metadata`` with ``RestrictedUnpickler``: every global the pickle names must be an exact
  (module, name) pair of ``METADATA_GLOBALS``; a name with a dot (which pickle protocol 4+ would
  resolve attribute by attribute, e.g. ``os.system`` through an allowed module) is refused, and so
  is everything else, whatever the protocol. llmtrain keeps non-tensor state out of pickles
  (``split_non_tensor_state``, stored as JSON by ``write_non_tensor_state``, one file per rank),
  and ``TensorOnlyLoadPlanner`` refuses any bytes entry a tampered ``.metadata`` could introduce.
- DeepSpeed engine (0.19): it reads its files with ``torch.load(weights_only=False)``. Before
  DeepSpeed sees a checkpoint, every ``*.pt`` file is read weights-only (tensors, builtins and the
  exact classes of ``deepspeed_globals``; torch matches them by full name); then, while DeepSpeed
  loads (``deepspeed_loading``), ``torch.load`` itself is replaced by the same weights-only read
  of the checked bytes (a path the manifest does not list is refused) and
  ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` is set.

Messages name the file and the kind of problem, never the refused file's contents: at most the
dotted Python name of a global a pickle asked for (checked to be one).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from launcher import fsio
from launcher.train.checkpoint.store import checked_bytes, checked_manifest


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file is refused: it differs from its (signed) manifest, or reading it would
    need code execution. The message says which file and why."""


# --- checked bytes -------------------------------------------------------------------------------
class CheckpointFiles:
    """The files of one checkpoint folder, each read once into memory and checked against the
    manifest read when this object was made (see the module docstring)."""

    def __init__(self, root: Path, manifest: dict[str, Any] | None):
        self.root = Path(os.path.abspath(root))
        self.manifest = manifest
        self._hashed: dict[str, tuple[int, ...]] = {}  # rel -> identity when its hash matched

    @classmethod
    def verified(cls, checkpoint: Path) -> CheckpointFiles:
        """The checkpoint folder `checkpoint` (``step_XXXXXXXX``) with its manifest checked."""
        manifest, problem = checked_manifest(Path(checkpoint))
        if problem is not None:
            raise UnsafeCheckpointError(f"{checkpoint}: refused: {problem}")
        return cls(Path(checkpoint), manifest)

    @classmethod
    def unchecked(cls, root: Path) -> CheckpointFiles:
        """Files under `root` read as they are (no manifest): engines' own save/load tests."""
        return cls(Path(root), None)

    def relative(self, path: str | os.PathLike[str]) -> str:
        full = Path(os.path.abspath(path))
        try:
            return full.relative_to(self.root).as_posix()
        except ValueError:
            raise UnsafeCheckpointError(f"{full}: outside the checkpoint {self.root}") from None

    def read(self, path: str | os.PathLike[str]) -> bytes:
        """The bytes of `path` (inside the checkpoint), exactly as the manifest lists them."""
        rel = self.relative(path)
        if self.manifest is None:
            return fsio.read_bytes(self.root / rel)
        if rel not in self.manifest["files"]:
            raise UnsafeCheckpointError(
                f"{self.root / rel}: refused: not listed in the checkpoint's manifest.json"
            )
        try:
            data = checked_bytes(self.root, rel, self.manifest)
        except OSError as exc:
            raise UnsafeCheckpointError(
                f"{self.root / rel}: unreadable ({exc.strerror or type(exc).__name__})"
            ) from None
        if data is None:
            raise UnsafeCheckpointError(
                f"{self.root / rel}: refused: its bytes differ from the checkpoint's manifest.json "
                "(changed since the checkpoint was verified)"
            )
        return data

    def open(self, path: str | os.PathLike[str]) -> CheckedFile:
        """`path` as a seekable binary stream of exactly the bytes the manifest lists (module
        docstring, "Streamed"): hashed once through its descriptor, then read by offset."""
        rel = self.relative(path)
        if self.manifest is not None and rel not in self.manifest["files"]:
            raise UnsafeCheckpointError(
                f"{self.root / rel}: refused: not listed in the checkpoint's manifest.json"
            )
        try:
            fd = fsio.open_regular(self.root / rel)
        except OSError as exc:
            raise UnsafeCheckpointError(
                f"{self.root / rel}: unreadable ({exc.strerror or type(exc).__name__})"
            ) from None
        stream = CheckedFile(fd, self.root / rel)
        if self.manifest is not None and self._hashed.get(rel) != stream.identity:
            meta = self.manifest["files"][rel]
            size, digest = stream.sha256()
            if size != meta.get("size") or digest != meta.get("sha256"):
                stream.close()
                raise UnsafeCheckpointError(
                    f"{self.root / rel}: refused: its bytes differ from the checkpoint's "
                    "manifest.json (changed since the checkpoint was verified)"
                )
            self._hashed[rel] = stream.identity
        return stream

    def names(self, pattern: str, under: Path) -> list[Path]:
        """The files under `under` whose names match the glob `pattern`: the manifest's when
        there is one (a file added later is not seen), else what lies there."""
        if self.manifest is None:
            return sorted(Path(under).glob(pattern))
        prefix = self.relative(under)
        found = []
        for rel in self.manifest["files"]:
            parent, _, name = rel.rpartition("/")
            if parent == prefix and Path(name).match(pattern):
                found.append(self.root / rel)
        return sorted(found)


HASH_CHUNK = 1 << 20  # bytes hashed at once while a streamed file is checked


class CheckedFile(io.RawIOBase):
    """A checkpoint file read by offset through one descriptor; every read checks that the inode
    has not changed since it was opened (``CheckpointFiles.open``)."""

    def __init__(self, fd: int, path: Path):
        super().__init__()
        self.fd, self.path, self.position = fd, path, 0
        self.identity = self._stat()

    def _stat(self) -> tuple[int, ...]:
        st = os.fstat(self.fd)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def sha256(self) -> tuple[int, str]:
        """(size, sha256) of the whole file, read in chunks of HASH_CHUNK bytes."""
        hasher, offset = hashlib.sha256(), 0
        while chunk := os.pread(self.fd, HASH_CHUNK, offset):
            hasher.update(chunk)
            offset += len(chunk)
        self._check()
        return offset, hasher.hexdigest()

    def _check(self) -> None:
        if self._stat() != self.identity:
            raise UnsafeCheckpointError(f"{self.path}: refused: written to while it was being read")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.identity[2]}
        self.position = base[whence] + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view):
            n = os.preadv(self.fd, [view[done:]], self.position + done)
            if n <= 0:
                break
            done += n
        self._check()
        self.position += done
        return done

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


_DOTTED = re.compile(r"[A-Za-z_]\w{0,60}(?:\.[A-Za-z_]\w{0,60}){0,8}")


def _global_name(name: str) -> str:
    """A global a pickle asked for, as a message may show it: a dotted Python name (what the
    pickle's GLOBAL opcode names), else a neutral phrase; never other bytes of the file."""
    return name if _DOTTED.fullmatch(name) else "a global that is not a Python name"


def _weights_only_reason(text: str) -> str:
    """The global torch's weights-only unpickler refused, from its message; nothing else."""
    found = re.search(r"GLOBAL ([^\s]+)", text)
    return (
        f"it names {_global_name(found.group(1))}" if found else "an object outside the allow-list"
    )


# --- torch engine: DCP ---------------------------------------------------------------------------
_DTYPES = [
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
]
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# Exactly the globals torch 2.13 writes into a DCP .metadata pickle of tensors (found by recording
# find_class while loading real checkpoints); nothing is matched by prefix or wildcard.
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "BytesStorageMetadata"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
        *(("torch", name) for name in _DTYPES),
    }
)
NON_TENSOR_FILE = "non_tensor_state.rank{rank}.json"


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the exact (module, name) pairs it is given."""

    def __init__(self, file: IO[bytes], allowed: frozenset[tuple[str, str]]):
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if "." in name or (module, name) not in self.allowed:
            raise UnsafeCheckpointError(
                f"names {_global_name(f'{module}.{name}')}, which a checkpoint written by "
                "llmtrain never holds; llmtrain never executes code from checkpoint files"
            )
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError("holds a persistent reference, which DCP metadata never has")


def load_metadata(data: bytes) -> Metadata:
    """A DCP .metadata pickle, unpickled with the exact allow-list; anything else is refused."""
    try:
        metadata = RestrictedUnpickler(io.BytesIO(data), METADATA_GLOBALS).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # malformed pickles raise all sorts
        raise UnsafeCheckpointError(
            f"is not a readable DCP metadata pickle ({type(exc).__name__})"
        ) from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class _CheckedFileSystem(FileSystem):
    """DCP's file system whose reads come from ``CheckpointFiles`` (checked, in memory)."""

    def __init__(self, files: CheckpointFiles):
        super().__init__()
        self.files = files

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "rb":
            raise UnsafeCheckpointError(f"{path}: a checkpoint is only read while loading")
        with self.files.open(path) as stream:  # read by offset: only the items asked for
            yield stream


class SafeFileSystemReader(FileSystemReader):
    """DCP's FileSystemReader reading every file through `files` (default: unchecked reads of the
    folder) and ``.metadata`` through ``load_metadata``."""

    def __init__(self, path: str | os.PathLike[str], files: CheckpointFiles | None = None):
        super().__init__(path)
        self.fs = _CheckedFileSystem(files or CheckpointFiles.unchecked(Path(path)))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        try:
            metadata = load_metadata(data)
        except UnsafeCheckpointError as exc:
            raise UnsafeCheckpointError(f"{path}: refused: it {exc}") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, except that a bytes entry is refused instead of torch.load'ed."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise UnsafeCheckpointError(
            f"checkpoint entry {read_item.dest_index.fqn!r} is a pickled object; llmtrain "
            "checkpoints hold only tensors (non-tensor state is JSON), so it is refused"
        )


def first_failure(exc: BaseException) -> BaseException | None:
    """The first rank's exception inside a DCP CheckpointException (e.g. an OSError: disk full)."""
    failures = getattr(exc, "failures", {}) or {}
    for rank in sorted(failures):
        pair = failures[rank]
        error = pair[0] if isinstance(pair, tuple) else pair
        return error if isinstance(error, BaseException) else None
    return None


def checkpoint_failure(exc: BaseException) -> str:
    """The first rank's error of a DCP CheckpointException, in one line."""
    failures = getattr(exc, "failures", {}) or {}
    for rank in sorted(failures):
        pair = failures[rank]
        error = pair[0] if isinstance(pair, tuple) else pair
        return f"rank {rank}: {type(error).__name__}: {str(error)[:600]}"
    return str(exc).splitlines()[0]


def split_non_tensor_state(
    state: dict[str, dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """({part: tensors}, {part: everything else}) of a {"model": ..., "optim": ...} state dict
    (flattened, as ``StateDictOptions(flatten_optimizer_state_dict=True)`` gives)."""
    tensors: dict[str, dict[str, Any]] = {}
    others: dict[str, dict[str, Any]] = {}
    for part, entries in state.items():
        tensors[part] = {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}
        others[part] = {k: v for k, v in entries.items() if not isinstance(v, torch.Tensor)}
    return tensors, others


def _encode(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"non-tensor checkpoint state of type {type(value).__name__} is not JSON-able")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) != {"tuple"} or not isinstance(value["tuple"], list):
            raise UnsafeCheckpointError("an object that is not a tuple in non-tensor state")
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def write_non_tensor_state(directory: Path, rank: int, others: dict[str, dict[str, Any]]) -> Path:
    path = Path(directory) / NON_TENSOR_FILE.format(rank=rank)
    document = {
        part: {k: _encode(v) for k, v in entries.items()} for part, entries in others.items()
    }
    path.write_text(json.dumps(document, sort_keys=True), encoding="utf-8")
    return path


def read_json(files: CheckpointFiles, path: Path) -> Any:
    """A JSON file of the checkpoint, from its checked bytes."""
    try:
        return json.loads(files.read(path))
    except ValueError:
        raise UnsafeCheckpointError(f"{path}: not JSON") from None


def read_non_tensor_state(
    directory: Path, files: CheckpointFiles | None = None
) -> dict[str, dict[str, Any]]:
    """The union of every rank's non-tensor state (pipeline stages hold different keys)."""
    files = files or CheckpointFiles.unchecked(Path(directory))
    merged: dict[str, dict[str, Any]] = {}
    for path in files.names(NON_TENSOR_FILE.format(rank="*"), Path(directory)):
        document = read_json(files, path)
        if not isinstance(document, dict):
            raise UnsafeCheckpointError(f"{path}: not a JSON object")
        for part, entries in document.items():
            if not isinstance(entries, dict):
                raise UnsafeCheckpointError(f"{path}: a part that is not a JSON object")
            merged.setdefault(part, {}).update({k: _decode(v) for k, v in entries.items()})
    return merged


# --- DeepSpeed engine ----------------------------------------------------------------------------
def deepspeed_globals() -> list[Any]:
    """Classes DeepSpeed pickles into its checkpoints besides tensors and builtins (found by
    loading real ZeRO 0-3 checkpoints of this version with weights_only=True)."""
    from launcher.train.deepspeed_import import import_deepspeed

    import_deepspeed()
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


_TORCH_LOAD = torch.load  # the real one, whatever ``deepspeed_loading`` puts in its place


def weights_only_load(
    path: str | os.PathLike[str], map_location: Any = None, files: CheckpointFiles | None = None
) -> Any:
    """The torch.save file `path`, from its checked bytes (`files`; default unchecked), limited
    to tensors, builtins and ``deepspeed_globals`` (never runs pickled code)."""
    files = files or CheckpointFiles.unchecked(Path(path).parent)
    data = files.read(path)
    try:
        with torch.serialization.safe_globals(deepspeed_globals()):
            return _TORCH_LOAD(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:  # a damaged or foreign file makes torch.load raise all sorts
        raise load_refusal(path, exc) from None


def load_refusal(path: str | os.PathLike[str], exc: Exception) -> UnsafeCheckpointError:
    """Why a weights-only ``torch.load`` of `path` failed, as the refusal to raise."""
    if isinstance(exc, UnsafeCheckpointError):
        return exc
    if isinstance(exc, pickle.UnpicklingError):
        return UnsafeCheckpointError(
            f"{path}: refused to load: it holds pickled objects that a weights-only load "
            f"does not allow ({_weights_only_reason(str(exc))}); llmtrain never executes code "
            "from checkpoint files"
        )
    return UnsafeCheckpointError(f"{path}: not a readable torch.save file ({type(exc).__name__})")


@contextlib.contextmanager
def forced_weights_only() -> Iterator[None]:
    """Every torch.load in this block is weights-only, whatever its caller asks for."""
    previous = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(deepspeed_globals()):
            yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = previous


def verify_weights_only(directory: Path, files: CheckpointFiles | None = None) -> None:
    """Refuse a DeepSpeed checkpoint any of whose files cannot be read without executing pickled
    code (each read from its checked bytes)."""
    files = files or CheckpointFiles.unchecked(Path(directory))
    directory = Path(directory)
    if files.manifest is None:
        paths = sorted(directory.rglob("*.pt"))
    else:
        prefix = files.relative(directory)
        paths = [
            files.root / rel
            for rel in sorted(files.manifest["files"])
            if rel.endswith(".pt") and rel.startswith(prefix + "/")
        ]
    for path in paths:
        weights_only_load(path, map_location="cpu", files=files)


@contextlib.contextmanager
def deepspeed_loading(files: CheckpointFiles) -> Iterator[None]:
    """While DeepSpeed reads a checkpoint: every ``torch.load`` (DeepSpeed's checkpoint engine,
    ``zero_to_fp32``) reads the checked bytes of a path of `files`, weights-only; a stream or a
    path outside the checkpoint is refused."""

    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, str | os.PathLike):
            raise UnsafeCheckpointError("a torch.load of a stream while loading a checkpoint")
        return weights_only_load(f, map_location=map_location, files=files)

    with forced_weights_only():
        torch.load = load
        try:
            yield
        finally:
            torch.load = _TORCH_LOAD
