"""Validation loss during training (``train.eval_every`` steps, ``train.eval_steps`` batches).

The evaluation batches are fixed for the whole run: batch b is validation samples
[b*G, (b+1)*G) (G, the global batch) and data-parallel rank r reads its contiguous share
[r*P, (r+1)*P) of it (P = micro_batch_size * grad_accum, the rows a training step gives it), so
every evaluation of a run, resumed or not, reads the same tokens. The engine runs them with the
model in eval mode (no dropout) and no gradients (``Engine.evaluate``); val_loss is the mean of the
batches' mean token losses, val_ppl its exponential. Fine-tuning rows (chat data) weigh each batch
by its trained tokens, so val_loss is the mean over every trained token of the evaluation
(``launcher.train.finetune.masked_loss``'s convention; every rank reads the whole global batch's
loss masks to count them, no collective). No RNG is drawn: training is not disturbed.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from launcher.train.engines.base import Engine


def eval_due(done: int, total: int, eval_every: int | None) -> bool:
    """After every `eval_every` steps, and after the last step."""
    if not eval_every or eval_every < 1:
        return False
    return done % eval_every == 0 or done == total


class Evaluator:
    def __init__(self, data: Any, eval_steps: int, per_rank_batch: int, dp_rank: int, dp_size: int):
        self.data = data
        self.eval_steps = eval_steps
        self.per_rank_batch, self.dp_rank = per_rank_batch, dp_rank
        self.global_batch = per_rank_batch * dp_size

    def indices(self, b: int) -> list[int]:
        """This rank's validation samples in evaluation batch b."""
        start = b * self.global_batch + self.dp_rank * self.per_rank_batch
        return list(range(start, start + self.per_rank_batch))

    def weight(self, b: int, seq_len: int) -> float:
        """Trained targets in evaluation batch b over every rank (1.0 for pre-training rows)."""
        start = b * self.global_batch
        rows = self.data.batch(list(range(start, start + self.global_batch)), seq_len)
        return float((rows[:, 1, 1:] > 0).sum()) if rows.ndim == 3 else 1.0

    def run(self, engine: Engine, seq_len: int) -> dict[str, float]:
        losses, weights = [], []
        for b in range(self.eval_steps):
            rows = torch.from_numpy(self.data.batch(self.indices(b), seq_len))
            losses.append(engine.evaluate(rows))
            weights.append(self.weight(b, seq_len) if rows.dim() == 3 else 1.0)
        total = sum(weights)
        loss = sum(x * w for x, w in zip(losses, weights, strict=True)) / total if total else 0.0
        return {"val_loss": loss, "val_ppl": math.exp(min(loss, 700.0))}
