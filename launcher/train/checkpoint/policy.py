"""When to write a checkpoint: one object decides (the loop only asks it).

Reasons, checked after every optimizer step (``CheckpointPolicy.due``):
- ``preempted``: SIGUSR1/SIGTERM/SIGINT/SIGHUP reached a rank (every rank agrees first);
- ``every_steps``: checkpoint.every_steps divides the step;
- ``every_minutes``: that much wall time since the last save (rank 0's clock decides for all);
- ``young_daly``: when neither every_steps nor every_minutes is set, the interval `plan` computed
  as sqrt(2 C MTBF) (Young 1974, Daly 2006) from plan.json's ``checkpoint.interval_s``;
- the last step is always saved by the trainer itself (``final``).
No torch here: the trainer supplies the agreement between ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.plan.figures import PlanFigures


@dataclass
class CheckpointPolicy:
    total_steps: int
    every_steps: int | None = None
    every_minutes: float | None = None
    young_daly_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    last_save: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.last_save = self.clock()

    @classmethod
    def from_config(cls, checkpoint: Any, plan: PlanFigures, total_steps: int) -> CheckpointPolicy:
        """`checkpoint` is the config's checkpoint section; `plan` the figures of plan.json."""
        interval = None
        if not checkpoint.every_steps and not checkpoint.every_minutes:
            value = plan.checkpoint_interval_s
            interval = value if value is not None and value > 0 else None
        return cls(
            total_steps=total_steps,
            every_steps=checkpoint.every_steps or None,
            every_minutes=checkpoint.every_minutes or None,
            young_daly_s=interval,
        )

    @property
    def interval_s(self) -> float | None:
        """The time-based interval in force (every_minutes, else Young/Daly), if any."""
        if self.every_minutes:
            return 60.0 * self.every_minutes
        return self.young_daly_s

    @property
    def time_based(self) -> bool:
        return self.interval_s is not None

    def describe(self) -> str:
        parts = []
        if self.every_steps:
            parts.append(f"every {self.every_steps} steps")
        if self.every_minutes:
            parts.append(f"every {self.every_minutes:g} min")
        if self.young_daly_s is not None:
            # Young/Daly from plan.json; checkpoint.every_steps / every_minutes replace it.
            parts.append(f"every {self.young_daly_s / 60:.1f} min (Young/Daly)")
        return "checkpoints: " + ", ".join([*parts, "at the end, on interrupt"])

    def due(self, done: int) -> str | None:
        """Why step `done` should be saved now (None: not due). The time-based reason is this
        process's view; with several ranks the trainer lets rank 0 decide it for everyone."""
        if done >= self.total_steps:
            return None  # the trainer's final save
        if self.every_steps and done % self.every_steps == 0:
            return "every_steps"
        interval = self.interval_s
        if interval is not None and self.clock() - self.last_save >= interval:
            return "every_minutes" if self.every_minutes else "young_daly"
        return None

    def saved(self) -> None:
        self.last_save = self.clock()
