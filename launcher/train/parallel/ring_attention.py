"""Context parallelism: causal ring attention over the cp group, with load-balanced chunks.

The sequence is cut into 2 * cp equal chunks and cp rank r holds chunks r and 2cp-1-r, so every
rank does the same causal work (the zig-zag layout of Megatron-LM's context parallel; Brandon et
al., "Striped attention", 2023, discuss the imbalance it removes). Attention is ring attention
(Liu et al., "Ring Attention with Blockwise Transformers", 2023): each rank keeps its queries and
passes its keys/values around the ring, cp steps.

Each ring step is ONE call of a fused attention kernel (``ring_block`` says which rows and keys):
with its own keys (step 0) the block is plain causal; with keys of a lower rank every local query
sees exactly the first of that rank's two chunks, unmasked; with keys of a higher rank only the
second local chunk of queries sees anything, and it sees all of them, unmasked. No block the
causal mask hides is computed. The kernel returns the block's output and log-sum-exp; blocks are
merged in fp32 with the log-sum-exp rescaling of online softmax (Milakov & Gimelshein 2018;
FlashAttention, Dao et al. 2022). The backward runs the ring again and calls the kernel's
backward per block with the FINAL output and log-sum-exp (the row slice the block covers): the
softmax it rebuilds is then the block's slice of the whole row's softmax, so the gradients are
the block's exact share (FlashAttention's backward; PyTorch's own context parallel,
torch/distributed/tensor/experimental/_context_parallel/_attention.py, does the same). A rank's
key/value gradients travel with its keys/values and arrive back home after cp hops.

Kernels (``kernel_for``): on CPU aten's flash attention for CPU
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which takes fewer key/value
heads than query heads as they are (grouped-query attention) and works in tiles, so a block's
workspace is O(rows + keys), never a rows x keys score matrix. On CUDA aten's flash attention for
fp16/bf16 and its memory-efficient attention otherwise, the choice torch's own context parallel
makes; the efficient kernel needs equal head counts, so key/value heads are repeated for it and
their gradients summed back over each group. The CUDA path is not run on a GPU in this
repository's CI (tests/gpu/test_gpu_ring_attention.py checks it where a GPU is present).
Kernels want one head size for q, k and v: where v's differs (multi-head latent attention) the
narrower side is padded with zeros, which changes neither the scores nor the output.

Dtypes: q, k, v stay in their own dtype (bf16 stays bf16 on the wire); the output, log-sum-exp
and gradient accumulators are fp32 (fp64 for fp64 inputs, the tests' exact reference), the
result is returned in q's dtype. Communication is plain point-to-point (``batch_isend_irecv``),
which gloo has on CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

Exchange = Callable[[list[torch.Tensor]], list[torch.Tensor]]


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


@dataclass(frozen=True)
class Block:
    """One ring step's kernel call: the local query rows, the source rank's key rows, and whether
    the causal mask applies (only with the rank's own keys, where rows and keys coincide)."""

    rows: slice
    keys: slice
    causal: bool


def ring_block(rank: int, source: int, local_len: int) -> Block:
    """What rank `rank`'s queries compute against the keys of rank `source` (zig-zag layout).

    Rank r holds chunks (r, 2cp-1-r), local halves (first, second); the source s holds (s,
    2cp-1-s). s == r: the positions increase along the local order, so the causal mask over local
    indices is the positional one. s < r: chunk s precedes both local chunks (s < r < 2cp-1-r),
    chunk 2cp-1-s follows both (2cp-1-s > 2cp-1-r > r): all rows see the source's first half.
    s > r: the local first chunk r precedes both source chunks (r < s, r < cp <= 2cp-1-s), the
    local second chunk 2cp-1-r follows both (2cp-1-r >= cp > s, 2cp-1-r > 2cp-1-s): only the
    second half of the rows sees anything, and it sees every source key."""
    if local_len % 2:
        raise ValueError(f"ring attention: {local_len} local tokens, expected two equal chunks")
    half = local_len // 2
    if source == rank:
        return Block(slice(0, local_len), slice(0, local_len), True)
    if source < rank:
        return Block(slice(0, local_len), slice(0, half), False)
    return Block(slice(half, local_len), slice(0, local_len), False)


# --- fused kernels ----------------------------------------------------------------------------


def _pad_head(t: torch.Tensor, size: int) -> torch.Tensor:
    return t if t.shape[-1] == size else F.pad(t, (0, size - t.shape[-1]))


def _repeat_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Query head h uses key/value head h // groups."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _sum_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return t
    b, h, s, d = t.shape
    return t.view(b, h // groups, groups, s, d).sum(2)


def _cpu_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, scale=scale
    )
    return out, lse


def _cpu_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse, 0.0, causal, scale=scale
    )
    return dq, dk, dv


