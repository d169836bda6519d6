"""How each engine builds and batches a model (launcher/train/parallel/build.py), as the plan
prices it and validate words its fixes: which engine builds under DeepSpeed's ``zero.Init`` (each
module's parameters partitioned as constructed, in the compute dtype), which shards on meta with
FSDP2 before materialising (backend=torch, zero.stage >= 2), which cuts unpacked micro-batches to
their longest example."""

from __future__ import annotations

from launcher.config.schema import LLMTrainConfig


def builds_in_zero_init(cfg: LLMTrainConfig) -> bool:
    """DeepSpeed: the model is built under ``deepspeed.zero.Init`` (partitioned at ZeRO-3)."""
    return cfg.backend.name == "deepspeed"


def shards_before_materialising(cfg: LLMTrainConfig) -> bool:
    """The torch engine: the build order meta -> parallelize -> materialise this rank's shard."""
    return cfg.backend.name == "torch"


def autocasts_fp32_parameters(cfg: LLMTrainConfig) -> bool:
    """The torch engine without FSDP2 (zero.stage 0/1) trains mixed precision under
    ``torch.autocast`` over fp32 parameters (torch_engine ``_autocast``); FSDP2 hands the forward
    bf16 parameters (``MixedPrecisionPolicy``) and runs no autocast, and DeepSpeed's and
    Megatron's bf16/fp16 modules are 16-bit themselves."""
    return (
        cfg.backend.name == "torch"
        and cfg.zero.stage < 2
        and cfg.precision.compute_dtype in ("bf16", "fp16")
    )


def cuts_to_longest(cfg: LLMTrainConfig) -> bool:
    """The torch and DeepSpeed engines cut an unpacked micro-batch to its longest example
    (``finetune.masked_loss.trim_to_longest``); Megatron-LM pads to model.seq_length."""
    return cfg.backend.name in ("torch", "deepspeed")
