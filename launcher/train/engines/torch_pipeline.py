"""The torch engine's pipeline parallel (pp > 1), with ``torch.distributed.pipelining``: what a
chunk of the model keeps, the schedule over this rank's chunks (GPipe, 1F1B or interleaved 1F1B
with parallel.vpp chunks per rank), and one training or evaluation pass through it. The loss lives
on the last stage; the other stages return zero, which the engine's sum over the world leaves out.
``torch.distributed.pipelining`` is imported when a schedule is built: it imports torch._dynamo
(~0.8 CPU s a rank, measured here), which a run without pipeline stages never uses.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from launcher.config.layout import Layout


def keep_chunk(model: Any, lay: Layout, chunk: int) -> None:
    """Delete from `model` (on the meta device) what pipeline chunk `chunk` does not hold: the
    layers outside its range, the embeddings off the first chunk, norm and head off the last."""
    start = sum(lay.chunk_layers[:chunk])
    keep = {str(i) for i in range(start, start + lay.chunk_layers[chunk])}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if chunk != 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if chunk != lay.pp * lay.vpp - 1:
        model.norm = None
        model.output = None


def build_schedule(
    parts: list[nn.Module],
    chunk_ids: list[int],
    lay: Layout,
    device: torch.device,
    *,
    group: Any,
    kind: str,
    loss_fn: Any,
) -> Any:
    """The pipeline schedule (parallel.pp_schedule `kind`) over this rank's `parts`."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    chunks = lay.pp * lay.vpp
    stages = [
        PipelineStage(part, chunk, chunks, device, group=group)
        for part, chunk in zip(parts, chunk_ids, strict=True)
    ]
    n = lay.grad_accum
    if kind == "interleaved":
        return ScheduleInterleaved1F1B(cast(Any, stages), n_microbatches=n, loss_fn=loss_fn)
    cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=n, loss_fn=loss_fn)


def run_schedule(
    schedule: Any,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    first: bool,
    last: bool,
    train: bool,
    device: torch.device,
) -> torch.Tensor:
    """One pass of `schedule` over the micro-batches (``step``: forward and backward; else
    ``eval``): the mean loss of the micro-batches on the last stage, zero on the others."""
    run = schedule.step if train else schedule.eval
    args = (inputs,) if first else ()
    if not last:
        run(*args)
        return torch.zeros((), device=device)
    losses: list[torch.Tensor] = []
    run(*args, target=targets, losses=losses)
    return torch.stack([x.detach().float() for x in losses]).mean()
