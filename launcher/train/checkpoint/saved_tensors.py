"""Tensors of ``torch.save`` files read by offset, a box at a time, through a checked descriptor:
DeepSpeed's checkpoint files (``deepspeed_tensors``) and the items of DCP's ``.distcp`` files
(``consolidate.DcpTensors``: each item is one ``torch.save`` of a saved chunk).

A ``torch.save`` file is a zip whose pickle names the tensors and whose records hold their
storages. ``layout`` loads the pickle weights-only (tensors, builtins and the classes it is
given: ``safe_load.deepspeed_globals`` for DeepSpeed's files) with ``map_location="meta"``,
which reads no tensor data: torch 2.13 (``serialization._load``, ``load_tensor``) gives each
meta storage the byte offset of its record in the file (``_checkpoint_offset``), predicted from
the sizes the pickle declares (``_get_offset``), never compared with the records: ``layout``
reads the zip's records and ``where_stored`` holds each storage to one (where its data starts,
as long as it), then turns the meta tensor into where its values lie; ``Stored.read`` reads
elements of it with ``pread`` through the descriptor, and ``safetensors_slices.read_runs`` reads
a box of it run by run, nothing else.

The descriptor is a ``safe_load.CheckedFile`` (``CheckpointFiles.open``): the file was hashed
through it and compared with the manifest before anything here reads it. A file changed after its
hash: the descriptor keeps the inode that was hashed, so a name swapped for another file is never
read; a write in place moves the inode's change time, which ``CheckedFile`` compares after every
read, so the read is refused (a write within one tick of the file system's clock of the open is
the limit of that check, as for every streamed file). A reader of many files (DeepSpeed's: 2 W
under ZeRO-3) holds at most ``Descriptors.LIMIT`` of them open; one closed and opened again must
be the inode, size and times of its first open, or it is refused. Nothing is memory-mapped:
``torch.load(mmap=True)`` would map the file again by its name (a swap between hash and map would
map another inode), a private mapping shows later writes to pages not yet touched, a truncation
would kill the process with SIGBUS (here: a short read, refused), and every page touched would
stay in the resident set (over an export, the whole model).
"""

from __future__ import annotations

import errno
import io
import math
import struct
import sys
import weakref
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, cast

import torch

from launcher.train.checkpoint.engine_dirs import ConsolidateError

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.train.checkpoint.safe_load import CheckedFile, CheckpointFiles

# {file ``layout`` read: {byte offset of a record's data: its length}}: what ``where_stored``
# holds a tensor's storage to (torch.load's own check, "record size ... does not match").
_RECORDS: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()
# The zip's local file header (PKWARE APPNOTE.TXT 4.3.7): 30 bytes, the lengths of the name and
# of the extra field at bytes 26 and 28, the record's data right after them.
_LOCAL_HEADER = struct.Struct("<4s22xHH")


class Window(io.RawIOBase):
    """Bytes [offset, offset + length) of a checked file, as a file of their own (a DCP item)."""

    def __init__(self, file: CheckedFile, offset: int, length: int):
        super().__init__()
        self.file, self.offset, self.length, self.position = file, offset, length, 0
        self.path = file.path

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        if base + offset < 0:  # as a file refuses it (EINVAL): never the bytes ahead of it
            raise OSError(errno.EINVAL, f"seek to {base + offset}, before the start of the item")
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        view = view[: max(0, min(len(view), self.length - self.position))]
        self.file.seek(self.offset + self.position)
        done = self.file.readinto(view)
        self.position += done
        return done


class Descriptors:
    """The checkpoint files a reader reads again and again (a DeepSpeed checkpoint's: 2 W of
    them under ZeRO-3 at W ranks), at most LIMIT open at once: the least recently read one is
    closed, and opened again through ``CheckpointFiles.open`` when it is read next. That open
    hashes nothing again (``CheckpointFiles`` keeps what it hashed: the inode, size and times),
    and a file whose inode, size or times differ from those of its first open (swapped,
    truncated, written to) is refused, as ``CheckedFile`` refuses it between two reads."""

    # Well under the usual soft limit of open files (1024, ``ulimit -n``).
    LIMIT = 128

    def __init__(self, files: CheckpointFiles):
        self.files = files
        self.open: OrderedDict[Path, CheckedFile] = OrderedDict()
        self.identity: dict[Path, tuple[int, ...]] = {}

    def get(self, path: Path) -> CheckedFile:
        """The open descriptor of `path` (opened again if it was closed)."""
        from launcher.train.checkpoint.safe_load import UnsafeCheckpointError

        stream = self.open.pop(path, None)
        if stream is None:
            stream = self.files.open(path)  # hashed against the manifest the first time
            if self.identity.setdefault(path, stream.identity) != stream.identity:
                stream.close()
                raise UnsafeCheckpointError(f"{path}: refused: written to while it was being read")
        self.open[path] = stream
        while len(self.open) > self.LIMIT:
            self.open.popitem(last=False)[1].close()
        return stream


