"""What stands in for Transformer Engine when Megatron-LM runs on plain PyTorch (a GPU image without
Transformer Engine or Apex), for bench/gpu_megatron_memory.py. Imported by the ranks only, through
``--spec bench.mcore_without_te layer_spec`` (megatron/core/transformer/spec_utils.py import_module
takes the module attribute as is, so all of this happens when the module is imported: in
gpt_builder, after Megatron parsed its arguments and before it builds the optimizer). Needs
megatron-core 0.16.1; never imported by llmtrain.

- The layer spec: Megatron-Core's own local spec (megatron/core/models/gpt/gpt_layer_specs.py
  get_gpt_layer_local_spec, core_v0.16.1) with its core attention replaced by PyTorch's fused
  scaled_dot_product_attention. The local DotProductAttention materializes the [b, heads, s, s]
  scores (softmax in fp32, kept for the backward), which no production Megatron run does;
  Transformer Engine's fused attention keeps q, k, v, the output and the fp32 log-sum-exp, and so
  do PyTorch's flash / cuDNN / memory-efficient kernels.
- The optimizer: without Transformer Engine or Apex, Megatron-Core falls back to
  torch.optim.AdamW (megatron/core/optimizer/__init__.py, USING_PYTORCH_OPTIMIZER), whose default
  multi-tensor implementation allocates temporaries as large as the fp32 parameters at each step;
  Transformer Engine's FusedAdam, which Megatron-Core uses when it is there, updates in place.
  torch.optim.AdamW is made fused=True (one in-place kernel) for these ranks, so the measured peak
  is not an artifact of the missing Transformer Engine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

# Fused kernels only: without this a shape none of them takes would fall back silently to the
# math kernel, which keeps the full score matrix (the memory this spec exists to avoid).
_FUSED = (
    torch.nn.attention.SDPBackend.FLASH_ATTENTION,
    torch.nn.attention.SDPBackend.CUDNN_ATTENTION,
    torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
)
TAG = "mcore_without_te"
# Whether the fused kernels take grouped-query attention natively (enable_gqa); None: not tried.
_native_gqa: bool | None = None


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, scale: float
) -> torch.Tensor:
    """Causal attention of q [b, np, s, hn] over k, v [b, ng, s, hn]."""
    global _native_gqa
    groups = q.size(1) // k.size(1)
    kernels = _FUSED if q.is_cuda else (torch.nn.attention.SDPBackend.MATH,)
    with torch.nn.attention.sdpa_kernel(list(kernels)):
        if groups > 1 and _native_gqa is not False:
            try:
                out = F.scaled_dot_product_attention(
                    q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=True
                )
            except RuntimeError as exc:  # no fused kernel takes enable_gqa for this shape
                if _native_gqa is None:
                    print(f"{TAG}: enable_gqa refused ({exc}); repeating k, v")
                _native_gqa = False
            else:
                if _native_gqa is None:
                    print(f"{TAG}: fused attention with native grouped-query heads")
                _native_gqa = True
                return out
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scale
        )


class SdpaAttention(DotProductAttention):
    """DotProductAttention's interface and checks, PyTorch's fused causal attention inside."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        if self.softmax_offset is not None:
            raise ValueError(f"{TAG}: only softmax_type vanilla is supported")
        if self.config.window_size is not None:
            raise ValueError(f"{TAG}: window attention is not supported")

    def forward(  # type: ignore[no-untyped-def, override]
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        """query [sq, b, np, hn], key / value [sk, b, ng, hn] -> [sq, b, np * hn]."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError(f"{TAG}: packed sequences and attention bias unsupported")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if mask_type != AttnMaskType.causal:
            raise ValueError(f"{TAG}: causal attention only, not {mask_type}")
        # The causal mask is implied (is_causal): `attention_mask` is the dataloader's causal one.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        dropout = self.attention_dropout.p if self.training else 0.0
        out = _attend(q, k, v, dropout, self.softmax_scale)
        out = out.permute(2, 0, 1, 3).contiguous()  # [sq, b, np, hn]
        return out.view(out.size(0), out.size(1), self.hidden_size_per_partition)


def build_layer_spec(normalization: str):  # type: ignore[no-untyped-def]
    spec = get_gpt_layer_local_spec(normalization=normalization)
    spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    return spec


def _normalization() -> str:
    try:
        from megatron.training import get_args

        return str(get_args().normalization)
    except (ImportError, AssertionError):  # imported outside pretrain_gpt.py (a test)
        return "RMSNorm"


class FusedAdamW(torch.optim.AdamW):
    """torch.optim.AdamW with fused=True unless the caller chose (module docstring)."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("foreach") is None:
            kwargs.setdefault("fused", True)
        super().__init__(*args, **kwargs)


def use_fused_adamw() -> None:
    if not issubclass(torch.optim.AdamW, FusedAdamW):
        torch.optim.AdamW = FusedAdamW  # type: ignore[misc]
        print(f"{TAG}: torch.optim.AdamW is fused (in place of Transformer Engine's FusedAdam)")


layer_spec = build_layer_spec(_normalization())
use_fused_adamw()
