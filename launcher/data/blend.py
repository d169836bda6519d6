"""Training windows from one Megatron dataset, or a weighted blend of several.

``data.blend`` follows Megatron-LM's ``--data-path`` convention: a flat list of weight, prefix
pairs, e.g. ``[0.7, /data/web_text_document, 0.3, /data/code_text_document]``; weights need not
sum to one (they are normalised).

Which dataset serves each sample is Megatron-LM's blending rule (``build_blending_indices`` in
``megatron/core/datasets/helpers.cpp``): sample i goes to the dataset whose share lags its weight
the most, argmax_d (w_d * max(i, 1) - taken_d), so every prefix of the sample order holds each
dataset within one sample of its weight. It is a pure function of the weights, so a resumed run
sees exactly the samples an uninterrupted one does. A dataset asked for more samples than it has
windows wraps around (an epoch), each epoch in a fresh order drawn from (seed, dataset, epoch).

A "window" is seq_length + 1 consecutive tokens of a dataset's token stream (documents back to
back, each ending with the end-of-document token), non-overlapping, the tail dropped: the same
packing as llmtrain's own shards and Megatron-LM's GPTDataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from launcher.data.megatron_indexed import IndexedDataset
from launcher.errors import UserError


@dataclass(frozen=True)
class BlendEntry:
    weight: float
    prefix: Path


def parse_blend(values: Sequence[object], key: str = "data.blend") -> list[BlendEntry]:
    """[w1, prefix1, w2, prefix2, ...] -> entries with weights normalised to sum to one."""
    if len(values) == 0 or len(values) % 2:
        raise UserError(
            f"{key}={list(values)}: expected weight, path pairs, e.g. "
            f"{key}=[0.7,/data/a_text_document,0.3,/data/b_text_document]"
        )
    entries: list[tuple[float, Path]] = []
    for i in range(0, len(values), 2):
        weight, prefix = values[i], values[i + 1]
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise UserError(f"{key}[{i}]={weight!r}: a weight must be a number > 0")
        if not isinstance(prefix, str) or not prefix:
            raise UserError(f"{key}[{i + 1}]={prefix!r}: expected a dataset path prefix")
        entries.append((float(weight), Path(prefix)))
    total = sum(w for w, _ in entries)
    return [BlendEntry(w / total, p) for w, p in entries]


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset of each sample, its ordinal within that dataset) for samples 0..size-1."""
    w = [float(x) for x in weights]
    taken = [0] * len(w)
    dataset = np.empty(size, dtype=np.int16)
    ordinal = np.empty(size, dtype=np.int64)
    # Plain Python floats (the same float64 arithmetic as numpy, without its per-call overhead:
    # ~5x faster; the blend's index is built once per run over every window of every dataset).
    chosen, ordinals = [0] * size, [0] * size
    for i in range(size):
        scale = i if i > 1 else 1
        best, lag = 0, w[0] * scale - taken[0]
        for d in range(1, len(w)):
            error = w[d] * scale - taken[d]
            if error > lag:  # the first maximum on ties, as Megatron-LM
                best, lag = d, error
        chosen[i], ordinals[i] = best, taken[best]
        taken[best] += 1
    dataset[:] = chosen
    ordinal[:] = ordinals
    return dataset, ordinal


class Windows(Protocol):
    """A dataset's training windows: non-overlapping runs of seq_len + 1 tokens."""

    def num_windows(self, seq_len: int) -> int: ...

    def window(self, i: int, seq_len: int) -> np.ndarray: ...


class WindowedDataset:
    """Non-overlapping windows of seq_length + 1 tokens over one Megatron dataset's stream."""

    def __init__(self, prefix: Path):
        try:
            self.data = IndexedDataset.open(prefix)
        except (FileNotFoundError, ValueError) as exc:
            raise UserError(f"data: {exc}") from None
        # Documents are written back to back: the stream is the .bin itself, in index order.
        self.stream = self.data.tokens[: self.data.num_tokens]

    def num_windows(self, seq_len: int) -> int:
        return int(self.stream.size) // (seq_len + 1)

    def window(self, i: int, seq_len: int) -> np.ndarray:
        width = seq_len + 1
        return np.asarray(self.stream[i * width : (i + 1) * width], dtype=np.int64)

    # The engines' data contract, for a dataset read on its own (no blend).
    def num_sequences(self, seq_len: int) -> int:
        return self.num_windows(seq_len)

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        rows = np.empty((len(indices), seq_len + 1), dtype=np.int64)
        for r, i in enumerate(indices):
            rows[r] = self.window(int(i), seq_len)
        return rows


class BlendedTokens:
    """The engines' data contract (``num_sequences``, ``batch``) over a weighted blend."""

    def __init__(
        self,
        entries: Sequence[BlendEntry],
        seq_len: int,
        seed: int,
        size: int | None = None,
        datasets: Sequence[Windows] | None = None,
    ):
        """`datasets`: the window source of each entry (default: its prefix as a Megatron
        dataset); anything with ``num_windows(seq_len)`` and ``window(i, seq_len)``."""
        self.entries = list(entries)
        self.seq_len, self.seed = seq_len, seed
        self.datasets: list[Windows] = (
            list(datasets) if datasets is not None else [WindowedDataset(e.prefix) for e in entries]
        )
        self.windows = [d.num_windows(seq_len) for d in self.datasets]
        for entry, count in zip(self.entries, self.windows, strict=True):
            if count == 0:
                raise UserError(
                    f"data.blend: {entry.prefix} holds fewer than seq_length+1="
                    f"{seq_len + 1} tokens; it cannot give one training window"
                )
        # One blend epoch: as many samples as all datasets have windows together, or `size` (the
        # samples a run will draw) when given, so a huge corpus costs no index it never reads.
        self.size = sum(self.windows) if size is None else size
        self.dataset_of, self.ordinal_of = blending_indices([e.weight for e in entries], self.size)
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def num_sequences(self, seq_len: int) -> int:
        if seq_len != self.seq_len:
            raise ValueError(f"built for seq_len {self.seq_len}, asked for {seq_len}")
        return self.size

    def _window_index(self, d: int, ordinal: int) -> int:
        count = self.windows[d]
        epoch, within = divmod(ordinal, count)
        key = (d, epoch)
        if key not in self._orders:
            rng = np.random.default_rng([self.seed, d, epoch])
            self._orders[key] = rng.permutation(count)
        return int(self._orders[key][within])

    def sample(self, i: int) -> tuple[int, int]:
        """(dataset, window) that blended sample i reads."""
        d = int(self.dataset_of[i])
        return d, self._window_index(d, int(self.ordinal_of[i]))

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        rows = np.empty((len(indices), seq_len + 1), dtype=np.int64)
        for r, i in enumerate(indices):
            d, w = self.sample(int(i))
            rows[r] = self.datasets[d].window(w, seq_len)
        return rows
