"""Measured against planned on one GPU: step time, tokens/s, MFU and peak memory of a ~1B Llama.

    python bench/gpu_plan_vs_measured.py [--bf16 | --fp8] [--steps 30] [--warmup 5]
        [--micro-batch 1] [--seq 8192] [--cluster NAME] [--band X] [--json FILE] [--workdir DIR]
    python bench/gpu_plan_vs_measured.py --smoke         # CPU plumbing: tiny recipe, a few steps
    python bench/gpu_plan_vs_measured.py --from-run DIR  # compare a finished run directory again
    python bench/gpu_plan_vs_measured.py --matrix [--only NAME ...]  # MATRIX, with/without profile
    python bench/gpu_plan_vs_measured.py --smoke --matrix  # the matrix code path on the CPU
    python bench/gpu_plan_vs_measured.py --rescore DIR   # re-price recorded runs (no GPU), e.g.
        bench/results/h100-80gb-2026-11-25 (measured.json + the profiles calibrate wrote)

--matrix trains each configuration of MATRIX (>= 10: hidden 2k-8k, sequence 2k-8k, micro-batch,
recompute, compile, bf16/fp8, dense/MoE, torch/DeepSpeed) once and compares its step time and
peak memory with two plans of it: from published figures (cluster.profile=none) and from a
profile `llmtrain calibrate` wrote for that configuration on this GPU just before the run. It
prints each error and the median |error| of each, and exits 1 on a miss (a figure outside the
stated band) or a failed run. The matrix is held out: no constant was fitted to it (the fitted
constants come from bench/plan_fit.py on calibration.csv; a profile holds measurements only).
Large shapes keep their per-layer dimensions with fewer layers so that one GPU holds them.

For each precision (bf16 and fp8 unless --bf16 or --fp8 picks one) it trains `recipe=llama3-1b`
(Llama 3.2 1B shape, 1.24B parameters) with backend=torch on one GPU through the real CLI
(`python -m launcher run`, what the `llmtrain` script runs) in a fresh folder, then reads what the
trainer wrote: metrics.jsonl (per-step step_time_s, tokens_per_s, mfu) and summary.json (peak
memory: torch.cuda.max_memory_allocated / max_memory_reserved of rank 0, recorded on CUDA only).
The prediction comes from the planner in this process (`launcher.plan.planner.make_plan` on the same
overrides through the compose API); the memory rows compare with the heaviest GPU's `allocated` and
`reserved_observed` (what max_memory_reserved reports), as bench/plan_calibration.py does.

Warm-up: the first --warmup steps (default 5) are left out of the medians. Step 1 creates the CUDA
context, cuBLAS handles and workspaces and allocates the Adam states; the caching allocator keeps
growing its pool and the GEMM heuristics settle over the next few steps. Peak memory is the peak of
the whole run (a peak is a peak; warm-up does not inflate it beyond the steady state's).

Error = predicted / measured - 1, the convention of bench/plan_calibration.py whose leave-one-
source-out errors are the plan's bands (launcher/plan/calibration/error_bands.py). A figure passes
when |error| is within the band the planner states for its regime ("typically within +-X%": the time
band for step time, tokens/s and MFU, the memory band for memory), or within --band when given.

Exit status: 0 every figure within its band; 1 a figure outside its band, a figure the run did not
record, or a run that failed or was refused (e.g. fp8 on a GPU older than compute capability 8.9);
2 no CUDA GPU (without --smoke), an unknown GPU without --cluster, or bad arguments.

--smoke goes through the same code (launch, read metrics, plan, compare, table, JSON, exit status)
on the CPU with the tiny recipe and skips the GPU-only figures (peak allocated/reserved). The CPU
entry of the GPU catalog is not calibrated and the machine may be shared, so smoke compares against
a deliberately wide band (SMOKE_BAND) unless --band is given: it checks the plumbing, not the plan.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.config.composition.compose import compose_config, config_from_values  # noqa: E402
from launcher.config.schema import LLMTrainConfig  # noqa: E402
from launcher.plan.document import pricing_json  # noqa: E402
from launcher.plan.planner import Plan, make_plan  # noqa: E402

GIB = 2**30
WARMUP = 5
# |predicted / measured - 1| allowed in --smoke (a factor of ~1000 either way): the CPU entry is
# not calibrated and a shared CPU's step time varies tenfold; smoke checks the plumbing only.
SMOKE_BAND = 1000.0
RUN_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Row:
    figure: str
    unit: str
    measured: float | None
    predicted: float
    band: float  # allowed |predicted / measured - 1|
    band_source: str
    gpu_only: bool
    status: str  # ok | MISS | not measured | n/a on CPU

    @property
    def error(self) -> float | None:
        if self.measured is None or not self.measured > 0:
            return None
        return self.predicted / self.measured - 1.0

    @property
    def failed(self) -> bool:
        return self.status in ("MISS", "not measured")


@dataclass
class Outcome:
    precision: str
    overrides: list[str]
    run_dir: str | None
    problem: str | None  # why the run gave no figures (failed, refused), else None
    rows: list[Row]
    figures: dict[str, float | None] | None = None  # what the run measured (measured_figures)

    @property
    def ok(self) -> bool:
        return self.problem is None and not any(r.failed for r in self.rows)


class BenchError(Exception):
    """A run that failed or left no usable figures: reported, exit status 1."""


def cluster_for(device_name: str, total_memory_bytes: int) -> str | None:
    """The conf/cluster entry for a CUDA device as torch names it (torch.cuda.get_device_name:
    "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", ...), or None when the catalog has
    no entry that matches it (pass --cluster)."""
    name = device_name.upper()
    if "H200" in name:
        return "h200"
    if "H800" in name:
        return "h800"
    if "H100" in name:
        if "NVL" in name:  # H100 NVL (94 GB, PCIe form factor with a bridge): not in the catalog
            return None
        if "PCIE" in name:
            return "h100-pcie"
        return "h100-96gb" if total_memory_bytes > 90 * GIB else "h100-80gb"
    return None


def detect_gpu() -> tuple[str, int] | None:
    """(name, total memory) of CUDA device 0, asked in a child process so that this one holds no
    CUDA context (it would take GPU memory from the measured run); None without CUDA."""
    probe = (
        "import torch\n"
        "if torch.cuda.is_available():\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    print(torch.cuda.get_device_name(0)); print(p.total_memory)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return None
    return lines[0], int(lines[1])


def gpu_overrides(cluster: str, precision: str, steps: int, mbs: int, seq: int) -> list[str]:
    return [
        "recipe=llama3-1b",
        f"cluster={cluster}",
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=1",
        "backend=torch",
        f"precision={precision}",
        f"model.seq_length={seq}",
        f"train.micro_batch_size={mbs}",
        f"train.global_batch_size={mbs}",
        f"train.steps={steps}",
        "checkpoint.keep_last=1",
    ]


def smoke_overrides(precision: str, steps: int) -> list[str]:
    return [
        "recipe=tiny",
        "cluster=cpu",
        "backend=torch",
        f"precision={precision}",
        "model.seq_length=128",
        "train.micro_batch_size=2",
        "train.global_batch_size=2",
        f"train.steps={steps}",
        "checkpoint.keep_last=1",
    ]


# name -> overrides on top of matrix_base(); held out (module docstring).
MATRIX: dict[str, list[str]] = {
    "1b-s8k-bf16": ["recipe=llama3-1b", "precision=bf16", "backend.compile=false"],
    "1b-s8k-compile": ["recipe=llama3-1b", "precision=bf16", "backend.compile=true"],
    # precision=fp8 compiles by default (launcher/backends/engine_choices.py).
    "1b-s8k-fp8": ["recipe=llama3-1b", "precision=fp8"],
    "1b-s8k-full-recompute": ["recipe=llama3-1b", "train.recompute=full"],
    "1b-s4k-mbs2": [
        "recipe=llama3-1b",
        "model.seq_length=4096",
        "train.micro_batch_size=2",
        "train.global_batch_size=2",
    ],
    "1b-s4k-mbs2-deepspeed": [
        "recipe=llama3-1b",
        "model.seq_length=4096",
        "train.micro_batch_size=2",
        "train.global_batch_size=2",
        "backend=deepspeed",
        "zero.stage=1",
    ],
    "1b-accum4": ["recipe=llama3-1b", "model.seq_length=4096", "train.global_batch_size=4"],
    "8b-4layers-s4k": ["recipe=llama3-8b", "model.num_layers=4", "model.seq_length=4096"],
    "8b-4layers-s8k-compile": [
        "recipe=llama3-8b",
        "model.num_layers=4",
        "precision=bf16",
        "backend.compile=true",
        "train.recompute=none",
    ],
    "8b-4layers-s8k-fp8": [
        "recipe=llama3-8b",
        "model.num_layers=4",
        "precision=fp8",
        "train.recompute=none",
    ],
    "mixtral-1layer-s4k-mbs2": [
        "recipe=mixtral-8x7b",
        "backend=torch",
        "model.num_layers=1",
        "model.seq_length=4096",
        "train.micro_batch_size=2",
        "train.global_batch_size=2",
        "parallel.sequence_parallel=false",
        "precision=bf16",
        "backend.compile=false",
        "train.recompute=none",
    ],
    "70b-1layer-s2k": ["recipe=llama3-70b", "model.num_layers=1", "model.seq_length=2048"],
}
# --smoke --matrix: the same code on the CPU, two tiny configurations.
SMOKE_MATRIX: dict[str, list[str]] = {
    "tiny-a": ["recipe=tiny", "model.seq_length=128"],
    "tiny-b": ["recipe=tiny", "model.seq_length=128", "model.num_layers=2"],
}


def matrix_base(cluster: str, steps: int, smoke: bool) -> list[str]:
    base = [
        f"cluster={cluster}",
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=1",
        f"train.steps={steps}",
        "checkpoint.keep_last=1",
        "parallel.tp=1",
        "parallel.pp=1",
        "parallel.cp=1",
        "parallel.ep=1",
        "zero.stage=0",
    ]
    if smoke:
        return [*base, "backend=torch", "train.micro_batch_size=2", "train.global_batch_size=2"]
    return [*base, "train.micro_batch_size=1", "train.global_batch_size=1"]


def calibrate_profile(overrides: list[str], profile: Path, workdir: Path) -> float:
    """`llmtrain calibrate OVERRIDES --out profile --no-cache` (merged into one file); its
    wall-clock seconds."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "launcher", "calibrate", *overrides]
    command += ["--out", str(profile), "--no-cache"]
    print("$ llmtrain calibrate " + " ".join(overrides), flush=True)
    started = time.monotonic()
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise BenchError(f"`llmtrain calibrate` failed (exit {done.returncode}):\n{tail}")
    print(f"  calibrated in {elapsed:.1f} s", flush=True)
    return elapsed


