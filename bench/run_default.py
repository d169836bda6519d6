"""Wall time of `llmtrain run` with the default (tiny) recipe on this machine, and its losses.

    python bench/run_default.py [--runs 3]

Each run starts fresh in a temporary folder (the built-in corpus stays cached in ~/.cache/llmtrain,
as it would for a user after the first run). Prints the median wall time, the first and last loss
and the median steady-state tokens/s from metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(extra: list[str]) -> tuple[float, list[dict[str, float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "launcher", "run", *extra],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"llmtrain run failed:\n{done.stderr[-3000:]}")
        (run_dir,) = (Path(tmp) / "runs").iterdir()
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return wall, [json.loads(line) for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    walls, firsts, lasts, rates = [], [], [], []
    for _ in range(args.runs):
        wall, records = one_run(args.overrides)
        walls.append(wall)
        firsts.append(records[0]["loss"])
        lasts.append(records[-1]["loss"])
        rates.append(statistics.median(r["tokens_per_s"] for r in records[1:]))
        print(f"run: {wall:.1f} s, loss {records[0]['loss']:.4f} -> {records[-1]['loss']:.4f}")
    print(
        f"llmtrain run {' '.join(args.overrides) or '(default tiny recipe)'}: median wall "
        f"{statistics.median(walls):.1f} s over {args.runs} runs; first loss "
        f"{statistics.median(firsts):.4f}, last loss {statistics.median(lasts):.4f}; "
        f"{statistics.median(rates):,.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
