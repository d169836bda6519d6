"""precision.fp8_param_gather: the compute weights kept in fp8 only and all-gathered in fp8.

Megatron-LM (megatron/training/arguments.py, --fp8-param-gather: "Keep the compute param in fp8
... and perform the param all-gather in fp8"; TransformerConfig.fp8_param) runs it with
precision=fp8 only (transformer_config.py: "fp8_param must be used together with fp8 mode") and
with the distributed optimizer or Megatron-FSDP (arguments.py: "--fp8-param-gather only supported
with distributed optimizer, torch fsdp2, megatron fsdp"): zero.stage 1 or 3 here. llmtrain's
torch and DeepSpeed engines keep high-precision weights (torchao casts on the fly).
"""

from __future__ import annotations

from launcher.backends.common import Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

KEY = "precision.fp8_param_gather"


def megatron_fp8_param_gather(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    prec = cfg.precision
    if not prec.fp8_param_gather:
        return None
    if not prec.fp8:
        return Refusal(
            (KEY, "precision"),
            f"{KEY}=true with precision={prec.name}: Megatron-Core keeps fp8 parameters only in "
            "fp8 mode; use precision=fp8 or precision.fp8_param_gather=false",
        )
    if cfg.zero.stage not in (1, 3):
        return Refusal(
            (KEY, "zero.stage"),
            f"{KEY}=true with zero.stage={cfg.zero.stage}: Megatron-LM gathers fp8 parameters "
            "with the distributed optimizer or Megatron-FSDP only; use zero.stage=1 or 3",
        )
    return None


def fp8_param_gather_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if not cfg.precision.fp8_param_gather:
        return None
    return Refusal(
        (KEY, "backend"),
        f"{KEY}=true: this engine keeps high-precision weights and casts them to fp8 per GEMM; "
        "use precision.fp8_param_gather=false, or backend=megatron",
    )
