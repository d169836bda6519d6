"""Plan vs measured: the peak memory LoRA saves over full training of the same model.

    python bench/lora_memory.py [--steps 4] [--limit 0.15]          # CPU (fp32, ~30M params)
    python bench/lora_memory.py --gpu [--steps 10] [--limit 0.10]   # one CUDA GPU, llama3-1b bf16

Trains the same model twice, full and finetune=lora (rank 16 on q, k, v, o; base frozen), each
in its own fresh process through llmtrain's engine (``trainer.build_engine``, backend=torch, one
rank, random base weights: the memory does not depend on their values), and reads its peak
memory as the trainer does (``launcher.train.reporting.metrics.peak_memory``): on CUDA
``torch.cuda.max_memory_allocated``; on the CPU the peak resident set minus the resident set
before the model existed (the runtime's own share). `plan` prices both configurations (the
heaviest rank's `allocated`). Prints both, the saving each way and the saving's relative error.

CPU: a Llama-block model of 8 layers, hidden 512 (~27M parameters, 16 bytes each in full fp32
training vs 4 frozen + the adapters' 16), seq 128, micro-batch 1. GPU (--gpu): model=llama3-1b,
bf16, seq 2048, micro-batch 1, cluster=h100-80gb pricing (the memory arithmetic does not depend
on the GPU), no network and nothing downloaded; about a minute on an H100.

Exit status: 1 when |predicted saving - measured saving| / measured saving exceeds --limit.

    python bench/lora_memory.py --savers [--savers-limit 0.10]     # CPU, one process

The memory savers of issue #40 (none, optim.state_dtype=bf16, adamw8bit, adamw4bit,
optim.in_backward, train.activation_offload, precision=bf16-pure), each on the same model
(bench/cpu_allocated_peak.py's `grads` shape, ~15M parameters, bf16, full training), all in
this one process. Convention (bench/cpu_allocated_peak.measure): the CPU allocator's allocated
bytes, not the resident set: the storages live when a steady-state step begins plus the peak of
torch.profiler's +/- allocation events up to the optimizer's step; the step's own peak is printed
apart ("opt step") and not compared, as the plan prices the step CUDA runs (fused Adam, torchao
compiled), which allocates next to nothing, where the CPU engine runs eager code that
materialises temporaries (foreach sqrt(v); torchao's dequantized fp32 copy of each state).
Under the activation-offload row: what its hooks would move on a GPU (saved tensors of 1 KiB
or more that are not weights, counted on the CPU where nothing moves) beside the plan's PCIe
bytes for the same run priced on a GPU; printed, not compared (docs/finetuning.md says why).
"left": the tensor bytes still alive once a saver's engine is dropped (each saver's peak must
not include the previous engine's). Exit status 1 when any |plan - measured| / measured exceeds
--savers-limit, or when an engine leaves more than 1 MiB alive.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
MIB = 2**20

CPU_MODEL = [
    "model.num_layers=8",
    "model.hidden_size=512",
    "model.ffn_hidden_size=1536",
    "model.num_attention_heads=8",
    "model.seq_length=128",
    "model.activation=swiglu",
    "model.norm=rmsnorm",
    "model.position=rope",
    "model.tie_embeddings=false",
    "model.linear_bias=false",
    "precision=fp32",
]
GPU_MODEL = [
    "model=llama3-1b",
    "model.seq_length=2048",
    "precision=bf16",
    "cluster=h100-80gb",
    "cluster.gpus_per_node=1",
]
COMMON = [
    "recipe=tiny",
    "backend=torch",
    "train.micro_batch_size=1",
    "train.global_batch_size=1",
    "train.chunked_loss=false",
    "train.recompute=none",
]
LORA = [
    "finetune=lora",
    "finetune.rank=16",
    "finetune.targets=[q,k,v,o]",
    "zero.stage=0",  # one rank: no FSDP (the finetune group's default layout shards over dp)
]


def overrides(gpu: bool, method: str, steps: int) -> list[str]:
    model = GPU_MODEL if gpu else CPU_MODEL
    tuned = LORA if method == "lora" else ["zero.stage=0"]
    return [*COMMON, *model, f"train.steps={steps}", *tuned]


def child(args: argparse.Namespace) -> None:
    """One training run in this process; prints its peak memory as JSON."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.reporting.metrics import current_rss, memory_bytes, peak_memory
    from launcher.train.trainer import build_engine

    torch.manual_seed(0)
    if not args.gpu:
        torch.set_num_threads(2)
    cfg = compose_config(overrides(args.gpu, args.child, args.steps)).config
    init_process_group_from_env()
    baseline = current_rss()
    engine = build_engine(cfg)
    seq, vocab = cfg.model.seq_length, cfg.model.vocab_size
    g = torch.Generator().manual_seed(1)
    for _ in range(args.steps):
        rows = torch.randint(0, vocab, (1, seq + 1), generator=g)
        engine.step(rows, lr=1e-4)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    peak = peak_memory(baseline)
    measured = memory_bytes(peak) - (0 if "max_allocated" in peak else peak["baseline_rss"])
    extra = engine.extra_state()
    engine.close()
    dist.destroy_process_group()
    print(json.dumps({"measured": measured, "trainable": extra.get("params_trainable")}))


