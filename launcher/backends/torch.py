"""``backend=torch``: what llmtrain's PyTorch-native engine (launcher/train/engines/torch_engine.py)
runs: DDP (zero.stage=0), FSDP2 ``fully_shard`` (2: reshard_after_forward=False, 3: full shard, with
CPUOffloadPolicy for parameter offload), DTensor tensor and sequence parallel, and
``torch.distributed.pipelining`` (GPipe, 1F1B, interleaved 1F1B) on one DeviceMesh. Every accepted
combination is exercised on CPU with gloo by tests/integration/test_torch_engine.py."""

from __future__ import annotations

from launcher.backends.common import Backend, Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig


def _optimizer_offload_alone(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    z = cfg.zero
    if z.offload_optimizer == "cpu" and z.offload_params != "cpu" and z.stage == 3:
        return Refusal(
            ("zero.offload_optimizer", "zero.offload_params"),
            "zero.offload_optimizer=cpu alone is not available with FSDP2 (its CPUOffloadPolicy "
            "offloads parameters, gradients and optimizer states together); set "
            "zero.offload_params=cpu as well",
        )
    return None


def _interleaved_rounds(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    p = cfg.parallel
    if p.pp <= 1 or p.pp_schedule != "interleaved":
        return None
    # ScheduleInterleaved1F1B runs the micro-batches in rounds of grad_accum // pp.
    rounds = max(1, layout.grad_accum // p.pp)
    if layout.grad_accum % rounds == 0:
        return None
    return Refusal(
        ("train.grad_accum", "parallel.pp"),
        f"parallel.pp_schedule=interleaved runs grad_accum={layout.grad_accum} micro-batches in "
        f"{rounds} rounds, which must divide it; use a multiple of pp={p.pp} (or fewer than "
        f"{2 * p.pp})",
    )


BACKEND = Backend(
    name="torch",
    summary="PyTorch-native: DDP, FSDP2, DTensor TP/SP, torch.distributed.pipelining",
    launchable=True,
    not_launchable="",
    needs="",
    devices=("cpu", "cuda"),
    degrees=frozenset({"tp", "pp"}),
    degree_notes={
        "cp": "context parallelism is not implemented by the torch backend (fold the ranks into dp "
        "or tp)",
        "ep": "expert parallelism is not implemented by the torch backend (experts are sharded by "
        "FSDP or replicated by DDP over dp)",
    },
    zero_stages=(0, 2, 3),
    zero_notes={
        0: "DDP",
        1: "sharded optimizer states alone have no PyTorch-native equivalent here",
        2: "FSDP2, parameters kept after forward",
        3: "FSDP2 full shard",
    },
    precisions=("bf16", "fp32"),
    optimizers=("adamw", "adam"),
    offload_optimizer_stages=(3,),
    offload_params_stages=(3,),
    schedules=("1f1b", "gpipe", "interleaved"),
    features=frozenset({"moe", "mla", "kv-replication", "sequence-parallel"}),
    combos=(_optimizer_offload_alone, _interleaved_rounds),
)
