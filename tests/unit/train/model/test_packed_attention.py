"""Packed rows through flex_attention (model.packed_attention=flex) give the dense-mask SDPA path's
outputs and gradients; unpacked rows keep SDPA's is_causal path; auto picks sdpa on the CPU.

flex_attention refuses a CPU backward in torch 2.13 by one input check (``_validate_device``); its
eager path (the reference implementation the compiled kernel is tested against upstream) runs the
backward fine, so the gradient tests lift that check. What they test is llmtrain's part: the
mask_mod, the BlockMask over several examples a row, GQA and RoPE positions restarting per
example, and the wiring through the blocks and selective recompute.

Tolerance: both paths compute softmax(q k^T / sqrt(d)) v over the same keys in float64, so they
differ only in summation order, ~1e-16 relative per operation, a few hundred operations deep:
1e-10 holds with room, while one token attending across examples moves the outputs by ~0.1
(seen: 0.12 with the same-example condition dropped from the mask_mod).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy

from launcher.backends.packed_attention import packed_kernel
from launcher.train.model import document_mask, selective_checkpoint
from launcher.train.model.transformer import apply_recompute, build_model
from tests.unit.train.model.test_model_keys import LLAMA_TINY

pytestmark = [
    pytest.mark.unit,
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

# GQA (4 query heads over 2 key/value heads) and RoPE, the Llama layout, on 48-token rows.
TINY = dataclasses.replace(LLAMA_TINY, seq_length=48)
# Row 0: three examples and the padding (one more example); row 1: one example filling the row.
SEGMENTS = torch.tensor([[1] * 7 + [2] * 20 + [3] * 15 + [4] * 6, [1] * 48])
TOL = 1e-10


@pytest.fixture
def cpu_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flex_module, "_validate_device", lambda *a: None)


def _run(kernel: str, recompute: str = "none") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = build_model(dataclasses.replace(TINY, packed_attention=kernel), seed=0).double()
    apply_recompute(model, recompute)
    tokens = torch.randint(
        0, TINY.vocab_size, (2, TINY.seq_length), generator=torch.Generator().manual_seed(1)
    )
    logits = model(tokens, segments=SEGMENTS)
    logits.square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


@pytest.mark.usefixtures("cpu_backward")
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_flex_matches_the_dense_mask(recompute: str) -> None:
    dense_logits, dense_grads = _run("sdpa", recompute)
    flex_logits, flex_grads = _run("flex", recompute)
    assert (flex_logits - dense_logits).abs().max() < TOL
    assert dense_grads.keys() == flex_grads.keys() and len(dense_grads) == 21
    for name, grad in dense_grads.items():
        assert (flex_grads[name] - grad).abs().max() < TOL, name


def test_the_block_mask_keeps_examples_apart() -> None:
    # The dense mask the BlockMask's mask_mod describes, token by token, is DocumentMask's.
    dense = document_mask.DocumentMask(SEGMENTS, "sdpa").mask
    block = document_mask.DocumentMask(SEGMENTS, "flex").block_mask
    assert dense is not None and block is not None
    s = TINY.seq_length
    q, kv = torch.arange(s)[:, None], torch.arange(s)[None, :]
    for b in range(2):
        rule = block.mask_mod(torch.tensor(b), torch.tensor(0), q, kv)
        assert torch.equal(rule, dense[b, 0])
    assert not bool(dense[0, 0, 7, 6]) and bool(dense[0, 0, 8, 7])  # example 2 starts at 7


def test_unpacked_rows_keep_is_causal(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = build_model(dataclasses.replace(TINY, packed_attention="flex"), seed=0)
    model(torch.zeros(2, TINY.seq_length, dtype=torch.long))
    assert len(calls) == TINY.num_layers
    assert all(c["is_causal"] and c.get("attn_mask") is None for c in calls)


def test_auto_runs_flex_on_a_gpu_only() -> None:
    assert packed_kernel("auto", "cuda", "flash", 0.0) == "flex"
    assert packed_kernel("auto", "cpu", "flash", 0.0) == "sdpa"
    assert packed_kernel("auto", "cuda", "flash", 0.1) == "sdpa"  # flex has no dropout
    assert packed_kernel("auto", "cuda", "eager", 0.0) == "sdpa"
    assert packed_kernel("flex", "cpu", "flash", 0.0) == "flex"  # asked for (validate refuses)
    # A CPU run (the default auto) builds the dense mask, as before flex existed.
    model = build_model(TINY, seed=0)
    assert model._document_mask(SEGMENTS).mask is not None


def test_the_bench_exits_on_a_flex_miss() -> None:
    # bench/sft_attention.py's verdict (pure): flex at 8,192 tokens within 10% of is_causal.
    path = Path(__file__).resolve().parents[4] / "bench" / "sft_attention.py"
    spec = importlib.util.spec_from_file_location("sft_attention", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = {"check": "time", "seq": 8192, "is_causal_ms": 100.0}
    assert bench.misses({**row, "flex_ms": 109.9}) == []
    assert "+11.0%" in bench.misses({**row, "flex_ms": 111.0})[0]
    assert bench.misses({**row, "seq": 4096, "flex_ms": 150.0}) == []  # only 8k is the target
    assert bench.misses(row) == []  # no flex figure (the CPU)


@pytest.mark.usefixtures("cpu_backward")
def test_selective_recompute_keeps_the_flex_output(monkeypatch: pytest.MonkeyPatch) -> None:
    # Op-level selective recompute saves the attention kernel's output (plan prices no second
    # attention forward); flex_attention reaches the policy as a higher-order op.
    decided: list[CheckpointPolicy] = []
    policy_of = selective_checkpoint.selective_policy

    def recording() -> Callable[..., CheckpointPolicy]:
        policy = policy_of()

        def record(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            decision = policy(ctx, func, *args, **kwargs)
            if func is torch.ops.higher_order.flex_attention:
                decided.append(decision)
            return decision

        return record

    monkeypatch.setattr(selective_checkpoint, "selective_policy", recording)
    _run("flex", "selective")
    assert decided and set(decided) == {CheckpointPolicy.MUST_SAVE}
