"""Totals of the run: time, GPU-hours, cost, checkpoint size, failures and checkpoint cadence.

- Failure rate: Llama 3 (Grattafiori et al. 2024, section 3.3.4) saw 419 unexpected interruptions in
  54 days on 16,384 GPUs: 419 / (54 * 24 * 16384) = 1.97e-5 per GPU-hour, the default here.
- Checkpoint interval: Young 1974, tau = sqrt(2 * C * M) for a checkpoint write time C and a mean
  time between failures M of the whole job; Daly 2006 shows it is the first-order optimum. Expected
  fraction of time lost: C / tau (writing) + tau / (2 M) (half an interval redone per failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16384)


@dataclass(frozen=True)
class Totals:
    steps: int
    train_s: float
    gpu_hours: float
    cost_usd: float
    price_per_gpu_hour: float
    checkpoint_bytes: float
    checkpoint_write_s: float
    mtbf_s: float
    expected_interruptions: float
    checkpoint_interval_s: float
    lost_fraction: float

    @property
    def expected_wall_s(self) -> float:
        """Training time plus checkpoint writes and work redone after failures."""
        return self.train_s / (1.0 - self.lost_fraction) if self.lost_fraction < 1 else math.inf


def young_daly_interval(write_s: float, mtbf_s: float) -> float:
    """Young 1974 / Daly 2006: the checkpoint interval minimising expected lost time."""
    return math.sqrt(2.0 * write_s * mtbf_s)


def lost_fraction(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Expected fraction of wall time lost writing checkpoints and redoing work after failures."""
    if interval_s <= 0 or mtbf_s <= 0:
        return 0.0
    return write_s / interval_s + interval_s / (2.0 * mtbf_s)


def estimate_totals(
    steps: int,
    step_s: float,
    world_size: int,
    price_per_gpu_hour: float,
    checkpoint_bytes: float,
    storage_write_gbps: float,
    failures_per_gpu_hour: float = FAILURES_PER_GPU_HOUR,
) -> Totals:
    train_s = steps * step_s
    gpu_hours = train_s / 3600.0 * world_size
    write_s = checkpoint_bytes / (storage_write_gbps * 1e9)
    rate_per_s = failures_per_gpu_hour * world_size / 3600.0
    mtbf_s = 1.0 / rate_per_s if rate_per_s > 0 else math.inf
    interval = young_daly_interval(write_s, mtbf_s) if math.isfinite(mtbf_s) else math.inf
    return Totals(
        steps=steps,
        train_s=train_s,
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours * price_per_gpu_hour,
        price_per_gpu_hour=price_per_gpu_hour,
        checkpoint_bytes=checkpoint_bytes,
        checkpoint_write_s=write_s,
        mtbf_s=mtbf_s,
        expected_interruptions=gpu_hours * failures_per_gpu_hour,
        checkpoint_interval_s=interval,
        lost_fraction=lost_fraction(interval, write_s, mtbf_s) if math.isfinite(interval) else 0.0,
    )
