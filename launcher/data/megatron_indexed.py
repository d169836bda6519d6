"""Megatron-LM's indexed dataset format (``PREFIX.bin`` + ``PREFIX.idx``), written and read.

The layout, as Megatron-LM's ``megatron/core/datasets/indexed_dataset.py`` (``_IndexWriter`` /
``_IndexReader``) defines it, all integers little-endian:

``PREFIX.idx``
    ==========  =====================  ==============================================
    offset      type                   content
    ==========  =====================  ==============================================
    0           9 bytes                magic ``b"MMIDIDX\\x00\\x00"``
    9           uint64                 version, 1
    17          uint8                  dtype code of the tokens (see ``DTYPE_CODES``)
    18          uint64                 S, the number of sequences
    26          uint64                 D, the number of document indices (documents + 1)
    34          int32[S]               the length in tokens of each sequence
    34 + 4S     int64[S]               the byte offset of each sequence in ``PREFIX.bin``
    34 + 12S    int64[D]               document boundaries, as sequence indices: 0, ..., S
    ==========  =====================  ==============================================

``PREFIX.bin``
    The tokens of every sequence, back to back, in the dtype above.

Here every document is one sequence (what Megatron-LM's ``tools/preprocess_data.py`` writes without
``--split-sentences``), ending with the tokenizer's end-of-document token when it has one. Token
dtype: uint16 while the vocabulary fits below 65,500, else int32 (Megatron-LM's
``DType.optimal_dtype``). Nothing here imports torch.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron-LM's DType enum values.
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document indices


def optimal_dtype(vocab_size: int) -> type[np.generic]:
    """uint16 below 65,500 tokens of vocabulary, int32 above (Megatron-LM's choice)."""
    return np.uint16 if vocab_size < 65_500 else np.int32


def dtype_code(dtype: type[np.generic]) -> int:
    for code, candidate in DTYPE_CODES.items():
        if np.dtype(candidate) == np.dtype(dtype):
            return code
    raise ValueError(f"dtype {np.dtype(dtype)} has no Megatron-LM code")


class IndexedDatasetWriter:
    """Appends documents to ``PREFIX.bin`` and writes ``PREFIX.idx`` on ``finish``.

    The caller decides where the files go (a temporary folder that is renamed into place keeps a
    half-written dataset from ever being seen).
    """

    def __init__(self, prefix: Path, vocab_size: int):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(optimal_dtype(vocab_size))
        self._bin = open(Path(f"{self.prefix}.bin"), "wb")  # noqa: SIM115 (closed in finish)
        self._lengths: list[int] = []

    def add_document(self, tokens: np.ndarray | Iterable[int]) -> None:
        array = np.asarray(tokens)
        if array.size and (array.min() < 0 or array.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token id out of range for {self.dtype}")
        self._bin.write(array.astype(self.dtype, copy=False).tobytes(order="C"))
        self._lengths.append(int(array.size))

    def finish(self) -> None:
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        write_index(Path(f"{self.prefix}.idx"), self.dtype.type, self._lengths)


def write_index(path: Path, dtype: type[np.generic], lengths: list[int]) -> None:
    """PREFIX.idx for one document per sequence with these token counts."""
    count = len(lengths)
    sizes = np.asarray(lengths, dtype=np.int32)
    pointers = np.zeros(count, dtype=np.int64)
    if count:
        np.cumsum(sizes[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    documents = np.arange(count + 1, dtype=np.int64)
    with open(path, "wb") as f:
        f.write(_HEADER.pack(MAGIC, VERSION, dtype_code(dtype), count, count + 1))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(documents.tobytes())
        f.flush()
        os.fsync(f.fileno())


@dataclass(frozen=True)
class IndexedDataset:
    """A memory-mapped ``PREFIX.bin`` / ``PREFIX.idx`` pair (read-only)."""

    prefix: Path
    dtype: np.dtype
    sizes: np.ndarray  # int32 [sequences]
    pointers: np.ndarray  # int64 [sequences], byte offsets into .bin
    document_indices: np.ndarray  # int64 [documents + 1]
    tokens: np.ndarray  # the whole .bin as one flat array of `dtype`

    @classmethod
    def open(cls, prefix: Path) -> IndexedDataset:
        prefix = Path(prefix)
        # Not with_suffix: a prefix may hold dots of its own (web.en_text_document).
        idx_path, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        for path in (idx_path, bin_path):
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path}: missing (a Megatron dataset is PREFIX.bin + .idx)"
                )
        raw = np.memmap(idx_path, dtype=np.uint8, mode="r")
        if raw.size < _HEADER.size:
            raise ValueError(f"{idx_path}: too short for a Megatron index header")
        magic, version, code, count, doc_count = _HEADER.unpack(bytes(raw[: _HEADER.size]))
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{idx_path}: not a Megatron MMIDIDX version-1 index")
        if code not in DTYPE_CODES:
            raise ValueError(f"{idx_path}: unknown token dtype code {code}")
        expected = _HEADER.size + 12 * count + 8 * doc_count
        if raw.size < expected:
            raise ValueError(f"{idx_path}: {raw.size} bytes, the header promises {expected}")
        offset = _HEADER.size
        sizes = np.frombuffer(raw, np.int32, count, offset)
        pointers = np.frombuffer(raw, np.int64, count, offset + 4 * count)
        documents = np.frombuffer(raw, np.int64, doc_count, offset + 12 * count)
        dtype = np.dtype(DTYPE_CODES[code])
        total = int(sizes.astype(np.int64).sum())
        bin_bytes = bin_path.stat().st_size
        if bin_bytes < total * dtype.itemsize:
            raise ValueError(
                f"{bin_path}: {bin_bytes} bytes, the index describes {total} {dtype} tokens"
            )
        tokens = (
            np.memmap(bin_path, dtype=dtype, mode="r", shape=(bin_bytes // dtype.itemsize,))
            if bin_bytes
            else np.zeros(0, dtype=dtype)
        )
        return cls(prefix, dtype, sizes, pointers, documents, tokens)

    def __len__(self) -> int:
        return int(self.sizes.size)

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.astype(np.int64).sum())

    def sequence(self, i: int) -> np.ndarray:
        """The tokens of sequence `i` (a view into the memory map)."""
        start = int(self.pointers[i]) // self.dtype.itemsize
        return self.tokens[start : start + int(self.sizes[i])]