def run_matrix_one(
    name: str, overrides: list[str], workdir: Path, opts: argparse.Namespace, cpu: bool
) -> list[Outcome]:
    """One real run, compared with the published-figures plan and with the profile's plan."""
    published = [*overrides, "cluster.profile=none"]
    try:
        cfg = compose_config(published).config
        profile = workdir / f"profile-{name}.json"
        calibrate_s = None
        if not opts.no_profile:
            calibrate_s = calibrate_profile(overrides, profile, workdir / "calibrate")
        run_dir = launch(published, workdir / name)
        outcomes = [
            evaluate(f"{name} (published)", published, cfg, run_dir, opts.warmup, opts.band, cpu)
        ]
        if not opts.no_profile:
            measured_cfg = compose_config([*overrides, f"cluster.profile={profile}"]).config
            figures = {**measured_figures(run_dir, opts.warmup), "calibrate_s": calibrate_s}
            rows = compare(make_plan(measured_cfg), figures, opts.band, cpu)
            outcomes.append(
                Outcome(f"{name} (profile)", overrides, str(run_dir), None, rows, figures)
            )
        prune_checkpoints(run_dir)
        return outcomes
    except BenchError as exc:
        return [Outcome(name, overrides, None, str(exc), [])]
    except Exception as exc:  # ConfigError and friends: report, exit 1, no traceback
        return [Outcome(name, overrides, None, f"{type(exc).__name__}: {exc}", [])]


