"""Fine-tuning state behind one small interface (finetune=lora|qlora; docs/finetuning.md): the
engines, the build, export and sample ask this module, not LoRA's internals
(``launcher.train.finetune.lora`` holds those: the adapter module, seeds, merging, digests).

The interface, after torchtune's ``modules/peft`` (an adapter module type, ``get_adapter_params``,
``disable_adapter``; torchtune v0.6.0 ``torchtune/modules/peft/_utils.py``):

- ``enabled(cfg)``: whether the run trains adapters over a frozen base;
- ``add_adapters(model, cfg, frozen_dtype)``: a build step, on the meta device: the base frozen,
  the target projections wrapped (``launcher.train.parallel.build`` then draws or loads each shard);
- ``quantize(unit, cfg)``: the NF4 step of qlora, on a materialised unit (a block), so that the
  build never holds more than one block's base in bf16 (finetune.quantize: the adapted
  projections, or every linear of the blocks);
- ``adapter_params(model)`` / ``is_adapter(name)``: what trains and what checkpoints hold;
- ``disable_adapters(model)``: a context in which the model is its frozen base (a DPO reference
  is the same model with its adapters off, not a copy);
- ``base_record`` / ``base_problem`` / ``BASE_FILE``: which base a checkpoint's adapters apply to;
- ``merged_state(model)``: what a merged export writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from launcher.config.adapters import ALL_LINEAR
from launcher.config.schema import LLMTrainConfig
from launcher.train.finetune import lora
from launcher.train.finetune.lora import (
    BASE_FILE,
    LoRALinear,
    adapted,
    base_problem,
    base_record,
    is_adapter,
    merged_state,
    nf4_param,
)

__all__ = [
    "BASE_FILE",
    "LoRALinear",
    "adapter_params",
    "add_adapters",
    "base_problem",
    "base_record",
    "disable_adapters",
    "enabled",
    "is_adapter",
    "merged_state",
    "nf4_param",
    "quantize",
]


def enabled(cfg: LLMTrainConfig) -> bool:
    """Adapters over a frozen base (lora, qlora), rather than every weight trained."""
    return cfg.finetune.name != "full"


def nf4_on(cfg: LLMTrainConfig) -> bool:
    return cfg.finetune.name == "qlora"


def add_adapters(model: nn.Module, cfg: LLMTrainConfig, frozen_dtype: torch.dtype) -> int:
    """The build step (any device, meta included): freeze, wrap the targets; how many."""
    return lora.wrap_adapters(model, cfg.model, cfg.finetune, frozen_dtype)


def frozen_linears(unit: nn.Module) -> Iterator[nn.Linear]:
    """The plain frozen linears in `unit` (not the adapters; a LoRALinear's base included)."""
    for name, module in unit.named_modules():
        if type(module) is nn.Linear and lora.ADAPTER_PREFIX not in name:
            yield module


@torch.no_grad()
def quantize(unit: nn.Module, cfg: LLMTrainConfig, in_block: bool) -> int:
    """qlora, on a materialised `unit`: the adapted bases to NF4 and, with
    finetune.quantize=all-linear, every other frozen linear of a block (`in_block`: the unit
    is, or lies inside, a transformer block); returns how many weights became NF4."""
    if not nf4_on(cfg):
        return 0
    count = lora.quantize_bases(unit)
    if cfg.finetune.quantize == ALL_LINEAR and in_block:
        for linear in frozen_linears(unit):
            if not nf4_param(linear.weight):
                linear.weight = lora.to_nf4_param(linear.weight)
                count += 1
    return count


def adapter_params(model: nn.Module) -> list[nn.Parameter]:
    """The trained parameters (the adapters), in the model's order."""
    return [p for name, p in model.named_parameters() if is_adapter(name)]


@contextlib.contextmanager
def disable_adapters(model: nn.Module) -> Iterator[nn.Module]:
    """Inside: `model` computes as its frozen base (every adapter's update skipped); after:
    as before, even on an error. Nesting is allowed."""
    modules = [m for _, m in adapted(model)]
    before = [m.enabled for m in modules]
    for module in modules:
        module.enabled = False
    try:
        yield model
    finally:
        for module, was in zip(modules, before, strict=True):
            module.enabled = was
