"""Pipeline schedules: bubble, micro-batches in flight per stage, and a timeline to draw.

Bubble (Narayanan et al. 2021, section 2.2): with p stages, m micro-batches and v virtual chunks per
stage (interleaved 1F1B), the idle time is (p-1)/(v*m) of the ideal compute time; as a fraction of
the whole pipeline time that is (p-1)/(v*m + p-1), i.e. (p-1)/(m+p-1) for gpipe and 1F1B (v = 1).

Micro-batches in flight (activations held at the peak), stage index 0-based:
- gpipe: all m forwards run before the first backward, so every stage holds m;
- 1F1B (PipeDream-Flush): stage i runs pp - i warm-up forwards, so it holds min(m, pp - i); the
  first   stage holds pp (Narayanan et al. 2021);
- interleaved (Megatron-LM schedules.py): stage i runs (pp - i - 1) * 2 + (v - 1) * pp warm-up chunk
  forwards plus one in steady state, each holding one chunk (1/v of the stage's layers); the first
  stage therefore holds pp * (1 + (pp - 1)/(pp * v)) micro-batches' worth (Korthikanti et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.pipeline_split import interleaved_warmup


def bubble_overhead(pp: int, microbatches: int, vpp: int = 1) -> float:
    """Bubble time as a multiple of the ideal compute time: (p-1)/(v*m)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (max(1, vpp) * max(1, microbatches))


def bubble_fraction(pp: int, microbatches: int, vpp: int = 1) -> float:
    """Bubble time as a fraction of the pipeline's total time: (p-1)/(v*m + p-1)."""
    overhead = bubble_overhead(pp, microbatches, vpp)
    return overhead / (1.0 + overhead)


def pipeline_efficiency(pp: int, microbatches: int, vpp: int = 1) -> float:
    return 1.0 - bubble_fraction(pp, microbatches, vpp)


def chunk_microbatches_in_flight(
    schedule: str, pp: int, microbatches: int, vpp: int, stage: int, extra_warmup: int = 0
) -> int:
    """Chunk forwards whose activations are alive at the peak on `stage` (chunk = 1/vpp stage).

    extra_warmup: forwards run ahead of the schedule's own warm-up (Megatron-Core's combined 1F1B
    for backend.moe_comm_overlap runs one, launcher/backends/moe_overlap.py)."""
    m = max(1, microbatches)
    if pp <= 1:
        # No pipeline: one micro-batch at a time (gradient accumulation frees each), or with the
        # combined 1F1B one forward ahead of the backward it is paired with.
        return max(1, vpp) * min(m, 1 + extra_warmup)
    if schedule == "gpipe":
        return m * vpp
    if schedule == "interleaved" and vpp > 1:
        warmup = interleaved_warmup(pp, vpp, stage) + extra_warmup
        return min(m * vpp, warmup + 1)
    return min(m, pp - stage + extra_warmup) * vpp


def combined_1f1b_overlap_share(pp: int, microbatches: int, vpp: int, stage: int) -> float:
    """The share of `stage`'s chunk forwards (and of its backwards) that Megatron-Core's combined
    1F1B schedule runs paired with another micro-batch's backward (forward), so that one's
    expert all-to-all hides behind the other's compute (backend.moe_comm_overlap).

    Megatron-Core (pipeline_parallel/schedules.py, combined_1f1b.py) keeps its warm-up and
    cool-down, with one extra warm-up forward: without pipelining 1 forward runs alone and
    m - 1 are paired; interleaved, stage i runs (pp - i - 1) * 2 + (vpp - 1) * pp + 1 warm-up
    chunk forwards alone out of m * vpp. The cool-down's backwards are as many, alone."""
    m = max(1, microbatches)
    if pp <= 1:
        return (m - 1) / m
    total = m * max(1, vpp)
    warm = min(total, interleaved_warmup(pp, vpp, stage) + 1)
    return (total - warm) / total


