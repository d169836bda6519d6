"""The loss of fine-tuning rows: only trained tokens count, averaged over the whole global batch.

Rows (``launcher.data.packing``): pre-training rows are [n, seq + 1] token ids; chat rows are
[n, 3, seq + 1]: tokens, 1 where a token is a trained target, the example number within the row
(0 everywhere: one example, no document mask needed). ``unpack`` gives inputs [n, seq], targets
[n, seq] with ``IGNORE_INDEX`` where a target carries no loss, and the segment ids of the inputs
(None for pre-training rows and for padded, unpacked rows).

The convention (one place): the loss of a step is the mean over every trained token of the global
batch, all micro-batches and data-parallel ranks together: sum of the token losses / N, N the
trained tokens of the global batch. Not a mean of per-micro-batch means, which would weigh a
token of a short micro-batch more. Each engine counts N before the forward (one all-reduce of a
scalar over the data-parallel ranks) and gives every micro-batch the loss
sum_mb / (N / (dp x accum)): the engines' own averaging (divide by the micro-batch count, average
gradients over dp) then yields exactly sum / N, and so does the logged loss. With every target
trained (pre-training) N / (dp x accum) is the micro-batch's token count and this is the plain
mean. ``loss_divisor`` computes that divisor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # the targets of untrained tokens (torch's cross_entropy default)


def is_chat_rows(rows: torch.Tensor) -> bool:
    return rows.dim() == 3


def unpack(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(inputs, targets, segments) of pre-training or chat rows (see the module docstring)."""
    if not is_chat_rows(rows):
        return rows[:, :-1], rows[:, 1:], None
    tokens, trained, segment = rows[:, 0], rows[:, 1], rows[:, 2]
    targets = torch.where(trained[:, 1:] > 0, tokens[:, 1:], IGNORE_INDEX)
    segments = segment[:, :-1]
    packed = bool((segments > 0).any())
    return tokens[:, :-1], targets, segments if packed else None


def trained_tokens(rows: torch.Tensor) -> torch.Tensor:
    """Trained targets in `rows` (a 0-dim int64 tensor on the rows' device)."""
    if not is_chat_rows(rows):
        return torch.tensor(rows.shape[0] * (rows.shape[1] - 1), device=rows.device)
    return (rows[:, 1, 1:] > 0).sum()


def loss_divisor(global_trained: float, dp: int, accum: int) -> float:
    """What each micro-batch divides its summed token loss by (module docstring); at least one
    token, so a batch without trained tokens gives a zero loss and zero gradients."""
    return max(float(global_trained), 1.0) / (dp * accum)


def masked_loss(
    logits: torch.Tensor, targets: torch.Tensor, divisor: float | None = None
) -> torch.Tensor:
    """Cross-entropy (fp32) of logits [b, s, V] against targets [b, s]: the mean over all targets
    when `divisor` is None (pre-training), else the sum over trained targets / `divisor`."""
    flat, t = logits.float().flatten(0, 1), targets.flatten()
    if divisor is None:
        return F.cross_entropy(flat, t)
    return F.cross_entropy(flat, t, ignore_index=IGNORE_INDEX, reduction="sum") / divisor


class LossFn:
    """A loss function object for schedules that take one fixed at build time (torch's pipeline
    schedules, DeepSpeed's PipelineModule): ``divisor`` is set before each step (None: the plain
    mean). `inner(logits, targets, divisor)`: the loss to apply."""

    def __init__(self, inner: object = masked_loss):
        self.inner = inner
        self.divisor: float | None = None

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.inner(logits, targets, self.divisor)  # type: ignore[operator, no-any-return]
