"""Chat examples into training rows of model.seq_length + 1 tokens: packed or padded, with the
loss mask ``data.train_on`` asks for and the over-long policy ``data.overlong``. No torch.

A row holds seq_length + 1 tokens (inputs row[:-1], targets row[1:], as for pre-training data).
- ``data.packing=true``: examples are placed whole, in data order, into the current row while they
  fit, else into a new row (next-fit: one pass, deterministic; the sampler shuffles rows). The tail
  of each row is padding. Attention never crosses examples: the model applies a block-diagonal
  causal mask and restarts positions at every example (``launcher.train.model.transformer``).
- ``data.packing=false``: one example a row, padded at the end (causal attention alone keeps the
  example from seeing its padding; positions start at 0 already).
- Over-long examples (more than seq_length + 1 tokens): ``truncate`` keeps the first
  seq_length + 1 tokens, ``drop`` leaves the example out. An example with no trained token left
  (after truncation, or under data.train_on=completion) is dropped too, and counted.

``ChatRows.batch`` returns int64 arrays [n, 3, seq_length + 1]: channel 0 the tokens, channel 1 1
where the token is a trained target (never the first token of an example, which nothing in its
example predicts, nor padding), channel 2 the example's number within the row (1, 2, ...; padding
counts as one more example; without packing 0 on the example and PADDING (-1) on its padding, so
that a micro-batch can be cut to its longest example). The engines read that layout
(``launcher.train.finetune.masked_loss``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from launcher.config.schema.data import OVERLONG, TRAIN_ON
from launcher.data.chat.chat_prepare import ROLE_FINAL
from launcher.errors import UserError

TOKENS, TRAINED, SEGMENT = 0, 1, 2  # the channels of a batch
PADDING = -1  # SEGMENT of an unpacked row's padding


def trained_roles(roles: np.ndarray, train_on: str) -> np.ndarray:
    """Which tokens of one example carry loss (bool), before the first-token rule."""
    if train_on == "assistant":
        return np.asarray(roles > 0)
    if train_on == "completion":
        return np.asarray(roles == ROLE_FINAL)
    if train_on == "all":
        return np.ones(roles.shape, dtype=bool)
    raise UserError(f"data.train_on={train_on}: must be one of {', '.join(TRAIN_ON)}")


@dataclass(frozen=True)
class PackingReport:
    """What packing did to a split, for the prepare report and the run's log."""

    seq_length: int
    packing: bool
    overlong: str
    train_on: str
    examples: int
    kept: int
    truncated: int
    dropped_overlong: int
    dropped_untrained: int
    rows: int
    tokens_in: int  # tokens of every example
    tokens_kept: int  # tokens placed in rows
    trained_tokens: int  # targets that carry loss
    padding: int  # padding tokens in the rows

    @property
    def padding_share(self) -> float:
        slots = self.rows * (self.seq_length + 1)
        return self.padding / slots if slots else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "padding_share": round(self.padding_share, 6)}

    def _trained_what(self) -> str:
        # Preference pairs (launcher.data.chat.preference_rows) train on their responses alone.
        if self.train_on == "response":
            return "the responses of preference pairs"
        return f"data.train_on={self.train_on}"

    def line(self) -> str:
        kept = self.tokens_kept / self.tokens_in if self.tokens_in else 0.0
        dropped = self.dropped_overlong + self.dropped_untrained
        return (
            f"{self.examples:,} examples -> {self.rows:,} rows of {self.seq_length} + 1 "
            f"({'packed' if self.packing else 'padded, one example a row'}): {self.tokens_kept:,} "
            f"tokens kept ({kept:.1%}), {self.trained_tokens:,} trained ({self._trained_what()}), "
            f"padding {self.padding_share:.1%}; "
            f"{self.truncated:,} truncated, {dropped:,} dropped ({self.dropped_overlong:,} too "
            f"long under data.overlong={self.overlong}, {self.dropped_untrained:,} with no "
            "trained token)"
        )


