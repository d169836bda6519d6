"""What the training loop needs from an engine, whatever the backend.

An engine owns the model, its parallel wrapping, the optimizer and its checkpoints. The loop
(``launcher.train.loop``) owns the data, the learning-rate schedule, metrics and checkpoint
cadence.

Data contract: each optimizer step, every rank calls ``step`` with the token rows of its
data-parallel shard: a LongTensor of shape [grad_accum * micro_batch_size, seq_length + 1] (inputs
are row[:-1], targets row[1:]), or for fine-tuning data [.., 3, seq_length + 1]: tokens,
trained-target flags and packed examples' ids (``launcher.train.finetune.masked_loss``; the loss is
then the global mean over trained tokens), or for preference pairs [.., 2, 3, seq_length + 1]
(chosen, rejected: ``chat.preference_rows``; micro_batch_size counts pairs, the loss is the
mean over the global batch's pairs, ``finetune.preference``). Ranks of the same dp index
(tensor, pipeline and context peers) receive the same rows. The engine splits them into
micro-batches, accumulates, clips and steps the optimizer at ``lr``. The loss it returns is the mean
token loss over the whole global batch (averaged over dp), identical on every rank.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from launcher.train.checkpoint.tensor_parts import tensor_bytes

if TYPE_CHECKING:
    from launcher.train.checkpoint.safe_load import CheckpointFiles


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's outcome, identical on every rank: the global-batch mean loss, the
    global gradient norm before clipping (None where the engine cannot tell), which of the two
    were NaN or infinite (``launcher.health.nonfinite``), and whether the update was applied
    (engines withhold the update of a non-finite step where they can)."""

    loss: float
    grad_norm: float | None
    nonfinite: tuple[str, ...] = ()
    applied: bool = True
    # Targets that carried loss in the global batch (every target of pre-training rows; the
    # unmasked ones of fine-tuning rows, launcher.train.finetune.masked_loss); None: not counted.
    trained_tokens: int | None = None
    # Preference objectives (launcher.train.finetune.preference): rewards/chosen, rewards/rejected,
    # rewards/accuracy, rewards/margin over the global batch's pairs; None otherwise.
    preference: dict[str, float] | None = None


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits. Rank order, innermost first: tp, cp, dp, pp (as `plan` assumes)."""

    rank: int
    world_size: int
    local_rank: int
    dp_rank: int
    dp_size: int
    tp_rank: int = 0
    pp_rank: int = 0
    cp_rank: int = 0


class Engine(ABC):
    info: RankInfo

    @abstractmethod
    def step(
        self, rows: torch.Tensor, lr: float, reference: torch.Tensor | None = None
    ) -> StepResult:
        """One optimizer step over this dp shard's rows (see the module docstring); with
        preference pairs and a precomputed reference, `reference` [pairs, 2] holds the
        reference's log-probabilities of this shard's pairs (launcher.train.finetune.preference)."""

    @abstractmethod
    def evaluate(self, rows: torch.Tensor) -> float:
        """Mean token loss over the global batch of `rows` (same contract as ``step``), with the
        model in eval mode (no dropout) and no gradients; the model is back in train mode after.
        Identical on every rank (a collective)."""

    @abstractmethod
    def save(self, directory: Path) -> list[Path]:
        """Write this engine's state into `directory` (a collective: every rank calls it).

        Returns the files this rank wrote (the checkpoint manifest checksums them)."""

    @abstractmethod
    def load(self, directory: Path, files: CheckpointFiles) -> None:
        """Restore the state written by `save` (a collective), reading every file through `files`
        (``CheckpointFiles.verified`` of the checkpoint: the bytes its manifest lists, read once;
        see ``launcher.train.checkpoint.safe_load``)."""

    @abstractmethod
    def local_tensors(self) -> Iterator[torch.Tensor]:
        """This rank's own part of the model's parameters (local shards), in a fixed order."""

    def weights_digest(self) -> str:
        """sha256 over every rank's local parameter bytes, in rank order (a collective).

        Two runs with the same layout end with the same digest exactly when their weights are
        bit-for-bit equal: the check that a killed and resumed run matches an uninterrupted one."""
        digest = hashlib.sha256()
        for tensor in self.local_tensors():  # NF4, DTensor, fp8: their stored bytes
            digest.update(tensor_bytes(tensor))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, digest.hexdigest())
        return hashlib.sha256("".join(everyone).encode()).hexdigest()

    def extra_state(self) -> dict[str, Any]:
        """Small JSON-able facts about the engine for the run's metrics (optional)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release process groups or engine resources."""