def _flash_cuda_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # Outputs: out, lse [b, h, sq] fp32, cum_seq_q/k (None for dense inputs), max_q, max_k,
    # rng state, unused, debug mask.
    result = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale
    )
    return result[0], result[1]


def _flash_cuda_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Without dropout the philox seed and offset are not read; their shapes follow torch's meta
    # function for this op (torch/_meta_registrations.py).
    seed = torch.empty(2, dtype=torch.uint64, device=q.device)
    offset = torch.empty((), dtype=torch.uint64, device=q.device)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, seed, offset,
        scale=scale,
    )  # fmt: skip
    return dq, dk, dv


def _efficient_cuda_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    groups = q.shape[1] // k.shape[1]
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, _repeat_heads(k, groups), _repeat_heads(v, groups), None, True, 0.0, causal, scale=scale
    )
    # The kernel pads the log-sum-exp's rows to a multiple of 32 on CUDA builds.
    return out, lse[..., : q.shape[2]]


def _efficient_cuda_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups = q.shape[1] // k.shape[1]
    rows = q.shape[2]
    if torch.version.hip is None:
        lse = F.pad(lse, (0, -rows % 32))
    seed = torch.zeros((), dtype=torch.long, device=q.device)
    offset = torch.zeros((), dtype=torch.long, device=q.device)
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        dout.contiguous(), q.contiguous(), _repeat_heads(k, groups).contiguous(),
        _repeat_heads(v, groups).contiguous(), None, out.contiguous(), lse.contiguous(), seed,
        offset, 0.0, [True, True, True, False], causal, scale=scale,
    )  # fmt: skip
    return dq, _sum_heads(dk, groups), _sum_heads(dv, groups)


@dataclass(frozen=True)
class Kernel:
    """A fused attention kernel returning (out, lse) and its backward taking the final ones."""

    name: str
    forward: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, bool, float], tuple[torch.Tensor, torch.Tensor]
    ]
    backward: Callable[
        [
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            bool,
            float,
        ],
        tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ]


CPU_FLASH = Kernel("cpu_flash", _cpu_forward, _cpu_backward)
CUDA_FLASH = Kernel("cuda_flash", _flash_cuda_forward, _flash_cuda_backward)
CUDA_EFFICIENT = Kernel("cuda_efficient", _efficient_cuda_forward, _efficient_cuda_backward)


def kernel_for(q: torch.Tensor) -> Kernel:
    if q.device.type == "cpu":
        return CPU_FLASH
    if q.device.type == "cuda":
        if q.dtype in (torch.float16, torch.bfloat16):
            return CUDA_FLASH
        if q.dtype == torch.float32:
            return CUDA_EFFICIENT
    raise NotImplementedError(
        f"ring attention: no fused attention kernel for {q.dtype} on {q.device.type} "
        "(CPU: any float dtype; CUDA: fp16, bf16, fp32)"
    )


# --- one block, forward and backward ------------------------------------------------------------


