"""Megatron-LM measured against `llmtrain plan` on one GPU: peak allocated memory and step time.

    python bench/gpu_megatron_memory.py [--cases none,selective] [--steps 10] [--warmup 3]
        [--root-dir DIR] [--megatron DIR] [--cluster NAME] [--limit 0.10] [--json FILE]
    python bench/gpu_megatron_memory.py --dry-run [--check-args]   # CPU: compose, plan, render

Each case trains a Llama-like model (Llama 3.2 1B's layer shape: hidden 2048, 32 heads, 8 kv heads,
ffn 8192; 8 layers, vocabulary 32000, sequence 4096, micro-batch 1, 2 micro-batches a step, bf16,
tp = pp = 1) with backend=megatron through the real CLI, `llmtrain run --fresh`, exactly as a user
would: llmtrain renders the arguments (launcher/render/megatron_args.py) and starts the Megatron-LM
checkout's pretrain_gpt.py (backend.megatron_path, default .mcore/src: Megatron-LM core_v0.16.1's
pretrain_gpt.py, gpt_builders.py, model_provider.py and megatron/{training,legacy,rl,post_training}
beside the megatron-core 0.16.1 wheel; both third-party, kept out of git) under torchrun, on
Megatron's mock data. The cases differ in train.recompute (none, selective).

Without Transformer Engine or Apex (the GPU image has neither) backend.megatron_extra_args adds what
Megatron-LM needs to run on plain PyTorch (megatron/training/arguments.py, core_v0.16.1):
--transformer-impl local; --no-gradient-accumulation-fusion (the fused weight-gradient GEMM is
Apex's / TE's); --no-persist-layer-norm (the local spec's torch norm asserts it off);
--no-masked-softmax-fusion and --no-rope-fusion (Apex / TE kernels); and --spec
bench.mcore_without_te layer_spec, which stands in for Transformer Engine where it matters for
memory (bench/mcore_without_te.py says why): Megatron-Core's own local layer spec with PyTorch's
fused attention in place of its unfused DotProductAttention (which would keep the s x s scores
that no production run keeps), and torch.optim.AdamW, Megatron-Core's fallback optimizer, made
fused (in place, as Transformer Engine's FusedAdam; the multi-tensor default would add
temporaries the size of the fp32 parameters). The plan is asked with
backend.attention_kernel=sdpa accordingly. The bias-SwiGLU fusion stays on (Megatron-Core's own
torch.compile'd function, what plan prices). For the measurement: --log-interval 1 and
--log-memory-interval 1 (Megatron-LM prints "memory (MB) | allocated: ... | max allocated: ..."
after every iteration: training.py training_log, utils.py report_memory);
--no-create-attention-mask-in-dataloader (the causal mask is implied); --ckpt-format torch,
--no-save-optim and --no-save-rng (Megatron-LM always writes a final checkpoint with the --save
llmtrain renders: weights only keeps that to seconds).

Measured: the largest "max allocated" Megatron-LM printed (torch.cuda.max_memory_allocated, MiB;
the peak of the whole run) and the median "elapsed time per iteration (ms)" after --warmup
iterations, both from the run's logs/torchrun.log. Predicted: `launcher.plan.planner.make_plan`
on the same overrides, in this process (the heaviest GPU's allocated bytes, the step time).
Error = predicted / measured - 1. The exit status gates on memory only: 1 when a case's
|error| exceeds --limit (default 0.10: the planner's tensor-by-tensor Megatron-Core model,
launcher/plan/memory/mcore_activations.py, is expected within 10% on its first check; step time is
reported, not gated, as the plan's time model is calibrated for Transformer Engine's kernels),
or a run failed or printed no figures; 2 for bad arguments or no CUDA GPU (without --dry-run).
Results go to stdout as a table and, one JSON object per case, to --json or $OUT/
gpu_megatron_memory.jsonl when $OUT is set (with each run's torchrun.log as
$OUT/torchrun-CASE.log). The checkpoint of each run is deleted once its figures are read.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_plan_vs_measured import cluster_for, detect_gpu  # noqa: E402

from launcher.config.composition.compose import compose_config  # noqa: E402
from launcher.config.run_config import override_value  # noqa: E402
from launcher.plan.planner import make_plan  # noqa: E402
from launcher.render.megatron_launch import ENTRY, megatron_run_args  # noqa: E402
from launcher.rundir import RunDir  # noqa: E402

MIB = 2**20
LIMIT = 0.10
WARMUP = 3
STEPS = 10
RUN_TIMEOUT_S = 165  # per case; two fit the 6-minute device slot with the install
CASES = {"none": "train.recompute=none", "selective": "train.recompute=selective"}
# What Megatron-LM needs on plain PyTorch, and what it prints for the measurement (docstring).
EXTRA_ARGS = [
    "--transformer-impl", "local",
    "--spec", "bench.mcore_without_te", "layer_spec",
    "--no-gradient-accumulation-fusion",
    "--no-persist-layer-norm",
    "--no-masked-softmax-fusion",
    "--no-rope-fusion",
    "--no-create-attention-mask-in-dataloader",
    "--ckpt-format", "torch",
    "--no-save-optim",
    "--no-save-rng",
    "--log-interval", "1",
    "--log-memory-interval", "1",
]  # fmt: skip

# training_log's reports only ("(after N iterations)"): the ones around save_checkpoint would add
# what saving allocates to the training peak.
MEMORY_LINE = re.compile(
    r"\(after \d+ iterations\) memory \(MB\) \| allocated: ([\d.]+) \| max allocated: ([\d.]+)"
)
# Megatron-LM's own estimate (training/theoretical_memory_usage.py, printed with the first memory
# report; MB there is 2**20 bytes): shown beside the plan's, not gated.
THEORETICAL_LINE = re.compile(
    r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB, activation=([\d.]+) MB, "
    r"total=([\d.]+) MB"
)
ITERATION_LINE = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)"
)


def overrides(case: str, cluster: str, megatron: Path, root_dir: Path, steps: int) -> list[str]:
    return [
        "backend=megatron",
        "model=llama3-1b",
        "model.num_layers=8",
        "model.vocab_size=32000",
        "model.seq_length=4096",
        f"cluster={cluster}",
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=1",
        "precision=bf16",
        "train.micro_batch_size=1",
        "train.global_batch_size=2",
        f"train.steps={steps}",
        "optim.warmup_steps=1",
        CASES[case],
        "backend.attention_kernel=sdpa",
        f"backend.megatron_path={megatron}",
        f"backend.megatron_extra_args={override_value(EXTRA_ARGS)}",
        f"run.root_dir={root_dir}",
        f"run.name=megatron-{case}",
    ]


def parse_log(text: str, warmup: int) -> dict[str, Any]:
    """Megatron-LM's figures in a torchrun.log: peak allocated bytes (the largest "max
    allocated"), the median iteration time after `warmup` iterations, and how many it had."""
    peaks = [float(m.group(2)) for m in MEMORY_LINE.finditer(text)]
    times = {int(m.group(1)): float(m.group(2)) for m in ITERATION_LINE.finditer(text)}
    steady = [ms for it, ms in sorted(times.items()) if it > warmup]
    theory = THEORETICAL_LINE.search(text)
    return {
        "peak_allocated_bytes": max(peaks) * MIB if peaks else None,
        "megatron_theoretical_bytes": float(theory.group(3)) * MIB if theory else None,
        "step_s": statistics.median(steady) / 1000.0 if steady else None,
        "iterations_logged": len(times),
        "iterations_timed": len(steady),
    }


