"""optim.state_dtype: Adam's moments stored in 16 bits, Megatron-Core's precision-aware optimizer.

Megatron-LM (megatron/training/arguments.py, core_v0.16.1: --use-precision-aware-optimizer,
--exp-avg-dtype, --exp-avg-sq-dtype) hands the dtypes to Transformer Engine's FusedAdam, which
stores m and v in them and computes in fp32. Megatron-Core's OptimizerConfig.__post_init__
(megatron/core/optimizer/optimizer_config.py) accepts it with Adam and the distributed optimizer
only; Megatron-Bridge turns it off under Megatron-FSDP (scripts/performance/utils/overrides.py,
v0.4.2: "cannot work with FSDP"). llmtrain's torch and DeepSpeed engines keep fp32 moments.
DeepSeek-V3's Megatron-Bridge recipe runs bf16 moments (recipes/deepseek/deepseek_v3.py).
"""

from __future__ import annotations

from launcher.backends.common import Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

KEY = "optim.state_dtype"


def megatron_state_dtype(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    dtype = cfg.optim.state_dtype
    if dtype == "fp32":
        return None
    if cfg.optim.name not in ("adam", "adamw"):
        return Refusal(
            (KEY, "optim.name"),
            f"{KEY}={dtype} with optim.name={cfg.optim.name}: Megatron-Core's precision-aware "
            "optimizer is Transformer Engine's FusedAdam; use optim.name=adamw or "
            f"{KEY}=fp32",
        )
    if cfg.zero.stage != 1:
        return Refusal(
            (KEY, "zero.stage"),
            f"{KEY}={dtype} with zero.stage={cfg.zero.stage}: Megatron-Core's precision-aware "
            "optimizer runs with the distributed optimizer only; use zero.stage=1 or "
            f"{KEY}=fp32",
        )
    return None


def state_dtype_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    if cfg.optim.state_dtype == "fp32":
        return None
    return Refusal(
        (KEY, "backend"),
        f"{KEY}={cfg.optim.state_dtype}: this engine keeps Adam's moments in fp32; use "
        f"{KEY}=fp32, or backend=megatron",
    )
