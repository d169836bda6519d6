"""Cross-entropy over the vocabulary without materializing the full logits.

The plain loss (``model.loss_fn``) keeps, for N tokens and a vocabulary of V, the logits in the
compute dtype, an fp32 copy, and the fp32 softmax gradient: N V (2 + 4 + 4) bytes (10 GB at
N = 8192, V = 128k). Here the head GEMM and the loss run per chunk of tokens: the chunk's logits
in the compute dtype, upcast to fp32 for log-sum-exp, and, when gradients are wanted, the chunk's
gradients computed right away (the loss is the last operation of the forward, so its gradient
needs nothing but a scale from backward). No chunk's logits outlive it, and the head GEMM is not
recomputed in backward. What is kept until backward: the input gradient [N, h] (compute dtype)
and the weight gradient [V, h] (fp32). This is the "fused linear cross-entropy" of Liger-Kernel
(Hsu et al. 2024, arXiv:2410.10989, section 3.2), written with torch GEMMs.

The softmax gradient (softmax - one-hot, in [-1, 1]) is cast to the compute dtype unscaled; the
1/N of the mean and the backward's scale (gradient accumulation, a loss scaler) are applied in
backward, so fp16 gradients do not underflow before the loss scale is known.

Fine-tuning rows (``launcher.train.finetune.masked_loss``): targets equal to ``IGNORE_INDEX``
contribute neither loss nor gradient, and the sum is divided by the given divisor instead of the
token count.

Chunk size: ``launcher.backends.engine_choices.loss_chunk_tokens`` (2**27 // V tokens, ~1k at
V = 128k), which ``plan`` prices too.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from launcher.backends.engine_choices import loss_chunk_tokens as chunk_tokens
from launcher.train.finetune.masked_loss import IGNORE_INDEX

__all__ = ["chunk_tokens", "chunked_cross_entropy"]


def _dtype(hidden: torch.Tensor) -> torch.dtype:
    kind = hidden.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype


def _chunk_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast(h.device.type, enabled=False):
        return (h @ w.t()).float()


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk: int,
        dtype: torch.dtype,
        divisor: float | None,
    ) -> torch.Tensor:
        n = hidden.shape[0]
        masked = divisor is not None
        w = weight.to(dtype)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty((n, hidden.shape[1]), dtype=dtype, device=hidden.device)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk):
            h = hidden[start : start + chunk].to(dtype)
            t = targets[start : start + chunk]
            keep = t != IGNORE_INDEX if masked else None
            if keep is not None:
                t = torch.where(keep, t, 0)
            logits = _chunk_logits(h, w)
            lse = torch.logsumexp(logits, dim=-1)
            losses = lse - logits.gather(1, t[:, None]).squeeze(1)
            total += (losses if keep is None else losses * keep).sum()
            # d loss_sum / d logits = softmax - one-hot (the 1/N and the scale come in backward)
            grad = logits.sub_(lse[:, None]).exp_()
            grad[torch.arange(t.shape[0], device=t.device), t] -= 1.0
            if keep is not None:
                grad.mul_(keep[:, None])
            g = grad.to(dtype)
            del logits, grad
            with torch.autocast(h.device.type, enabled=False):
                if want_h:
                    grad_h[start : start + chunk] = g @ w
                if want_w:
                    grad_w.add_((g.t() @ h).float())
        ctx.save_for_backward(grad_h if want_h else None, grad_w if want_w else None)
        scale: float = n if divisor is None else divisor
        ctx.n, ctx.hidden_dtype, ctx.weight_dtype = scale, hidden.dtype, weight.dtype
        return total / scale

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out.float() / ctx.n
        gh = None if grad_h is None else (grad_h.float() * scale).to(ctx.hidden_dtype)
        gw = None if grad_w is None else (grad_w * scale).to(ctx.weight_dtype)
        return gh, gw, None, None, None, None


def _loss_only(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    dtype: torch.dtype,
    divisor: float | None,
) -> torch.Tensor:
    w = weight.to(dtype)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        logits = _chunk_logits(hidden[start : start + chunk].to(dtype), w)
        t = targets[start : start + chunk]
        keep = t != IGNORE_INDEX if divisor is not None else None
        if keep is not None:
            t = torch.where(keep, t, 0)
        losses = torch.logsumexp(logits, -1) - logits.gather(1, t[:, None]).squeeze(1)
        total += (losses if keep is None else losses * keep).sum()
    return total / (hidden.shape[0] if divisor is None else divisor)


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int | None = None,
    divisor: float | None = None,
) -> torch.Tensor:
    """Mean cross-entropy (fp32) of ``hidden @ weight.T`` against `targets`, never holding more
    than `chunk` tokens' logits (None: ``chunk_tokens(V)``). hidden [..., h], targets [...],
    weight [V, h]. Equals ``loss_fn(F.linear(hidden, weight), targets)`` within rounding.
    `divisor`: targets equal to IGNORE_INDEX are left out and the sum is divided by `divisor`
    (``masked_loss.masked_loss`` with the same divisor)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    size = chunk or chunk_tokens(weight.shape[0])
    dtype = _dtype(hidden)
    if torch.is_grad_enabled() and (flat.requires_grad or weight.requires_grad):
        out = _ChunkedCrossEntropy.apply(flat, weight, t, size, dtype, divisor)  # type: ignore[no-untyped-call]
        return cast(torch.Tensor, out)
    return _loss_only(flat, weight, t, size, dtype, divisor)