def predicted(args: list[str]) -> dict[str, Any]:
    cfg = compose_config(args).config
    plan = make_plan(cfg)
    return {
        "peak_allocated_bytes": plan.memory.heaviest.allocated,
        "step_s": plan.time.step_s,
        "memory_band": plan.memory_band.typical if plan.memory_band else None,
    }


def error(pred: float | None, meas: float | None) -> float | None:
    return pred / meas - 1.0 if pred is not None and meas else None


def launch(args: list[str], workdir: Path) -> tuple[Path | None, str]:
    """`llmtrain run --fresh ARGS` (what the `llmtrain` script runs); (run directory, problem)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    root = Path(next(a for a in args if a.startswith("run.root_dir=")).split("=", 1)[1])
    before = set(root.iterdir()) if root.is_dir() else set()
    command = [sys.executable, "-m", "launcher", "run", "--fresh", *args]
    print("$ llmtrain run --fresh " + " ".join(args), flush=True)
    try:
        done = subprocess.run(
            command, cwd=workdir, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S
        )
        problem = (
            ""
            if done.returncode == 0
            else f"`llmtrain run` exited {done.returncode}:\n"
            + (done.stderr.strip() or done.stdout.strip())[-3000:]
        )
    except subprocess.TimeoutExpired:
        problem = f"`llmtrain run` did not finish within {RUN_TIMEOUT_S} s"
    new = (
        sorted(set(root.iterdir()) - before, key=lambda p: p.stat().st_mtime)
        if root.is_dir()
        else []
    )
    return (new[-1] if new else None), problem


def run_case(case: str, opts: argparse.Namespace, cluster: str) -> dict[str, Any]:
    args = overrides(case, cluster, opts.megatron, opts.root_dir, opts.steps)
    pred = predicted(args)
    row: dict[str, Any] = {"case": case, "cluster": cluster, "overrides": args, "predicted": pred}
    started = time.monotonic()
    run_dir, problem = launch(args, opts.root_dir.parent)
    row["wall_s"] = round(time.monotonic() - started, 1)
    row["run_dir"] = str(run_dir) if run_dir else None
    log = RunDir(run_dir).torchrun_log if run_dir else None
    text = log.read_text(errors="replace") if log and log.is_file() else ""
    meas = parse_log(text, opts.warmup)
    row["measured"] = meas
    if run_dir is not None:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    if text and os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / f"torchrun-{case}.log").write_text(text)
    if meas["peak_allocated_bytes"] is None and not problem:
        problem = "the run printed no Megatron-LM memory report"
    if problem:
        tail = "\n".join(text.splitlines()[-60:])
        row["problem"] = problem + (
            f"\n--- torchrun.log (last 60 lines) ---\n{tail}" if tail else ""
        )
    row["memory_error"] = error(pred["peak_allocated_bytes"], meas["peak_allocated_bytes"])
    row["step_error"] = error(pred["step_s"], meas["step_s"])
    mem = row["memory_error"]
    row["ok"] = not problem and mem is not None and abs(mem) <= opts.limit
    return row


def show_row(row: dict[str, Any]) -> str:
    p, m = row["predicted"], row["measured"]

    def gib(v: float | None) -> str:
        return f"{v / 2**30:8.2f} GiB" if v else "       -    "

    def sec(v: float | None) -> str:
        return f"{v * 1000:8.1f} ms" if v else "       -   "

    def pct(v: float | None) -> str:
        return f"{v:+7.1%}" if v is not None else "     -"

    return (
        f"{row['case']:<10} peak allocated plan {gib(p['peak_allocated_bytes'])} measured "
        f"{gib(m['peak_allocated_bytes'])} error {pct(row['memory_error'])} | step plan "
        f"{sec(p['step_s'])} measured {sec(m['step_s'])} error {pct(row['step_error'])} | "
        f"Megatron's own estimate {gib(m.get('megatron_theoretical_bytes'))} | "
        + ("ok" if row["ok"] else "MISS" if row["memory_error"] is not None else "FAILED")
    )


class _Absent(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


def check_args(args: list[str], megatron: Path) -> None:
    """Megatron-LM's own parser and checks (megatron/training/arguments.py parse_args,
    validate_args) on the arguments llmtrain renders for `args`, as rank 0 of 1 would see them."""
    cfg = compose_config(args).config
    argv = megatron_run_args(cfg, "/tmp/llmtrain-bench-run")
    sys.path[:0] = [str(megatron)]
    if importlib.util.find_spec("triton") is None:
        # A CPU torch has no triton; megatron.training imports Megatron-Core's batch-invariant
        # Triton kernels at start (initialize.py). Stood in for this parse only.
        sys.modules["megatron.core.transformer.custom_layers.batch_invariant_kernels"] = _Absent(
            "batch_invariant_kernels"
        )
    saved = sys.argv
    sys.argv = [str(megatron / ENTRY), *argv]
    try:
        from megatron.training.arguments import (
            core_transformer_config_from_args,
            parse_args,
            validate_args,
        )

        parsed = parse_args()
    finally:
        sys.argv = saved
    parsed.rank, parsed.world_size = 0, 1
    validate_args(parsed)
    # The TransformerConfig pretrain_gpt.py builds from them (its __post_init__ checks).
    config = core_transformer_config_from_args(parsed)
    wanted = {
        "transformer_impl": "local",
        "spec": ["bench.mcore_without_te", "layer_spec"],
        "gradient_accumulation_fusion": False,
        "no_persist_layer_norm": True,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "bias_swiglu_fusion": True,
        "log_interval": 1,
        "log_memory_interval": 1,
        "mock_data": True,
        "no_save_optim": True,
        "num_query_groups": 8,
        "seq_length": 4096,
    }
    wrong = {
        k: getattr(parsed, k, None) for k, v in wanted.items() if getattr(parsed, k, None) != v
    }
    wrong.update(
        {
            f"config.{k}": getattr(config, k)
            for k, v in {"transformer_impl": "local", "bias_activation_fusion": True}.items()
            if getattr(config, k, None) != v
        }
    )
    if wrong:
        raise SystemExit(f"Megatron-LM parsed {wrong}, expected {wanted}")
    print(f"Megatron-LM's parser took the {len(argv)} rendered arguments: {' '.join(argv)}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="none,selective", help="comma-separated: none,selective")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--root-dir", type=Path, default=Path("/dev/shm/llmtrain-bench-megatron/runs"))
    ap.add_argument(
        "--megatron", type=Path, default=None, help="default: $MEGATRON_LM_PATH, else .mcore/src"
    )
    ap.add_argument("--cluster", default=None, help="conf/cluster entry (default: from the GPU)")
    ap.add_argument("--limit", type=float, default=LIMIT, help="allowed |memory error|")
    ap.add_argument("--json", default=None, help="JSON lines file (default $OUT/...jsonl)")
    ap.add_argument("--dry-run", action="store_true", help="compose, plan, render; no run")
    ap.add_argument("--check-args", action="store_true", help="with --dry-run: Megatron's parser")
    opts = ap.parse_args(argv)
    opts.case_list = [c for c in opts.cases.split(",") if c]
    bad = [c for c in opts.case_list if c not in CASES]
    if bad or not opts.case_list:
        ap.error(f"--cases: unknown {bad}; choose from {','.join(CASES)}")
    if opts.steps <= opts.warmup:
        ap.error(f"--steps {opts.steps} must exceed --warmup {opts.warmup}")
    default = os.environ.get("MEGATRON_LM_PATH") or str(REPO / ".mcore" / "src")
    opts.megatron = (opts.megatron or Path(default)).resolve()
    opts.root_dir = opts.root_dir.resolve()
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if opts.dry_run:
        cluster = opts.cluster or "h100-80gb"
        for case in opts.case_list:
            args = overrides(case, cluster, opts.megatron, opts.root_dir, opts.steps)
            pred = predicted(args)
            print(
                f"{case}: plan peak allocated {pred['peak_allocated_bytes'] / 2**30:.2f} GiB, "
                f"step {pred['step_s'] * 1000:.1f} ms on {cluster}"
            )
            if opts.check_args:
                check_args(args, opts.megatron)
        return 0
    gpu = detect_gpu()
    if gpu is None:
        print("no CUDA GPU (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    cluster = opts.cluster or cluster_for(*gpu)
    if cluster is None:
        print(f"no conf/cluster entry for {gpu[0]}: pass --cluster", file=sys.stderr)
        return 2
    if not (opts.megatron / ENTRY).is_file():
        print(f"--megatron {opts.megatron}: no {ENTRY} there", file=sys.stderr)
        return 2
    opts.root_dir.mkdir(parents=True, exist_ok=True)
    print(f"GPU: {gpu[0]} ({gpu[1] / 2**30:.1f} GiB) as cluster={cluster}", flush=True)
    out = opts.json or (
        str(Path(os.environ["OUT"]) / "gpu_megatron_memory.jsonl")
        if os.environ.get("OUT")
        else None
    )
    if out:
        Path(out).write_text("")
    rows = []
    for case in opts.case_list:
        row = run_case(case, opts, cluster)
        rows.append(row)
        # Each case as it ends: an outer timeout still leaves the finished ones.
        print(show_row(row), flush=True)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps({"gpu": gpu[0], **row}) + "\n")
    print(
        f"\nMegatron-LM core_v0.16.1 on {gpu[0]} vs `llmtrain plan` "
        f"(limit |memory error| {opts.limit:.0%}):"
    )
    for row in rows:
        print(show_row(row))
        if row.get("problem"):
            print(f"  {row['case']}: {row['problem']}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
