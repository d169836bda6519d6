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

from launcher.config.layout import Layout
from launcher.train.engines.torch_grads import full
from launcher.train.finetune.masked_loss import Micro, masked_loss, micro_batches, unpack
from launcher.train.finetune.preference_loss import token_logps
from launcher.train.parallel.ring_attention import shard_sequence


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


def token_log_probs(
    output: torch.Tensor, targets: torch.Tensor, vocab_parallel: bool
) -> torch.Tensor:
    """Each target's fp32 log-probability [b, s] (0 where ignored), for preference losses
    (finetune.preference_loss): from full logits, or under tp from logits split over the
    vocabulary (loss_parallel's cross-entropy with reduction="none", inside ``loss_context``)."""
    return token_logps(output if vocab_parallel else full(output), targets)


def cp_unpacked(
    rows: torch.Tensor, cp: int, cp_rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(inputs, targets, segments) of `rows`, this cp rank's share of the sequence."""
    inputs, targets, segments = unpack(rows)
    if cp > 1:
        inputs = shard_sequence(inputs, cp, cp_rank)
        targets = shard_sequence(targets, cp, cp_rank)
    return inputs, targets, segments


def cp_micro_batches(rows: torch.Tensor, layout: Layout, cp_rank: int) -> list[Micro]:
    """The unpacked micro-batches of a step (pp = 1), each cut to its longest example; with
    cp > 1 whole rows, sharded (each rank's two chunks need the full, evenly divisible sequence)."""
    mbs = layout.micro_batch_size
    if layout.cp == 1:
        return micro_batches(rows, mbs)
    inputs, targets, seg = cp_unpacked(rows, layout.cp, cp_rank)
    cut = [slice(i, i + mbs) for i in range(0, len(rows), mbs)]
    return [(inputs[c], targets[c], None if seg is None else seg[c]) for c in cut]
