"""Ring attention's block math, with the cp ranks simulated in one process.

Each simulated rank holds its load-balanced chunks of q, k, v; the forward merges the blocks of
every rank in ring order, the backward sums each rank's contributions to every block's key/value
gradients. Both must equal causal ``scaled_dot_product_attention`` on the whole sequence."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from launcher.train.ring_attention import (
    block_backward,
    block_forward,
    chunk_positions,
    merge,
    shard_sequence,
)

pytestmark = pytest.mark.unit


def test_chunks_are_load_balanced_and_cover_the_sequence() -> None:
    seq, cp = 16, 4
    held = [chunk_positions(seq, cp, r).tolist() for r in range(cp)]
    assert held[0] == [0, 1, 14, 15] and held[3] == [6, 7, 8, 9]
    assert sorted(p for h in held for p in h) == list(range(seq))
    # Causal work per rank (keys each query sees) is the same on every rank.
    assert len({sum(p + 1 for p in h) for h in held}) == 1
    x = torch.arange(seq).view(1, seq)
    assert shard_sequence(x, cp, 1).tolist() == [held[1]]


@pytest.mark.parametrize(("cp", "hq", "hkv"), [(2, 4, 4), (4, 4, 2), (3, 2, 1)])
def test_simulated_ring_matches_causal_attention(cp: int, hq: int, hkv: int) -> None:
    torch.manual_seed(0)
    b, seq, d = 2, 12 * cp, 8
    q = torch.randn(b, hq, seq, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, hkv, seq, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, hkv, seq, d, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(b, hq, seq, d, dtype=torch.float64)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
    ref.backward(dout)
    assert q.grad is not None and k.grad is not None and v.grad is not None

    scale = 1.0 / math.sqrt(d)
    pos = [chunk_positions(seq, cp, r) for r in range(cp)]
    qs = [shard_sequence(q.detach(), cp, r, dim=2) for r in range(cp)]
    ks = [shard_sequence(k.detach(), cp, r, dim=2) for r in range(cp)]
    vs = [shard_sequence(v.detach(), cp, r, dim=2) for r in range(cp)]
    dos = [shard_sequence(dout, cp, r, dim=2) for r in range(cp)]
    dks = [torch.zeros_like(x) for x in ks]
    dvs = [torch.zeros_like(x) for x in vs]
    for r in range(cp):
        out = torch.zeros_like(qs[r])
        lse = torch.full(qs[r].shape[:-1], float("-inf"), dtype=torch.float64)
        for step in range(cp):  # the ring order: keys of rank r - step
            src = (r - step) % cp
            bo, bl = block_forward(qs[r], ks[src], vs[src], pos[r], pos[src], scale)
            out, lse = merge(out, lse, bo, bl)
        torch.testing.assert_close(out, shard_sequence(ref.detach(), cp, r, dim=2))
        delta = (dos[r] * out).sum(-1)
        dq = torch.zeros_like(qs[r])
        for src in range(cp):
            bq, bk, bv = block_backward(
                qs[r], ks[src], vs[src], pos[r], pos[src], scale, lse, dos[r], delta
            )
            dq += bq
            dks[src] += bk
            dvs[src] += bv
        torch.testing.assert_close(dq, shard_sequence(q.grad, cp, r, dim=2))
    for r in range(cp):
        torch.testing.assert_close(dks[r], shard_sequence(k.grad, cp, r, dim=2))
        torch.testing.assert_close(dvs[r], shard_sequence(v.grad, cp, r, dim=2))
