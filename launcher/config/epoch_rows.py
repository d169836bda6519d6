"""How many training rows one epoch of the prepared data is: what ``train.epochs`` multiplies.

``train.epochs`` (launcher/config/schema/) sets the run's optimizer steps from the data's size:

    steps = ceil(epochs * rows / train.global_batch_size)

where ``rows`` are the sequences the sampler deals out (``num_sequences`` of the training data,
launcher/train/data.py). The trainer counts them on the opened data and uses that exact number
(launcher/train/trainer.py). Everything else (`plan`, `validate`, `render`) reads it here from the
prepared folder's index.json alone, small JSON, no torch and no token file:

- pre-training tokens (llmtrain's ``shards`` layout): ``total_tokens // (seq_length + 1)`` whole
  windows, exactly what ``TokenShards.num_sequences`` counts;
- chat data with ``data.packing=false``: one example a row, the examples of
  ``chat.length_histogram`` (``launcher.data.length_histogram``) less, under
  ``data.overlong=drop``, those whose input exceeds seq_length; exact up to the examples the
  trainer also drops for having no trained token left (it logs them);
- chat data with ``data.packing=true``: the rows next-fit packing fills (``launcher.data.packing``:
  examples placed whole, in data order, into the current row while they fit). The histogram
  keeps lengths to 8 tokens, not their order, so the rows are those of next-fit over the
  histogram's examples in a fixed shuffled order, each at its bucket's upper length (an estimate:
  a few tokens long per example, so a few rows more than the run's; the run logs its count).

Anything else (no data.path, data.blend, a Megatron-indexed folder, a built-in dataset, an
unreadable or older index) gives None: the data's size is unknown, and `plan` prices train.steps /
train.tokens instead and says so.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from launcher.bounded_read import read_regular
from launcher.config.schema import LLMTrainConfig

_MAX_INDEX_BYTES = 64 << 20
# The histogram's bucket (launcher.data.length_histogram.BUCKET, not imported: launcher.data
# imports numpy, and this module stays importable with the configuration alone).
_BUCKET = 8
# The fixed order next-fit is simulated in (module docstring): any seed; fixed so plan repeats.
_PACKING_SEED = 0


@dataclass(frozen=True)
class EpochRows:
    """The rows of one epoch and how they were counted, for the plan's note."""

    rows: int
    how: str


def epoch_steps(epochs: float, rows: int, global_batch_size: int) -> int:
    """Optimizer steps of `epochs` passes over `rows` rows at `global_batch_size` rows a step
    (the last, partial batch counts as a step: ceil)."""
    return max(1, math.ceil(epochs * rows / max(1, global_batch_size) - 1e-9))


def epoch_rows(cfg: LLMTrainConfig) -> EpochRows | None:
    """One epoch's training rows read from data.path's index.json (module docstring), or None."""
    d = cfg.data
    if d.path is None or d.blend:
        return None
    index = _read_index(str(Path(d.path).expanduser() / "index.json"))
    if index is None:
        return None
    seq = cfg.model.seq_length
    try:
        layout = index.get("layout", "shards")
        if layout == "shards":
            windows = int(index["total_tokens"]) // (seq + 1)
            return EpochRows(windows, f"{windows:,} windows of {seq + 1:,} tokens in data.path")
        if layout != "chat":
            return None
        hist = {int(k): int(v) for k, v in index["chat"]["length_histogram"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not hist or any(k <= 0 or v < 0 for k, v in hist.items()):
        return None
    if not d.packing:
        kept = sum(c for length, c in hist.items() if length <= seq or d.overlong != "drop")
        return EpochRows(kept, f"{kept:,} examples in data.path, one a row")
    rows = _next_fit_rows(tuple(sorted(hist.items())), seq, d.overlong)
    return EpochRows(
        rows, f"about {rows:,} packed rows (next-fit over data.path's length histogram)"
    )


def index_layout(folder: str) -> str | None:
    """The layout a prepared folder's index.json names (shards, megatron, chat); None when it
    cannot be read."""
    index = _read_index(str(Path(folder).expanduser() / "index.json"))
    layout = None if index is None else index.get("layout", "shards")
    return layout if isinstance(layout, str) else None


@lru_cache(maxsize=16)
def _read_index(path: str) -> dict[str, Any] | None:
    try:
        data = json.loads(read_regular(Path(path), _MAX_INDEX_BYTES, follow_symlinks=True))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@lru_cache(maxsize=64)
def _next_fit_rows(hist: tuple[tuple[int, int], ...], seq_length: int, overlong: str) -> int:
    """Rows next-fit packing fills with the histogram's examples: an example of padded input
    length L (a bucket's upper end) holds L + 1 tokens; a row holds seq_length + 1; over-long ones
    are cut to a row (truncate) or left out (drop)."""
    width = seq_length + 1
    tokens: list[int] = []
    for length, count in hist:
        n = length + 1
        if n > width:
            if overlong == "drop":
                continue
            n = width
        tokens.extend([n] * count)
    random.Random(_PACKING_SEED).shuffle(tokens)
    rows, used = 0, width
    for n in tokens:
        if used + n <= width:
            used += n
        else:
            rows, used = rows + 1, n
    return rows


def budget_note(cfg: LLMTrainConfig, steps: int) -> str | None:
    """The line `plan` prints under its totals where train.epochs sets the length: the rows it
    counted, or that the data's size is unknown and which key priced the steps instead."""
    epochs = cfg.train.epochs
    if epochs is None:
        return None
    rows = epoch_rows(cfg)
    if rows is not None:
        return f"train.epochs={epochs:g} over {rows.how}: {steps:,} steps"
    given = (
        f"train.tokens={cfg.train.tokens:,}"
        if cfg.train.tokens is not None
        else f"train.steps={cfg.train.steps}"
    )
    where = (
        "no prepared data.path"
        if cfg.data.path is None
        else f"data.path={cfg.data.path} gives no example count"
    )
    return (
        f"train.epochs={epochs:g}: the data's size is unknown ({where}), "
        f"so {steps:,} steps priced from {given}; `llmtrain data prepare` and data.path=DIR "
        "price the epochs"
    )
