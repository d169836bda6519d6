"""Ring attention over real gloo point-to-point: output and gradients equal whole-sequence
causal attention computed in one process.

Every rank builds the same random q, k, v (grouped-query: 4 query heads, 2 kv heads) and the
same output gradient, runs causal ``scaled_dot_product_attention`` on the whole sequence as the
reference, then runs ``ring_attention`` on its load-balanced chunks and backpropagates its chunk
of the output gradient; its chunks of dq, dk, dv must equal the reference's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.elastic import run_ranks

pytestmark = pytest.mark.integration


def _rank(cp: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from launcher.train.parallel.ring_attention import ring_attention, shard_sequence

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        g = torch.Generator().manual_seed(7)
        b, hq, hkv, seq, d = 2, 4, 2, 8 * cp, 16
        q, k, v, dout = (
            torch.randn(b, h, seq, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv, hq)
        )
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=True)
        ref.backward(dout)
        mine = [shard_sequence(t, cp, rank, dim=2).requires_grad_() for t in (q, k, v)]
        out = ring_attention(*mine, dist.group.WORLD)
        out.backward(shard_sequence(dout, cp, rank, dim=2))
        errors = {"out": (out - shard_sequence(ref, cp, rank, dim=2)).abs().max().item()}
        for name, local, whole in zip("qkv", mine, full, strict=True):
            assert local.grad is not None and whole.grad is not None
            expected = shard_sequence(whole.grad, cp, rank, dim=2)
            errors[f"d{name}"] = (local.grad - expected).abs().max().item()
        return errors
    finally:
        dist.destroy_process_group()


def _launch(nproc: int) -> list[Any]:
    return run_ranks(nproc, _rank, nproc)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_matches_whole_sequence_attention(cp: int) -> None:
    for errors in _launch(cp):
        print(f"cp={cp}: {errors}")
        assert max(errors.values()) < 1e-10, errors
