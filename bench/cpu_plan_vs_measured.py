"""The plan priced from a CPU profile against real CPU runs: step time of single- and
multi-process configurations (dp, tp, pp over 2 local processes, gloo).

    python bench/cpu_plan_vs_measured.py [--steps 8] [--warmup 2] [--repeats 2] [--only NAME ...]
        [--workdir DIR] [--json FILE] [--max-median 0.25] [--no-after] [--force]

For each configuration of MATRIX (tiny and small GPT shapes, 1 and 2 processes, dp / tp / pp),
--repeats times:
1. `llmtrain calibrate cluster=cpu OVERRIDES --out BEFORE --no-cache` measures, on this machine,
   the operators of that configuration, its collectives (2 processes, gloo, at a size ladder) and
   the per-step overhead of its layout (real runs of the model cut to one layer per pipeline
   chunk, less their plans: launch/step_overhead.py) into a fresh profile;
2. `llmtrain run --fresh OVERRIDES` trains it for --steps steps; the measured step time is the
   median of metrics.jsonl's step_time_s after --warmup steps;
3. unless --no-after, `llmtrain calibrate ... --out AFTER` measures again right after the run;
4. the plans of the configuration with cluster.profile=BEFORE (and =AFTER) (`llmtrain plan
   --json`) predict the step time; the prediction is their geometric mean. A shared CPU's speed
   moves with the load of other processes (a 2-thread process ran tiny's step in 0.13 s on an
   idle machine and in 4-8 s at a load average of 10 here), so the two profiles bracket the run
   in time; both single-profile errors are printed too, with the load average at the run.
Error = predicted / measured - 1. It prints each run's error, per configuration the median and
worst |error| over the repeats, and the median over configurations of their median |error|; it
exits 1 when that median exceeds --max-median (25%) or a run fails, 0 otherwise.

Held out: no constant of the planner or of the profile pricing (launcher/plan/timing/measured.py)
was fitted to this matrix or to its results; the profile's figures are measurements of operators,
collectives and cut runs' overhead (never of the run being predicted), and the only fitted
constants (launcher/plan/calibration/fitted.py) come from bench/plan_fit.py on the published
reference runs (bench/data/calibration.csv). Each calibrate runs right before its run because a
shared CPU's speed moves with the load of other processes; that load is the main source of error
here.
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
    "tiny-tp2-seq512": [
        "cluster.gpus_per_node=2",
        "parallel.tp=2",
        "model.seq_length=512",
        "train.micro_batch_size=4",
        "train.global_batch_size=4",
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
    load1: float | None = None  # the 1-minute load average when the run started

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


def calibrate(overrides: list[str], profile: Path, work: Path, *, force: bool) -> str | None:
    args = ["calibrate", *overrides, "--out", str(profile), "--no-cache"]
    done = llmtrain([*args, "--force"] if force else args, work)
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
    res.problem = calibrate(overrides, before, work, force=opts.force)
    res.calibrate_s = time.monotonic() - start
    if res.problem:
        return res
    # A run root of its own: `run --fresh` into an existing run.name starts a new, timestamped
    # directory, and reading runs/NAME would price every repeat against the first run's steps.
    (work / "runs").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work / "runs"))
    run_args = [
        "run",
        "--fresh",
        *overrides,
        "cluster.profile=none",
        f"train.steps={opts.steps}",
        f"run.root_dir={root}",
        f"run.name={name}",
    ]
    res.load1 = os.getloadavg()[0]
    done = llmtrain(run_args, work)
    if done.returncode != 0:
        res.problem = f"run exit {done.returncode}: {(done.stderr or done.stdout)[-800:]}"
        return res
    if opts.after:
        res.problem = calibrate(overrides, after, work, force=opts.force)
        if res.problem:
            return res
    metrics = root / name / "metrics.jsonl"
    records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steady = [float(r["step_time_s"]) for r in records if r["step"] > opts.warmup]
    if not steady:
        res.problem = "no steps after the warm-up"
        return res
    res.measured_s = statistics.median(steady)
    try:
        res.before_s = predict(overrides, before, work)
        res.after_s = predict(overrides, after, work) if opts.after else res.before_s
    except RuntimeError as exc:
        res.problem = str(exc)
        return res
    res.predicted_s = math.sqrt(res.before_s * res.after_s)
    return res


def case_summary(results: list[Result]) -> dict[str, tuple[float, float, int]]:
    """Per configuration: (median |error|, worst |error|, runs) over its repeats that finished."""
    out: dict[str, tuple[float, float, int]] = {}
    for name in dict.fromkeys(r.name for r in results):
        errs = [abs(r.error) for r in results if r.name == name and r.error is not None]
        if errs:
            out[name] = (statistics.median(errs), max(errs), len(errs))
    return out


def show(r: Result) -> str:
    if r.problem:
        return f"{r.name:<16} FAIL: {r.problem}"
    assert r.predicted_s is not None and r.measured_s is not None and r.error is not None
    return (
        f"{r.name:<16} predicted {r.predicted_s * 1e3:9.1f} ms  measured "
        f"{r.measured_s * 1e3:9.1f} ms  error {r.error:+7.1%}  (profile before the run "
        f"{(r.before_s or 0) / r.measured_s - 1:+.1%}, after "
        f"{(r.after_s or 0) / r.measured_s - 1:+.1%}; load {r.load1 or 0:.1f} on "
        f"{os.cpu_count()} CPU(s); calibrate {r.calibrate_s:.1f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="runs of each configuration")
    p.add_argument("--only", nargs="*", choices=sorted(MATRIX), help="run these only")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--json")
    p.add_argument("--max-median", type=float, default=0.25)
    p.add_argument(
        "--no-after",
        dest="after",
        action="store_false",
        help="price from the profile measured before each run only (half the calibrations)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="calibrate --force: keep figures judged noise (a busy shared machine); say so",
    )
    opts = p.parse_args(argv)
    if opts.steps <= opts.warmup:
        p.error("--steps must exceed --warmup")
    if opts.repeats < 1:
        p.error("--repeats must be at least 1")
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="llmtrain-cpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    print(
        f"workdir {work}; {os.cpu_count()} CPU(s); load {os.getloadavg()[0]:.1f}"
        + ("; calibrate --force (figures judged noise kept)" if opts.force else ""),
        flush=True,
    )
    for repeat in range(opts.repeats):
        for name in opts.only or list(MATRIX):
            r = run_one(name, MATRIX[name], work, opts)
            results.append(r)
            print(f"[{repeat + 1}/{opts.repeats}] " + show(r), flush=True)
    cases = case_summary(results)
    print()
    for name, (med, worst, n) in cases.items():
        print(f"{name:<16} median |error| {med:6.1%}  worst {worst:6.1%}  ({n} run(s))")
    median = statistics.median(m for m, _, _ in cases.values()) if cases else float("inf")
    failed = sorted({r.name for r in results if r.problem})
    print(
        f"\n{len(cases)} configurations: median of their median |error| {median:.1%}; limit "
        f"{opts.max_median:.0%}" + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if opts.json:
        Path(opts.json).write_text(
            json.dumps(
                {
                    "median_abs_error": median,
                    "cases": {
                        k: {"median": m, "worst": w, "runs": n} for k, (m, w, n) in cases.items()
                    },
                    "results": [{**r.__dict__, "error": r.error} for r in results],
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if (not failed and median <= opts.max_median) else 1


if __name__ == "__main__":
    sys.exit(main())
