"""The per-step overhead of a layout: what a real step of the engine costs beyond the planner's
terms (compute, collectives, bubble, optimizer), measured for `llmtrain calibrate`.

How: the configuration is cut to one layer per pipeline chunk (pp x vpp layers, as ``plan
--measure``'s smaller run, launch/measure.py), keeping everything else: the layout (dp, tp, pp, cp,
ep, ZeRO stage, backend), the widths, the sequence, the micro-batch, the vocabulary. Then, for two
such runs that differ in how often their ranks meet (``cut_variants``: 1 and 2 layers per chunk
with tensor, context or expert parallelism; else the configuration's micro-batches and twice as
many):
1. a real ``llmtrain run`` of the cut model trains OVERHEAD_STEPS steps (the same compose ->
   preflight -> torchrun -> engine path as ``plan --measure``); its step time is the median after
   the first step;
2. the plan of the cut model is priced from the profile being written (its layers have the shapes
   whose operators calibrate has just timed, and its collectives those measured);
3. the overhead is the measured step less that plan (never below 0): the waits for the slower rank
   at each synchronisation (each rank's compute between two collectives is its layer's, so the
   waits are those of the full model's layers), the engine's small per-step collectives (loss,
   gradient norm, the finite-loss check), the DTensor / DDP / pipeline-schedule dispatch.

``plan`` adds it to the step of a configuration of the same layout family: the line (a fixed part
per step + a part per synchronisation) through the two runs at the configuration's number of
synchronisations (``profile_rates.overhead_units``: per layer and micro-batch with tensor, context
or expert parallelism, per micro-batch with pipeline stages, once per step otherwise).
The run measured is never the one predicted: the full model's layers are not in it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.composition.compose import compose_config
from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.launch.measure import cut_run
from launcher.plan.hardware.profile_rates import layout_family, overhead_units

# Steps of the cut run: the first (warm-up: allocation, autograd graph, gloo connections) is
# dropped; the median of the other five is robust to one step slowed by a neighbour's process.
OVERHEAD_STEPS = 6


@dataclass(frozen=True)
class CutRun:
    """One measured run of the cut model."""

    config: LLMTrainConfig
    layout: Layout
    measured_s: float
    spread: float
    steps: int


def cut_layers(cfg: LLMTrainConfig) -> int:
    """Layers of the cut model: one per pipeline chunk (the full model's when it has no more)."""
    return min(cfg.model.num_layers, max(1, cfg.parallel.pp) * max(1, cfg.parallel.vpp))


def cut_variants(cfg: LLMTrainConfig, overrides: list[str]) -> list[tuple[list[str], int]]:
    """(overrides, layers) of the two cut runs, which differ in what the layout's synchronisations
    count (``profile_rates.overhead_units``), so that the overhead's part per synchronisation and
    its fixed part are told apart (``Rates.overhead_s`` fits the line through them): with tensor,
    context or expert parallelism one and two layers per pipeline chunk (the ranks meet in every
    layer); otherwise, or when two layers per chunk would be the whole model, one layer per chunk
    with the configuration's micro-batches and with twice as many (global batch doubled)."""
    layout = derive_layout(cfg)
    chunk = cut_layers(cfg)
    per_layer = layout.tp > 1 or layout.cp > 1 or layout.ep > 1
    if per_layer and 2 * chunk < cfg.model.num_layers:
        return [(list(overrides), chunk), (list(overrides), 2 * chunk)]
    doubled = [*overrides, f"train.global_batch_size={2 * layout.global_batch_size}"]
    return [(list(overrides), chunk), (doubled, chunk)]


def run_cut(
    cfg: LLMTrainConfig, overrides: list[str], layers: int, progress: Callable[[str], None]
) -> CutRun | str:
    """The model of `overrides` cut to `layers` layers, trained for real (OVERHEAD_STEPS steps),
    or why it was not."""
    if cfg.cluster.num_nodes > 1:
        return (
            f"the layout spans cluster.num_nodes={cfg.cluster.num_nodes} nodes and a cut run "
            "trains on this one (the catalog prices what crosses nodes)"
        )
    cut = [*overrides, f"model.num_layers={layers}", "parallel.pp_layers=null"]
    try:
        small = compose_config(cut).config
    except UserError as exc:
        return f"the cut model is not a valid configuration ({exc})"
    root = Path(tempfile.mkdtemp(prefix="llmtrain-overhead-"))
    try:
        point, _ = cut_run(overrides, layers, root, OVERHEAD_STEPS, progress)
    except UserError as exc:
        return str(exc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return CutRun(
        config=small,
        layout=derive_layout(small),
        measured_s=point.step_s,
        spread=point.spread,
        steps=point.steps,
    )


def planned_step_s(run: CutRun, doc: dict[str, Any]) -> float:
    """The plan of the cut run priced from `doc` (the profile being written, without its
    overhead entries)."""
    import dataclasses

    from launcher.plan.hardware import profile as prof
    from launcher.plan.planner import make_plan

    doc = {**doc, "overhead": [], "digest": ""}
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


def overhead_entry(run: CutRun, planned_s: float, threads: int) -> dict[str, Any]:
    """The profile's "overhead" entry of a cut run measured and planned."""
    layout = run.layout
    return {
        "layout": layout_family(run.config, layout),
        "threads": threads,
        "ranks": layout.world_size,
        "units": overhead_units(layout, max(layout.stage_layers)),
        "seconds": max(0.0, run.measured_s - planned_s),
        "measured_s": run.measured_s,
        "planned_s": planned_s,
        "spread": round(run.spread, 4),
    }


__all__ = [
    "OVERHEAD_STEPS",
    "CutRun",
    "cut_layers",
    "cut_variants",
    "overhead_entry",
    "planned_step_s",
    "run_cut",
]
