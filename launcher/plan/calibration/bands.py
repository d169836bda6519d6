"""How far off the planner typically is, by regime: the leave-one-source-out errors that
``bench/plan_calibration.py`` measured (stored as data in ``error_bands.py``, written by it).

A regime is (metric, model kind, precision, GPU family, long context); a layout takes the band of
the most specific regime with at least MIN_ROWS cross-validated rows, falling back to coarser ones
(dropping long context, then precision, then family) and finally to all rows of the metric.
Per row the error is the larger of its cross-validated error and its error with the committed
constants. `typical` and `worst` are the 80% and 90% split-conformal levels of those errors
(the ceil(c (n + 1))-th smallest of n: a new layout of the regime falls within them with
probability at least 80% / 90% when its error is drawn like the rows'), pooled with the coarser
regimes' rows where a regime has too few (worst: fewer than 9), and `worst` never below the
regime's own largest error. A layout of a model kind with no cross-validated rows of its own
(e.g. MoE memory) takes the worst as typical too. `memory.verdict` says "tight" only within the
memory band's worst (memory.MemoryPlan.verdict).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.schema import LLMTrainConfig
from launcher.plan.calibration.error_bands import BANDS

MIN_ROWS = 3
LONG_CONTEXT = 32768
FAMILY_LABEL = {"ampere": "A100", "hopper": "H100", "blackwell": "B200/GB200", "cdna3": "MI300X"}


@dataclass(frozen=True)
class ErrorBand:
    typical: float
    worst: float
    rows: int
    regime: str  # human label of the regime the figures come from
    source: str = "leave-one-source-out"


def regime_keys(cfg: LLMTrainConfig, arch: str) -> tuple[str, str, str, str]:
    """(kind, precision, family, context) of a configuration, as the band table's keys use them."""
    m = cfg.model
    experts = m.num_experts or 0
    kind = "dense" if experts <= 1 else ("moe-fine" if experts >= 64 else "moe")
    prec = "fp8" if cfg.precision.fp8 else "bf16"
    ctx = "long" if m.seq_length >= LONG_CONTEXT else "short"
    return kind, prec, arch, ctx


def key_levels(kind: str, prec: str, fam: str, ctx: str) -> list[str]:
    """Most to least specific table keys of a regime."""
    return [
        f"{kind}|{prec}|{fam}|{ctx}",
        f"{kind}|{prec}|{fam}|*",
        f"{kind}|*|{fam}|*",
        f"{kind}|*|*|*",
        f"*|*|{fam}|*",
        "*|*|*|*",
    ]


def label(key: str) -> str:
    kind, prec, fam, ctx = key.split("|")
    words = []
    if kind != "*":
        words.append({"dense": "dense", "moe": "MoE", "moe-fine": "fine-grained MoE"}[kind])
    if prec != "*":
        words.append(prec)
    text = " ".join(words) or "all models"
    if fam != "*":
        text += f", {FAMILY_LABEL.get(fam, fam)}"
    if ctx == "long":
        text += ", long context"
    return text


def error_band(metric: str, cfg: LLMTrainConfig, arch: str) -> ErrorBand:
    """The band of `metric` ("time" | "memory") for a configuration on a GPU family."""
    table = BANDS[metric]
    keys = regime_keys(cfg, arch)
    for key in key_levels(*keys):
        if key in table and table[key][2] >= MIN_ROWS:
            typical, worst, rows = table[key]
            if key.startswith("*") and keys[0] != "dense":
                # No cross-validated rows of this model kind: be as unsure as the worst row seen,
                # on any GPU (rows of other kinds on this family say little about this kind).
                typical, worst, rows = table["*|*|*|*"]
                return ErrorBand(
                    worst, worst, int(rows), label("*|*|*|*") + " (worst; no rows of this kind)"
                )
            return ErrorBand(typical, worst, int(rows), label(key))
    typical, worst, rows = table["*|*|*|*"]
    return ErrorBand(worst, worst, int(rows), label("*|*|*|*") + " (worst)")


__all__ = ["ErrorBand", "error_band", "key_levels", "label", "regime_keys"]
