"""What torchrun's agent costs a one-process run: the same run directory trained by the command
`llmtrain run` starts for one process (the trainer itself, ``single_process_command``) and by
torchrun with one process (``torchrun_command``, what it started before).

    python bench/one_process_launch.py [--runs 3] [--min-cpu-s 1.0] [--min-wall-s 0.5]

One short `llmtrain run` (the tiny recipe, 2 steps) makes the run directory; each launch then
trains a copy of its config.yaml and plan.json from scratch, the two ways alternating. Prints the
median wall time and CPU time (the launched process and its children) of each, and exits 1 when
the median saving is under --min-cpu-s CPU seconds or --min-wall-s seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.render.torchrun import SINGLE_PROCESS_ENV, single_process_command, torchrun_command

STEPS = ["train.steps=2", "train.log_every=1"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s) of `command` and everything it started."""
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{command[:4]} failed:\n{done.stderr[-3000:]}")
    return wall, children_cpu() - cpu


def fresh_copy(template: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    (target / "logs").mkdir()
    for name in ("config.yaml", "plan.json"):
        shutil.copy(template / name, target / name)
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--min-cpu-s", type=float, default=1.0)
    parser.add_argument("--min-wall-s", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        made = subprocess.run(
            [sys.executable, "-m", "launcher", "run", *STEPS, "run.name=template"],
            cwd=root,
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            sys.exit(f"llmtrain run failed:\n{made.stderr[-3000:]}")
        template = root / "runs" / "template"
        base = {**os.environ, "LLMTRAIN_DEVICE": "cpu", "PYTHONUNBUFFERED": "1"}
        ways = {
            "torchrun, 1 process": (lambda d: torchrun_command(sys.executable, 1, str(d)), base),
            "trainer alone": (
                lambda d: single_process_command(sys.executable, str(d)),
                {**base, **SINGLE_PROCESS_ENV},
            ),
        }
        seen: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        for i in range(args.runs):
            for j, (way, (command, env)) in enumerate(ways.items()):
                run_dir = fresh_copy(template, root / "runs" / f"launch-{i}-{j}")
                wall, cpu = launch(command(run_dir), env, root)
                seen[way].append((wall, cpu))
                print(f"{way:>20}: wall {wall:5.2f} s, CPU {cpu:5.2f} s")
    medians = {
        way: (statistics.median(w for w, _ in rows), statistics.median(c for _, c in rows))
        for way, rows in seen.items()
    }
    (agent_wall, agent_cpu), (alone_wall, alone_cpu) = medians.values()
    print(
        f"median over {args.runs}: torchrun {agent_wall:.2f} s wall / {agent_cpu:.2f} CPU s, "
        f"trainer alone {alone_wall:.2f} s / {alone_cpu:.2f} CPU s: saves "
        f"{agent_wall - alone_wall:.2f} s wall and {agent_cpu - alone_cpu:.2f} CPU s a launch "
        f"(targets >= {args.min_wall_s} s, >= {args.min_cpu_s} CPU s)"
    )
    if agent_cpu - alone_cpu < args.min_cpu_s or agent_wall - alone_wall < args.min_wall_s:
        sys.exit(1)


if __name__ == "__main__":
    main()
