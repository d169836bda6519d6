"""Ring attention's CUDA kernels (aten flash attention for bf16, memory-efficient attention for
fp32) against whole-sequence causal SDPA, the cp ranks simulated in one process on one GPU
(tests/ring_sim.py). Skipped cleanly without CUDA (CI has no GPU): the CUDA path is otherwise
not run in this repository.

On a GPU machine: `python -m pytest -m gpu tests/gpu/test_gpu_ring_attention.py`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize(
    ("dtype", "kernel", "tol"),
    [
        # bf16: every block's output and gradients rounded to 8 bits before the fp32 merge.
        ("bfloat16", "cuda_flash", 5e-2),
        ("float32", "cuda_efficient", 2e-3),
    ],
)
@pytest.mark.parametrize(("cp", "hq", "hkv"), [(2, 8, 2), (4, 4, 4), (3, 2, 1)])
def test_ring_on_cuda_matches_whole_sequence_attention(
    cp: int, hq: int, hkv: int, dtype: str, kernel: str, tol: float
) -> None:
    import torch.nn.functional as F

    from launcher.train.parallel.ring_attention import (
        kernel_for,
        ring_attention_on,
        shard_sequence,
    )
    from tests.ring_sim import run_ring

    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    b, seq, d = 2, 256 * cp, 64
    q = torch.randn(b, hq, seq, d, device=dev).to(dt)
    k, v = (torch.randn(b, hkv, seq, d, device=dev).to(dt) for _ in range(2))
    dout = torch.randn(b, hq, seq, d, device=dev).to(dt)
    assert kernel_for(q).name == kernel
    # Reference: fp32 causal SDPA on the whole sequence (the inputs already rounded to dtype).
    full = [t.float().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=hq != hkv)
    ref.backward(dout.float())

    def body(ring):  # type: ignore[no-untyped-def]
        torch.cuda.set_device(dev)
        mine = [shard_sequence(t, cp, ring.rank, dim=2).requires_grad_() for t in (q, k, v)]
        out = ring_attention_on(*mine, ring)
        out.backward(shard_sequence(dout, cp, ring.rank, dim=2))
        torch.cuda.synchronize()
        return out.detach(), [t.grad for t in mine]

    for r, (out, grads) in enumerate(run_ring(cp, body)):
        assert out.dtype == dt
        want = shard_sequence(ref.detach(), cp, r, dim=2)
        torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
        for got, whole in zip(grads, full, strict=True):
            assert got is not None and got.dtype == dt
            expected = shard_sequence(whole.grad, cp, r, dim=2)
            torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)