def run_child(args: argparse.Namespace, method: str) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "LLMTRAIN_DEVICE": "cuda" if args.gpu else "cpu",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, __file__, "--child", method, "--steps", str(args.steps)]
    command += ["--gpu"] if args.gpu else []
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"the {method} run failed (exit {done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def predicted(gpu: bool, method: str, steps: int) -> float:
    from launcher.config.composition.compose import compose_config
    from launcher.plan.planner import make_plan

    cfg = compose_config(overrides(gpu, method, steps)).config
    return float(make_plan(cfg).memory.heaviest.allocated)


SAVER_BASE = ["precision=bf16", "optim.grad_clip=0", "optim.name=adamw"]
SAVERS = {
    "none": [],
    "bf16-states": ["optim.state_dtype=bf16"],
    "adamw8bit": ["optim.name=adamw8bit"],
    "adamw4bit": ["optim.name=adamw4bit"],
    "in-backward": ["optim.in_backward=true"],
    "act-offload": ["train.activation_offload=true"],
    "bf16-pure": ["precision=bf16-pure"],
}


def offload_priced(overrides: list[str]) -> float:
    """The plan's activation-offload PCIe bytes a micro-batch, the same run priced on a GPU."""
    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.plan.memory.stage_activations import offloaded_bytes

    gpu = [*overrides, "cluster=h100-80gb", "cluster.gpus_per_node=1"]
    cfg = compose_config(gpu).config
    return offloaded_bytes(cfg, derive_layout(cfg), 0)


def savers(limit: float) -> int:
    """Each saver's allocated peak, plan vs measured (the --savers convention above)."""
    import cpu_allocated_peak as peak  # bench/, beside this file
    import torch
    import torch.distributed as dist

    torch.set_num_threads(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    base = [*peak.COMMON, *peak.SHAPES["grads"], *SAVER_BASE]
    print(f"{'saver':<12} {'plan MiB':>9} {'measured':>9} {'error':>7} {'opt step':>9} {'left':>6}")
    worst, leaked = 0.0, 0.0
    before = peak.live_tensor_bytes()
    for name, extra in SAVERS.items():
        overrides = [*base, *extra]
        plan, _ = peak.planned(overrides)
        got = peak.measure(overrides)
        error = (plan - got["peak"]) / got["peak"]
        worst = max(worst, abs(error))
        # What the dropped engine left alive: it would count in the next saver's peak (one
        # process). optim.in_backward's hooks once kept their engine's weights and states.
        gc.collect()
        left = peak.live_tensor_bytes() - before
        leaked = max(leaked, left)
        print(
            f"{name:<12} {plan / MIB:9.2f} {got['peak'] / MIB:9.2f} {error:+7.1%} "
            f"{got['opt_step'] / MIB:9.2f} {left / MIB:6.1f}"
        )
        if got["movable"]:
            moved = offload_priced([*base, *extra])
            print(
                f"{'':<12} on a GPU the hooks would move {got['movable'] / MIB:.2f} MiB a "
                f"micro-batch each way; the plan's PCIe bytes {moved / MIB:.2f} (not compared)"
            )
    if dist.is_initialized():
        dist.destroy_process_group()
    print(
        "measured: CPU allocator bytes up to the optimizer step (torch.profiler events); "
        "'opt step': the eager CPU step's own peak, not compared (the plan prices CUDA's)"
    )
    print(f"worst |error| {worst:.1%} (limit {limit:.0%}); left alive {leaked / MIB:.1f} MiB")
    return 1 if worst > limit or leaked > MIB else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", action="store_true", help="one CUDA GPU, llama3-1b in bf16")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (4 CPU, 10 GPU)")
    parser.add_argument("--limit", type=float, default=None, help="0.15 CPU, 0.10 GPU")
    parser.add_argument("--savers", action="store_true", help="each memory saver, CPU")
    parser.add_argument("--savers-limit", type=float, default=0.10)
    parser.add_argument("--child", choices=("full", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.savers:
        return savers(args.savers_limit)
    args.steps = args.steps or (10 if args.gpu else 4)
    if args.child:
        child(args)
        return 0
    limit = args.limit if args.limit is not None else (0.10 if args.gpu else 0.15)
    rows = {}
    for method in ("full", "lora"):
        run = run_child(args, method)
        rows[method] = (predicted(args.gpu, method, args.steps), float(run["measured"]))
        plan_b, meas_b = rows[method]
        print(
            f"{method:5s} plan {plan_b / MIB:9.1f} MiB  measured {meas_b / MIB:9.1f} MiB  "
            f"trainable {run['trainable']:,}"
        )
    plan_saving = rows["full"][0] - rows["lora"][0]
    measured_saving = rows["full"][1] - rows["lora"][1]
    error = abs(plan_saving - measured_saving) / measured_saving
    where = "cuda max_memory_allocated" if args.gpu else "cpu peak RSS over the runtime's"
    print(
        f"saving: plan {plan_saving / MIB:.1f} MiB, measured {measured_saving / MIB:.1f} MiB "
        f"({where}); error {error:.1%} (limit {limit:.0%})"
    )
    return 1 if error > limit else 0


if __name__ == "__main__":
    raise SystemExit(main())
