"""The torch engine's gradients after the backward passes: averaged over the data-parallel ranks
where the engine does it itself (tp or pp or expert parallel with zero.stage=0, see
``launcher.train.engines.torch_engine``), and clipped on their global norm over every shard,
expert and pipeline stage.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (its shards gathered), else `t`."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def average(grads: list[torch.Tensor], group: Any, ranks: int) -> None:
    """Sum `grads` in place over `group` (None: this rank alone) and divide by `ranks` (the
    ranks whose losses the global-batch mean averages: dp x cp), one flat buffer per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        if group is not None:
            dist.all_reduce(flat, group=group)
        flat /= ranks
        offset = 0
        for g in same:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def local_grads(
    params: list[nn.Parameter], *, chosen: set[int], inside: bool
) -> list[torch.Tensor]:
    """This rank's part of the gradients of `params` whose id is (`inside`) or is not in
    `chosen`."""
    return [
        p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        for p in params
        if p.grad is not None and (id(p) in chosen) == inside
    ]


def clip_with_experts(
    params: list[nn.Parameter], experts: set[int], max_norm: float, ep_group: Any
) -> float:
    """The global gradient norm under expert parallel, and `params` clipped to `max_norm`
    (0: not clipped): replicated parameters count once, each rank's own experts once, so the
    experts' squared norms are summed over the ep group."""
    shared = [cast(torch.Tensor, p.grad) for p in params if id(p) not in experts]
    mine = [cast(torch.Tensor, p.grad) for p in params if id(p) in experts]
    # Under tp the norms of sharded gradients are summed over tp first (full).
    expert_sq = full(torch.nn.utils.get_total_norm(mine, 2.0)).float() ** 2
    dist.all_reduce(expert_sq, group=ep_group)
    shared_sq = full(torch.nn.utils.get_total_norm(shared, 2.0)).float() ** 2
    total = (shared_sq + expert_sq).sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def clip_over_stages(params: list[nn.Parameter], max_norm: float, pp_group: Any) -> float:
    """The global gradient norm with pipeline parallel (each stage's squared norm summed over
    the "pp" group), and `params` clipped to `max_norm` (0: not clipped)."""
    grads = [cast(torch.Tensor, p.grad) for p in params]
    local = full(torch.nn.utils.get_total_norm(grads, 2.0)).float() ** 2
    dist.all_reduce(local, group=pp_group)
    total = local.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
