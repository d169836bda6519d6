"""MoE experts as grouped GEMMs (launcher.train.model.experts) equal the per-expert loop they
replace: forward and every gradient, on the grouped (torch._grouped_mm) and padded (bmm) paths."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from launcher.config.schema import ModelConfig
from launcher.train.model import experts as experts_mod
from launcher.train.model.transformer import MoE, build_model

pytestmark = pytest.mark.unit

BASE = ModelConfig(
    num_layers=1,
    hidden_size=32,
    ffn_hidden_size=48,
    num_attention_heads=4,
    vocab_size=64,
    seq_length=16,
    activation="swiglu",
    norm="rmsnorm",
    position="rope",
    linear_bias=False,
    num_experts=4,
    moe_top_k=2,
    moe_ffn_hidden_size=32,
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loop_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The MoE forward as llmtrain computed it before grouped GEMMs: a Python loop over the
    ModuleDict of experts, index_add per expert (kept here as the reference)."""
    flat = x.reshape(-1, x.shape[-1])
    top_logits, top_index = moe.router(flat).topk(moe.top_k, dim=-1)
    gates = top_logits.float().softmax(dim=-1).to(flat.dtype)
    out = torch.zeros_like(flat)
    for key, expert in moe.experts.items():
        token, slot = torch.where(top_index == int(key))
        y = expert(flat[token]) * gates[token, slot, None]
        out = out.index_add(0, token, y)
    for shared in moe.shared_experts:
        out = out + shared(flat)
    return out.view_as(x)


def _moe(cfg: ModelConfig) -> MoE:
    moe = build_model(cfg, seed=3).layers["0"].moe
    assert isinstance(moe, MoE)
    return moe


def _grads(moe: MoE, fn: Any, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    moe.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    grads = {n: p.grad.clone() for n, p in moe.named_parameters() if p.grad is not None}
    assert x.grad is not None
    grads["input"] = x.grad
    return out.detach(), grads


CASES: dict[str, dict[str, Any]] = {
    "swiglu": {},
    "gelu-bias": {"activation": "gelu", "linear_bias": True, "norm": "layernorm"},
    "top1-shared": {"moe_top_k": 1, "moe_shared_experts": 1},
    # hidden 18: fp32 rows of 72 bytes, not a multiple of 16 bytes -> the padded bmm path.
    "unaligned": {"hidden_size": 18, "num_attention_heads": 2, "moe_ffn_hidden_size": 12},
}


@pytest.mark.parametrize("path", ["grouped", "padded"])
@pytest.mark.parametrize("case", list(CASES))
def test_grouped_experts_equal_the_loop(
    case: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = dataclasses.replace(BASE, **CASES[case])
    if path == "padded":
        monkeypatch.setattr(experts_mod, "grouped_mm_applies", lambda x, w: False)
    calls: list[bool] = []
    applies = experts_mod.grouped_mm_applies

    def spy(x: torch.Tensor, w: Any) -> bool:
        calls.append(applies(x, w))
        return calls[-1]

    monkeypatch.setattr(experts_mod, "grouped_mm_applies", spy)
    moe = _moe(cfg)
    # 3 x 7 tokens, one expert never chosen: its parameters still get a (zero) gradient.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, cfg.hidden_size, generator=gen)
    x[..., 0] = 10.0
    with torch.no_grad():  # tokens spread over experts 0, 2, 3; expert 1 never in the top k
        moe.router.weight.normal_(0.0, 1.0, generator=gen)
        moe.router.weight[:, 0] = 0.0
        moe.router.weight[1, 0] = -100.0
    chosen = moe.router(x.reshape(-1, cfg.hidden_size)).topk(cfg.moe_top_k or 1).indices
    assert set(chosen.unique().tolist()) == {0, 2, 3}
    ref_out, ref_grads = _grads(moe, lambda v: loop_reference(moe, v), x)
    out, grads = _grads(moe, moe, x)
    assert calls and calls[0] == (path == "grouped" and case != "unaligned")
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    assert grads.keys() == {n for n, _ in moe.named_parameters()} | {"input"}
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert float(grads["experts.1.w1.weight"].abs().sum()) == 0.0


def test_grouped_experts_under_bf16_autocast_match_the_loop() -> None:
    """With autocast bf16 the experts compute in bf16 (grouped_mm has no autocast rule: cast
    explicitly), within bf16 rounding of the loop."""
    moe = _moe(BASE)
    x = torch.randn(4, 8, BASE.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_out, ref_grads = _grads(moe, lambda v: loop_reference(moe, v), x)
        out, grads = _grads(moe, moe, x)
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=2e-2, atol=2e-2)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=5e-2, atol=5e-3, msg=name)


def test_grouped_mm_rule() -> None:
    """Where torch._grouped_mm is used: aligned rows (16 bytes) on CPU eager; else bmm."""
    w = experts_mod.stack(list(_moe(BASE).experts.values()), "swiglu", torch.float32)
    assert experts_mod.grouped_mm_applies(torch.zeros(2, 32), w)
    assert not experts_mod.grouped_mm_applies(torch.zeros(2, 30), w)
    assert not experts_mod.grouped_mm_applies(torch.zeros(2, 32, device="meta"), w)
