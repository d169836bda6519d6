"""The DeepSpeed config (ds_config.json) for a resolved llmtrain config.

Keys follow DeepSpeed's config reference (deepspeed.ai/docs/config-json): train_batch_size =
train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel size; zero_optimization
stage/offload/bucket sizes; bf16 / fp16 (dynamic loss scaling when loss_scale is 0).
The optimizer is not in the file: the runtime hands DeepSpeed a torch AdamW (so no FusedAdam JIT
build on CPU), and the learning rate comes from llmtrain's own schedule each step.
"""

from __future__ import annotations

import json
from typing import Any

from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig


def ds_config(cfg: LLMTrainConfig) -> dict[str, Any]:
    layout = derive_layout(cfg)
    z, prec, backend = cfg.zero, cfg.precision, cfg.backend
    zero: dict[str, Any] = {
        "stage": z.stage,
        "overlap_comm": backend.overlap_comm,
        "contiguous_gradients": True,
        "reduce_bucket_size": backend.reduce_bucket_size,
    }
    if z.stage in (1, 2):
        zero["allgather_bucket_size"] = backend.allgather_bucket_size
        zero["reduce_scatter"] = True
    if z.stage == 3:
        zero["stage3_prefetch_bucket_size"] = backend.allgather_bucket_size
    if z.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": z.offload_optimizer, "pin_memory": False}
    if z.offload_params != "none":
        zero["offload_param"] = {"device": z.offload_params, "pin_memory": False}
    config: dict[str, Any] = {
        "train_batch_size": layout.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.grad_accum,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "seed": cfg.train.seed,
    }
    if prec.compute_dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif prec.compute_dtype == "fp16":
        dynamic = prec.loss_scaling == "dynamic"
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0 if dynamic else 1,
            "initial_scale_power": 16,
        }
    return config


def render_ds_config(cfg: LLMTrainConfig) -> str:
    return json.dumps(ds_config(cfg), indent=2, sort_keys=True) + "\n"
