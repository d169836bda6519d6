"""Preference training inside an engine (finetune.objective=dpo|simpo|orpo): one micro-batch's
loss from preference rows, the reference's log-probabilities, the step's reward metrics.

The batch contract (``launcher.data.chat.preference_rows``): each step a rank receives its pairs as
int64 [pairs, 2, 3, seq + 1] (chosen, rejected); a micro-batch is ``micro_batch_size`` pairs. Its
sequences go through the model in ONE forward, concatenated along the batch: all the chosen rows,
then all the rejected rows ([2 x pairs, seq], TRL's "concatenated forward"), so the model sees
2 x micro_batch_size sequences (what ``plan`` prices). The loss (``launcher.train
.preference_loss``) is the mean over the micro-batch's pairs; the engines average micro-batches
and data-parallel ranks as for any loss, which gives the mean over the global batch's pairs.

The reference (dpo only; ``launcher.plan.preference.reference_mode``):
- adapters-off (finetune=lora|qlora): the same model with its adapters switched off
  (``finetune.adapters.disable_adapters``), forward under no_grad before the policy's, no
  second copy of the weights;
- precomputed: the reference's summed log-probabilities of every pair, computed before step 1 by
  ``logps`` over the data (``launcher.train.finetune.preference_reference``), passed to the step;
- copy (finetune=full): a second model, frozen (no gradients, eval mode), built by the engine the
  way it builds the policy from the same train.init_from and sharded the same way; its forward
  (the engine's ``reference_forward``) under no_grad before the policy's, as adapters-off.

The engine gives the forward (tokens -> logits, under its autocast and loss contexts) and the
per-token log-probabilities of its logits (full, or split over the vocabulary under tp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.schema import LLMTrainConfig
from launcher.plan.preference import reference_mode
from launcher.train.finetune import adapters
from launcher.train.finetune.masked_loss import unpack
from launcher.train.finetune.preference_loss import (
    Settings,
    pair_losses,
    pair_mean,
    reward_metrics,
    reward_sums,
    sequence_logps,
)

Forward = Callable[[torch.Tensor], torch.Tensor]
TokenLogps = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SUMS = 5  # preference_loss.reward_sums


def settings(cfg: LLMTrainConfig) -> Settings:
    ft = cfg.finetune
    return Settings(ft.objective, ft.beta, ft.loss_type, ft.label_smoothing, ft.simpo_gamma)


def is_pairs(rows: torch.Tensor) -> bool:
    """Preference rows [pairs, 2, 3, seq + 1] (launcher.data.chat.preference_rows)."""
    return rows.dim() == 4


def concatenated(pairs: torch.Tensor) -> torch.Tensor:
    """[m, 2, 3, s + 1] -> [2m, 3, s + 1]: the m chosen rows, then the m rejected rows."""
    return torch.cat([pairs[:, 0], pairs[:, 1]])


def response_tokens(rows: torch.Tensor) -> torch.Tensor:
    """The trained targets (response tokens) of preference rows, a 0-dim int64 tensor."""
    return (rows[:, :, 1, 1:] > 0).sum()


class PreferenceObjective:
    """An engine's preference loss: ``micro_loss`` per micro-batch, ``finish`` per step."""

    def __init__(self, cfg: LLMTrainConfig):
        self.settings = settings(cfg)
        self.mode = reference_mode(cfg)  # None, "adapters-off", "precomputed" or "copy"
        self.sums: torch.Tensor | None = None
        self.metrics: dict[str, float] = {}

    def _sequence_logps(
        self, forward: Forward, token_logps: TokenLogps, inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return sequence_logps(token_logps(forward(inputs), targets), targets)

    def micro_loss(
        self,
        model: nn.Module,
        forward: Forward,
        token_logps: TokenLogps,
        pairs: torch.Tensor,
        reference: torch.Tensor | None = None,
        reference_forward: Forward | None = None,
    ) -> torch.Tensor:
        """The mean loss of one micro-batch of pairs [m, 2, 3, s + 1]; `reference` [m, 2]: the
        precomputed reference log-probs (dpo with reference=precomputed); `reference_forward`:
        the frozen copy's forward (reference=copy). Adds to the step's reward sums."""
        m = pairs.shape[0]
        inputs, targets, _ = unpack(concatenated(pairs))
        ref: tuple[torch.Tensor, torch.Tensor] | None = None
        # A live reference first, so that its logits are gone before the policy's activations
        # exist.
        if self.mode == "adapters-off":
            with torch.no_grad(), adapters.disable_adapters(model):
                sums, _ = self._sequence_logps(forward, token_logps, inputs, targets)
            ref = (sums[:m], sums[m:])
        elif self.mode == "copy":
            if reference_forward is None:
                raise ValueError("finetune.reference=copy: the step got no reference model")
            with torch.no_grad():
                sums, _ = self._sequence_logps(reference_forward, token_logps, inputs, targets)
            ref = (sums[:m], sums[m:])
        elif self.mode == "precomputed" and reference is None:
            raise ValueError("finetune.reference=precomputed: the step got no reference")
        sums, counts = self._sequence_logps(forward, token_logps, inputs, targets)
        if reference is not None and self.mode == "precomputed":
            table = reference.to(sums.device, sums.dtype)
            ref = (table[:, 0], table[:, 1])
        losses = pair_losses(self.settings, sums[:m], sums[m:], (counts[:m], counts[m:]), ref)
        step = reward_sums(losses)
        self.sums = step if self.sums is None else self.sums + step
        return pair_mean(losses)

    def finish(self, group: Any = None) -> dict[str, float]:
        """The step's reward metrics over the data-parallel `group` (a collective when it has
        more than one rank); resets the sums for the next step."""
        sums = self.sums if self.sums is not None else torch.zeros(SUMS)
        self.sums = None
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(sums, group=group)
        self.metrics = reward_metrics(sums)
        return self.metrics

    @torch.no_grad()
    def logps(
        self, forward: Forward, token_logps: TokenLogps, pairs: torch.Tensor, micro: int
    ) -> torch.Tensor:
        """Summed response log-probs [n, 2] (chosen, rejected) of pairs [n, 2, 3, s + 1], in
        micro-batches of `micro` pairs (the reference pass), fp64 on the CPU."""
        out = []
        for start in range(0, pairs.shape[0], micro):
            chunk = pairs[start : start + micro]
            inputs, targets, _ = unpack(concatenated(chunk))
            sums, _ = self._sequence_logps(forward, token_logps, inputs, targets)
            out.append(sums.view(2, -1).t().double().cpu())
        return torch.cat(out) if out else torch.zeros((0, 2), dtype=torch.float64)
