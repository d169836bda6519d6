"""`llmtrain plan --measure`: train the configured model, shrunk to a few layers, for a few real
steps and extrapolate its step time and memory to the full layer count.

The runs are real `llmtrain run`s (the same compose -> preflight -> run directory -> torchrun ->
engine path, in a temporary run root that is removed afterwards): the layout (tp, pp, cp, ep, dp),
micro-batch, sequence, precision, recompute and backend are the configuration's, so every layer
has the same per-GPU shapes and shards as in the full run; only model.num_layers changes, to
k x pp x vpp layers for k = 1 and 2 (one and two layers per pipeline chunk). A MoE model is measured
with every layer a MoE layer (moe_dense_layers=0).

Fit: step time = a + b x layers through the two runs (a: embedding, output layer, loss, optimizer
of the non-layer parameters, fixed per-step work; b: one layer), evaluated at the full model's
layers; memory likewise (peak allocated on a GPU; on the CPU the run's peak RSS less the runtime's
RSS before the model existed). Each run's step time is the median of its steps after the first
(warm-up). No torch in this process: the runs are child processes.

A fit that no real step can have (a negative fixed part, a layer that costs nothing or less) is
refused with the runs' figures, their spread and the machine's load: on a busy machine two short
runs differ by noise more than by a layer (launcher.plan.hardware.measurement_noise). A run whose
steps spread wider than the limit is named as noise in the table.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.errors import UserError
from launcher.plan.hardware import measurement_noise as noise

MEASURE_STEPS = 5


@dataclass(frozen=True)
class Point:
    layers: int
    step_s: float
    memory_bytes: float | None
    predicted_step_s: float
    predicted_memory_bytes: float
    steps: int
    spread: float = 0.0  # of its steps' times (measurement_noise.relative_spread)


@dataclass(frozen=True)
class Measured:
    points: tuple[Point, Point]
    layers: int  # the full model's
    step_s: float  # extrapolated
    per_layer_s: float
    fixed_s: float
    memory_bytes: float | None
    memory_kind: str  # "peak allocated (torch.cuda)" | "peak RSS less the runtime (CPU)"
    predicted_step_s: float  # the plan of the full model
    predicted_memory_bytes: float
    load: noise.Load | None = None  # the machine's load when the runs started


def _fit(x1: float, y1: float, x2: float, y2: float, x: float) -> tuple[float, float, float]:
    """(value at x, slope, intercept) of the line through (x1, y1), (x2, y2)."""
    slope = (y2 - y1) / (x2 - x1)
    intercept = y1 - slope * x1
    return intercept + slope * x, slope, intercept


def cut_run(
    overrides: list[str], layers: int, root: Path, steps: int, progress: Callable[[str], None]
) -> tuple[Point, str]:
    from launcher.launch.local import launch, prepare_run_dir
    from launcher.launch.preflight import preflight
    from launcher.launch.run_outcome import RunFailed, RunInterrupted, RunPreempted
    from launcher.plan.document import plan_to_json

    composed = compose_config(
        [
            *overrides,
            f"model.num_layers={layers}",
            f"run.root_dir={root}",
            f"run.name=measure-{layers}",
            f"train.steps={steps}",
            "train.tokens=null",
            "train.log_every=1",
            "checkpoint.every_steps=1000000",
            "checkpoint.resume=false",
            "parallel.pp_layers=null",
        ]
        + (
            ["model.moe_dense_layers=0"]
            if (compose_config(overrides).config.model.num_experts or 0) > 1
            else []
        )
    )
    plan = preflight(composed.config, force=True)
    prepared = prepare_run_dir(composed, plan_to_json(plan), fresh=True)
    progress(f"measuring {layers} layer(s): {steps} steps in {prepared.run_dir}")
    try:
        launch(prepared, progress_to_stderr=True)
    except (RunFailed, RunPreempted, RunInterrupted) as exc:
        raise UserError(f"plan --measure: the {layers}-layer run failed: {exc}") from None
    finally:
        prepared.release()
    run_dir = prepared.run_dir
    records = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    steady = [float(r["step_time_s"]) for r in records if r["step"] > 1] or [
        float(r["step_time_s"]) for r in records
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    peak: dict[str, Any] = summary.get("measured_peak_memory") or {}
    if "max_allocated" in peak:
        memory: float | None = float(peak["max_allocated"])
        kind = "peak allocated (torch.cuda)"
    elif "max_rss" in peak and "baseline_rss" in peak:
        memory = float(max(0, peak["max_rss"] - peak["baseline_rss"]))
        kind = "peak RSS less the runtime's (CPU)"
    else:
        memory, kind = None, "not recorded"
    point = Point(
        layers=layers,
        step_s=statistics.median(steady),
        memory_bytes=memory,
        predicted_step_s=plan.time.step_s,
        predicted_memory_bytes=plan.memory.heaviest.allocated,
        steps=len(steady),
        spread=noise.relative_spread(steady),
    )
    return point, kind


def measure(
    overrides: list[str],
    progress: Callable[[str], None],
    steps: int = MEASURE_STEPS,
    keep: Path | None = None,
) -> Measured:
    """Two shrunk real runs and the extrapolation (module docstring)."""
    from launcher.plan.planner import make_plan

    cfg = compose_config(overrides).config
    layout = derive_layout(cfg)
    chunk = max(1, layout.pp * layout.vpp)
    full_layers = cfg.model.num_layers
    small, large = chunk, 2 * chunk
    if large > full_layers:
        raise UserError(
            f"plan --measure: model.num_layers={full_layers} is too few to shrink (it needs "
            f"{large} = 2 x pp x vpp layers to fit a line); plan it, or run it"
        )
    full = make_plan(cfg)
    load = noise.Load(os.getloadavg()[0], os.cpu_count() or 1)
    root = keep or Path(tempfile.mkdtemp(prefix="llmtrain-measure-"))
    try:
        p1, kind = cut_run(overrides, small, root, steps, progress)
        p2, _ = cut_run(overrides, large, root, steps, progress)
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    step, per_layer, fixed = _fit(small, p1.step_s, large, p2.step_s, full_layers)
    unphysical = fit_problem(fixed, per_layer)
    if unphysical:
        raise UserError(
            f"plan --measure: step = {fixed * 1e3:.1f} ms + {per_layer * 1e3:.2f} ms x layers is "
            f"not a fit any real step has ({unphysical}): the {small}-layer run took "
            f"{p1.step_s * 1e3:.1f} ms a step (spread {p1.spread:.0%}) and the {large}-layer run "
            f"{p2.step_s * 1e3:.1f} ms (spread {p2.spread:.0%}), {load.text()} when they "
            "started; that difference is noise, not a layer. Rerun it on a quiet machine, "
            "or use `llmtrain plan` (published figures)"
        )
    memory = None
    if p1.memory_bytes is not None and p2.memory_bytes is not None:
        memory = _fit(small, p1.memory_bytes, large, p2.memory_bytes, full_layers)[0]
    return Measured(
        points=(p1, p2),
        layers=full_layers,
        step_s=step,
        per_layer_s=per_layer,
        fixed_s=fixed,
        memory_bytes=memory,
        memory_kind=kind,
        predicted_step_s=full.time.step_s,
        predicted_memory_bytes=full.memory.heaviest.allocated,
        load=load,
    )


def fit_problem(fixed_s: float, per_layer_s: float) -> str | None:
    """Why step = fixed + per_layer x layers cannot describe real steps, or None: a layer costs
    time (slope > 0), and the rest of a step (embedding, loss, optimizer) is not negative."""
    if per_layer_s <= 0:
        return "a layer would cost nothing or less"
    if fixed_s < 0:
        return "the part of a step outside the layers would be negative"
    return None


def to_json(m: Measured) -> dict[str, Any]:
    return {
        "layers": m.layers,
        "runs": [
            {
                "layers": p.layers,
                "measured_step_s": p.step_s,
                "predicted_step_s": p.predicted_step_s,
                "measured_memory_bytes": p.memory_bytes,
                "predicted_memory_allocated_bytes": p.predicted_memory_bytes,
                "steps_measured": p.steps,
                "spread": p.spread,
                "noise": noise.is_noise(p.spread),
            }
            for p in m.points
        ],
        "fit": {"fixed_s": m.fixed_s, "per_layer_s": m.per_layer_s},
        "measured_step_s": m.step_s,
        "predicted_step_s": m.predicted_step_s,
        "measured_memory_bytes": m.memory_bytes,
        "memory_kind": m.memory_kind,
        "predicted_memory_allocated_bytes": m.predicted_memory_bytes,
        "load": None if m.load is None else {"load1": m.load.load1, "cores": m.load.cores},
    }


def table(m: Measured) -> str:
    gib = 2**30

    def mem(x: float | None) -> str:
        return "-" if x is None else f"{x / gib:.3f} GiB"

    lines = [
        f"{'':<26}{'step measured':>15}{'modelled':>12}{'memory measured':>18}{'modelled':>12}",
    ]
    for p in m.points:
        lines.append(
            f"{f'{p.layers} layer(s), real run':<26}{p.step_s * 1e3:>12.1f} ms"
            f"{p.predicted_step_s * 1e3:>9.1f} ms{mem(p.memory_bytes):>18}"
            f"{mem(p.predicted_memory_bytes):>12}"
        )
    lines.append(
        f"{f'{m.layers} layers, extrapolated':<26}{m.step_s * 1e3:>12.1f} ms"
        f"{m.predicted_step_s * 1e3:>9.1f} ms{mem(m.memory_bytes):>18}"
        f"{mem(m.predicted_memory_bytes):>12}"
    )
    err = m.predicted_step_s / m.step_s - 1 if m.step_s > 0 else float("nan")
    lines.append(
        f"fit: step = {m.fixed_s * 1e3:.1f} ms + {m.per_layer_s * 1e3:.2f} ms x layers; "
        f"the plan is {err:+.1%} against it. memory: {m.memory_kind} against the plan's "
        "allocated."
    )
    for p in m.points:
        if noise.is_noise(p.spread):
            lines.append(
                f"noise: the {p.layers}-layer run's steps spread {p.spread:.0%} of their median "
                f"(limit {noise.SPREAD_LIMIT:.0%}); its figure is not a measurement of the model"
            )
    if m.load is not None and m.load.busy:
        lines.append(f"the machine was busy ({m.load.text()}): every figure above competed for it")
    return "\n".join(lines)


__all__ = ["Measured", "cut_run", "measure", "table", "to_json"]
