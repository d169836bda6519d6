"""Preference pairs into training rows: the batch contract of preference data. No torch.

A prepared preference dataset (``launcher.data.chat.chat_prepare``, ``chat.input_format:
"preference"``) stores pair i as sequences 2i (prompt + chosen) and 2i + 1 (prompt + rejected),
each with its loss roles; the response is role 2 (``ROLE_FINAL``), the only tokens that carry
loss, whatever data.train_on says.

``PreferenceRows.batch(indices, seq_len)`` returns int64 [n, 2, 3, seq_len + 1]: for each of the
n pairs, [:, 0] the chosen sequence and [:, 1] the rejected one, each a padded chat row
(``launcher.data.packing``: channel 0 the tokens, channel 1 1 where the target is a response
token, channel 2 zeros: one example a row). A pair is one sample: the sampler, data parallel and
micro-batches count pairs, so chosen and rejected are always in the same micro-batch, where the
engines concatenate them along the batch (all chosen, then all rejected: TRL's "concatenated
forward", ``finetune.preference``). Rows are never packed (data.packing=false; validate
refuses packing for preference data).

Over-long sequences (more than seq_len + 1 tokens): ``truncate`` keeps the first seq_len + 1
tokens of each (TRL's "keep_start"), ``drop`` leaves the pair out when either is too long. A pair
where either sequence is left with no response token is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from launcher.config.schema.data import OVERLONG
from launcher.data.chat.chat_prepare import ROLE_FINAL
from launcher.data.packing import SEGMENT, TOKENS, TRAINED, PackingReport
from launcher.errors import UserError

CHOSEN, REJECTED = 0, 1  # the pair axis of a batch


def is_preference_index(chat: dict[str, Any] | None) -> bool:
    """Whether a prepared folder's ``chat`` index entry is preference data."""
    return bool(chat) and chat.get("input_format") == "preference"  # type: ignore[union-attr]


def packing_message(source: str) -> str:
    """Why packing is refused for preference data (validate and the pre-launch data check)."""
    return (
        f"data.packing=true with {source}: preference pairs are not packed (each sequence of a "
        "pair is one padded row); set data.packing=false"
    )


class PreferenceRows:
    """The training pairs of one split of a prepared preference dataset (the engines' data
    contract: ``num_sequences(seq_len)`` pairs and ``batch(indices, seq_len)``)."""

    def __init__(self, tokens: Any, roles: Any, seq_length: int, overlong: str, pad_id: int):
        if overlong not in OVERLONG:
            raise UserError(f"data.overlong={overlong}: must be one of {', '.join(OVERLONG)}")
        sizes = np.asarray(tokens.sizes, dtype=np.int64)
        if sizes.size % 2:
            raise UserError(
                f"{sizes.size} sequences: preference data holds pairs (an even count); prepare "
                "it again with --input-format preference"
            )
        self.tokens, self.roles = tokens, roles
        self.seq_length, self.pad_id = seq_length, pad_id
        width = seq_length + 1
        self.pairs: list[tuple[int, int, int]] = []  # (first sequence, taken 2i, taken 2i + 1)
        truncated = dropped_long = dropped_untrained = kept_tokens = trained = 0
        for first in range(0, sizes.size, 2):
            lengths = sizes[first : first + 2]
            if overlong == "drop" and (lengths > width).any():
                dropped_long += 1
                continue
            takes = [min(int(n), width) for n in lengths]
            counts = [self._trained(first + k, takes[k]).sum() for k in (CHOSEN, REJECTED)]
            if min(counts) == 0:
                dropped_untrained += 1
                continue
            truncated += int((lengths > width).sum())
            kept_tokens += sum(takes)
            trained += int(sum(counts))
            self.pairs.append((first, takes[0], takes[1]))
        rows = 2 * len(self.pairs)
        self.report = PackingReport(
            seq_length, False, overlong, "response", int(sizes.size), rows, truncated,
            2 * dropped_long, 2 * dropped_untrained, rows, int(sizes.sum()), kept_tokens, trained,
            rows * width - kept_tokens,
        )  # fmt: skip

    def _trained(self, sequence: int, take: int) -> np.ndarray:
        """Which targets of the first `take` tokens carry loss: the response, never the first
        token (nothing in its row predicts it)."""
        mask: np.ndarray = np.asarray(self.roles.sequence(sequence)[:take]) == ROLE_FINAL
        mask[:1] = False
        return mask

    def num_sequences(self, seq_len: int) -> int:
        self._check(seq_len)
        return len(self.pairs)

    def _check(self, seq_len: int) -> None:
        if seq_len != self.seq_length:
            raise ValueError(f"rows built for seq_length {self.seq_length}, asked {seq_len}")

    def pair(self, p: int) -> np.ndarray:
        """Pair p as [2, 3, seq_length + 1] (module docstring)."""
        first, *takes = self.pairs[p]
        out = np.zeros((2, 3, self.seq_length + 1), dtype=np.int64)
        out[:, TOKENS] = self.pad_id
        for k, take in enumerate(takes):
            out[k, TOKENS, :take] = np.asarray(self.tokens.sequence(first + k)[:take])
            out[k, TRAINED, :take] = self._trained(first + k, take)
        out[:, SEGMENT] = 0
        return out

    def batch(self, indices: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        self._check(seq_len)
        if not len(indices):
            return np.zeros((0, 2, 3, seq_len + 1), dtype=np.int64)
        return np.stack([self.pair(int(i)) for i in indices])
