"""The end-of-run summary (summary.json) and its text for the terminal."""

from __future__ import annotations

import statistics
from typing import Any

from launcher.config.schema import LLMTrainConfig
from launcher.plan.figures import PlanFigures
from launcher.train.reporting.metrics import peak_memory


def summarize(
    cfg: LLMTrainConfig,
    plan: PlanFigures,
    losses: list[float],
    step_times: list[float],
    start: int,
    world_size: int,
    runtime_rss: int | None = None,
) -> dict[str, Any]:
    # The first step of a process includes warm-up (allocation, JIT, DeepSpeed hooks).
    steady = step_times[1:] or step_times
    return {
        "steps": len(losses),
        "resumed_at": start,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "measured_step_s": statistics.median(steady) if steady else None,
        "predicted_step_s": plan.step_s,
        "measured_peak_memory": peak_memory(runtime_rss),
        "predicted_memory_allocated_bytes": plan.allocated_bytes,
        "predicted_memory_reserved_bytes": plan.reserved_bytes,
        "world_size": world_size,
        "recipe": cfg.recipe,
    }


def format_summary(s: dict[str, Any]) -> str:
    def num(x: Any, fmt: str) -> str:
        return format(x, fmt) if isinstance(x, int | float) else "n/a"

    memory = s["measured_peak_memory"]
    gib = 2**30

    def predicted(key: str) -> str:
        value = s.get(f"predicted_memory_{key}_bytes")
        return num(value / gib if value else None, ".2f")

    if "max_allocated" in memory:
        mem_line = (
            f"memory per GPU: max allocated {memory['max_allocated'] / gib:.2f} GiB (predicted "
            f"{predicted('allocated')}), max reserved {memory['max_reserved'] / gib:.2f} GiB "
            f"(predicted {predicted('reserved')})"
        )
    elif "baseline_rss" in memory:
        runtime, peak = memory["baseline_rss"], memory["max_rss"]
        mem_line = (
            f"memory per process: peak RSS {peak / gib:.2f} GiB = runtime "
            f"{runtime / gib:.2f} GiB (Python, torch, before the model) + training "
            f"{max(0, peak - runtime) / gib:.2f} GiB; predicted {predicted('allocated')} GiB "
            "allocated"
        )
    else:
        mem_line = (
            f"memory per process: peak RSS {memory.get('max_rss', 0) / gib:.2f} GiB; predicted "
            f"{predicted('allocated')} GiB allocated"
        )
    val = f", last val_loss {s['last_val_loss']:.4f}" if "last_val_loss" in s else ""
    return (
        f"done: {s['steps']} steps, loss {num(s['first_loss'], '.4f')} -> "
        f"{num(s['last_loss'], '.4f')}{val}\n"
        f"step time: measured {num(s['measured_step_s'], '.4f')} s (median), predicted "
        f"{num(s['predicted_step_s'], '.4f')} s\n{mem_line}"
    )
