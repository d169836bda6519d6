"""The loss over chunks of tokens (launcher.train.model.chunked_loss) equals the full-logits loss:
value and gradients, in fp32 and under bf16 autocast, tied and untied heads, in eval."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from launcher.config.schema import ModelConfig
from launcher.train.model.chunked_loss import chunk_tokens, chunked_cross_entropy
from launcher.train.model.transformer import build_model, loss_fn

pytestmark = pytest.mark.unit

CFG = ModelConfig(
    num_layers=1,
    hidden_size=32,
    ffn_hidden_size=48,
    num_attention_heads=4,
    vocab_size=200,
    seq_length=12,
    activation="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _operands(n: int = 37, h: int = 16, v: int = 50) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=gen, requires_grad=True)
    weight = (torch.randn(v, h, generator=gen) * 0.3).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 8, 37, 100])
def test_equals_full_cross_entropy_and_gradients(chunk: int) -> None:
    hidden, weight, targets = _operands()
    full = loss_fn(F.linear(hidden, weight)[None], targets[None])
    g_h, g_w = torch.autograd.grad(full * 3.0, (hidden, weight))
    chunked = chunked_cross_entropy(hidden, weight, targets, chunk)
    c_h, c_w = torch.autograd.grad(chunked * 3.0, (hidden, weight))  # the scale reaches both
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, full)
    torch.testing.assert_close(c_h, g_h)
    torch.testing.assert_close(c_w, g_w)


def test_bf16_autocast_within_rounding_of_full() -> None:
    hidden, weight, targets = _operands()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = loss_fn(F.linear(hidden, weight)[None], targets[None])
        chunked = chunked_cross_entropy(hidden, weight, targets, 8)
    g_h, g_w = torch.autograd.grad(full, (hidden, weight))
    c_h, c_w = torch.autograd.grad(chunked, (hidden, weight))
    assert c_h.dtype == torch.float32 and c_w.dtype == torch.float32  # the leaves' dtypes
    torch.testing.assert_close(chunked, full, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(c_h, g_h, rtol=3e-2, atol=2e-4)
    torch.testing.assert_close(c_w, g_w, rtol=3e-2, atol=2e-4)


def test_fp16_gradient_does_not_underflow_before_the_loss_scale() -> None:
    """1/N is applied in backward, with the scaler's factor: with N large the per-token
    gradient (~1e-8) is below fp16's range, but the scaled one is not."""
    n = 4096
    hidden, weight, targets = _operands(n=n)
    h16 = hidden.detach().half().requires_grad_()
    loss = chunked_cross_entropy(h16, weight.detach().half(), targets, 512)
    (grad,) = torch.autograd.grad(loss * 2.0**16, (h16,))
    ref = torch.autograd.grad(
        loss_fn(F.linear(hidden, weight)[None], targets[None]) * 2.0**16, (hidden,)
    )[0]
    assert float(grad.float().abs().sum()) > 0.5 * float(ref.abs().sum())
    torch.testing.assert_close(grad.float(), ref, rtol=2e-2, atol=2e-2)


def test_no_grad_gives_the_loss() -> None:
    hidden, weight, targets = _operands()
    with torch.no_grad():
        full = loss_fn(F.linear(hidden, weight)[None], targets[None])
        torch.testing.assert_close(chunked_cross_entropy(hidden, weight, targets, 5), full)


def test_chunk_tokens_bounds_the_fp32_logits() -> None:
    assert chunk_tokens(128_256) == 1046  # 2**27 elements / V: 512 MiB of fp32 logits
    assert chunk_tokens(10**9) == 1


@pytest.mark.parametrize("tied", [False, True])
def test_model_forward_with_targets_chunked_equals_full(tied: bool) -> None:
    cfg = dataclasses.replace(CFG, tie_embeddings=tied)
    rows = torch.randint(0, cfg.vocab_size, (3, cfg.seq_length + 1))
    losses, grads = [], []
    for chunked in (False, True):
        model = build_model(cfg, seed=1)
        model.chunked_loss, model.loss_chunk_tokens = chunked, 7
        loss = model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(losses[0], loss_fn(model(rows[:, :-1]), rows[:, 1:]).detach())
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)
