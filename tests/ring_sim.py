"""A context-parallel ring simulated in one process: one thread per cp rank, the point-to-point
exchange replaced by a barrier-synchronised mailbox, so tests run
launcher.train.parallel.ring_attention's own ring (forward, backward, the travelling key/value
gradients) without a process group."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from launcher.train.parallel.ring_attention import Ring


def run_ring(cp: int, body: Callable[[Ring], Any], timeout: float = 120.0) -> list[Any]:
    """`body(ring)` on cp threads, ring.rank 0..cp-1; their return values, by rank."""
    barrier = threading.Barrier(cp, timeout=timeout)
    slots: list[list[torch.Tensor]] = [[] for _ in range(cp)]
    results: list[Any] = [None] * cp
    errors: list[BaseException] = []

    def ring_of(rank: int) -> Ring:
        def exchange(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            slots[rank] = tensors
            barrier.wait()
            # A copy, as the wire makes one: the receiver owns what it gets.
            received = [t.clone() for t in slots[(rank - 1) % cp]]
            barrier.wait()
            return received

        return Ring(rank, cp, exchange)

    def run(rank: int) -> None:
        try:
            results[rank] = body(ring_of(rank))
        except BaseException as error:  # re-raised in the caller
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,), name=f"cp{r}") for r in range(cp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # The first failure, not the broken barriers it left the other ranks at.
        raise next(
            (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
        )
    return results
