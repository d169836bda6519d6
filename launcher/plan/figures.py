"""The figures of plan.json (``launcher.plan.document``) the training runtime compares against:
predicted step time and memory, the Young/Daly checkpoint interval, FLOPs per token, the peak
its MFU divides by.

Apart from the document's writer, which imports the planner: every rank reads these at start-up,
and importing the planner there cost ~0.14 CPU s a rank (python -X importtime, the tiny run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlanFigures:
    """The figures of plan.json the trainer uses; each None when the document lacks it (a run
    directory written without a plan, or by an older llmtrain)."""

    step_s: float | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    checkpoint_interval_s: float | None = None
    flops_per_token: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None

    @property
    def peak_flops(self) -> float | None:
        """Peak FLOP/s per device exactly as `plan` divided by for its MFU (mfu = tflops_per_gpu /
        peak), so measured and predicted MFU share one denominator."""
        if self.tflops_per_gpu is None or self.mfu is None or self.mfu <= 0:
            return None
        return self.tflops_per_gpu * 1e12 / self.mfu

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PlanFigures:
        def number(section: str, key: str) -> float | None:
            part = doc.get(section)
            value = part.get(key) if isinstance(part, dict) else None
            if not isinstance(value, int | float) or isinstance(value, bool):
                return None
            return float(value) if math.isfinite(value) else None

        def whole(section: str, key: str) -> int | None:
            value = number(section, key)
            return None if value is None else int(value)

        return cls(
            step_s=number("time", "step_s"),
            allocated_bytes=whole("memory", "allocated_bytes"),
            reserved_bytes=whole("memory", "reserved_bytes"),
            checkpoint_interval_s=number("checkpoint", "interval_s"),
            flops_per_token=number("flops", "per_token_model"),
            tflops_per_gpu=number("time", "tflops_per_gpu"),
            mfu=number("time", "mfu"),
        )
