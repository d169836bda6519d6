"""Optimizer parameter groups and the learning-rate schedule (one place for each)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from launcher.config.schema import OptimConfig


def param_groups(params: Iterable[nn.Parameter], optim: OptimConfig) -> list[dict[str, Any]]:
    """GPT-style weight decay: on matrices (dim >= 2: linear and embedding weights), not on norms
    and biases (nanoGPT's configure_optimizers makes the same split)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in params:
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def optimizer_class(optim: OptimConfig) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The torch optimizer class for ``optim.name`` and its constructor options (lr, betas, eps)."""
    options: dict[str, Any] = {
        "lr": optim.lr,
        "betas": (float(optim.betas[0]), float(optim.betas[1])),
        "eps": optim.eps,
    }
    if optim.name == "adam":
        return torch.optim.Adam, options
    if optim.name == "adamw":
        return torch.optim.AdamW, options
    # Refused before launch by the engines' capability checks; this guards direct callers.
    raise ValueError(f"optim.name={optim.name!r}: the training runtime has adamw and adam")


def build_optimizer(params: Iterable[nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW (or Adam) over ``param_groups``. The learning rate is set by the loop on every step
    (``learning_rate``)."""
    cls, options = optimizer_class(optim)
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
