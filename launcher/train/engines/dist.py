"""Process-group setup for the engines, from the environment torch elastic (torchrun) provides (or
`llmtrain run` sets the same for a one-process run: ``launcher.render.torchrun``)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def use_cuda() -> bool:
    """True when this rank should train on a GPU (LLMTRAIN_DEVICE=cpu forces the CPU)."""
    return os.environ.get("LLMTRAIN_DEVICE", "") != "cpu" and torch.cuda.is_available()


def init_process_group_from_env(timeout_s: float = 600.0) -> None:
    """Initialise the default process group: nccl on CUDA, gloo on CPU.

    Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (``env://``). A no-op when a
    group is already initialised."""
    if dist.is_initialized():
        return
    if use_cuda():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def engine_device() -> torch.device:
    """The device this rank computes on, consistent with the initialised process group."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