def _work_dtype(q: torch.Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs, fp64 for fp64 (the tests' exact reference)."""
    return torch.promote_types(q.dtype, torch.float32)


def forward_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: Block,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> None:
    """Attend `block`'s rows of q [b, hq, s, d] to its keys of k, v [b, hkv, s, d] with one fused
    kernel call, and merge the result into the running output `out` [b, hq, s, dv] and
    log-sum-exp `lse` [b, hq, s] (fp32 accumulators, updated in place; other rows untouched)."""
    kernel = kernel_for(q)
    width = max(q.shape[-1], v.shape[-1])
    qb = _pad_head(q[:, :, block.rows], width)
    kb = _pad_head(k[:, :, block.keys], width)
    vb = _pad_head(v[:, :, block.keys], width)
    block_out, block_lse = kernel.forward(qb, kb, vb, block.causal, scale)
    # Online softmax: new = log(e^old + e^block); each part weighted by its share of e^new. Every
    # row of a block sees at least one key, so block_lse is finite (old is -inf before step 0).
    old = lse[:, :, block.rows]
    new = torch.logaddexp(old, block_lse.to(lse.dtype))
    rows = out[:, :, block.rows]
    rows.mul_(torch.exp(old - new).unsqueeze(-1))
    rows.add_(block_out[..., : out.shape[-1]].to(out.dtype) * torch.exp(block_lse - new)[..., None])
    lse[:, :, block.rows] = new


def backward_block(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    block: Block,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block's gradients (dq of its rows, dk and dv of its keys) from the kernel's backward,
    given the FINAL output `out` (q's dtype) and log-sum-exp `lse` of the whole row."""
    kernel = kernel_for(q)
    width = max(q.shape[-1], v.shape[-1])
    rows = block.rows
    dq, dk, dv = kernel.backward(
        _pad_head(dout[:, :, rows], width),
        _pad_head(q[:, :, rows], width),
        _pad_head(k[:, :, block.keys], width),
        _pad_head(v[:, :, block.keys], width),
        _pad_head(out[:, :, rows], width),
        lse[:, :, rows].contiguous(),
        block.causal,
        scale,
    )
    return dq[..., : q.shape[-1]], dk[..., : k.shape[-1]], dv[..., : v.shape[-1]]


# --- the ring -----------------------------------------------------------------------------------


def ring_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, cp: int, exchange: Exchange
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s output (q's dtype) and log-sum-exp (fp32) over the whole sequence; `exchange`
    sends tensors to the next rank of the ring and returns the previous rank's."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    work = _work_dtype(q)
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=work, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=work, device=q.device)
    kv = [k, v]
    for step in range(cp):
        block = ring_block(rank, (rank - step) % cp, q.shape[2])
        forward_block(q, kv[0], kv[1], block, scale, out, lse)
        if step < cp - 1:
            kv = exchange(kv)
    return out.to(q.dtype), lse


def ring_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    rank: int,
    cp: int,
    exchange: Exchange,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of rank `rank`'s q, k, v (their dtypes), given the forward's out and lse."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    work = _work_dtype(q)
    dq = torch.zeros(q.shape, dtype=work, device=q.device)
    # Travelling together: a rank's keys, values (their own dtype) and the fp32 gradients
    # gathered for them so far.
    kv = [k, v]
    grads = [torch.zeros(k.shape, dtype=work, device=k.device)]
    grads.append(torch.zeros(v.shape, dtype=work, device=v.device))
    for step in range(cp):
        block = ring_block(rank, (rank - step) % cp, q.shape[2])
        bq, bk, bv = backward_block(dout, q, kv[0], kv[1], out, lse, block, scale)
        dq[:, :, block.rows] += bq
        grads[0][:, :, block.keys] += bk
        grads[1][:, :, block.keys] += bv
        del bq, bk, bv
        # After cp hops every rank holds its own keys' gradients again; the keys themselves are
        # not needed after the last step.
        if step < cp - 1:
            *kv, grads[0], grads[1] = exchange([*kv, *grads])
        elif cp > 1:
            grads = exchange(grads)
    return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype)


def _group_exchange(group: Any) -> Exchange:
    def exchange(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Send `tensors` to the next rank of the ring and receive the previous rank's."""
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        nxt = dist.get_global_rank(group, (rank + 1) % size)
        prv = dist.get_global_rank(group, (rank - 1) % size)
        received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
        ops = [
            dist.P2POp(dist.isend, t.contiguous(), nxt, group, tag) for tag, t in enumerate(tensors)
        ]
        ops += [dist.P2POp(dist.irecv, r, prv, group, tag) for tag, r in enumerate(received)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        return received

    return exchange


class Ring:
    """Where a rank sits in the ring and how it reaches its neighbours."""

    def __init__(self, rank: int, size: int, exchange: Exchange):
        self.rank, self.size, self.exchange = rank, size, exchange

    @classmethod
    def of_group(cls, group: Any) -> Ring:
        return cls(dist.get_rank(group), dist.get_world_size(group), _group_exchange(group))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring) -> Any:
        with torch.autocast(q.device.type, enabled=False):
            k, v = k.to(q.dtype), v.to(q.dtype)
            out, lse = ring_forward(q, k, v, ring.rank, ring.size, ring.exchange)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        ring: Ring = ctx.ring
        with torch.autocast(q.device.type, enabled=False):
            dq, dk, dv = ring_backward(
                dout.to(q.dtype), q, k, v, out, lse, ring.rank, ring.size, ring.exchange
            )
        return dq, dk, dv, None


def ring_attention_on(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring
) -> torch.Tensor:
    """``ring_attention`` over any `ring` (tests simulate one in a single process)."""
    out: torch.Tensor = _RingAttention.apply(q, k, v, ring)  # type: ignore[no-untyped-call]
    return out


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any) -> torch.Tensor:
    """Causal attention of this rank's q [b, hq, s/cp, d] over the whole sequence's keys/values,
    each rank holding its load-balanced chunks (``shard_sequence``) of q, k [b, hkv, s/cp, d], v."""
    return ring_attention_on(q, k, v, Ring.of_group(group))


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
