"""Boxes of safetensors tensors read with plain file reads, never memory-mapped.

``safe_open(...).get_slice`` maps the file: every page a rank touches stays in its resident set
until the mapping is dropped, so a rank that reads its slices (and, fine-tuning, hashes whole
tensors of its share of the base) ends up holding about as much of the file as it read (issue #39's
bench: ~2x the plan's per-rank figure). Here each box is read with ``os.pread`` into the tensor it
returns, one contiguous run at a time; the file's pages stay in the kernel's page cache (shared by
the ranks of a node, reclaimable, not in any process's resident set). A whole tensor's digest is
taken in bounded chunks of rows (``CHUNK_BYTES``), its bytes never all in memory at once.

The format (https://huggingface.co/docs/safetensors, "Format"): 8 bytes, the header's length N
(little-endian u64); N bytes of JSON, {name: {"dtype", "shape", "data_offsets": [begin, end]}} and
an optional "__metadata__"; then the data, row-major, little-endian, offsets relative to its start.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from launcher.bounded_read import FileRefused, open_regular
from launcher.export.safetensors_stream import TORCH_DTYPES
from launcher.plan.memory.build_peak import DIGEST_CHUNK_BYTES

DTYPES = TORCH_DTYPES  # safetensors' dtype names (safetensors/src/tensor.rs, Dtype)
# The most read at once for a digest: rows of a whole tensor, converted to fp32 one chunk at a time
# (the plan prices it: launcher.plan.memory.build_peak).
CHUNK_BYTES = DIGEST_CHUNK_BYTES


@dataclass(frozen=True)
class Entry:
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offset of the tensor's data in the file


def read_header(path: Path) -> dict[str, Entry]:
    """The tensors of one safetensors file, from its header alone, checked against the file
    (``launcher.export.safetensors_header``: bounded, offsets contiguous within the file)."""
    from launcher.export.safetensors_header import read_layout

    entries, start = read_layout(path)
    out = {}
    for name, info in entries.items():
        dtype = DTYPES.get(info.dtype)
        if dtype is None:
            raise ValueError(f"{path}: {name} has dtype {info.dtype}, not read here")
        out[name] = Entry(path, dtype, info.shape, start + info.begin)
    return out


def _read_into(fd: int, out: torch.Tensor, offset: int) -> None:
    """`out.nbytes` bytes of the file at `offset` into the contiguous tensor `out`."""
    view = memoryview(out.reshape(-1).view(torch.uint8).numpy().data).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"short read at byte {offset + done}")
        done += n


def read_box(entry: Entry, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    """The box `offsets` + `shape` of the tensor, in the file's dtype, read run by run
    (``read_runs``)."""
    out = torch.empty(shape, dtype=entry.dtype)
    if out.numel() == 0:
        return out
    # Opened as the header was (launcher.bounded_read): a file swapped for a FIFO or a device
    # since then is refused, naming it, instead of blocking the rank for ever.
    try:
        fd = open_regular(entry.path, follow_symlinks=True)
    except FileRefused as exc:
        raise FileRefused(f"{entry.path} {exc}") from None
    try:
        itemsize = entry.dtype.itemsize
        read_runs(
            entry.shape,
            offsets,
            out,
            lambda part, start: _read_into(fd, part, entry.begin + start * itemsize),
        )
    finally:
        os.close(fd)
    return out


def box_outside(full: tuple[int, ...], offsets: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """The box `offsets` + `shape` is not one of a tensor of shape `full` (other dims, or past
    an edge)."""
    return (
        len(offsets) != len(full)
        or len(shape) != len(full)
        or any(o < 0 or n < 0 or o + n > m for o, n, m in zip(offsets, shape, full, strict=True))
    )


def read_runs(
    full: tuple[int, ...],
    offsets: tuple[int, ...],
    out: torch.Tensor,
    read: Callable[[torch.Tensor, int], None],
) -> None:
    """Fill the contiguous `out` with the box `offsets` + ``out.shape`` of a row-major tensor of
    shape `full`, one contiguous run at a time: ``read(part, start)`` fills the 1-D `part` with
    elements [start, start + part.numel()) of the tensor flattened. A run is the box's innermost
    dims from the first one it does not cover whole (a box of whole rows is one run)."""
    shape = tuple(out.shape)
    if not full:  # a scalar
        read(out.reshape(-1), 0)
        return
    # dims after j covered whole by the box: a run is box[j] x those, contiguous in the tensor.
    j = len(full) - 1
    while j > 0 and shape[j] == full[j]:
        j -= 1
    inner = math.prod(full[j + 1 :])
    run = shape[j] * inner
    strides = [math.prod(full[k + 1 :]) for k in range(len(full))]
    flat = out.reshape(-1)
    for i, index in enumerate(_outer(shape[:j])):
        start = sum((offsets[k] + index[k]) * strides[k] for k in range(j)) + offsets[j] * inner
        read(flat[i * run : (i + 1) * run], start)


def _outer(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for n in shape:
        out = [(*prefix, i) for prefix in out for i in range(n)]
    return out


def fp32_digest(entry: Entry) -> str:
    """sha256 of the whole tensor's values as fp32 bytes (``lora.base_digest`` of it, the same
    hex), read in chunks of rows of at most CHUNK_BYTES (fp32)."""
    whole = Entry(entry.path, entry.dtype, entry.shape or (1,), entry.begin)
    return rows_digest(whole.shape, lambda offsets, shape: read_box(whole, offsets, shape))


def rows_digest(
    shape: tuple[int, ...], box: Callable[[tuple[int, ...], tuple[int, ...]], torch.Tensor]
) -> str:
    """``fp32_digest`` of a tensor of `shape` whose boxes `box(offsets, shape)` gives: its rows
    read CHUNK_BYTES (as fp32) at a time, in order."""
    hasher = hashlib.sha256()
    shape = shape or (1,)
    rows, row = shape[0], math.prod(shape[1:])
    step = max(1, CHUNK_BYTES // max(1, row * 4))
    for first in range(0, rows, step):
        n = min(step, rows - first)
        part = box((first,) + (0,) * (len(shape) - 1), (n, *shape[1:]))
        hasher.update(part.float().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()
