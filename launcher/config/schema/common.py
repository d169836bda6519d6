"""Bounds and limits several config groups share."""

from __future__ import annotations

from launcher.config.schema.allowed import bounds

# Bounds shared by many keys: counts of at least 1, counts that may be 0, rates above 0.
AT_LEAST_1 = bounds(ge=1)


AT_LEAST_0 = bounds(ge=0)


ABOVE_0 = bounds(gt=0)


# Values past these are typos, not plans (the largest published runs are far below them).
LAYERS_TYPO = 10_000


HIDDEN_TYPO = 1_000_000


SEQUENCE_TYPO = 100_000_000


NODES_TYPO = 1_000_000


GPUS_PER_NODE_TYPO = 1024


# numpy seeds (Generator, legacy RandomState in Megatron-LM) and torch.manual_seed all take this.
MAX_SEED = 2**32 - 1
