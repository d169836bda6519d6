"""The torch engine's optimizer, by what the run asks: one optimizer a parameter stepped in the
backward (optim.in_backward), states on the host stepped one parameter at a time (optim.offload),
ZeroRedundancyOptimizer's sharded states (zero.stage=1), else one optimizer over every trainable
parameter (FSDP2's shards under zero.stage >= 2)."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from launcher.train.optim import build_optimizer, fused_on, optimizer_class, param_groups
from launcher.train.optim_in_backward import InBackwardOptimizer
from launcher.train.optim_offload import StepInTurn, offloaded


def engine_optimizer(engine: Any) -> Any:
    """The optimizer of `engine` (a TorchEngine whose parts are built)."""
    cfg = engine.cfg
    params = [p for part in engine.parts for p in part.parameters() if p.requires_grad]
    # With CPUOffloadPolicy the sharded parameters and their optimizer states live on the
    # host: the foreach implementation steps them there as before.
    fused = fused_on(engine.device) and cfg.zero.offload_params == "none"

    def one(param: list[nn.Parameter]) -> torch.optim.Optimizer:  # optim.offload's states
        return offloaded(build_optimizer(param, cfg.optim, fused), cfg.optim.offload)

    if cfg.optim.in_backward:  # one optimizer a parameter, stepped in the backward
        return InBackwardOptimizer(params, one)
    if cfg.optim.offload == "cpu":  # states on the host, one parameter's at a time
        return StepInTurn(params, one)
    if engine.zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # see torch_state._is_zero1

        cls, options = optimizer_class(cfg.optim, fused)
        return ZeroRedundancyOptimizer(
            cast(Any, param_groups(params, cfg.optim)),
            optimizer_class=cls,
            process_group=engine.dp_mesh.get_group(),
            **options,
        )
    return build_optimizer(params, cfg.optim, fused=fused)
