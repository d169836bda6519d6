"""Training health, shared by the ranks and the launcher (no torch import): what counts as a
non-finite step, the exit code of a run stopped by one, and the loss-spike detector.

A step is non-finite when its loss (the global-batch mean, identical on every rank) or its global
gradient norm is NaN or infinite. Under dynamic loss scaling (precision.loss_scaling=dynamic) an
infinite gradient is the scaler's business (it skips that step and lowers the scale, as
Micikevicius et al. 2018 describe), so only the loss counts there. The engines withhold the
update of a non-finite step wherever they can (``StepResult.applied``); the trainer then stops
the run with ``EXIT_DIVERGED``, or skips the step while ``train.max_nonfinite_skips`` allows.

Loss spikes: a robust z-score of the step's loss against the previous ``train.loss_spike_window``
finite losses, z = (loss - median) / (1.4826 * MAD), the median absolute deviation scaled to
estimate the standard deviation of normal data (Rousseeuw & Croux 1993; the "modified z-score" of
Iglewicz & Hoaglin 1993 uses 0.6745 = 1 / 1.4826). A step whose z exceeds
``train.loss_spike_zscore`` is a spike: warned about and marked in metrics.jsonl.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable

# Exit code of `llmtrain run` (and of each rank) when training stopped on a non-finite loss or
# gradient norm. 1 is any other failure, 2 bad input, 99 preempted, 130 Ctrl-C.
EXIT_DIVERGED = 3
# The error type a rank writes into its error file when it stops for that reason.
DIVERGED = "TrainingDiverged"
# MAD -> standard deviation for normally distributed data (1 / Phi^-1(3/4)).
MAD_TO_SIGMA = 1.4826
# Fewest previous losses a z-score is computed from (fewer: no verdict).
MIN_SPIKE_HISTORY = 10


def nonfinite(loss: float, grad_norm: float | None, dynamic_scaling: bool) -> tuple[str, ...]:
    """Which of the step's quantities are NaN or infinite ("loss", "grad_norm"); an unknown
    gradient norm (None) and, under dynamic loss scaling, an infinite one do not count."""
    bad = []
    if not math.isfinite(loss):
        bad.append("loss")
    if grad_norm is not None and not dynamic_scaling and not math.isfinite(grad_norm):
        bad.append("grad_norm")
    return tuple(bad)


def robust_zscore(value: float, history: Iterable[float]) -> float | None:
    """(value - median) / (1.4826 * MAD) over `history`; None with fewer than
    MIN_SPIKE_HISTORY values or when they do not vary (MAD 0)."""
    values = list(history)
    if len(values) < MIN_SPIKE_HISTORY:
        return None
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    if mad <= 0:
        return None
    return (value - median) / (MAD_TO_SIGMA * mad)


class LossSpikes:
    """Robust z-scores of successive losses over a sliding window of finite ones."""

    def __init__(self, window: int, threshold: float, history: Iterable[float] = ()):
        self.threshold = threshold
        self.window: deque[float] = deque(maxlen=max(1, window))
        for value in history:
            self.add(value)

    def add(self, loss: float) -> None:
        if math.isfinite(loss):
            self.window.append(loss)

    def observe(self, loss: float) -> tuple[float | None, bool]:
        """(z-score of `loss` against the window, whether it is a spike); then `loss` joins
        the window. Only upward spikes count; threshold 0 disables the verdict."""
        z = robust_zscore(loss, self.window) if math.isfinite(loss) else None
        self.add(loss)
        spike = z is not None and self.threshold > 0 and z > self.threshold
        return z, spike


def finite_or_none(value: float | None) -> float | None:
    """metrics.jsonl is strict JSON: NaN and infinities are written as null (the record's
    "nonfinite" list names them)."""
    return value if value is not None and math.isfinite(value) else None
