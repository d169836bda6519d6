"""Context parallelism: causal ring attention over the cp group, with load-balanced chunks.

The sequence is cut into 2 * cp equal chunks and cp rank r holds chunks r and 2cp-1-r, so every
rank does the same causal work (the zig-zag layout of Megatron-LM's context parallel; Brandon et
al., "Striped attention", 2023, discuss the imbalance it removes). Attention is ring attention
(Liu et al., "Ring Attention with Blockwise Transformers", 2023): each rank keeps its queries and
passes its keys/values around the ring, cp steps; the blocks are merged with the log-sum-exp
rescaling of online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022). The
backward runs the ring again, passing each rank's key/value gradients along with its keys/values
so that they arrive back at their owner after cp hops (FlashAttention's backward per block:
dS = P * (dP - rowsum(dO * O))).

Communication is plain point-to-point (``batch_isend_irecv``), which gloo has on CPU. The block
math is in fp32 for fp32/bf16/fp16 inputs (autocast off inside), returned in q's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


def chunk_positions(
    seq_len: int, cp: int, rank: int, device: torch.device | None = None
) -> torch.Tensor:
    """Token positions held by cp rank `rank`: chunks rank and 2cp-1-rank of 2cp (LongTensor)."""
    chunk = seq_len // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    mirror = 2 * cp - 1 - rank
    second = torch.arange(mirror * chunk, (mirror + 1) * chunk, device=device)
    return torch.cat([first, second])


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's part of `x` along `dim` (the positions of ``chunk_positions``)."""
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=dim)


def _expand(kv: torch.Tensor, groups: int) -> torch.Tensor:
    """Repeat kv heads for grouped-query attention: query head h uses kv head h // groups."""
    return kv.repeat_interleave(groups, dim=1) if groups > 1 else kv


def _scores(
    q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float
) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) * scale
    visible = q_pos[:, None] >= k_pos[None, :]
    return s.masked_fill(~visible, float("-inf"))


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (rows that see no key) replaced by 0, so exp(score - lse) is 0, not NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def block_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of q [b, hq, sq, d] over one key/value block [b, hkv, sk, d].

    Returns the block's normalised output and its log-sum-exp [b, hq, sq] (-inf for query rows
    that see none of the block's keys)."""
    groups = q.shape[1] // k.shape[1]
    s = _scores(q, _expand(k, groups), q_pos, k_pos, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - _finite(lse)[..., None])
    return p @ _expand(v, groups), lse


def merge(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two normalised partial attentions over disjoint key sets (online softmax)."""
    new = torch.logaddexp(lse, block_lse)
    safe = _finite(new)
    weight_old = torch.exp(lse - safe)[..., None]
    weight_new = torch.exp(block_lse - safe)[..., None]
    return out * weight_old + block_out * weight_new, new


def block_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of one block, given the final lse and delta = rowsum(dout * out)."""
    hkv = k.shape[1]
    groups = q.shape[1] // hkv
    kr, vr = _expand(k, groups), _expand(v, groups)
    p = torch.exp(_scores(q, kr, q_pos, k_pos, scale) - _finite(lse)[..., None])
    dv = p.transpose(-1, -2) @ dout
    ds = p * (dout @ vr.transpose(-1, -2) - delta[..., None])
    dq = (ds @ kr) * scale
    dk = (ds.transpose(-1, -2) @ q) * scale
    if groups > 1:
        b, _, sk, d = dk.shape
        dk = dk.view(b, hkv, groups, sk, d).sum(2)
        dv = dv.view(b, hkv, groups, sk, d).sum(2)
    return dq, dk, dv


def _ring_exchange(tensors: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Send `tensors` to the next rank of the ring and receive the previous rank's."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    nxt = dist.get_global_rank(group, (rank + 1) % size)
    prv = dist.get_global_rank(group, (rank - 1) % size)
    received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group, tag) for tag, t in enumerate(tensors)]
    ops += [dist.P2POp(dist.irecv, r, prv, group, tag) for tag, r in enumerate(received)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


def _work_dtype(q: torch.Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs, fp64 for fp64 (the tests' exact reference)."""
    return torch.promote_types(q.dtype, torch.float32)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any
    ) -> torch.Tensor:
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        seq = q.shape[2] * cp
        scale = 1.0 / math.sqrt(q.shape[-1])
        with torch.autocast(q.device.type, enabled=False):
            work = _work_dtype(q)
            q32, kv = q.to(work), [k.to(work), v.to(work)]
            q_pos = chunk_positions(seq, cp, rank, q.device)
            out = torch.zeros_like(q32)
            lse = torch.full(q32.shape[:-1], float("-inf"), dtype=work, device=q.device)
            for step in range(cp):
                source = (rank - step) % cp
                k_pos = chunk_positions(seq, cp, source, q.device)
                block_out, block_lse = block_forward(q32, kv[0], kv[1], q_pos, k_pos, scale)
                out, lse = merge(out, lse, block_out, block_lse)
                if step < cp - 1:
                    kv = _ring_exchange(kv, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group = group
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        seq = q.shape[2] * cp
        scale = 1.0 / math.sqrt(q.shape[-1])
        with torch.autocast(q.device.type, enabled=False):
            work = _work_dtype(q)
            q32, do32 = q.to(work), dout.to(work)
            delta = (do32 * out).sum(-1)
            q_pos = chunk_positions(seq, cp, rank, q.device)
            dq = torch.zeros_like(q32)
            # Travelling together: a rank's keys, values and the gradients gathered for them.
            travel = [k.to(work), v.to(work), torch.zeros_like(k, dtype=work)]
            travel.append(torch.zeros_like(travel[2]))
            for step in range(cp):
                source = (rank - step) % cp
                k_pos = chunk_positions(seq, cp, source, q.device)
                bq, bk, bv = block_backward(
                    q32, travel[0], travel[1], q_pos, k_pos, scale, lse, do32, delta
                )
                dq += bq
                travel[2] += bk
                travel[3] += bv
                # After cp hops every rank holds its own keys' gradients again.
                travel = _ring_exchange(travel, group)
        return dq.to(q.dtype), travel[2].to(k.dtype), travel[3].to(v.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any) -> torch.Tensor:
    """Causal attention of this rank's q [b, hq, s/cp, d] over the whole sequence's keys/values,
    each rank holding its load-balanced chunks (``shard_sequence``) of q, k [b, hkv, s/cp, d], v."""
    out: torch.Tensor = _RingAttention.apply(q, k, v, group)  # type: ignore[no-untyped-call]
    return out


@dataclass
class ContextParallel:
    """What a model's attention needs under context parallelism: the group and its positions."""

    group: Any
    cp: int
    rank: int
    seq_length: int

    def positions(self, device: torch.device) -> torch.Tensor:
        return chunk_positions(self.seq_length, self.cp, self.rank, device)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.group)