def medians(outcomes: list[Outcome]) -> None:
    """Median and max |error| of step time and peak allocated, per pricing source."""
    for source in ("published", "profile"):
        for figure in ("step time", "peak allocated"):
            errors = [
                abs(r.error)
                for o in outcomes
                if o.precision.endswith(f"({source})")
                for r in o.rows
                if r.figure == figure and r.error is not None
            ]
            if errors:
                print(
                    f"{source:<10} {figure:<15} median |error| {statistics.median(errors):.1%}, "
                    f"max {max(errors):.1%} over {len(errors)} runs"
                )


def launch(overrides: list[str], workdir: Path) -> Path:
    """`llmtrain run --fresh OVERRIDES` in workdir; the run directory it wrote."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "launcher", "run", "--fresh", *overrides]
    print("$ llmtrain run --fresh " + " ".join(overrides), flush=True)
    try:
        done = subprocess.run(
            command, cwd=workdir, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"`llmtrain run` did not finish within {RUN_TIMEOUT_S} s") from None
    if done.returncode != 0:
        what = "refused" if done.returncode == 2 else "failed"
        tail = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise BenchError(f"`llmtrain run` {what} (exit {done.returncode}):\n{tail}")
    runs = sorted((workdir / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise BenchError(f"`llmtrain run` exited 0 but wrote no run directory under {workdir}")
    return runs[-1]


def measured_figures(run_dir: Path, warmup: int) -> dict[str, float | None]:
    """Medians over the steps after `warmup` (metrics.jsonl) and the run's peak memory
    (summary.json; max allocated/reserved exist only for a CUDA run)."""
    metrics, summary_file = run_dir / "metrics.jsonl", run_dir / "summary.json"
    if not metrics.is_file() or not summary_file.is_file():
        raise BenchError(f"{run_dir}: no metrics.jsonl or summary.json (the run did not finish)")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steady = [r for r in records if r["step"] > warmup]
    if not steady:
        raise BenchError(
            f"{run_dir}: {len(records)} steps recorded, none after the {warmup} warm-up steps; "
            f"train for more steps (--steps {warmup + 10})"
        )
    peak = json.loads(summary_file.read_text())["measured_peak_memory"]

    def median(key: str) -> float | None:
        values = [r.get(key) for r in steady]
        numbers = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
        return statistics.median(numbers) if len(numbers) == len(values) else None

    return {
        "step_s": median("step_time_s"),
        "tokens_per_s": median("tokens_per_s"),
        "mfu": median("mfu"),
        "peak_allocated_bytes": peak.get("max_allocated"),
        "peak_reserved_bytes": peak.get("max_reserved"),
        "steps_measured": len(steady),
        # Step 1 holds the CUDA start-up and, with compile, the compilation: what compile costs.
        "first_step_s": records[0].get("step_time_s") if records else None,
    }


def prune_checkpoints(run_dir: Path) -> None:
    """Drop the run's checkpoints once its figures are read (16 bytes a parameter each; a
    matrix of 1-8B runs on /dev/shm fills the host memory otherwise)."""
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def compare(
    plan: Plan, figures: dict[str, float | None], band: float | None, cpu: bool
) -> list[Row]:
    time_band, memory_band = plan.time_band, plan.memory_band
    assert time_band is not None and memory_band is not None  # make_plan always sets them
    heaviest = plan.memory.heaviest
    specs: list[tuple[str, str, str, float, str, bool]] = [
        ("step time", "s", "step_s", plan.time.step_s, "time", False),
        ("tokens/s", "tok/s", "tokens_per_s", plan.time.tokens_per_s, "time", False),
        ("MFU", "%", "mfu", plan.time.mfu, "time", False),
        ("peak allocated", "GiB", "peak_allocated_bytes", heaviest.allocated, "memory", True),
        ("peak reserved", "GiB", "peak_reserved_bytes", heaviest.reserved_observed, "memory", True),
    ]
    rows = []
    for figure, unit, key, predicted, kind, gpu_only in specs:
        stated = time_band if kind == "time" else memory_band
        allowed = band if band is not None else stated.typical
        source = "--band" if band is not None else f"plan: {kind}, {stated.regime}"
        value = figures.get(key)
        if gpu_only and cpu:
            status = "n/a on CPU"
        elif value is None or not value > 0:
            status = "not measured"
        else:
            status = "ok" if abs(predicted / value - 1.0) <= allowed else "MISS"
        rows.append(Row(figure, unit, value, predicted, allowed, source, gpu_only, status))
    return rows


def show(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "GiB":
        return f"{value / GIB:.2f} GiB"
    if unit == "%":
        return f"{value:.1%}"
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    return f"{value:,.0f} {unit}"


def table(outcome: Outcome) -> str:
    lines = [f"{'figure':<16}{'measured':>14}{'predicted':>14}{'error':>10}{'band':>10}  status"]
    for r in outcome.rows:
        err = f"{r.error:+.1%}" if r.error is not None else "-"
        lines.append(
            f"{r.figure:<16}{show(r.measured, r.unit):>14}{show(r.predicted, r.unit):>14}"
            f"{err:>10}{'±' + format(r.band, '.0%'):>10}  {r.status}"
        )
    sources = sorted({r.band_source for r in outcome.rows})
    lines.append("bands: " + "; ".join(sources))
    return "\n".join(lines)


def evaluate(
    precision: str,
    overrides: list[str],
    cfg: LLMTrainConfig,
    run_dir: Path,
    warmup: int,
    band: float | None,
    cpu: bool,
) -> Outcome:
    figures = measured_figures(run_dir, warmup)
    plan = make_plan(cfg)
    # The launcher planned the same composition (plan.json): a different step time means the
    # prediction here is not for the configuration that ran.
    launched = json.loads((run_dir / "plan.json").read_text())["time"]["step_s"]
    if not math.isclose(launched, plan.time.step_s, rel_tol=1e-9):
        raise BenchError(
            f"{run_dir}: plan.json predicts {launched:.6f} s per step, this process "
            f"{plan.time.step_s:.6f} s: the configurations differ"
        )
    rows = compare(plan, figures, band, cpu)
    return Outcome(precision, overrides, str(run_dir), None, rows, figures)


def run_one(
    precision: str, overrides: list[str], workdir: Path, opts: argparse.Namespace, cpu: bool
) -> Outcome:
    try:
        cfg = compose_config(overrides).config  # the same composition `llmtrain run` makes
        run_dir = launch(overrides, workdir / precision)
        return evaluate(precision, overrides, cfg, run_dir, opts.warmup, opts.band, cpu)
    except BenchError as exc:
        return Outcome(precision, overrides, None, str(exc), [])
    except Exception as exc:  # ConfigError and friends: report, exit 1, no traceback
        return Outcome(precision, overrides, None, f"{type(exc).__name__}: {exc}", [])


def from_run(run_dir: Path, opts: argparse.Namespace) -> Outcome:
    import yaml

    values = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg = config_from_values(values)
    cpu = cfg.cluster.gpu == "cpu"
    try:
        return evaluate(cfg.precision.name, [], cfg, run_dir, opts.warmup, opts.band, cpu)
    except BenchError as exc:
        return Outcome(cfg.precision.name, [], str(run_dir), str(exc), [])


def rescore(folder: Path, band: float | None) -> int:
    """Re-price recorded runs: FOLDER/measured.json (what --matrix measured on a GPU: each
    entry's overrides and figures, and the profile calibrate wrote for its shapes) against the
    plan of today's code, from published figures and from the profile. No GPU needed; nothing is
    fitted to these runs (they are the held-out matrix)."""
    doc = json.loads((folder / "measured.json").read_text())
    print(f"recorded on {doc['device']}, {doc['date']}; {doc['warmup_steps']} warm-up steps")
    results: list[Outcome] = []
    for name, entry in doc["entries"].items():
        overrides = [*doc["base"], *entry["overrides"]]
        figures = entry["figures"]
        if entry.get("note"):
            print(f"{name}: {entry['note']}")
        published = [*overrides, "cluster.profile=none"]
        plan = make_plan(compose_config(published).config)
        results.append(
            Outcome(
                f"{name} (published)",
                published,
                None,
                None,
                compare(plan, figures, band, False),
                figures,
            )
        )
        if entry.get("profile") is None:
            print(f"{name}: no profile comparison ({entry.get('profile_note', 'none recorded')})")
            continue
        profiled = [*overrides, f"cluster.profile={folder / entry['profile']}"]
        plan = make_plan(compose_config(profiled).config)
        parts = pricing_json(plan).get("parts", {})
        scaled = sorted(k for k, v in parts.items() if v != "profile")
        if scaled:
            print(
                f"{name}: not priced from exact measurements: "
                + ", ".join(f"{k} ({parts[k]})" for k in scaled)
            )
        results.append(
            Outcome(
                f"{name} (profile)",
                profiled,
                None,
                None,
                compare(plan, figures, band, False),
                figures,
            )
        )
    code = report(results, {"rescore": str(folder)}, None)
    medians(results)
    return code


def report(outcomes: list[Outcome], header: dict[str, Any], json_path: str | None) -> int:
    for o in outcomes:
        print(f"\n== precision={o.precision}" + (f"  run {o.run_dir}" if o.run_dir else ""))
        if o.problem:
            print(f"FAIL: {o.problem}")
        else:
            print(table(o))
    ok = bool(outcomes) and all(o.ok for o in outcomes)
    misses = [f"{o.precision} {r.figure}" for o in outcomes for r in o.rows if r.failed]
    failed_runs = [o.precision for o in outcomes if o.problem]
    if ok:
        print("\nPASS: every figure within its band")
    else:
        why = []
        if failed_runs:
            why.append("run failed: " + ", ".join(failed_runs))
        if misses:
            why.append("outside the band or not measured: " + ", ".join(misses))
        print("\nFAIL: " + "; ".join(why))
    if json_path:
        doc = {
            **header,
            "ok": ok,
            "runs": [
                {
                    "precision": o.precision,
                    "overrides": o.overrides,
                    "run_dir": o.run_dir,
                    "ok": o.ok,
                    "problem": o.problem,
                    "figures": o.figures,
                    "rows": [{**asdict(r), "error": r.error} for r in o.rows],
                }
                for o in outcomes
            ],
        }
        Path(json_path).write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if ok else 1


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--bf16", action="store_true", help="only precision=bf16")
    which.add_argument("--fp8", action="store_true", help="only precision=fp8")
    p.add_argument("--smoke", action="store_true", help="CPU plumbing run (tiny recipe)")
    p.add_argument("--from-run", type=Path, help="compare this finished run directory")
    p.add_argument(
        "--rescore",
        type=Path,
        help="re-price the runs recorded in this folder (measured.json + profiles; no GPU)",
    )
    p.add_argument("--cluster", help="conf/cluster name (default: from the GPU found)")
    p.add_argument("--steps", type=int, help="steps per run (default 30; smoke 4)")
    p.add_argument("--warmup", type=int, help=f"steps left out (default {WARMUP}; smoke 1)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per step (GPU)")
    p.add_argument("--seq", type=int, default=8192, help="sequence length (GPU)")
    p.add_argument("--band", type=float, help="allowed |error| for every figure (0.1 = ±10%%)")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--matrix", action="store_true", help="run MATRIX (module docstring)")
    p.add_argument("--only", nargs="*", help="with --matrix: these configurations only")
    p.add_argument(
        "--no-profile", action="store_true", help="with --matrix: published figures only"
    )
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temp folder)")
    opts = p.parse_args(argv)
    if opts.warmup is None:
        opts.warmup = 1 if opts.smoke else WARMUP
    if opts.steps is None:
        opts.steps = opts.warmup + (3 if opts.smoke else 25)
    if opts.steps <= opts.warmup:
        p.error(f"--steps {opts.steps} must exceed --warmup {opts.warmup}")
    if opts.band is None and opts.smoke:
        opts.band = SMOKE_BAND
    if opts.band is not None and opts.band < 0:
        p.error("--band must be >= 0")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if opts.rescore is not None:
        return rescore(opts.rescore, opts.band)
    if opts.from_run is not None:
        outcome = from_run(opts.from_run, opts)
        return report([outcome], {"from_run": str(opts.from_run)}, opts.json)
    cluster: str | None
    if opts.smoke:
        device, cluster = "cpu", "cpu"
    else:
        gpu = detect_gpu()
        if gpu is None:
            print(
                "error: no CUDA GPU found (torch.cuda.is_available() is False); run this on a "
                "GPU machine, or pass --smoke to check the benchmark's plumbing on the CPU",
                file=sys.stderr,
            )
            return 2
        device = gpu[0]
        cluster = opts.cluster or cluster_for(*gpu)
        if cluster is None:
            print(
                f"error: no cluster entry for the GPU {device!r}; pass --cluster NAME "
                "(e.g. h100-80gb, h200; see conf/cluster/)",
                file=sys.stderr,
            )
            return 2
    if opts.fp8:
        precisions = ["fp8"]
    elif opts.bf16 or (opts.smoke and not opts.fp8):
        precisions = ["bf16"]
    else:
        precisions = ["bf16", "fp8"]
    header = {
        "device": device,
        "cluster": cluster,
        "warmup_steps": opts.warmup,
        "steps": opts.steps,
        "smoke": opts.smoke,
    }
    print(f"device {device}, cluster={cluster}, {opts.steps} steps, first {opts.warmup} skipped")
    if opts.matrix:
        table_ = SMOKE_MATRIX if opts.smoke else MATRIX
        names = opts.only or list(table_)
        unknown = sorted(set(names) - set(table_))
        if unknown:
            print(f"error: --only {unknown}: not in the matrix {sorted(table_)}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
            workdir = opts.workdir or Path(tmp)
            results: list[Outcome] = []
            for name in names:
                base = matrix_base(cluster, opts.steps, opts.smoke)
                results += run_matrix_one(name, [*base, *table_[name]], workdir, opts, opts.smoke)
            code = report(results, {**header, "matrix": names}, opts.json)
            medians(results)
            return code
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        workdir = opts.workdir or Path(tmp)
        outcomes = []
        for precision in precisions:
            if opts.smoke:
                overrides = smoke_overrides(precision, opts.steps)
            else:
                overrides = gpu_overrides(
                    cluster, precision, opts.steps, opts.micro_batch, opts.seq
                )
            outcomes.append(run_one(precision, overrides, workdir, opts, opts.smoke))
        return report(outcomes, header, opts.json)


if __name__ == "__main__":
    sys.exit(main())
