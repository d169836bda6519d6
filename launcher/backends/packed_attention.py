"""Which kernel keeps packed examples apart (``model.packed_attention``), decided in one place
without torch: ``plan`` states and prices it (launcher/plan/timing/kernels.py), the model follows
it (``launcher.train.model.document_mask``).

Packed rows (``data.packing=true`` on chat data, ``launcher.data.packing``) hold several examples;
attention must stay causal within each. Two kernels do that:

- flex: ``torch.nn.attention.flex_attention`` with a ``BlockMask`` built from the rows' example
  ids (mask: causal and same example), compiled on CUDA. Blocks between examples are skipped, so
  it runs at a flash-class rate (PyTorch blog "FlexAttention", 2024-08). No attention dropout,
  and no backward on the CPU in torch 2.13 (``flex_attention`` raises NotImplementedError).
- sdpa: ``scaled_dot_product_attention`` with a dense boolean mask [b, 1, s, s]: any device and
  dropout, but an explicit mask rules out SDPA's flash kernel (the memory-efficient kernel runs,
  over the whole s x s square): 122.8 against 86.5 ms is_causal at 8,192 tokens on an H200
  (bench/results/h200-2026-11-27/sft_attention.txt).

``auto`` (the default) picks flex on a GPU and sdpa on the CPU, with attention dropout, or with
``model.attention=eager`` (which asks for the explicit-mask path).
"""

from __future__ import annotations

from launcher.backends.common import Refusal, device_of
from launcher.config.epoch_rows import index_layout
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

PACKED_KERNELS = ("sdpa", "flex")


def packed_kernel(setting: str, device: str, attention: str, dropout: float) -> str:
    """The kernel of ``model.packed_attention=setting`` on `device` (cuda | cpu) with
    model.attention and model.attention_dropout (module docstring)."""
    if setting in PACKED_KERNELS:
        return setting
    if setting != "auto":
        raise ValueError(f"model.packed_attention={setting!r}: expected auto, sdpa or flex")
    return "flex" if device == "cuda" and attention == "flash" and dropout == 0 else "sdpa"


def _why(cfg: LLMTrainConfig, kernel: str) -> str:
    m = cfg.model
    if m.packed_attention != "auto":
        return f"model.packed_attention={m.packed_attention}"
    if kernel == "flex":
        return "model.packed_attention=auto on a GPU"
    if device_of(cfg) != "cuda":
        return "model.packed_attention=auto on the CPU (flex_attention has no CPU backward)"
    if m.attention != "flash":
        return "model.packed_attention=auto with model.attention=eager"
    return "model.packed_attention=auto with model.attention_dropout > 0 (flex has no dropout)"


def packed_rows(cfg: LLMTrainConfig) -> bool:
    """Whether the run's rows hold several examples each: chat data (the built-in set or a
    prepared chat folder) with data.packing=true, fine-tuned by sft (preference pairs are never
    packed) on an engine that reads chat rows. A blend is priced as whole rows."""
    d = cfg.data
    if not d.packing or d.blend or cfg.backend.name == "megatron":
        return False
    if cfg.finetune.objective != "sft":
        return False
    if d.path is None:
        return d.builtin == "chat"
    return index_layout(d.path) == "chat"


def packed_attention(cfg: LLMTrainConfig) -> tuple[str, str] | None:
    """(kernel, why) of the run's packed rows; None where rows are not packed."""
    if not packed_rows(cfg):
        return None
    m = cfg.model
    kernel = packed_kernel(m.packed_attention, device_of(cfg), m.attention, m.attention_dropout)
    return kernel, _why(cfg, kernel)


def flex_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """model.packed_attention=flex where flex_attention cannot train (a backend combo rule)."""
    m = cfg.model
    if m.packed_attention != "flex":
        return None
    if device_of(cfg) != "cuda":
        problem = "flex_attention has no backward on the CPU (torch 2.13)"
    elif m.attention_dropout > 0:
        problem = f"model.attention_dropout={m.attention_dropout:g}: flex_attention has no dropout"
    else:
        return None
    return Refusal(
        ("model.packed_attention",),
        f"model.packed_attention=flex: {problem}; use model.packed_attention=auto (sdpa here)",
    )
