"""Optimizer parameter groups and the learning-rate schedule (one place for each)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from launcher.config.schema import OptimConfig

# Optimizers with small Adam states (launcher.train.optim_states, on torchao, imported only
# when one is asked for).
SMALL_STATE_NAMES = ("adamw8bit", "adamw4bit")


def param_groups(params: Iterable[nn.Parameter], optim: OptimConfig) -> list[dict[str, Any]]:
    """GPT-style weight decay: on matrices (dim >= 2: linear and embedding weights), not on norms
    and biases (nanoGPT's configure_optimizers makes the same split). The dimensions are the
    whole tensor's: a parameter built under DeepSpeed's zero.Init is an empty 1-D stand-in whose
    shape is ``ds_shape``."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in params:
        if param.requires_grad:
            dims = len(getattr(param, "ds_shape", param.shape))
            (decay if dims >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # LoRA adapters are all matrices: an empty group breaks DCP's flattened optimizer state.
    return [g for g in groups if g["params"]]


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2, with
    decoupled weight decay): with the gradient g and one momentum m per parameter,

        update = sign(beta1 * m + (1 - beta1) * g)
        p     <- p - lr * (update + weight_decay * p)
        m     <- beta2 * m + (1 - beta2) * g

    One state tensor per parameter (plan/memory/estimate.py counts 4 bytes), no epsilon."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, decay = group["lr"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                momentum = state["exp_avg"]
                update = (momentum * beta1 + grad * (1 - beta1)).sign_()
                if decay != 0:
                    param.mul_(1 - lr * decay)
                param.add_(update, alpha=-lr)
                momentum.mul_(beta2).add_(grad, alpha=1 - beta2)
        return loss


def fused_on(device: torch.device) -> bool:
    """Whether the engines step Adam/AdamW with torch's fused kernel (one kernel for the whole
    update instead of the foreach implementation's pass per operation; torch.optim docs: "fused >
    foreach > for-loop" in speed; torchtitan's default). On CUDA: measured by `llmtrain
    calibrate` on one H100 80GB (2026-11-25, torch 2.11): clip + step + zero_grad of 1.095e9
    parameters 36.8 ms foreach, 18.0 ms fused. On the CPU the foreach implementation stays, so
    CPU runs keep their numerics (fused and foreach round differently)."""
    return device.type == "cuda"


def optimizer_class(
    optim: OptimConfig, fused: bool = False
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The optimizer class for ``optim.name`` and its constructor options. SGD takes its momentum
    from ``optim.betas[0]`` (as Megatron's --sgd-momentum and DeepSpeed's SGD params do in the
    rendered jobs); Lion takes both betas and no epsilon. `fused`: Adam/AdamW with the fused
    kernel (fused_on); other optimizers ignore it. adamw8bit / adamw4bit, and Adam with
    optim.state_dtype=bf16: torchao's small-state Adam (launcher.train.optim_states). (torch's
    Adam keeps its states in the weights' dtype: bf16 already under precision=bf16-pure.)"""
    betas = (float(optim.betas[0]), float(optim.betas[1]))
    adam = {"lr": optim.lr, "betas": betas, "eps": optim.eps, **({"fused": True} if fused else {})}
    if optim.name in SMALL_STATE_NAMES or (
        optim.state_dtype == "bf16" and optim.name in ("adam", "adamw")
    ):  # bf16, 8-bit or 4-bit moments
        from launcher.train.optim_states import state_optimizer

        return state_optimizer(optim.name, adam)
    if optim.name == "adam":
        return torch.optim.Adam, adam
    if optim.name == "adamw":
        return torch.optim.AdamW, adam
    if optim.name == "sgd":
        return torch.optim.SGD, {"lr": optim.lr, "momentum": betas[0]}
    if optim.name == "lion":
        return Lion, {"lr": optim.lr, "betas": betas}
    raise ValueError(
        f"optim.name={optim.name!r}: the runtime has adamw, adam, sgd, lion, adamw8bit and "
        "adamw4bit"
    )


def build_optimizer(
    params: Iterable[nn.Parameter], optim: OptimConfig, fused: bool = False
) -> torch.optim.Optimizer:
    """The configured optimizer over ``param_groups``. The learning rate is set by the loop on
    every step (``learning_rate``). `fused`: see optimizer_class."""
    cls, options = optimizer_class(optim, fused)
    return cls(param_groups(params, optim), **options)


def learning_rate(optim: OptimConfig, step: int, total_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based).

    Linear warmup from lr/warmup_steps to lr over warmup_steps, then `schedule` from lr down to
    min_lr at the last step: cosine (half a cosine period), linear, constant (stays at lr), or wsd
    (warmup-stable-decay: lr until the last wsd_decay_fraction of the steps, then down to min_lr in
    the shape wsd_decay_style; Hu et al. 2024 "MiniCPM", Hägele et al. 2024 for 1-sqrt).
    """
    lr, floor, warmup = optim.lr, optim.min_lr, optim.warmup_steps
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if optim.schedule == "constant":
        return lr
    if optim.schedule == "wsd":
        decay_steps = max(1, round(optim.wsd_decay_fraction * total_steps))
        decay_start = max(warmup, total_steps - decay_steps)
        if step < decay_start:
            return lr
        progress = min(1.0, (step - decay_start + 1) / max(1, total_steps - decay_start))
        return floor + (lr - floor) * _decay_shape(optim.wsd_decay_style, progress)
    decay_steps = max(1, total_steps - warmup - 1)
    progress = min(1.0, max(0.0, (step - warmup) / decay_steps))
    if optim.schedule == "linear":
        return lr - (lr - floor) * progress
    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * progress))


def _decay_shape(style: str, progress: float) -> float:
    """Fraction of the way from min_lr (0) to lr (1) left at `progress` in [0, 1] of the decay."""
    if style == "linear":
        return 1.0 - progress
    if style == "minus_sqrt":
        return 1.0 - math.sqrt(progress)
    return 0.5 * (1 + math.cos(math.pi * progress))  # cosine
