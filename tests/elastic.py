"""Run a function on N local ranks with torch elastic, in-process (no torchrun subprocess).

The rendezvous is c10d on localhost:0 (a free port each time), so launches in parallel sessions
never collide; no restarts; each rank's return value comes back in rank order.

Ranks start from multiprocessing's fork server (start_method="forkserver"), which imports torch
and the training modules once (PRELOAD) and forks each rank from there: a rank starts without
importing torch again (~2 s of CPU a rank with spawn on this 2-core box), and, unlike a fork of
the test process, from a process that never ran an operator or a backward (autograd and OpenMP
refuse or hang after such a fork). torch elastic sets each rank's environment in the child.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

PRELOAD = [
    "torch",
    # Imported by every rank's first optimizer (torch.optim's _disable_dynamo): 0.7-1.0 CPU s a
    # rank when each forked rank imports it itself (measured, fsdp-zero2 and dp2xtp2 layouts).
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "torch.distributed.checkpoint",
    "launcher.train.trainer",
    "launcher.train.engines.torch_engine",
    "tests.preload_deepspeed",
    "tests.preload_compose",
]


def run_ranks(nproc: int, entrypoint: Callable[..., Any], *args: Any) -> list[Any]:
    """`entrypoint(*args)` on ranks 0..nproc-1; their return values, by rank."""
    import multiprocessing

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Before the fork server starts (the first launch of this process); later calls change
    # nothing once it runs.
    multiprocessing.set_forkserver_preload(PRELOAD)

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        run_id=str(uuid.uuid4()),
        max_restarts=0,
        monitor_interval=0.1,
        start_method="forkserver",
    )
    out = elastic_launch(config, entrypoint=entrypoint)(*args)
    return [out[r] for r in range(nproc)]
