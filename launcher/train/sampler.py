"""A deterministic, resumable sampler of training sequences, sharded over data-parallel ranks.

Layout of one step's global batch (G = per_rank_batch * dp_size sequences): each epoch is a
permutation of all sequence indices (numpy PCG64 seeded with (seed, epoch)); step p of the epoch
takes its slice ``perm[p*G : (p+1)*G]``, and dp rank r takes the contiguous part
``[r*per_rank_batch : (r+1)*per_rank_batch]`` of that slice. The epoch's last ``num_sequences % G``
indices are skipped; then the next epoch starts with a new permutation.

So the global batch of a step depends only on (seed, num_sequences, global batch, step), not on how
it is split over ranks: a run resumed with another dp_size but the same global batch reads exactly
the same data. The state (epoch and position within it) is tiny and goes into checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from launcher.errors import UserError


class ShardedSampler:
    def __init__(
        self, num_sequences: int, dp_rank: int, dp_size: int, per_rank_batch: int, seed: int
    ):
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} must lie in 0..dp_size-1 (dp_size={dp_size})")
        if per_rank_batch < 1:
            raise ValueError(f"per_rank_batch={per_rank_batch} must be positive")
        self.num_sequences = num_sequences
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.per_rank_batch = per_rank_batch
        self.global_batch = per_rank_batch * dp_size
        self.seed = seed
        if num_sequences < self.global_batch:
            raise UserError(
                f"the data holds {num_sequences} training sequences, fewer than one global batch "
                f"of {self.global_batch} ({per_rank_batch} per rank x {dp_size} data-parallel "
                "ranks): use more data, a shorter model.seq_length or a smaller batch"
            )
        self.steps_per_epoch = num_sequences // self.global_batch
        self.epoch = 0
        self.position = 0  # steps already taken in this epoch
        self._perm: np.ndarray | None = None
        self._perm_epoch = -1

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of all sequence indices in `epoch`."""
        if self._perm is None or self._perm_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm, self._perm_epoch = rng.permutation(self.num_sequences), epoch
        return self._perm

    def global_batch_indices(self) -> np.ndarray:
        """The whole next step's indices (all ranks), without advancing."""
        epoch, position = self.epoch, self.position
        if position >= self.steps_per_epoch:
            epoch, position = epoch + 1, 0
        start = position * self.global_batch
        return self.permutation(epoch)[start : start + self.global_batch]

    def next_batch_indices(self) -> list[int]:
        """This rank's `per_rank_batch` indices for the next step; advances the state."""
        if self.position >= self.steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.global_batch + self.dp_rank * self.per_rank_batch
        indices = self.permutation(self.epoch)[start : start + self.per_rank_batch]
        self.position += 1
        return [int(i) for i in indices]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch_indices()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_sequences": self.num_sequences,
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` left off. The global batch, data size and seed must match
        (dp_size may differ: the global batches are the same however they are split)."""
        for key in ("seed", "num_sequences", "global_batch"):
            if key in state and state[key] != getattr(self, key):
                raise UserError(
                    f"cannot resume the data order: the checkpoint's sampler has {key}="
                    f"{state[key]}, this run has {getattr(self, key)}; resume with the same "
                    "data, train.seed and global batch size, or start a new run"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
