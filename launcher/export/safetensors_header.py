"""A safetensors file's header, read and checked against the file before anything trusts it.

The format (huggingface/safetensors, README "Format", v0.8.0): 8 bytes, a little-endian u64 N;
N bytes of UTF-8 JSON, the header; then the byte buffer. The header maps each tensor's name to
``{"dtype": "F32", "shape": [..], "data_offsets": [BEGIN, END]}`` (offsets into the buffer) and
may hold ``"__metadata__"``, a map of strings to strings. The library itself refuses a header
over 100,000,000 bytes (``MAX_HEADER_SIZE`` in safetensors/src/tensor.rs) and requires the
tensors to tile the buffer: sorted by offset, each begins where the previous ended and the last
ends at the end of the file.

``read_header`` checks all of it before a tensor is made or a byte of data is read, so a header
that lies (N past the end of the file or 2^60, offsets past the end, a shape of [100000, 100000]
over a few bytes, an unknown dtype, a duplicate or missing field) is a ``HeaderError`` (a
ValueError) naming the file and the problem, never a traceback from the library or an attempt to
allocate what the header claims. The file is opened through ``launcher.bounded_read`` (regular
files only, never blocking; a symbolic link is followed, as the Hugging Face cache links
snapshots to blobs). Names and values appear in messages only as ``launcher.excerpt`` shows them.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.excerpt import excerpt

# safetensors/src/tensor.rs (v0.8.0): MAX_HEADER_SIZE.
MAX_HEADER_BYTES = 100_000_000
METADATA = "__metadata__"
# Bytes per element of each dtype the format names (safetensors/src/tensor.rs, Dtype::size) that
# torch loads and llmtrain may meet; sub-byte dtypes (F4, F6_*) are refused by name.
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
# No tensor of a model has more dimensions than this; a longer shape is a damaged header.
MAX_DIMS = 32


class HeaderError(ValueError):
    """A safetensors file whose header cannot be trusted (the message names the file and why)."""


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets into the byte buffer after the header
    end: int


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, value: Any, where: str) -> TensorEntry:
    """One tensor's entry, each field checked (offsets against the buffer come later)."""
    tensor = f"{where}: tensor {excerpt(name)}"
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise HeaderError(f"{tensor}: not an object of dtype, shape and data_offsets")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise HeaderError(
            f"{tensor}: dtype {excerpt(dtype)} is not one llmtrain loads ({', '.join(DTYPE_BYTES)})"
        )
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(map(_int, shape)):
        raise HeaderError(
            f"{tensor}: shape {excerpt(shape)} is not a list of at most {MAX_DIMS} "
            "whole numbers >= 0"
        )
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_int, offsets)):
        raise HeaderError(f"{tensor}: data_offsets {excerpt(offsets)} is not [BEGIN, END]")
    begin, end = offsets
    need = math.prod(shape) * DTYPE_BYTES[dtype]
    if end < begin or end - begin != need:
        raise HeaderError(
            f"{tensor}: shape {excerpt(shape)} of {dtype} needs {need:,} bytes, but its "
            f"data_offsets span {end - begin:,}"
        )
    return TensorEntry(dtype, tuple(shape), begin, end)


def parse_header(header: Any, buffer_bytes: int, where: str) -> dict[str, TensorEntry]:
    """The tensors of a decoded header, checked against a byte buffer of `buffer_bytes`."""
    if not isinstance(header, dict):
        raise HeaderError(f"{where}: the header is not a JSON object")
    metadata = header.get(METADATA, {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise HeaderError(f"{where}: {METADATA} is not a map of strings to strings")
    entries = {
        name: _entry(name, value, where) for name, value in header.items() if name != METADATA
    }
    position = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != position or entry.end > buffer_bytes:
            raise HeaderError(
                f"{where}: tensor {excerpt(name)}: data_offsets [{entry.begin:,}, {entry.end:,}] "
                f"do not follow the previous tensor (at {position:,}) inside the "
                f"{buffer_bytes:,}-byte buffer"
            )
        position = entry.end
    if position != buffer_bytes:
        raise HeaderError(
            f"{where}: the tensors end at byte {position:,} of a {buffer_bytes:,}-byte buffer"
        )
    return entries


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors the safetensors file `path` holds, its header checked against its size."""
    return read_layout(path)[0]


def read_layout(path: Path) -> tuple[dict[str, TensorEntry], int]:
    """``read_header``'s tensors and the file offset where their data begins (8 + the header's
    length): an entry's bytes are [start + begin, start + end) of the file."""
    where = str(path)
    try:
        fd = bounded_read.open_regular(Path(path), follow_symlinks=True)
    except bounded_read.FileRefused as exc:
        raise HeaderError(f"{where} {exc}") from None
    except OSError as exc:
        raise HeaderError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        first = f.read(8)
        if len(first) < 8:
            raise HeaderError(f"{where}: {size} bytes, too short for a safetensors file")
        (length,) = struct.unpack("<Q", first)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise HeaderError(
                f"{where}: its header claims {length:,} bytes, but the file holds "
                f"{size - 8:,} after the length (and a header is at most "
                f"{MAX_HEADER_BYTES:,}): not a safetensors file, or a damaged one"
            )
        data = f.read(length)
    if len(data) != length:
        raise HeaderError(f"{where}: shorter than its header claims (it shrank while read)")
    try:
        header = bounded_read.loads_json(data, max_depth=4)
    except bounded_read.FileRefused as exc:
        raise HeaderError(f"{where}: its header {exc}") from None
    return parse_header(header, size - 8 - length, where), 8 + length
