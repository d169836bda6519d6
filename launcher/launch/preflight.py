"""Everything checked before a run starts a process: no half-made run directory on bad input.

``preflight(cfg)`` returns the plan and raises ``UserError`` (exit 2) listing every problem: the
validation rules' errors, what the chosen backend cannot run (with what would), a predicted memory
overflow (with the planner's smallest fixes; ``force`` skips only this one), missing data, and
hardware this machine does not have.
"""

from __future__ import annotations

import os
from pathlib import Path

from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan.planner import Plan, make_plan
from launcher.validate.rules import check


def deepspeed_capabilities(cfg: LLMTrainConfig) -> list[str]:
    """Why llmtrain's DeepSpeed engine cannot run `cfg`, each with what would; [] if it can."""
    p, out = cfg.parallel, []
    for key, value in (("tp", p.tp), ("cp", p.cp), ("ep", p.ep)):
        if value > 1:
            out.append(
                f"parallel.{key}={value}: llmtrain's DeepSpeed engine runs data parallel (ZeRO) "
                f"and pipeline parallel only; use backend=torch, or parallel.{key}=1"
            )
    if p.pp > 1:
        # DeepSpeed's PipelineModule: one chunk per stage, its own 1F1B schedule
        # (deepspeed.ai/tutorials/pipeline); the embedding and head are separate layers.
        if p.vpp > 1 or p.pp_schedule != "1f1b":
            out.append(
                f"parallel.pp_schedule={p.pp_schedule}, parallel.vpp={p.vpp}: DeepSpeed's "
                "pipeline engine runs its own 1F1B schedule without virtual stages; use "
                "parallel.pp_schedule=1f1b and parallel.vpp=1, or backend=torch"
            )
        if cfg.model.tie_embeddings:
            out.append(
                "model.tie_embeddings=true with parallel.pp>1: llmtrain's DeepSpeed pipeline "
                "keeps the embedding and the head on different stages, unshared; set "
                "model.tie_embeddings=false, or parallel.pp=1"
            )
    if cfg.cluster.gpu == "cpu" and cfg.precision.compute_dtype == "fp16":
        out.append("DeepSpeed has no fp16 on CPU; use precision=fp32 or precision=bf16")
    if cfg.optim.name not in ("adamw", "adam"):
        out.append(
            f"optim.name={cfg.optim.name}: the training runtime has adamw and adam; "
            "use optim.name=adamw"
        )
    return out


def backend_problems(cfg: LLMTrainConfig) -> list[str]:
    name = cfg.backend.name
    if name == "deepspeed":
        return deepspeed_capabilities(cfg)
    if name == "torch":
        from launcher.train.engines.capabilities import torch_capabilities

        return torch_capabilities(cfg)
    return [
        "backend=megatron: llmtrain writes Megatron-LM's arguments (for your own Megatron-LM "
        "checkout) but trains with its own engines; use backend=torch or backend=deepspeed"
    ]


def hardware_problems(cfg: LLMTrainConfig) -> list[str]:
    """A local run needs the devices it names on this machine."""
    c = cfg.cluster
    if c.num_nodes > 1:
        return [
            f"cluster.num_nodes={c.num_nodes}: a local run uses this machine only; use "
            "cluster.num_nodes=1, or `llmtrain submit` to run on a SLURM cluster"
        ]
    if c.gpu == "cpu":
        cores = os.cpu_count() or 1
        if c.gpus_per_node > 4 * cores:
            return [
                f"cluster.gpus_per_node={c.gpus_per_node} CPU processes on {cores} cores would "
                f"crawl; use at most {4 * cores}"
            ]
        return []
    visible = _cuda_device_count()
    if visible < c.gpus_per_node:
        return [
            f"cluster={c.name} needs {c.gpus_per_node} CUDA GPUs on this machine, found "
            f"{visible}; use cluster=cpu (CPU processes, e.g. cluster.gpus_per_node=2), "
            "cluster.gpus_per_node={visible} if that many are free, or `llmtrain submit`"
        ]
    return []


def _cuda_device_count() -> int:
    """CUDA devices without importing torch (nvidia-smi's device files)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def data_problems(cfg: LLMTrainConfig) -> list[str]:
    if cfg.data.path is None:
        if cfg.data.tokenizer != "byte":
            return [
                "data.tokenizer=bpe needs prepared data: run `llmtrain data prepare --input TEXT "
                "--output DIR --tokenizer bpe` and set data.path=DIR"
            ]
        if cfg.model.vocab_size < 256:
            return [
                f"model.vocab_size={cfg.model.vocab_size}: the built-in corpus is byte-level "
                "(256 symbols); use model.vocab_size=256 or more"
            ]
        return []
    index = Path(cfg.data.path).expanduser() / "index.json"
    if not index.is_file():
        return [
            f"data.path={cfg.data.path}: no prepared data there ({index} is missing); run "
            f"`llmtrain data prepare --input TEXT... --output {cfg.data.path}`"
        ]
    return []


def preflight(cfg: LLMTrainConfig, force: bool = False, local: bool = True) -> Plan:
    """`local=False` (a SLURM submission) skips the checks of this machine's own hardware."""
    problems = [v.message for v in check(cfg) if v.is_error]
    if problems:
        raise UserError("the configuration is invalid:\n- " + "\n- ".join(problems))
    problems = (
        backend_problems(cfg) + (hardware_problems(cfg) if local else []) + data_problems(cfg)
    )
    if problems:
        raise UserError("cannot run this configuration:\n- " + "\n- ".join(problems))
    plan = make_plan(cfg)
    if not plan.memory.fits and not force:
        fixes = [f"{fix.line} -> {fix.device_bytes / 2**30:.1f} GiB" for fix in plan.fixes]
        need = plan.memory.heaviest.device_total / 2**30
        have = plan.memory.usable / 2**30
        raise UserError(
            f"predicted memory per device {need:.1f} GiB does not fit {have:.1f} GiB "
            f"({cfg.cluster.gpu}, with headroom); "
            + ("smallest changes that fit: " + "; ".join(fixes) if fixes else "no change found")
            + ". Pass --force to launch anyway."
        )
    if derive_layout(cfg).steps < 1:
        raise UserError("train.steps (or train.tokens) gives no optimizer step; set train.steps")
    return plan
