"""Batches as they are: the length `plan` prices a padded micro-batch at.

With ``data.packing=false`` each row holds one example and the engines cut every micro-batch to
its longest example, the inputs rounded up to a multiple of 8
(``launcher.train.finetune.masked_loss. trim_to_longest``; the torch engine with pp = cp = 1,
DeepSpeed without its pipeline). The activations and the compute of a step then follow that length,
not model.seq_length. `plan` reads the training split's length histogram that `data prepare` wrote
(``launcher.data.length_histogram``) and prices the expected longest of k = train.micro_batch_size
examples:

    Let L_1 < ... < L_m be the padded input lengths (each capped at S = model.seq_length under
    data.overlong=truncate; examples above S left out under drop), with counts c_j, N = sum c_j,
    and F_j = (c_1 + ... + c_j) / N the share of examples no longer than L_j (F_0 = 0). The
    sampler draws the k rows of a micro-batch from a shuffled epoch; for N >> k the draws are
    nearly independent, so P(longest <= L_j) = F_j^k and P(longest = L_j) = F_j^k - F_(j-1)^k:

        E[longest of k] = sum_j L_j * (F_j^k - F_(j-1)^k)

    (k = 1: the mean length; k -> infinity: L_m, the longest example.)

The plan prices memory and time at that expected length rounded up to a whole token: one number
for every step, where real steps vary around it (a micro-batch holding the longest example costs
more; the peak memory of a run is reached at its longest micro-batch, up to L_m). Without a
readable histogram (no data.path, a folder prepared before histograms, not chat data) the plan
prices model.seq_length and says so. Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.backends.build_order import cuts_to_longest
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.data.length_histogram import read_histogram


@dataclass(frozen=True)
class PricedLength:
    """The input length a micro-batch is priced at, and the line `plan` prints about it."""

    tokens: int
    note: str


def expected_longest(hist: dict[int, int], k: int) -> float:
    """E[the longest of k independent draws] from the histogram {length: count} (module
    docstring's derivation)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    total = sum(hist.values())
    expected, below, previous = 0.0, 0, 0.0
    for length in sorted(hist):
        below += hist[length]
        cdf_k = (below / total) ** k
        expected += length * (cdf_k - previous)
        previous = cdf_k
    return expected


def capped(hist: dict[int, int], seq_length: int, overlong: str) -> dict[int, int]:
    """The histogram as the run sees it: lengths above seq_length truncated to it, or dropped."""
    out: dict[int, int] = {}
    for length, count in hist.items():
        if length > seq_length:
            if overlong == "drop":
                continue
            length = seq_length
        out[length] = out.get(length, 0) + count
    return out


def padded_batches(cfg: LLMTrainConfig, layout: Layout) -> bool:
    """Whether the run pads micro-batches to their longest example (module docstring)."""
    return not cfg.data.packing and cuts_to_longest(cfg) and layout.pp == 1 and layout.cp == 1


def priced_length(cfg: LLMTrainConfig, layout: Layout) -> PricedLength | None:
    """The length to price a micro-batch at, or None where rows are whole (packed data,
    pre-training data, an engine that does not cut)."""
    if not padded_batches(cfg, layout) or (cfg.data.path is None and cfg.data.builtin != "chat"):
        return None
    seq, k = cfg.model.seq_length, layout.micro_batch_size
    hist = read_histogram(cfg.data.path) if cfg.data.path and not cfg.data.blend else None
    if hist == {}:  # pre-training tokens: whole windows
        return None
    if hist is not None:
        hist = capped(hist, seq, cfg.data.overlong)
    if not hist:
        where = f"data.path={cfg.data.path}" if cfg.data.path else "data.builtin=chat"
        return PricedLength(
            seq,
            f"priced at {seq:,} tokens (model.seq_length: {where} has no length histogram to "
            "price padded batches from; `llmtrain data prepare` writes one)",
        )
    tokens = min(seq, math.ceil(expected_longest(hist, k)))
    return PricedLength(
        tokens,
        f"priced at {tokens:,} tokens (expected longest of {k} example{'s' if k > 1 else ''}, "
        f"from data.path's histogram; model.seq_length={seq:,}, longest example "
        f"{max(hist):,})",
    )
