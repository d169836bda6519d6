"""The torch engine's cross-entropy on a model's output: on full logits, or, under tensor
parallel, on logits left split over the vocabulary (torch's loss_parallel, torchtitan's default
under tp). Where the whole head is on the rank the model computes the loss itself, over chunks of
tokens (``launcher.train.model.chunked_loss``), and neither applies.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from launcher.train.engines.torch_grads import full
from launcher.train.finetune.masked_loss import masked_loss


def full_logits_loss(
    output: torch.Tensor, targets: torch.Tensor, divisor: float | None = None
) -> torch.Tensor:
    """The model's fp32 cross-entropy, on full logits (a tied head under tp returns a DTensor);
    with `divisor`, over trained targets only (launcher.train.finetune.masked_loss)."""
    return masked_loss(full(output), targets, divisor)


def vocab_parallel_loss(
    output: torch.Tensor, targets: torch.Tensor, divisor: float | None = None
) -> torch.Tensor:
    """The same cross-entropy on logits left split over the vocabulary across tp (a DTensor):
    torch's loss_parallel computes the log-softmax from per-shard maxima and sums, so no rank
    gathers the full logits. Runs, with its backward, inside ``loss_context(True)``; returns
    this rank's copy of the replicated loss."""
    loss = masked_loss(output, targets, divisor)
    return loss.to_local() if isinstance(loss, DTensor) else loss


def loss_context(vocab_parallel: bool) -> contextlib.AbstractContextManager[None]:
    """torch's loss_parallel() where the loss is vocabulary-parallel, else nothing."""
    return loss_parallel() if vocab_parallel else contextlib.nullcontext()