def plan_rows(
    lengths: np.ndarray,
    trained_prefix: Any,
    seq_length: int,
    packing: bool,
    overlong: str,
    train_on: str,
) -> tuple[list[list[tuple[int, int]]], PackingReport]:
    """Rows as lists of (example index, tokens taken from its start), and the report.

    `trained_prefix(i, n)`: the number of trained targets among the first n tokens of example i
    (the first token excluded)."""
    if overlong not in OVERLONG:
        raise UserError(f"data.overlong={overlong}: must be one of {', '.join(OVERLONG)}")
    width = seq_length + 1
    rows: list[list[tuple[int, int]]] = []
    used = width  # forces a new row for the first example
    truncated = dropped_long = dropped_untrained = kept = tokens_kept = trained = 0
    for i, length in enumerate(lengths.tolist()):
        take = length
        if length > width:
            if overlong == "drop":
                dropped_long += 1
                continue
            take = width
        count = trained_prefix(i, take)
        if count == 0:
            dropped_untrained += 1
            continue
        truncated += int(take < length)
        kept += 1
        tokens_kept += take
        trained += count
        if packing and used + take <= width:
            rows[-1].append((i, take))
            used += take
        else:
            rows.append([(i, take)])
            used = take
    report = PackingReport(
        seq_length, packing, overlong, train_on, int(lengths.size), kept, truncated,
        dropped_long, dropped_untrained, len(rows), int(lengths.sum()), tokens_kept, trained,
        len(rows) * width - tokens_kept,
    )  # fmt: skip
    return rows, report


class ChatRows:
    """The training rows of one split of a prepared chat dataset (the engines' data contract:
    ``num_sequences(seq_len)`` and ``batch(indices, seq_len)``)."""

    def __init__(
        self,
        tokens: Any,
        roles: Any,
        seq_length: int,
        packing: bool,
        overlong: str,
        train_on: str,
        pad_id: int,
    ):
        """`tokens`, `roles`: IndexedDataset-like (``sequence(i)``, ``sizes``), one sequence per
        example."""
        self.tokens, self.roles = tokens, roles
        self.seq_length, self.pad_id = seq_length, pad_id
        self.packing, self.train_on = packing, train_on
        lengths = np.asarray(tokens.sizes, dtype=np.int64)

        def trained_prefix(i: int, n: int) -> int:
            mask = trained_roles(np.asarray(roles.sequence(i)[:n]), train_on)
            return int(mask[1:].sum())

        self.rows, self.report = plan_rows(
            lengths, trained_prefix, seq_length, packing, overlong, train_on
        )

    def num_sequences(self, seq_len: int) -> int:
        self._check(seq_len)
        return len(self.rows)

    def _check(self, seq_len: int) -> None:
        if seq_len != self.seq_length:
            raise ValueError(f"rows built for seq_length {self.seq_length}, asked {seq_len}")

    def row(self, r: int) -> np.ndarray:
        width = self.seq_length + 1
        out = np.zeros((3, width), dtype=np.int64)
        out[TOKENS] = self.pad_id
        at = 0
        for number, (i, take) in enumerate(self.rows[r], start=1):
            ids = np.asarray(self.tokens.sequence(i)[:take], dtype=np.int64)
            mask = trained_roles(np.asarray(self.roles.sequence(i)[:take]), self.train_on)
            mask[0] = False  # nothing in its own example predicts an example's first token
            out[TOKENS, at : at + take] = ids
            out[TRAINED, at : at + take] = mask
            if self.packing:
                out[SEGMENT, at : at + take] = number
            at += take
        if self.packing and at < width:
            out[SEGMENT, at:] = len(self.rows[r]) + 1
        elif at < width:
            out[SEGMENT, at:] = PADDING
        return out

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        self._check(seq_len)
        return (
            np.stack([self.row(int(i)) for i in indices])
            if len(indices)
            else np.zeros((0, 3, seq_len + 1), dtype=np.int64)
        )
