"""Op-level selective activation checkpointing of a dense transformer block (``train.recompute=
selective``, the policy torchtitan calls "op"): every other matrix product's output and the
attention kernels' and reduce-scatters' outputs are kept, everything else is recomputed in the
backward. ``launcher.train.model.transformer.apply_recompute`` turns it on per block; plan prices it
(launcher/backends/common.py selective_recompute).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


def _aten_ops(*names: str) -> frozenset[Any]:
    """The default overloads of the named aten ops this build has."""
    aten = torch.ops.aten
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


# Matrix products of the linear layers (with and without bias, torchao's fp8 one).
SAC_MATMULS = _aten_ops("mm", "addmm", "_scaled_mm")
# Attention kernels and collectives whose outputs are kept rather than recomputed: the kernels
# are the expensive part of a layer, and a reduce-scatter replayed in the backward would cost a
# second round of communication (torchtitan's list has the same families).
SAC_KEPT = (
    _aten_ops(
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    | frozenset(
        op.default
        for op in (getattr(torch.ops._c10d_functional, "reduce_scatter_tensor", None),)
        if op is not None
    )
    | frozenset(  # packed rows' flex_attention (launcher.train.model.document_mask): a HOP
        op for op in (getattr(torch.ops.higher_order, "flex_attention", None),) if op is not None
    )
)


def selective_policy() -> Callable[..., CheckpointPolicy]:
    """The op-level policy of one checkpointed call: the attention kernel outputs (SAC_KEPT) and
    every other linear-layer product (the 1st, 3rd, ... of the block's forward) are saved;
    everything else (norms, activation functions, rotary, the other products) is recomputed in the
    backward. Products are counted separately in the forward and in the recomputation, so both
    pick the same ones."""
    seen = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in SAC_MATMULS:
            phase = "recompute" if ctx.is_recompute else "forward"
            seen[phase] += 1
            keep = seen[phase] % 2 == 1
        else:
            keep = func in SAC_KEPT
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_context() -> tuple[Any, Any]:
    """Context pair for ``checkpoint(..., context_fn=selective_context)``: a fresh
    ``selective_policy`` per checkpointed call."""
    contexts = create_selective_checkpoint_contexts(selective_policy())  # type: ignore[no-untyped-call]
    return cast(tuple[Any, Any], contexts)
