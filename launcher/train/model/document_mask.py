"""Attention within each packed example (``launcher.data.packing``): the positions and the mask
of packed rows, and the flex_attention call (``model.packed_attention``; which kernel runs where
is decided by ``launcher.backends.packed_attention.packed_kernel``, the rule plan prices).

- sdpa: a dense boolean mask [b, 1, s, s] (causal and same example) for
  ``scaled_dot_product_attention``: any device, attention dropout; no flash kernel.
- flex: a ``BlockMask`` for ``torch.nn.attention.flex_attention`` from the same rule as a
  ``mask_mod`` (q >= kv and same example): the blocks between examples are never computed, and
  no s x s tensor is built. On CUDA both the block mask and the attention are compiled (eager
  flex_attention materialises the scores; PyTorch's flex_attention docs); elsewhere they run
  eager (flex_attention has no CPU backward in torch 2.13: the CPU trains with sdpa).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, cast

import torch

from launcher.backends.packed_attention import packed_kernel

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

    FLEX_AVAILABLE = True
except ImportError:  # pragma: no cover - the pinned torch has it
    FLEX_AVAILABLE = False


def resolve_kernel(setting: str, device: torch.device, attention: str, dropout: float) -> str:
    """The kernel packed rows run on `device` (sdpa where flex_attention is absent and the setting
    is auto)."""
    kernel = packed_kernel(setting, device.type, attention, dropout)
    if kernel == "flex" and not FLEX_AVAILABLE:
        if setting == "flex":
            raise RuntimeError(
                f"model.packed_attention=flex: torch {torch.__version__} has no "
                "torch.nn.attention.flex_attention; use model.packed_attention=sdpa"
            )
        return "sdpa"
    return kernel


@cache
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=False)


def document_block_mask(segments: torch.Tensor) -> BlockMask:
    """The flex BlockMask of packed rows whose example ids are `segments` [b, s]."""
    b, s = segments.shape

    def same_example_causal(
        batch: torch.Tensor, head: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return (q_idx >= kv_idx) & (segments[batch, q_idx] == segments[batch, kv_idx])

    create: Callable[..., Any] = (
        _compiled(create_block_mask) if segments.is_cuda else create_block_mask
    )
    return cast(
        BlockMask,
        create(same_example_causal, B=b, H=None, Q_LEN=s, KV_LEN=s, device=segments.device),
    )


def flex_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask) -> torch.Tensor:
    """flex_attention of q [b, hq, s, d] over k, v [b, hkv, s, d] under `mask` (compiled on
    CUDA); the softmax scale 1/sqrt(d) as SDPA's."""
    attend = _compiled(flex_attention) if q.is_cuda else cast(Callable[..., Any], flex_attention)
    out = attend(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    return cast(torch.Tensor, out)


class DocumentMask:
    """Packed examples in each row: segment ids [b, s] become the positions of every token
    within its example [b, s] (restarting at 0) and, by `kernel`, a block-diagonal causal mask
    [b, 1, s, s] (True: may attend; sdpa) or a flex BlockMask (flex), so that no token sees
    another example."""

    def __init__(self, segments: torch.Tensor, kernel: str = "sdpa"):
        s = segments.shape[1]
        index = torch.arange(s, device=segments.device).expand_as(segments)
        starts = torch.ones_like(segments, dtype=torch.bool)
        starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
        first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
        self.positions = index - first
        self.kernel = kernel
        self.mask: torch.Tensor | None = None
        self.block_mask: BlockMask | None = None
        if kernel == "flex":
            self.block_mask = document_block_mask(segments)
        elif kernel == "sdpa":
            same = segments[:, :, None] == segments[:, None, :]
            causal = torch.ones(s, s, dtype=torch.bool, device=segments.device).tril()
            self.mask = (same & causal)[:, None]
        else:
            raise ValueError(f"packed attention kernel {kernel!r}: expected sdpa or flex")
