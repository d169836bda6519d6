"""The per-step overhead of a layout: what a real step of the engine costs beyond the planner's
terms (compute, collectives, bubble, optimizer), measured for `llmtrain calibrate`.

How: the configuration is shrunk to SHRUNK_HEAD_DIM channels per head and two heads per
tensor-parallel rank (``shrunk_overrides``), keeping what the overhead depends on: the layout
(dp, tp, pp, cp, ep, ZeRO stage, backend), the layers, the sequence, the micro-batches and the
vocabulary. Then:
1. a real ``llmtrain run`` of the shrunk model trains OVERHEAD_STEPS steps (the same compose ->
   preflight -> torchrun -> engine path as ``plan --measure``, launch/measure.py); its step time is
   the median after the first step;
2. the shrunk model's own operators are timed (the caller's ``time_operators``) into a profile
   that also holds the collectives measured for the full configuration, and the plan of the shrunk
   model is priced from it;
3. the overhead is the measured step less that plan (never below 0): the waits for the slower
   rank, the engine's small per-step collectives (loss, gradient norm, the finite-loss check), the
   DTensor / DDP / pipeline-schedule dispatch: the work that a width does not change.

``plan`` adds it to the step of a configuration of the same layout family, scaled by the heaviest
stage's layers x micro-batches (``profile_rates.Rates.overhead_s``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.compose import compose_config
from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.launch.measure import _one_run
from launcher.plan.profile_rates import layout_family

# Channels per attention head of the shrunk model: the smallest the engines' kernels take for
# every precision (fp8 GEMMs need dimensions divisible by 16, torchao Float8Linear) and even
# for rotary embeddings.
SHRUNK_HEAD_DIM = 16
# Steps of the shrunk run: the first (warm-up: allocation, autograd graph, gloo connections) is
# dropped; the median of the other five is robust to one step slowed by a neighbour's process.
OVERHEAD_STEPS = 6


@dataclass(frozen=True)
class ShrunkRun:
    """One measured shrunk run and its plan."""

    overrides: list[str]
    config: LLMTrainConfig
    layout: Layout
    measured_s: float
    spread: float
    steps: int


def shrunk_overrides(cfg: LLMTrainConfig, overrides: list[str]) -> list[str] | None:
    """`overrides` plus the keys that shrink the model's widths (module docstring); None for a
    model the shrinking does not keep the shape of (multi-head latent attention)."""
    m = cfg.model
    if m.kv_lora_rank:
        return None
    heads = 2 * max(1, cfg.parallel.tp)
    hidden = heads * SHRUNK_HEAD_DIM
    out = [
        *overrides,
        f"model.hidden_size={hidden}",
        f"model.num_attention_heads={heads}",
        "model.num_kv_heads=null",
        "model.head_dim=null",
        f"model.ffn_hidden_size={2 * hidden}",
    ]
    if m.moe_ffn_hidden_size:
        out.append(f"model.moe_ffn_hidden_size={hidden}")
    return out


def run_shrunk(
    cfg: LLMTrainConfig, overrides: list[str], progress: Callable[[str], None]
) -> ShrunkRun | str:
    """The shrunk model trained for real (OVERHEAD_STEPS steps), or why it was not."""
    shrunk = shrunk_overrides(cfg, overrides)
    if shrunk is None:
        return "multi-head latent attention is not shrunk"
    try:
        small = compose_config(shrunk).config
    except UserError as exc:
        return f"the shrunk model is not a valid configuration ({exc})"
    root = Path(tempfile.mkdtemp(prefix="llmtrain-overhead-"))
    try:
        point, _ = _one_run(shrunk, cfg.model.num_layers, root, OVERHEAD_STEPS, progress)
    except UserError as exc:
        return str(exc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return ShrunkRun(
        overrides=shrunk,
        config=small,
        layout=derive_layout(small),
        measured_s=point.step_s,
        spread=point.spread,
        steps=point.steps,
    )


def planned_step_s(run: ShrunkRun, doc: dict[str, Any]) -> float:
    """The plan of the shrunk run priced from `doc` (a profile holding its operators)."""
    import dataclasses

    from launcher.plan import profile as prof
    from launcher.plan.planner import make_plan

    doc = {**doc, "digest": ""}
    doc["digest"] = prof.digest(doc)
    fd, tmp = tempfile.mkstemp(prefix="llmtrain-overhead-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(prof.dumps(doc))
        cluster = dataclasses.replace(run.config.cluster, profile=tmp)
        plan = make_plan(dataclasses.replace(run.config, cluster=cluster))
    finally:
        os.unlink(tmp)
    return plan.time.step_s


def overhead_entry(run: ShrunkRun, planned_s: float, threads: int) -> dict[str, Any]:
    """The profile's "overhead" entry of a shrunk run measured and planned."""
    layout = run.layout
    heaviest = max(layout.stage_layers)
    return {
        "layout": layout_family(run.config, layout),
        "threads": threads,
        "ranks": layout.world_size,
        "units": heaviest * layout.num_microbatches,
        "seconds": max(0.0, run.measured_s - planned_s),
        "measured_s": run.measured_s,
        "planned_s": planned_s,
        "spread": round(run.spread, 4),
    }


__all__ = [
    "OVERHEAD_STEPS",
    "SHRUNK_HEAD_DIM",
    "ShrunkRun",
    "overhead_entry",
    "planned_step_s",
    "run_shrunk",
    "shrunk_overrides",
]
