"""When a timing measured here is a fact and when it is noise (calibrate, plan --measure).

Pure arithmetic on the repeats of a timing and on the machine's load (read by the caller with
os.getloadavg and os.cpu_count):
- spread: the interquartile range of the repeats over their median. A timing whose repeats spread
  wider than SPREAD_LIMIT is noise (another process took the cores, the clock changed) and is
  named so; a profile holding one is not written, nor used, unless the user forces it.
- plausibility: a GEMM's backward runs two GEMMs of the forward's size (data and weight
  gradients: 2x its FLOPs), so a backward/forward ratio far outside [MIN_RATIO, MAX_RATIO] is not
  the kernel; an optimizer step on 4x the parameters cannot take less time, nor much more than 4x
  (its cost is a fixed part plus a part per parameter, both >= 0).
- load: the 1-minute load average per core before measuring; above LOAD_LIMIT the machine was
  busy and every figure competes with other work for the cores.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Interquartile range / median above which repeats are noise. Quiet CPU and GPU timings of the
# same call agree within a few percent; 25% leaves room for short calls' timer resolution.
SPREAD_LIMIT = 0.25
# Load average per core above which the machine is called busy.
LOAD_LIMIT = 0.5
# backward / forward of one call: 2 for a GEMM (Narayanan et al. 2021, eq. 2's 3x = 1 + 2);
# attention's backward recomputes and runs about 2.5x its forward (FlashAttention-2, section 3.1).
MIN_RATIO, MAX_RATIO = 0.5, 10.0


def relative_spread(samples: Sequence[float]) -> float:
    """Interquartile range over the median of repeated timings (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    median = statistics.median(samples)
    if median <= 0:
        return float("inf")
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median


def is_noise(spread: float) -> bool:
    return spread > SPREAD_LIMIT


def ratio_problem(what: str, forward_s: float, backward_s: float) -> str | None:
    """Why a (forward, backward) pair is not a kernel's, or None when it is plausible."""
    if forward_s <= 0 or backward_s <= 0:
        return f"{what}: forward {forward_s * 1e3:.3f} ms, backward {backward_s * 1e3:.3f} ms"
    ratio = backward_s / forward_s
    if MIN_RATIO <= ratio <= MAX_RATIO:
        return None
    return (
        f"{what}: backward {backward_s * 1e3:.3f} ms for forward {forward_s * 1e3:.3f} ms "
        f"({ratio:.1f}x; a backward runs about 2x its forward)"
    )


def line_problem(what: str, small: tuple[float, float], large: tuple[float, float]) -> str | None:
    """A time that should be fixed + per-unit x size (both >= 0), measured at two sizes
    (size, seconds): why the two points cannot be on such a line, or None."""
    (x1, y1), (x2, y2) = sorted([small, large])
    if x2 <= x1:
        return None
    slope = (y2 - y1) / (x2 - x1)
    intercept = y1 - slope * x1
    tolerance = SPREAD_LIMIT * max(y1, y2)  # what noise within the limit may move a point
    if slope < 0 and y1 - y2 > tolerance:
        return (
            f"{what}: {y2 * 1e3:.1f} ms on {x2:,.0f} but {y1 * 1e3:.1f} ms on {x1:,.0f} "
            "(more work measured faster)"
        )
    if intercept < 0 and -intercept > tolerance:
        return (
            f"{what}: {y1 * 1e3:.1f} ms on {x1:,.0f} and {y2 * 1e3:.1f} ms on {x2:,.0f} (a line "
            f"through them starts at {intercept * 1e3:.1f} ms, below zero)"
        )
    return None


@dataclass(frozen=True)
class Load:
    """The machine's 1-minute load average and its cores."""

    load1: float
    cores: int

    @property
    def per_core(self) -> float:
        return self.load1 / max(1, self.cores)

    @property
    def busy(self) -> bool:
        return self.per_core > LOAD_LIMIT

    def text(self) -> str:
        word = "busy" if self.busy else "quiet"
        return f"load {self.load1:.2f} on {self.cores} core(s) ({word})"


__all__ = [
    "LOAD_LIMIT",
    "SPREAD_LIMIT",
    "Load",
    "is_noise",
    "line_problem",
    "ratio_problem",
    "relative_spread",
]
