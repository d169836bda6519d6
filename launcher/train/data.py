"""The runtime reader of prepared token data: memory-mapped shards (see ``launcher.data.prepare``
for how they are made and what the index holds). No torch import."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from launcher.cache_dir import cache_root
from launcher.config.schema import LLMTrainConfig
from launcher.data.blend import BlendedTokens, BlendEntry, WindowedDataset, Windows
from launcher.data.builtin_corpus import builtin_corpus_dir
from launcher.data.chat.chat_checks import open_chat_rows
from launcher.data.sources import SourceInfo, data_spec, describe, validation_sources
from launcher.data.token_index import INDEX_FILE, PreparedIndex, check_vocab
from launcher.errors import UserError
from launcher.fsio import sha256_file

__all__ = [
    "TokenShards",
    "builtin_corpus_dir",
    "check_vocab",
    "training_data",
    "validation_data",
]


# --- reading shards ------------------------------------------------------------------------------
class TokenShards:
    """The token stream of a prepared directory, memory-mapped (read-only)."""

    def __init__(self, path: Path, verify: bool = False, split: str = "train"):
        self.path = Path(path)
        self.index = PreparedIndex.load(self.path)
        dtype = np.dtype(self.index.dtype).newbyteorder("<")
        self.shards: list[np.ndarray] = []
        listed = self.index.valid_shards if split == "valid" else self.index.shards
        for shard in listed:
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
        self.starts = np.cumsum([0, *(s.tokens for s in listed)])

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

    # As a blend entry (launcher.data.blend.Windows).
    def num_windows(self, seq_len: int) -> int:
        return self.num_sequences(seq_len)

    def window(self, i: int, seq_len: int) -> np.ndarray:
        return self.sequence(i, seq_len)

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        """Rows [len(indices), seq_len + 1] (int64), the engines' data contract."""
        rows = np.empty((len(indices), seq_len + 1), dtype=np.int64)
        for r, i in enumerate(indices):
            rows[r] = self.sequence(int(i), seq_len)
        return rows


# --- what a run reads ----------------------------------------------------------------------------
def open_split(info: SourceInfo, split: str) -> Any:
    """The windows of one split of a dataset (num_windows/window and num_sequences/batch)."""
    if info.kind == "megatron":
        return WindowedDataset(info.path)
    if info.train_prefix is not None:  # a prepared folder in Megatron's format
        prefix = info.valid_prefix if split == "valid" else info.train_prefix
        assert prefix is not None, f"{info.path} has no {split} split"
        return WindowedDataset(prefix)
    return TokenShards(info.path, split=split)


class CheckedTokens:
    """Refuses a batch holding token ids the model's embedding has no row for (a dataset whose
    tokenizer is not recorded, e.g. a bare Megatron prefix, is checked here, batch by batch)."""

    def __init__(self, data: Any, vocab_size: int, where: str):
        self.data, self.vocab_size, self.where = data, vocab_size, where

    def num_sequences(self, seq_len: int) -> int:
        return int(self.data.num_sequences(seq_len))

    @property
    def report(self) -> Any:
        """Chat data's packing report (launcher.data.packing.PackingReport), else None."""
        return getattr(self.data, "report", None)

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        rows: np.ndarray = self.data.batch(indices, seq_len)
        # chat rows: [n, 3, seq + 1]; preference pairs: [n, 2, 3, seq + 1]
        tokens = rows[:, 0] if rows.ndim == 3 else rows[:, :, 0] if rows.ndim == 4 else rows
        if tokens.size and int(tokens.max()) >= self.vocab_size:
            raise UserError(
                f"{self.where} holds token id {int(tokens.max())}, outside model.vocab_size="
                f"{self.vocab_size}; set model.vocab_size={int(tokens.max()) + 1} or more (the "
                "size of the tokenizer the data was made with)"
            )
        return rows


def _described(cfg: LLMTrainConfig) -> tuple[list[BlendEntry], list[SourceInfo]] | None:
    spec = data_spec(cfg.data.path, list(cfg.data.blend) or None)
    if spec is None:
        return None
    infos = [describe(str(e.prefix), k) for e, k in zip(spec.entries, spec.keys, strict=True)]
    return list(spec.entries), infos