class PooledFile(io.RawIOBase):
    """A checkpoint file read through its ``Descriptors`` (open when read), as a file."""

    def __init__(self, descriptors: Descriptors, path: Path):
        super().__init__()
        self.descriptors, self.path, self.position = descriptors, path, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        stream = self.descriptors.get(self.path)
        stream.seek(self.position)
        self.position = stream.seek(offset, whence)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        stream = self.descriptors.get(self.path)
        stream.seek(self.position)
        done = stream.readinto(buffer)
        self.position += done
        return done


def read_at(file: CheckedFile | Window | PooledFile, out: torch.Tensor, offset: int) -> None:
    """``out.nbytes`` bytes of `file` at `offset` into the contiguous tensor `out`."""
    view = memoryview(out.reshape(-1).view(torch.uint8).numpy().data).cast("B")
    file.seek(offset)
    if file.readinto(view) != len(view):  # readinto refuses a file written to since its hash
        raise ConsolidateError(f"{file.path}: shorter than its tensors say (a damaged file?)")


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """How many elements of its storage a tensor of `shape` and `stride` spans, from its first
    to its last (0 when it has none)."""
    if not all(shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for n, s in reversed(list(zip(shape, stride, strict=True))):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


@dataclass(frozen=True)
class Stored:
    """A tensor where a torch.save file stores it: `begin` is the byte offset of its first
    element (its record's offset plus its storage offset)."""

    file: CheckedFile | Window | PooledFile
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    begin: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def read(self, part: torch.Tensor, start: int) -> None:
        """Elements [start, start + part.numel()) of the tensor flattened, into `part`."""
        if _contiguous(self.shape, self.stride):
            read_at(self.file, part, self.begin + start * self.dtype.itemsize)
            return
        # A view saved with its base's strides: the span it covers, then its elements.
        whole = torch.empty(_span(self.shape, self.stride), dtype=self.dtype)
        read_at(self.file, whole, self.begin)
        values = whole.as_strided(self.shape, self.stride).reshape(-1)
        part.copy_(values[start : start + part.numel()])


def where_stored(tensor: Any, file: CheckedFile | Window | PooledFile, what: str) -> Stored:
    """The meta tensor `tensor` of `file` loaded by ``layout``, as where its values lie."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta":
        raise ConsolidateError(f"{file.path}: {what} is not a tensor")
    storage = tensor.untyped_storage()
    record = getattr(storage, "_checkpoint_offset", None)
    shape, stride = tuple(tensor.shape), tuple(tensor.stride())
    itemsize = tensor.element_size()
    end = (tensor.storage_offset() + _span(shape, stride)) * itemsize
    if not isinstance(record, int) or _RECORDS.get(file, {}).get(record) != storage.nbytes():
        raise ConsolidateError(f"{file.path}: {what} is not where a record of its file lies")
    if min(stride, default=0) < 0 or end > storage.nbytes():
        raise ConsolidateError(f"{file.path}: {what} lies outside its stored record")
    begin = record + int(tensor.storage_offset()) * itemsize
    return Stored(file, tensor.dtype, shape, stride, begin)


def _records(archive: zipfile.ZipFile, stream: CheckedFile | Window | PooledFile) -> dict[int, int]:
    """{byte offset of a record's data: its length} of the records of `archive` (read from
    `stream`) stored uncompressed, as torch.save writes them: a compressed one is no storage."""
    records = {}
    for info in archive.infolist():
        stream.seek(info.header_offset)
        header = stream.read(_LOCAL_HEADER.size) or b""
        if info.compress_type != zipfile.ZIP_STORED or len(header) != _LOCAL_HEADER.size:
            continue
        magic, name, extra = _LOCAL_HEADER.unpack(header)
        if magic == b"PK\x03\x04":
            records[info.header_offset + _LOCAL_HEADER.size + name + extra] = info.file_size
    return records


def layout(
    stream: CheckedFile | Window | PooledFile, path: Path, allowed: list[Any] | None = None
) -> Any:
    """The pickle of the torch.save file `stream` (from its start), weights-only (tensors,
    builtins and the classes `allowed`), its tensors on the meta device: nothing but the zip's
    directory and the pickle is read."""
    from launcher.train.checkpoint.safe_load import load_refusal

    try:
        stream.seek(0)
        with zipfile.ZipFile(cast(IO[bytes], stream)) as archive:
            orders = [n for n in archive.namelist() if n.endswith("/byteorder")]
            order = archive.read(orders[0]).decode() if orders else sys.byteorder
            _RECORDS[stream] = _records(archive, stream)
        if order != sys.byteorder:
            raise ConsolidateError(f"{path}: written {order}-endian, read on {sys.byteorder}")
        stream.seek(0)
        with torch.serialization.safe_globals(allowed or []):
            return torch.load(cast(IO[bytes], stream), map_location="meta", weights_only=True)
    except ConsolidateError:
        raise
    except Exception as exc:  # a damaged or foreign file makes these raise all sorts
        raise load_refusal(path, exc) from None
