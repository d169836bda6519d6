"""The DeepSpeed config (ds_config.json) for a resolved llmtrain config.

Keys follow DeepSpeed's config reference (deepspeed.ai/docs/config-json): train_batch_size =
train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel size; zero_optimization
stage/offload/bucket sizes; bf16 / fp16 (dynamic loss scaling when loss_scale is 0).
The file also carries "optimizer" and "scheduler", so a stock DeepSpeed training script runs from
it as is: the optimizer with "torch_adam": true (no FusedAdam JIT build on CPU), the schedule as
DeepSpeed's nearest built-in (WarmupCosineLR for cosine, WarmupDecayLR for linear — which decays
to 0, not min_lr —, WarmupLR for constant; DeepSpeed has no warmup-stable-decay scheduler, so a
wsd schedule leaves "scheduler" out). llmtrain's own runtime drops both keys, hands DeepSpeed a
torch optimizer and sets the learning rate from its own schedule each step (`runtime_ds_config`).

With parallel.tp > 1 the file carries DeepSpeed's training-time AutoTP block ("tensor_parallel":
autotp_size and a "partition_config" naming llmtrain's own projections, DeepSpeed's configurable
AutoTP API, deepspeed/module_inject/autotp_config.py): the query/key/value and the MLP's input
projections are split by output features (column), the attention output and the MLP's output
projection by input features (row); embeddings, norms and the output head stay replicated.
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
    if cfg.parallel.tp > 1:
        config["tensor_parallel"] = tensor_parallel_block(cfg.parallel.tp)
    config["optimizer"] = _optimizer(cfg)
    scheduler = _scheduler(cfg)
    if scheduler is not None:
        config["scheduler"] = scheduler
    return config


# Parameter names of launcher/train/model/transformer.py's Attention (wq, wk, wv, wo) and MLP (w1,
# w3 in; w2 out) inside each TransformerBlock (layers.<i>.attention / layers.<i>.feed_forward).
AUTOTP_COLUMN = (
    r".*\.attention\.w[qkv]\.(weight|bias)$",
    r".*\.feed_forward\.w[13]\.(weight|bias)$",
)
AUTOTP_ROW = (r".*\.attention\.wo\.(weight|bias)$", r".*\.feed_forward\.w2\.(weight|bias)$")


def tensor_parallel_block(tp: int) -> dict[str, Any]:
    """ds_config "tensor_parallel" for DeepSpeed AutoTP training over `tp` ranks."""
    specs = [
        {"patterns": list(AUTOTP_COLUMN), "partition_type": "column"},
        {"patterns": list(AUTOTP_ROW), "partition_type": "row"},
    ]
    return {
        "autotp_size": tp,
        "partition_config": {"use_default_specs": False, "layer_specs": specs},
    }


def runtime_ds_config(cfg: LLMTrainConfig) -> dict[str, Any]:
    """What llmtrain's DeepSpeed engine passes: ds_config without the optimizer and scheduler,
    which it supplies itself (DeepSpeed refuses a config optimizer beside a client optimizer)."""
    config = ds_config(cfg)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    return config


def _optimizer(cfg: LLMTrainConfig) -> dict[str, Any]:
    o = cfg.optim
    if o.name == "sgd":
        sgd = {"lr": o.lr, "momentum": o.betas[0], "weight_decay": o.weight_decay}
        return {"type": "SGD", "params": sgd}
    if o.name == "lion":
        lion = {"lr": o.lr, "betas": list(o.betas), "weight_decay": o.weight_decay}
        return {"type": "Lion", "params": lion}
    params: dict[str, Any] = {
        "lr": o.lr,
        "betas": list(o.betas),
        "eps": o.eps,
        "weight_decay": o.weight_decay,
        "torch_adam": True,
    }
    return {"type": {"adamw": "AdamW", "adam": "Adam"}[o.name], "params": params}


def _scheduler(cfg: LLMTrainConfig) -> dict[str, Any] | None:
    o = cfg.optim
    steps = derive_layout(cfg).steps
    warmup = {"warmup_num_steps": o.warmup_steps, "warmup_type": "linear"}
    if o.schedule == "cosine":
        params = {
            "total_num_steps": steps,
            "warmup_min_ratio": 0.0,
            "cos_min_ratio": o.min_lr / o.lr,
            **warmup,
        }
        return {"type": "WarmupCosineLR", "params": params}
    if o.schedule == "linear":
        params = {"total_num_steps": steps, "warmup_min_lr": 0.0, "warmup_max_lr": o.lr, **warmup}
        return {"type": "WarmupDecayLR", "params": params}
    if o.schedule == "constant":
        params = {"warmup_min_lr": 0.0, "warmup_max_lr": o.lr, **warmup}
        return {"type": "WarmupLR", "params": params}
    return None


def render_ds_config(cfg: LLMTrainConfig) -> str:
    return json.dumps(ds_config(cfg), indent=2, sort_keys=True) + "\n"
