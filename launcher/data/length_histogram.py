"""The length histogram of a prepared chat split, written by `llmtrain data prepare` into
index.json (``chat.length_histogram``) and read by `plan` to price padded batches
(``launcher.plan.padded_length``). Pure Python: no numpy needed to read it, no torch.

With ``data.packing=false`` a micro-batch is padded to its longest example, the input length
rounded up to a multiple of ``BUCKET`` tokens
(``launcher.train.finetune.masked_loss.trim_to_longest``). An example of n tokens is n - 1 inputs
(inputs row[:-1], targets row[1:]), so the histogram counts examples by that padded input length:
key L (a multiple of BUCKET) holds the examples whose n - 1 lies in (L - BUCKET, L]. Lengths are as
prepared, before ``data.overlong`` (the plan caps or drops them at model.seq_length itself).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from launcher.bounded_read import read_regular

# Inputs are padded to a multiple of 8 tokens (tensor-core friendly shapes; also the number
# torchtune's padded_collate_sft pads to with pad_to_multiple_of=8).
BUCKET = 8
HISTOGRAM_KEY = "length_histogram"
_MAX_INDEX_BYTES = 64 << 20


def padded_inputs(tokens: int) -> int:
    """The padded input length of an example of `tokens` tokens: n - 1 rounded up to BUCKET
    (at least one bucket)."""
    inputs = max(1, tokens - 1)
    return -(-inputs // BUCKET) * BUCKET


def length_histogram(lengths: Iterable[int]) -> dict[str, int]:
    """{padded input length: examples} (keys as strings, JSON's), in increasing length."""
    counts: dict[int, int] = {}
    for n in lengths:
        key = padded_inputs(int(n))
        counts[key] = counts.get(key, 0) + 1
    return {str(k): counts[k] for k in sorted(counts)}


def read_histogram(folder: str | Path) -> dict[int, int] | None:
    """The training split's histogram of the prepared chat folder; {} for a prepared folder of
    another layout (pre-training tokens: whole rows); None when there is none to read (no
    index.json, unreadable, a chat folder prepared before histograms)."""
    index = Path(folder).expanduser() / "index.json"
    try:
        data = json.loads(read_regular(index, _MAX_INDEX_BYTES, follow_symlinks=True))
        if data.get("layout") != "chat":
            return {}
        hist = {int(k): int(v) for k, v in data["chat"][HISTOGRAM_KEY].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not hist or any(k <= 0 or v < 0 for k, v in hist.items()) or sum(hist.values()) == 0:
        return None
    return dict(sorted(hist.items()))
