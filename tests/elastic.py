"""Run a function on N local ranks with torch elastic, in-process (no torchrun subprocess).

The rendezvous is c10d on localhost:0 (a free port each time), so launches in parallel sessions
never collide; no restarts; each rank's return value comes back in rank order.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any


def run_ranks(nproc: int, entrypoint: Callable[..., Any], *args: Any) -> list[Any]:
    """`entrypoint(*args)` on ranks 0..nproc-1; their return values, by rank."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        run_id=str(uuid.uuid4()),
        max_restarts=0,
        monitor_interval=0.1,
    )
    out = elastic_launch(config, entrypoint=entrypoint)(*args)
    return [out[r] for r in range(nproc)]
