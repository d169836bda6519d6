"""The runtime reader of prepared token data: memory-mapped shards (see ``launcher.data.prepare``
for how they are made and what the index holds). No torch import."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from launcher.data.prepare import (
    INDEX_FILE,
    PreparedIndex,
    builtin_corpus_dir,
    check_vocab,
    default_cache_root,
)
from launcher.errors import UserError
from launcher.fsio import sha256_file

__all__ = ["TokenShards", "builtin_corpus_dir", "check_vocab", "default_cache_root"]


# --- reading shards ------------------------------------------------------------------------------
class TokenShards:
    """The token stream of a prepared directory, memory-mapped (read-only)."""

    def __init__(self, path: Path, verify: bool = False):
        self.path = Path(path)
        self.index = PreparedIndex.load(self.path)
        dtype = np.dtype(self.index.dtype).newbyteorder("<")
        self.shards: list[np.ndarray] = []
        for shard in self.index.shards:
            file = self.path / shard.file
            if not file.is_file():
                raise UserError(f"{file}: listed in {self.path / INDEX_FILE} but missing")
            size = file.stat().st_size
            if size != shard.tokens * dtype.itemsize:
                raise UserError(
                    f"{file}: {size} bytes, expected {shard.tokens} {self.index.dtype} tokens "
                    f"({shard.tokens * dtype.itemsize} bytes); prepare the data again"
                )
            if verify and sha256_file(file) != shard.sha256:
                raise UserError(f"{file}: sha256 differs from the index; prepare the data again")
            self.shards.append(np.memmap(file, dtype=dtype, mode="r", shape=(shard.tokens,)))
        # starts[i]: offset of shard i in the concatenated stream.
        self.starts = np.cumsum([0, *(s.tokens for s in self.index.shards)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def vocab_size(self) -> int:
        return self.index.vocab_size

    def num_sequences(self, seq_len: int) -> int:
        """Non-overlapping windows of seq_len + 1 tokens."""
        return len(self) // (seq_len + 1)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the concatenated stream, as int64."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"tokens [{start}, {stop}) outside 0..{len(self)}")
        parts = []
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        for i in range(first, len(self.shards)):
            lo, hi = int(self.starts[i]), int(self.starts[i + 1])
            if lo >= stop:
                break
            parts.append(self.shards[i][max(start, lo) - lo : min(stop, hi) - lo])
        if not parts:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(parts).astype(np.int64)

    def sequence(self, i: int, seq_len: int) -> np.ndarray:
        """Window i: tokens [i*(seq_len+1), (i+1)*(seq_len+1)) as int64."""
        n = self.num_sequences(seq_len)
        if not 0 <= i < n:
            raise IndexError(f"sequence {i} outside 0..{n - 1} (seq_len {seq_len})")
        width = seq_len + 1
        return self.tokens(i * width, (i + 1) * width)

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        """Rows [len(indices), seq_len + 1] (int64), the engines' data contract."""
        rows = np.empty((len(indices), seq_len + 1), dtype=np.int64)
        for r, i in enumerate(indices):
            rows[r] = self.sequence(int(i), seq_len)
        return rows
