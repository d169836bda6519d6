"""The plan priced from a CPU profile against real CPU runs: step time of >= 6 configurations.

    python bench/cpu_plan_vs_measured.py [--steps 8] [--warmup 2] [--only NAME ...]
        [--workdir DIR] [--json FILE] [--max-median 0.15]

For each configuration of MATRIX (tiny and small GPT shapes, 1 and 2 processes, dp / tp / pp):
1. `llmtrain calibrate cluster=cpu OVERRIDES --out BEFORE --no-cache` measures, on this machine,
   the operators of that configuration (merged into one profile file for the whole matrix);
2. `llmtrain run --fresh OVERRIDES` trains it for --steps steps; the measured step time is the
   median of metrics.jsonl's step_time_s after --warmup steps;
3. `llmtrain calibrate ... --out AFTER` measures the operators again right after the run;
4. the plans of the configuration with cluster.profile=BEFORE and =AFTER (`llmtrain plan --json`)
   predict the step time; the prediction is their geometric mean. A shared CPU's speed moves with
   the load of other processes (a 2-thread process ran tiny's step in 0.13 s on an idle machine
   and in 4-8 s at a load average of 10 here), so the two profiles bracket the run in time; both
   single-profile errors are printed too.
Error = predicted / measured - 1. It prints each error and the median |error| and exits 1 when
the median |error| exceeds --max-median (15%) or a run fails, 0 otherwise.

Held out: no constant of the planner or of the profile pricing (launcher/plan/measured.py) was
fitted to this matrix or to its results; the profile's figures are measurements of operators, and
the only fitted constants (launcher/plan/fitted.py) come from bench/plan_fit.py on the published
rows of calibration.csv. Each calibrate runs right before its run because a shared CPU's speed
moves with the load of other processes; that load is the main source of error here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BASE = ["recipe=tiny", "cluster=cpu", "backend=torch", "precision=fp32", "checkpoint.keep_last=1"]
SMALL = [
    "model.hidden_size=256",
    "model.ffn_hidden_size=1024",
    "model.num_attention_heads=8",
    "model.num_layers=4",
]
# name -> overrides (on top of BASE). 2-process runs use gloo between two local processes.
MATRIX: dict[str, list[str]] = {
    "tiny-1p": ["train.micro_batch_size=8", "train.global_batch_size=8"],
    "tiny-seq512-1p": [
        "model.seq_length=512",
        "train.micro_batch_size=4",
        "train.global_batch_size=4",
    ],
    "small-1p": [*SMALL, "train.micro_batch_size=4", "train.global_batch_size=4"],
    "tiny-dp2": [
        "cluster.gpus_per_node=2",
        "train.micro_batch_size=8",
        "train.global_batch_size=16",
    ],
    "tiny-tp2": [
        "cluster.gpus_per_node=2",
        "parallel.tp=2",
        "train.micro_batch_size=8",
        "train.global_batch_size=8",
    ],
    "tiny-pp2": [
        "cluster.gpus_per_node=2",
        "parallel.pp=2",
        "model.tie_embeddings=false",  # backend=torch does not tie embeddings across stages
        "train.micro_batch_size=4",
        "train.global_batch_size=16",
    ],
    "small-dp2": [
        *SMALL,
        "cluster.gpus_per_node=2",
        "train.micro_batch_size=4",
        "train.global_batch_size=8",
    ],
}


@dataclass
class Result:
    name: str
    overrides: list[str]
    predicted_s: float | None = None
    measured_s: float | None = None
    calibrate_s: float | None = None
    before_s: float | None = None  # predicted from the profile measured before the run
    after_s: float | None = None  # ... and after it
    problem: str | None = None

    @property
    def error(self) -> float | None:
        if self.predicted_s is None or not self.measured_s:
            return None
        return self.predicted_s / self.measured_s - 1.0


def llmtrain(args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def calibrate(overrides: list[str], profile: Path, work: Path) -> str | None:
    done = llmtrain(["calibrate", *overrides, "--out", str(profile), "--no-cache"], work)
    if done.returncode != 0:
        return f"calibrate exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}"
    return None


def predict(overrides: list[str], profile: Path, work: Path) -> float:
    planned = llmtrain(["plan", "--json", *overrides, f"cluster.profile={profile}"], work)
    if planned.returncode != 0:
        raise RuntimeError(f"plan exit {planned.returncode}: {planned.stderr[-600:]}")
    doc = json.loads(planned.stdout)
    if doc["time"]["pricing"]["source"] != "profile":
        raise RuntimeError("the plan did not use the profile")
    return float(doc["time"]["step_s"])


def run_one(name: str, extra: list[str], work: Path, opts: argparse.Namespace) -> Result:
    overrides = [*BASE, *extra]
    res = Result(name, overrides)
    before, after = work / "profile-before.json", work / "profile-after.json"
    start = time.monotonic()
    res.problem = calibrate(overrides, before, work)
    res.calibrate_s = time.monotonic() - start
    if res.problem:
        return res
    run_args = [
        "run",
        "--fresh",
        *overrides,
        "cluster.profile=none",
        f"train.steps={opts.steps}",
        f"run.root_dir={work / 'runs'}",
        f"run.name={name}",
    ]
    done = llmtrain(run_args, work)
    if done.returncode != 0:
        res.problem = f"run exit {done.returncode}: {(done.stderr or done.stdout)[-800:]}"
        return res
    res.problem = calibrate(overrides, after, work)
    if res.problem:
        return res
    metrics = work / "runs" / name / "metrics.jsonl"
    records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steady = [float(r["step_time_s"]) for r in records if r["step"] > opts.warmup]
    if not steady:
        res.problem = "no steps after the warm-up"
        return res
    res.measured_s = statistics.median(steady)
    try:
        res.before_s = predict(overrides, before, work)
        res.after_s = predict(overrides, after, work)
    except RuntimeError as exc:
        res.problem = str(exc)
        return res
    res.predicted_s = math.sqrt(res.before_s * res.after_s)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--only", nargs="*", choices=sorted(MATRIX), help="run these only")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--json")
    p.add_argument("--max-median", type=float, default=0.15)
    opts = p.parse_args(argv)
    if opts.steps <= opts.warmup:
        p.error("--steps must exceed --warmup")
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="llmtrain-cpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"workdir {work}; {os.cpu_count()} CPU(s)", flush=True)
    for name in opts.only or list(MATRIX):
        r = run_one(name, MATRIX[name], work, opts)
        results.append(r)
        if r.problem:
            print(f"{name:<16} FAIL: {r.problem}", flush=True)
        else:
            assert r.predicted_s is not None and r.measured_s is not None and r.error is not None
            print(
                f"{name:<16} predicted {r.predicted_s * 1e3:9.1f} ms  measured "
                f"{r.measured_s * 1e3:9.1f} ms  error {r.error:+7.1%}  (profile before the "
                f"run {(r.before_s or 0) / r.measured_s - 1:+.1%}, after "
                f"{(r.after_s or 0) / r.measured_s - 1:+.1%}; calibrate {r.calibrate_s:.1f} s)",
                flush=True,
            )
    errors = [abs(r.error) for r in results if r.error is not None]
    median = statistics.median(errors) if errors else float("inf")
    failed = [r.name for r in results if r.problem]
    print(
        f"\n{len(errors)} configurations: median |error| {median:.1%}, max "
        f"{max(errors) if errors else float('nan'):.1%}; limit {opts.max_median:.0%}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if opts.json:
        Path(opts.json).write_text(
            json.dumps(
                {
                    "median_abs_error": median,
                    "results": [{**r.__dict__, "error": r.error} for r in results],
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if (not failed and median <= opts.max_median) else 1


if __name__ == "__main__":
    sys.exit(main())
