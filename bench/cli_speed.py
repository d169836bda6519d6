"""Median wall time of CLI commands that must answer fast (no torch import).

    python bench/cli_speed.py [--runs 9]

Prints one line per command: median, min and max seconds over the runs, each a fresh process, as a
user would type it. Targets: `show recipe=llama3-405b` <= 0.5 s and `plan recipe=llama3-405b`
<= 0.5 s (issues 2 and 3).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [
    ["--help"],
    ["show", "recipe=llama3-405b"],
    ["validate", "recipe=llama3-405b"],
    ["plan", "recipe=llama3-405b"],
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    exe = shutil.which("llmtrain")
    base = [exe] if exe else [sys.executable, "-m", "launcher"]
    print(f"{'command':40} {'median':>8} {'min':>8} {'max':>8}  (s, {args.runs} runs)")
    for cmd in COMMANDS:
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run([*base, *cmd], capture_output=True)
            times.append(time.perf_counter() - start)
        if done.returncode not in (0, 2):
            print(f"{' '.join(cmd):40} failed: {done.stderr.decode()[-200:]}")
            continue
        median = statistics.median(times)
        print(f"{' '.join(cmd):40} {median:8.3f} {min(times):8.3f} {max(times):8.3f}")


if __name__ == "__main__":
    main()
