"""Fit the planner's constants (launcher/plan/calibration/fitted.py) on the published reference
runs, reproducibly: the runs of launcher/plan/calibration/reference_runs.py, their figures checked
against the reference data in this repository, bench/data/calibration.csv (bench/reference_data.py).

Usage: PYTHONPATH=. .venv/bin/python bench/plan_fit.py   (prints the constants to paste)

Method: coordinate search in log space minimising the mean over sources of the mean
|log(predicted / measured)| of their scored rows (time rows fit the compute constants, memory rows
the fragmentation), from the fixed START values. Shared, dimensionless constants for every family;
gemm_sustained per GPU family (a family without rows in the fit takes the median of the others).
``fit(rows)`` is what bench/plan_calibration.py calls for each
leave-one-source-out fold.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reference_data import checked_points
from launcher.config.layout import Layout, derive_layout
from launcher.plan.calibration import fitted
from launcher.plan.calibration.reference_runs import ReferenceRun
from launcher.plan.flops import FlopsPerToken, config_flops
from launcher.plan.memory.estimate import HardwareView, estimate_memory
from launcher.plan.planner import hardware_view
from launcher.plan.timing.estimate import estimate_time

FAMILIES = ("ampere", "hopper", "blackwell")
TIME_PARAMS = (
    "gemm_sustained",
    "gemm_half_dim",
    "fp8_gemm_ratio",
    "attn_efficiency",
    "bytes_factor",
    "compile_bytes",
    "overlap_cost",
)
# Constants held at their committed value instead of fitted (experiments: PLAN_FIT_FIXED=a,b).
FIXED = tuple(
    x for x in os.environ.get("PLAN_FIT_FIXED", "overlap_cost,gemm_half_dim").split(",") if x
)
# Where every fit starts (not the committed values, so that a re-fit and every cross-validation
# fold do not depend on what was pasted last).
START = {
    "gemm_sustained": 1.0,
    "gemm_half_dim": 64.0,
    "fp8_gemm_ratio": 0.8,
    "attn_efficiency": 0.6,
    "bytes_factor": 1.5,
    "compile_bytes": 0.6,
    "fragmentation": 1.1,
}
BOUNDS = {
    "gemm_half_dim": (1.0, 2048.0),
    "fp8_gemm_ratio": (0.3, 1.0),
    "attn_efficiency": (0.1, 1.5),
    "bytes_factor": (0.5, 8.0),
    "compile_bytes": (0.2, 1.0),
    "fragmentation": (1.0, 1.5),
    "gemm_sustained": (0.5, 1.0),
    "overlap_cost": (0.01, 1.0),
}


@dataclass
class Prepared:
    point: ReferenceRun
    layout: Layout
    hw: HardwareView
    flops: FlopsPerToken

    @property
    def family(self) -> str:
        return self.hw.arch

    def predict(self) -> float:
        cfg = self.point.config
        mem = estimate_memory(cfg, self.layout, self.hw)
        if self.point.metric == "step_s":
            return estimate_time(cfg, self.layout, self.hw, self.flops, mem.stages).step_s
        h = mem.heaviest
        return h.allocated if self.point.metric == "allocated_bytes" else h.reserved_observed


def prepare(rows: list[ReferenceRun]) -> list[Prepared]:
    out = []
    for p in rows:
        cfg = p.config
        out.append(
            Prepared(
                p,
                derive_layout(cfg),
                hardware_view(cfg),
                config_flops(cfg),
            )
        )
    return out


Table = dict[str, fitted.ComputeConstants]
PER_FAMILY: tuple[str, ...] = ("gemm_sustained",)
FamilyValues = dict[tuple[str, str], float]


def table_from(shared: dict[str, float], fam: FamilyValues) -> Table:
    """Constants per family: shared ones, plus per-family ones; a family without its own value of
    a per-family constant takes the median of the families that have one."""
    base = replace(fitted.DEFAULT, **shared)  # type: ignore[arg-type]
    out: Table = {}
    for f in FAMILIES:
        changes = {}
        for name in PER_FAMILY:
            have = [v for (n, _), v in fam.items() if n == name]
            if (name, f) in fam:
                changes[name] = fam[(name, f)]
            elif have:
                changes[name] = statistics.median(have)
        out[f] = replace(base, **changes)  # type: ignore[arg-type]
    return out


def log_errors(rows: list[Prepared], table: Table | None) -> list[float]:
    fitted.set_override(table)
    try:
        return [math.log(r.predict() / r.point.measured) for r in rows]
    finally:
        fitted.set_override(None)


def _loss(rows: list[Prepared], table: Table) -> float:
    """Mean over sources of the mean |log error| of their rows: each table or paper weighs the
    same, so a source with many rows (one framework's quirks) does not pull the physics."""
    errs = log_errors(rows, table)
    per: dict[str, list[float]] = {}
    for r, e in zip(rows, errs, strict=True):
        per.setdefault(r.point.source, []).append(abs(e))
    return sum(sum(v) / len(v) for v in per.values()) / max(1, len(per))


def _uses(r: Prepared, name: str) -> bool:
    """Whether a row's time depends on a per-family constant."""
    return True


def fit(rows: list[Prepared], rounds: int = 8) -> tuple[dict[str, float], FamilyValues]:
    """(shared constants, per-family constants) fitted on the scored rows of `rows`."""
    rows = [r for r in rows if r.point.scored]
    time_rows = [r for r in rows if r.point.metric == "step_s"]
    mem_rows = [r for r in rows if r.point.metric != "step_s"]
    shared = {k: float(getattr(fitted.DEFAULT, k)) for k in (*TIME_PARAMS, "fragmentation")}
    shared.update({k: v for k, v in START.items() if k not in FIXED})
    fam: FamilyValues = {}
    for name in PER_FAMILY:
        for f in FAMILIES:
            if any(r.family == f and _uses(r, name) for r in time_rows):
                fam[(name, f)] = shared[name]
    names: list[tuple[str, tuple[str, str] | None]] = [
        (k, None) for k in TIME_PARAMS if k not in PER_FAMILY and k not in FIXED
    ]
    names += [(key[0], key) for key in fam]

    def get(name: str, key: tuple[str, str] | None) -> float:
        return fam[key] if key else shared[name]

    def put(name: str, key: tuple[str, str] | None, value: float) -> None:
        if key:
            fam[key] = value
        else:
            shared[name] = value

    def search(params: list[tuple[str, tuple[str, str] | None]], data: list[Prepared]) -> None:
        step = 0.5
        for _ in range(rounds):
            for name, key in params:
                best = _loss(data, table_from(shared, fam))
                for direction in (1.0, -1.0):
                    while True:
                        old = get(name, key)
                        lo, hi = BOUNDS[name]
                        new = min(hi, max(lo, old * math.exp(direction * step)))
                        if new == old:
                            break
                        put(name, key, new)
                        loss = _loss(data, table_from(shared, fam))
                        if loss < best - 1e-6:
                            best = loss
                        else:
                            put(name, key, old)
                            break
            step *= 0.5

    search(names, time_rows)
    reserved = [r for r in mem_rows if r.point.metric == "reserved_bytes"]
    if len({r.point.source for r in reserved}) >= 2:
        search([("fragmentation", None)], mem_rows)
    else:
        # One source cannot tell the allocator's overhead from its own quirks: keep the prior.
        shared["fragmentation"] = fitted.FRAGMENTATION_PRIOR
    return shared, fam


def main() -> int:
    rows = prepare(checked_points())
    shared, fam = fit(rows)
    print("DEFAULT = ComputeConstants(")
    for k, v in shared.items():
        print(f"    {k}={v:.4g},")
    print(")")
    print("FAMILY = {")
    for f in FAMILIES:
        own = {n: v for (n, ff), v in fam.items() if ff == f}
        print(f'    "{f}": {{' + ", ".join(f'"{n}": {v:.4g}' for n, v in own.items()) + "},")
    print("}")
    errs = log_errors(rows, table_from(shared, fam))
    for r, e in zip(rows, errs, strict=True):
        print(f"{r.point.id:10s} {r.point.metric:16s} {math.expm1(e):+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
