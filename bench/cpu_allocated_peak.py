"""Plan vs measured peak of allocated tensor bytes of one training step on the CPU.

    python bench/cpu_allocated_peak.py [--limit 0.10] [--case NAME ...] [--summed]

Each case builds llmtrain's engine (``trainer.build_engine``, backend=torch, one rank, zero.stage
0, no recompute, full-logits loss) for a small Llama-block model, runs one step (Adam's states
come to exist), then profiles a second step with ``torch.profiler`` (profile_memory=True): every
allocation and free of the CPU allocator is an event of +bytes / -bytes, so their running sum is
the bytes allocated beyond those live when the step began, as torch.cuda.max_memory_allocated
counts them on a GPU (allocations, not the resident set). The bytes live when the step began are
the storages of every tensor the garbage collector can reach (parameters, buffers, optimizer
states), each storage once. The measured peak is that plus the running sum's maximum up to the
optimizer's step: the plan prices the step as it runs on CUDA, with the fused Adam kernel
(train/optim.py fused_on), which allocates nothing; on the CPU the engine steps the foreach
implementation, whose sqrt(v) temporaries (4 bytes per parameter of a group) are reported
apart ("opt step") and not compared.

Cases: `acts` (long sequence, narrow model: activations dominate, the peak is at the start of the
backward), `grads` (short sequence, wide model: gradients dominate, the peak is at its end), each
in fp32 and bf16 autocast, full training and LoRA (rank 16 on q, k, v, o). `--summed` compares
the buckets' plain sum instead (the model before plan/memory/grad_liveness.py), to see it fail.

Exit status: 1 when |plan - measured| / measured exceeds --limit for any case.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import socket
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MIB = 2**20

COMMON = [
    "recipe=tiny",
    "backend=torch",
    "cluster=cpu",
    "train.micro_batch_size=1",
    "train.global_batch_size=1",
    "train.chunked_loss=false",
    "train.recompute=none",
    "zero.stage=0",
    "model.activation=swiglu",
    "model.norm=rmsnorm",
    "model.position=rope",
    "model.linear_bias=false",
    "model.tie_embeddings=false",
]
SHAPES = {
    # 4 layers of h 128 over 1024 tokens: ~1M parameters, activations ~ 8x the gradients.
    "acts": [
        "model.num_layers=4",
        "model.hidden_size=128",
        "model.ffn_hidden_size=384",
        "model.num_attention_heads=4",
        "model.seq_length=1024",
        "model.vocab_size=2048",
    ],
    # 2 layers of h 128 and a 8192-token vocabulary over 256 tokens: ~2.5M parameters, the loss's
    # logits (12 bytes each at its backward) ~ 2.5x the gradients, the layers' activations small.
    "loss": [
        "model.num_layers=2",
        "model.hidden_size=128",
        "model.ffn_hidden_size=384",
        "model.num_attention_heads=4",
        "model.seq_length=256",
        "model.vocab_size=8192",
    ],
    # 4 layers of h 512 over 32 tokens: ~15M parameters, gradients ~ 20x the activations.
    "grads": [
        "model.num_layers=4",
        "model.hidden_size=512",
        "model.ffn_hidden_size=1536",
        "model.num_attention_heads=8",
        "model.seq_length=32",
        "model.vocab_size=2048",
    ],
}
PRECISIONS = {"fp32": ["precision=fp32"], "bf16": ["precision=bf16"]}
METHODS = {
    "full": [],
    "lora": ["finetune.name=lora", "finetune.rank=16", "finetune.targets=[q,k,v,o]"],
}
CASES = {
    f"{shape}-{prec}-{method}": [*COMMON, *SHAPES[shape], *PRECISIONS[prec], *METHODS[method]]
    for shape in SHAPES
    for prec in PRECISIONS
    for method in METHODS
}


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every tensor the garbage collector reaches."""
    import torch

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.is_meta:
            try:  # a wrapper subclass (torchao's 8/4-bit states) has no storage of its own:
                storage = obj.untyped_storage()  # its inner tensors are counted themselves
                seen[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
    return sum(seen.values())


def measure(overrides: list[str]) -> dict[str, float]:
    """Peak allocated bytes of one steady-state step: up to the optimizer step and during it."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from launcher.config.composition.compose import compose_config
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.trainer import build_engine

    torch.manual_seed(0)
    cfg = compose_config(overrides).config
    init_process_group_from_env()
    engine: Any = build_engine(cfg)
    seq, vocab = cfg.model.seq_length, cfg.model.vocab_size
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, vocab, (1, seq + 1), generator=g) for _ in range(2)]
    engine.step(rows[0], lr=1e-4)
    optimizer = engine.optimizer
    plain_step = optimizer.step

    def marked_step(*args: Any, **kwargs: Any) -> Any:
        with record_function("llmtrain.optimizer_step"):
            return plain_step(*args, **kwargs)

    optimizer.step = marked_step
    gc.collect()
    start = live_tensor_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        engine.step(rows[1], lr=1e-4)
    optimizer.step = plain_step
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    step_at = min(
        (e.start_ns() for e in events if e.name() == "llmtrain.optimizer_step"), default=None
    )
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    running = list(itertools.accumulate(b for _, b in memory))
    before = [
        r for (t, _), r in zip(memory, running, strict=True) if step_at is None or t < step_at
    ]
    during = [r for (t, _), r in zip(memory, running, strict=True) if step_at and t >= step_at]
    offload = getattr(engine, "offload", None)  # train.activation_offload: its last forward's
    engine.close()
    return {
        "start": float(start),
        "peak": float(start + max([0, *before])),
        "opt_step": float(start + max([0, *during])),
        "movable": float(offload.stats.movable_bytes if offload is not None else 0),
    }


def planned(overrides: list[str]) -> tuple[float, float]:
    """(the plan's allocated peak, the buckets' plain sum) of the heaviest rank."""
    from launcher.config.composition.compose import compose_config
    from launcher.plan.planner import make_plan

    h = make_plan(compose_config(overrides).config).memory.heaviest
    return h.allocated, h.allocated + h.not_coexisting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=float, default=0.10)
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    parser.add_argument("--summed", action="store_true", help="compare the buckets' plain sum")
    args = parser.parse_args(argv)
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
    worst = 0.0
    print(
        f"{'case':<18} {'plan MiB':>9} {'sum MiB':>9} {'measured':>9} {'error':>7} {'opt step':>9}"
    )
    for name in args.case or sorted(CASES):
        plan, summed = planned(CASES[name])
        got = measure(CASES[name])
        compared = summed if args.summed else plan
        error = (compared - got["peak"]) / got["peak"]
        worst = max(worst, abs(error))
        print(
            f"{name:<18} {plan / MIB:9.2f} {summed / MIB:9.2f} {got['peak'] / MIB:9.2f} "
            f"{error:+7.1%} {got['opt_step'] / MIB:9.2f}"
        )
    if dist.is_initialized():
        dist.destroy_process_group()
    print(f"worst |error| {worst:.1%} (limit {args.limit:.0%})")
    return 1 if worst > args.limit else 0


if __name__ == "__main__":
    raise SystemExit(main())
