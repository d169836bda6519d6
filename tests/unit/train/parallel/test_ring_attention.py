"""Ring attention with the cp ranks simulated in one process (tests/ring_sim.py: a thread per
rank, the point-to-point exchange replaced by a mailbox), so the module's own ring runs: one fused
kernel call per step, the lse merge, the backward with the final out/lse and the key/value
gradients travelling home. Output and gradients must equal causal
``scaled_dot_product_attention`` on the whole sequence; the block decomposition must never
compute a pair the causal mask hides."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from launcher.train.parallel import ring_attention as ra
from launcher.train.parallel.ring_attention import (
    Kernel,
    Ring,
    chunk_positions,
    ring_attention_on,
    ring_block,
    shard_sequence,
)
from tests.ring_sim import run_ring

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


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 5])
def test_blocks_cover_the_causal_pairs_once_and_compute_no_masked_pair(cp: int) -> None:
    seq = 2 * cp * 3
    local = seq // cp
    pos = [chunk_positions(seq, cp, r) for r in range(cp)]
    computed: Counter[tuple[int, int]] = Counter()
    for r in range(cp):
        work = 0
        for s in range(cp):
            block = ring_block(r, s, local)
            rows, keys = pos[r][block.rows], pos[s][block.keys]
            assert len(rows) and len(keys)
            if block.causal:
                # Only the own block, whose local order is the positional order: the kernel's
                # causal mask over local indices is the true one.
                assert s == r and torch.equal(rows, keys)
                assert bool((rows[1:] > rows[:-1]).all())
                pairs = [(i, j) for i in rows.tolist() for j in keys.tolist() if j <= i]
            else:
                # Unmasked: every row sees every key of the block.
                assert rows.min() >= keys.max()
                pairs = [(i, j) for i in rows.tolist() for j in keys.tolist()]
            computed.update(pairs)
            work += len(rows) * len(keys)
        # Same kernel work on every rank: own block local^2, the others local^2 / 2 each.
        assert work == local * local * (cp + 1) // 2
    assert computed == Counter((i, j) for i in range(seq) for j in range(i + 1))


def _reference(
    cp: int, hq: int, hkv: int, dtype: torch.dtype, d: int = 8, dv: int = 8
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Inputs rounded to `dtype`, and fp64 causal SDPA's output and gradients on them."""
    torch.manual_seed(0)
    b, seq = 2, 12 * cp
    shapes = [(b, hq, seq, d), (b, hkv, seq, d), (b, hkv, seq, dv)]
    q, k, v = (torch.randn(s).to(dtype).double() for s in shapes)
    dout = torch.randn(b, hq, seq, dv).to(dtype).double()
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=hq != hkv)
    ref.backward(dout)
    grads = [t.grad for t in full]
    assert all(g is not None for g in grads)
    return [q, k, v], dout, ref.detach(), [g for g in grads if g is not None]


def _ring(
    cp: int, qkv: list[torch.Tensor], dout: torch.Tensor, dtype: torch.dtype
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """Each simulated rank's output and q, k, v gradients (of its chunks), in `dtype`."""

    def body(ring: Ring) -> tuple[torch.Tensor, list[torch.Tensor]]:
        mine = [shard_sequence(t, cp, ring.rank, dim=2).to(dtype).requires_grad_() for t in qkv]
        out = ring_attention_on(*mine, ring)
        out.backward(shard_sequence(dout, cp, ring.rank, dim=2).to(dtype))
        grads = [t.grad for t in mine]
        assert all(g is not None and g.dtype == dtype for g in grads)
        return out.detach(), [g for g in grads if g is not None]

    return run_ring(cp, body)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (2, 1)])
@pytest.mark.parametrize("cp", [2, 3, 4])
def test_simulated_ring_matches_causal_attention(
    cp: int, hq: int, hkv: int, dtype: torch.dtype
) -> None:
    qkv, dout, ref, ref_grads = _reference(cp, hq, hkv, dtype)
    # fp32: the blocks' fp32 rounding only (measured <= 1.2e-6). bf16: each block's output and
    # gradients are rounded to bf16 (8 bits) before the fp32 merge, like the whole-sequence bf16
    # kernel's own output (whose error against fp64 is ~1e-2 on these sizes too).
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 2e-2}
    for r, (out, grads) in enumerate(_ring(cp, qkv, dout, dtype)):
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), shard_sequence(ref, cp, r, dim=2), **tol)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got.double(), shard_sequence(want, cp, r, dim=2), **tol)


@pytest.mark.parametrize(("d", "dv"), [(8, 8), (12, 8), (8, 12)])
def test_fp64_ring_is_exact_with_any_value_head_size(d: int, dv: int) -> None:
    # fp64 leaves only summation-order rounding (~1e-15); v narrower or wider than q/k
    # (multi-head latent attention) is padded with zeros for the kernel and cut off again.
    cp = 3
    qkv, dout, ref, ref_grads = _reference(cp, 4, 2, torch.float64, d, dv)
    for r, (out, grads) in enumerate(_ring(cp, qkv, dout, torch.float64)):
        torch.testing.assert_close(out, shard_sequence(ref, cp, r, dim=2), atol=1e-12, rtol=0)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, shard_sequence(want, cp, r, dim=2), atol=1e-12, rtol=0)


def test_each_ring_step_is_one_kernel_call_on_an_unmasked_or_causal_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Record every kernel call (rows, keys, causal) of a cp 3 ring, forward and backward.
    calls: Counter[tuple[str, int, int, bool]] = Counter()
    lock = threading.Lock()
    real = ra.CPU_FLASH

    def forward(q: torch.Tensor, k: torch.Tensor, *rest: Any) -> Any:
        with lock:
            calls["fwd", q.shape[2], k.shape[2], rest[1]] += 1
        return real.forward(q, k, *rest)

    def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, *rest: Any) -> Any:
        with lock:
            calls["bwd", q.shape[2], k.shape[2], rest[3]] += 1
        return real.backward(dout, q, k, *rest)

    monkeypatch.setattr(ra, "kernel_for", lambda q: Kernel("recorded", forward, backward))
    cp = 3
    qkv, dout, ref, _ = _reference(cp, 4, 2, torch.float64)
    results = _ring(cp, qkv, dout, torch.float64)
    torch.testing.assert_close(results[0][0], shard_sequence(ref, cp, 0, dim=2))
    # 36 tokens, 12 a rank (two chunks of 6). Per pass: 3 own causal blocks 12 x 12; the 3
    # (rank, lower source) pairs: all 12 rows x the source's first 6 keys; the 3 (rank, higher
    # source) pairs: the second 6 rows x all 12 keys. Never an unmasked 12 x 12 block.
    expected = {(12, 12, True): 3, (12, 6, False): 3, (6, 12, False): 3}
    assert calls == Counter(
        {(p, *shape): n for p in ("fwd", "bwd") for shape, n in expected.items()}
    )


def test_odd_local_length_is_refused() -> None:
    with pytest.raises(ValueError, match="two equal chunks"):
        ring_block(0, 1, 7)
