"""Print the planner's calibration table: predicted vs measured for every calibration.csv row.

Usage: .venv/bin/python bench/plan_calibration.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.plan.calibration import points, predicted

UNITS = {
    "step_s": (1.0, "s"),
    "tokens_per_s_per_gpu": (1.0, "tok/s/GPU"),
    "allocated_bytes": (2**30, "GiB alloc"),
    "reserved_bytes": (2**30, "GiB reserved"),
}


def main() -> int:
    print(f"{'id':<10} {'metric':<14} {'predicted':>10} {'measured':>10} {'error':>8}  note")
    worst = 0.0
    for p in points():
        value = predicted(p)
        scale, unit = UNITS[p.metric]
        error = value / p.measured - 1.0
        worst = max(worst, abs(error))
        print(
            f"{p.id:<10} {unit:<14} {value / scale:>10.4g} {p.measured / scale:>10.4g} "
            f"{error:>+8.1%}  {p.note}"
        )
    print(f"worst |error|: {worst:.1%} (bar: 10%)")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
