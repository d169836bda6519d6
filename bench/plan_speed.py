"""Median wall time of `llmtrain plan recipe=llama3-405b` in a fresh Python (bar: 0.5 s).

Usage: .venv/bin/python bench/plan_speed.py [runs]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "launcher.cli", "plan", "recipe=llama3-405b"]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    probe = subprocess.run([*COMMAND, "--help"], cwd=ROOT, capture_output=True, text=True)
    if probe.returncode != 0:
        print("skipped: `python -m launcher.cli plan` is not available yet")
        return 0
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(COMMAND, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            return 1
    median = statistics.median(times)
    print(
        f"llmtrain plan recipe=llama3-405b: median {median:.3f} s over {runs} runs "
        f"(min {min(times):.3f}, max {max(times):.3f}); bar 0.5 s"
    )
    return 0 if median <= 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
