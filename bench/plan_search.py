"""Median wall time of `llmtrain plan --search recipe=llama3-405b` (bar: 2 s), and where the
published Llama 3 405B layout (TP8 PP16 DP128, interleaved) ranks, term by term against the top.

Each run is a fresh process (Python start, imports and composition included): warm (the compose
cache filled) and cold (LLMTRAIN_NO_CACHE=1).

Usage: .venv/bin/python bench/plan_search.py [runs]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RECIPE = "recipe=llama3-405b"
BAR_S = 2.0
CLI = [sys.executable, "-m", "launcher.cli", "plan", "--search", RECIPE]


def time_runs(command: list[str], runs: int, env: dict[str, str]) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return times


def describe(label: str, times: list[float]) -> str:
    return (
        f"{label}: median {statistics.median(times):.3f} s over {len(times)} runs "
        f"(min {min(times):.3f}, max {max(times):.3f})"
    )


def comparison() -> None:
    from launcher.config.composition.compose import compose_config
    from launcher.plan.memory.estimate import GIB
    from launcher.search.layouts import search

    cfg = compose_config([RECIPE]).config
    result = search(cfg)
    print(
        f"space {result.space_size:,} layouts; evaluated {result.evaluated:,} (memory), "
        f"{result.fitting:,} fit, {result.timed:,} timed; in-process {result.elapsed_s:.3f} s"
    )
    print("left out:", ", ".join(f"{k} {v:,}" for k, v in result.rejected.items()))
    ranked = search(cfg, rank_given=True)
    given, top = ranked.given, ranked.candidates[0]
    assert given is not None
    print(
        f"published layout (recipe: tp8 pp16 vpp4 interleaved, zero 2, selective recompute, sp): "
        f"{ranked.given_status}, rank {ranked.given_rank} of {ranked.fitting:,} fitting layouts "
        f"evaluated to rank it ({ranked.elapsed_s:.2f} s)"
    )
    print(f"top choice: {top.line}")
    rows = [
        ("tokens/s", given.tokens_per_s, top.tokens_per_s, "{:,.0f}"),
        ("step s", given.step_s, top.step_s, "{:.3f}"),
        ("  compute s", given.compute_s, top.compute_s, "{:.3f}"),
        ("  bubble s", given.bubble_s, top.bubble_s, "{:.3f}"),
        ("  exposed comm s", given.exposed_comm_s, top.exposed_comm_s, "{:.3f}"),
        ("  optimizer s", given.optimizer_s, top.optimizer_s, "{:.3f}"),
        ("MFU", given.mfu, top.mfu, "{:.3f}"),
        ("bubble fraction", given.bubble_fraction, top.bubble_fraction, "{:.3f}"),
        ("memory GiB", given.memory_bytes / GIB, top.memory_bytes / GIB, "{:.1f}"),
    ]
    print(f"{'':18} {'published':>12} {'top':>12} {'top - published':>16}")
    for name, a, b, fmt in rows:
        print(f"{name:18} {fmt.format(a):>12} {fmt.format(b):>12} {fmt.format(b - a):>16}")


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    env = dict(os.environ)
    subprocess.run(CLI, cwd=ROOT, capture_output=True, env=env)  # fill the compose cache
    warm = time_runs(CLI, runs, env)
    cold = time_runs(CLI, runs, {**env, "LLMTRAIN_NO_CACHE": "1"})
    print(f"llmtrain plan --search {RECIPE}, fresh process each run:")
    print(describe("  warm (compose cache)", warm))
    print(describe("  cold (LLMTRAIN_NO_CACHE=1)", cold))
    comparison()
    median = statistics.median(warm)
    print(f"bar {BAR_S} s: {'met' if median <= BAR_S else 'MISSED'}")
    return 0 if median <= BAR_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
