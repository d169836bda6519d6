"""Expert parallelism: the routed experts of each MoE layer split over the ep group, tokens sent
to their experts' ranks and back by all-to-all (GShard, Lepikhin et al. 2020; Switch Transformer,
Fedus et al. 2021).

Dropless: every (token, expert) assignment is computed, whatever the load (the config has no
capacity factor). Each ep rank holds experts [rank * E/ep, (rank + 1) * E/ep). Per MoE forward:
1. sort this rank's assignments by expert (stable, so token order is kept within an expert);
2. exchange the per-expert counts (one ``all_to_all_single`` of E integers);
3. send the tokens (``all_to_all_single`` with the counts as split sizes, differentiable: its
   backward is the reverse exchange), sort what arrived by local expert and run the local experts
   on it as grouped GEMMs (``launcher.train.model.experts``);
4. send the outputs back the same way; the caller weights them by their gates and adds them up
   per token.
Every rank runs both exchanges' backwards, also one whose experts got no rows (step 3's output is
then tied to its empty input): a collective skipped on one rank desynchronises the group.
gloo has ``all_to_all_single`` on CPU, so this runs on the same collectives as NCCL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class ExpertParallel:
    """The ep group this rank belongs to and its place in it."""

    group: Any
    size: int
    rank: int

    def local_experts(self, num_experts: int) -> range:
        per = num_experts // self.size
        return range(self.rank * per, (self.rank + 1) * per)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any
    ) -> torch.Tensor:
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    out: torch.Tensor = _AllToAll.apply(x, send, recv, group)  # type: ignore[no-untyped-call]
    return out


def sort_by_expert(expert_of: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts): the stable permutation sorting `expert_of` [N] by expert (token order kept
    within an expert) and the rows per expert [num_experts]."""
    order = torch.argsort(expert_of, stable=True)
    counts = torch.bincount(expert_of, minlength=num_experts)
    return order, counts


def inverse(order: torch.Tensor) -> torch.Tensor:
    """The inverse of the permutation `order`."""
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    return inv


def dispatch_combine(
    flat: torch.Tensor,
    top_index: torch.Tensor,
    run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    num_experts: int,
    ep: ExpertParallel,
) -> torch.Tensor:
    """The outputs [T*k, h] of the experts that tokens `flat` [T, h] are routed to by `top_index`
    [T, k], in assignment order (row t*k + j: token t's j-th expert). ``run(x, counts)`` computes
    this rank's E/ep experts on rows `x` sorted by local expert, `counts` rows each."""
    top_k = top_index.shape[1]
    per = num_experts // ep.size
    order, counts = sort_by_expert(top_index.reshape(-1), num_experts)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=ep.group)
    send = counts.view(ep.size, per).sum(1).tolist()
    recv = recv_counts.view(ep.size, per).sum(1).tolist()
    received = _all_to_all(flat[order // top_k], send, recv, ep.group)
    # Received rows come by source rank, then by expert: sort them by local expert (stable).
    local_id = torch.repeat_interleave(
        torch.arange(per, device=flat.device).repeat(ep.size),
        recv_counts.to(flat.device),
        output_size=received.shape[0],
    )
    local_order, local_counts = sort_by_expert(local_id, per)
    out = run(received[local_order], local_counts)[inverse(local_order)]
    if received.requires_grad and received.shape[0] == 0:
        # No rows came to this rank's experts: their output then does not depend on `received`,
        # and autograd would skip the dispatch all-to-all's backward here while the ranks that
        # sent rows run it: the ep group's collectives fall out of step ("Received data size
        # doesn't match expected size" at the next exchange, as soon as routing leaves one
        # rank's experts idle for a micro-batch). Keeping the empty input in the graph makes
        # every rank join every backward exchange.
        out = out + received.sum() * 0
    back = _all_to_all(out, recv, send, ep.group)
    return back[inverse(order)]