# The built-in fine-tuning datasets: chat conversations, preference pairs (prepared on first use).
BUILTIN_ROWS = ("chat", "preference")


def _builtin_rows(name: str) -> SourceInfo:
    if name == "preference":
        from launcher.data.chat.builtin_preference import builtin_preference_dir

        return describe(str(builtin_preference_dir(cache_root())), "data.builtin=preference")
    from launcher.data.chat.builtin_chat import builtin_chat_dir

    return describe(str(builtin_chat_dir(cache_root())), "data.builtin=chat")


def training_data(cfg: LLMTrainConfig) -> CheckedTokens:
    """data.path (a prepared folder or a Megatron prefix), data.blend, or the built-in corpus."""
    seq, vocab = cfg.model.seq_length, cfg.model.vocab_size
    described = _described(cfg)
    if described is None and cfg.data.builtin in BUILTIN_ROWS:
        info = _builtin_rows(cfg.data.builtin)
        key = f"data.builtin={cfg.data.builtin}"
        return CheckedTokens(open_chat_rows(info, "train", cfg), vocab, key)
    if described is None:
        shards = TokenShards(builtin_corpus_dir(cache_root()))
        check_vocab(shards.index, vocab)
        return CheckedTokens(shards, vocab, "the built-in corpus")
    entries, infos = described
    if infos[0].chat is not None and not cfg.data.blend:
        rows = open_chat_rows(infos[0], "train", cfg)
        return CheckedTokens(rows, vocab, f"data.path={cfg.data.path}")
    if not cfg.data.blend:
        return CheckedTokens(open_split(infos[0], "train"), vocab, f"data.path={cfg.data.path}")
    datasets: list[Windows] = [open_split(i, "train") for i in infos]
    blend = BlendedTokens(entries, seq, cfg.train.seed, datasets=datasets)
    return CheckedTokens(blend, vocab, "data.blend")


class _Cycled:
    """Window i mod n of one dataset: any number of evaluation samples from a small split."""

    def __init__(self, data: Any, seq_len: int):
        self.data, self.count = data, int(data.num_windows(seq_len))

    def num_sequences(self, seq_len: int) -> int:
        return self.count

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        return np.asarray(self.data.batch([int(i) % self.count for i in indices], seq_len))


class _CycledRows:
    """Row i mod n of chat rows: any number of evaluation samples from a small split."""

    def __init__(self, rows: Any):
        self.rows, self.count = rows, max(1, int(rows.num_sequences(rows.seq_length)))
        self.report = rows.report

    def num_sequences(self, seq_len: int) -> int:
        return self.count

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        return np.asarray(self.rows.batch([int(i) % self.count for i in indices], seq_len))


def validation_data(cfg: LLMTrainConfig, samples: int) -> CheckedTokens | None:
    """The validation windows (sample i for i < `samples`), or None when there are none."""
    seq, vocab = cfg.model.seq_length, cfg.model.vocab_size
    described = _described(cfg)
    if described is None and cfg.data.valid_path is None and cfg.data.builtin in BUILTIN_ROWS:
        rows = open_chat_rows(_builtin_rows(cfg.data.builtin), "valid", cfg)
        return CheckedTokens(_CycledRows(rows), vocab, f"data.builtin={cfg.data.builtin} (valid)")
    if described is None and cfg.data.valid_path is None:
        return None
    entries, infos = described if described is not None else ([], [])
    chosen = validation_sources(infos, [e.weight for e in entries], cfg.data.valid_path)
    if not chosen:
        return None
    if len(chosen) == 1:
        _, info, split = chosen[0]
        if info.chat is not None:
            rows = open_chat_rows(info, split, cfg)
            return CheckedTokens(_CycledRows(rows), vocab, f"{info.key} ({split})")
        return CheckedTokens(_Cycled(open_split(info, split), seq), vocab, f"{info.key} ({split})")
    blend = BlendedTokens(
        [BlendEntry(w, i.path) for w, i, _ in chosen],
        seq,
        cfg.train.seed,
        size=samples,
        datasets=[open_split(i, s) for _, i, s in chosen],
    )
    return CheckedTokens(blend, vocab, "the validation blend")