@dataclass(frozen=True)
class Slot:
    """One forward or backward of one micro-batch on one stage, in units of a forward's time."""

    stage: int
    microbatch: int
    kind: str  # "F" | "B"
    start: float
    end: float
    chunk: int = 0  # virtual pipeline chunk (interleaved schedule)


def _orders(schedule: str, pp: int, m: int, vpp: int) -> list[list[tuple[str, int, int]]]:
    """Each stage's ops in schedule order: (kind, chunk, micro-batch)."""
    orders: list[list[tuple[str, int, int]]] = []
    for stage in range(pp):
        if schedule == "gpipe":
            order = [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
        elif vpp > 1:
            # Megatron-LM's interleaved 1F1B: virtual op k runs chunk (k // pp) % vpp of
            # micro-batch (k // (pp * vpp)) * pp + k % pp (backwards: the chunks in reverse);
            # (pp - stage - 1) * 2 + (vpp - 1) * pp warm-up forwards, then one forward and one
            # backward, then the remaining backwards.
            total = m * vpp

            def op(kind: str, k: int) -> tuple[str, int, int]:
                chunk = (k // pp) % vpp
                mb = (k // (pp * vpp)) * pp + k % pp
                return (kind, chunk if kind == "F" else vpp - 1 - chunk, mb)

            warm = min(total, interleaved_warmup(pp, vpp, stage))
            order = [op("F", k) for k in range(warm)]
            for k in range(total - warm):
                order += [op("F", warm + k), op("B", k)]
            order += [op("B", k) for k in range(total - warm, total)]
        else:
            warm = min(m, pp - stage - 1)
            order = [("F", 0, i) for i in range(warm)]
            nxt_f, nxt_b = warm, 0
            while nxt_b < m:
                if nxt_f < m:
                    order.append(("F", 0, nxt_f))
                    nxt_f += 1
                order.append(("B", 0, nxt_b))
                nxt_b += 1
        orders.append(order)
    return orders


def timeline(
    schedule: str, pp: int, microbatches: int, backward_ratio: float = 2.0, vpp: int = 1
) -> list[Slot]:
    """Simulate gpipe, 1F1B or interleaved 1F1B (vpp > 1, micro-batches a multiple of pp) with
    forward = 1 and backward = ratio per stage (a chunk takes 1/vpp of that).

    Each stage runs its ops in schedule order; an op starts when the stage is free and its input
    is ready: a chunk's forward after the previous stage's forward of that chunk (stage 0: the
    last stage's forward of the previous chunk), a backward after the next stage's backward (the
    last stage: stage 0's backward of the next chunk, or its own forward of the last chunk).
    """
    m = max(1, microbatches)
    v = vpp if schedule == "interleaved" and vpp > 1 and m % pp == 0 else 1
    orders = _orders(schedule, pp, m, v)
    done: dict[tuple[str, int, int, int], float] = {}
    free = [0.0] * pp
    pos = [0] * pp
    slots: list[Slot] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for stage in range(pp):
            if pos[stage] >= len(orders[stage]):
                continue
            kind, chunk, mb = orders[stage][pos[stage]]
            dep: float | None
            if kind == "F":
                if stage > 0:
                    dep = done.get(("F", chunk, stage - 1, mb))
                else:
                    dep = done.get(("F", chunk - 1, pp - 1, mb)) if chunk > 0 else 0.0
                dur = 1.0 / v
            else:
                if stage < pp - 1:
                    dep = done.get(("B", chunk, stage + 1, mb))
                elif chunk < v - 1:
                    dep = done.get(("B", chunk + 1, 0, mb))
                else:
                    dep = done.get(("F", chunk, stage, mb))
                dur = backward_ratio / v
            if dep is None:
                continue
            start = max(free[stage], dep)
            end = start + dur
            done[(kind, chunk, stage, mb)] = end
            free[stage] = end
            pos[stage] += 1
            slots.append(Slot(stage, mb, kind, start, end, chunk))
            remaining -= 1
            progressed = True
        if not progressed:  # pragma: no cover - the orders above never deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    return slots
