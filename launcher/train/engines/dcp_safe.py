"""Reading torch.distributed.checkpoint (DCP) folders without ever unpickling code.

DCP (torch 2.13) stores tensors in ``*.distcp`` files (read back with ``weights_only=True``), but
its ``.metadata`` file is a plain pickle read with ``pickle.load``, and non-tensor entries
("bytes" entries, e.g. the optimizer's param_groups) are ``torch.save`` payloads read back with
``torch.load(weights_only=False)``. Either runs any code a tampered checkpoint names. So:

- ``SafeFileSystemReader`` reads ``.metadata`` with ``RestrictedUnpickler``: every global the
  pickle names must be an exact (module, name) pair of ``METADATA_GLOBALS``; a name with a dot
  (which pickle protocol 4+ would resolve attribute by attribute, e.g. ``os.system`` reached
  through an allowed module) is refused, and so is everything else, whatever the protocol.
- llmtrain keeps non-tensor state out of pickles: ``split_non_tensor_state`` separates it and
  ``write_non_tensor_state`` stores it as JSON (floats round-trip exactly through ``repr``), one
  file per rank. DCP then only holds tensors.
- ``TensorOnlyLoadPlanner`` refuses any bytes entry a tampered ``.metadata`` could introduce, so
  DCP's ``torch.load(weights_only=False)`` is never reached.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

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


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint holds something that would need code execution to read; it is refused."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the exact (module, name) pairs it is given."""

    def __init__(self, file: IO[bytes], allowed: frozenset[tuple[str, str]]):
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if "." in name or (module, name) not in self.allowed:
            raise UnsafeCheckpointError(
                f"names {module}.{name}, which a checkpoint written by llmtrain never holds; "
                "llmtrain never executes code from checkpoint files"
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
        raise UnsafeCheckpointError(f"is not a readable DCP metadata pickle ({exc})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose ``.metadata`` goes through ``load_metadata``."""

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
            raise UnsafeCheckpointError(f"unexpected object {value!r} in non-tensor state")
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


def read_non_tensor_state(directory: Path) -> dict[str, dict[str, Any]]:
    """The union of every rank's non-tensor state (pipeline stages hold different keys)."""
    merged: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(directory).glob(NON_TENSOR_FILE.format(rank="*"))):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UnsafeCheckpointError(f"{path}: unreadable ({exc})") from None
        if not isinstance(document, dict):
            raise UnsafeCheckpointError(f"{path}: not a JSON object")
        for part, entries in document.items():
            if not isinstance(entries, dict):
                raise UnsafeCheckpointError(f"{path}: {part!r} is not a JSON object")
            merged.setdefault(part, {}).update({k: _decode(v) for k, v in entries.items()})
    return merged
