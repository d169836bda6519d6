"""The DeepSpeed engine: ZeRO 0-3 and CPU offload from the generated ds_config.

The ds_config comes from ``launcher.render.ds_config`` (the same file `llmtrain run` writes into
the run directory). DeepSpeed gets a torch AdamW rather than an optimizer named in the config, so
nothing JIT-builds a fused optimizer on CPU; llmtrain's own schedule sets the learning rate on
every step. Checkpoints are DeepSpeed's own (``save_checkpoint``/``load_checkpoint``).

DeepSpeed 0.19 reads its checkpoint files with ``torch.load(weights_only=False)``, which runs any
code pickled into them. Before handing a checkpoint to DeepSpeed, every ``*.pt`` file is first read
with ``weights_only=True`` and an allow-list of the few DeepSpeed classes its checkpoints hold; a
file that needs anything else is refused and DeepSpeed never opens it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.render.ds_config import runtime_ds_config
from launcher.train.engines.base import Engine, RankInfo, StepResult
from launcher.train.engines.dist import engine_device
from launcher.train.model import apply_recompute, build_model, loss_fn
from launcher.train.optim import build_optimizer

TAG = "engine"


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds pickled objects outside the weights-only allow-list."""


def safe_globals() -> list[Any]:
    """Classes DeepSpeed pickles into its checkpoints besides tensors and builtins (found by
    loading real ZeRO 0-3 checkpoints of this version with weights_only=True)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def verify_weights_only(directory: Path) -> None:
    """Refuse a checkpoint any of whose files cannot be read without executing pickled code."""
    allowed = safe_globals()
    for path in sorted(directory.rglob("*.pt")):
        try:
            with torch.serialization.safe_globals(allowed):
                torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            reason = str(exc).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
            raise UnsafeCheckpointError(
                f"{path}: refused to load: it holds pickled objects that a weights-only load "
                f"does not allow ({reason}); llmtrain never executes code from checkpoint files"
            ) from None


class DeepSpeedEngine(Engine):
    def __init__(self, cfg: LLMTrainConfig, seed: int):
        import deepspeed

        layout = derive_layout(cfg)
        self.micro_batch_size = layout.micro_batch_size
        self.grad_accum = layout.grad_accum
        rank, world = dist.get_rank(), dist.get_world_size()
        self.info = RankInfo(
            rank=rank,
            world_size=world,
            local_rank=int(rank % max(1, cfg.cluster.gpus_per_node)),
            dp_rank=rank,
            dp_size=world,
        )
        model = build_model(cfg.model, device=engine_device(), seed=seed)
        apply_recompute(model, cfg.train.recompute)
        optimizer = build_optimizer(model.parameters(), cfg.optim)
        config: dict[str, Any] = runtime_ds_config(cfg)
        if cfg.zero.offload_optimizer != "none":
            # Keep the torch AdamW: DeepSpeedCPUAdam would JIT-compile (~1 min) on first use.
            config["zero_force_ds_cpu_optimizer"] = False
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )

    def step(self, rows: torch.Tensor, lr: float) -> StepResult:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        device = self.engine.device
        losses = []
        for micro in torch.split(rows, self.micro_batch_size):
            micro = micro.to(device)
            loss = loss_fn(self.engine(micro[:, :-1]), micro[:, 1:])
            self.engine.backward(loss)
            self.engine.step()
            losses.append(loss.detach().float())
        mean = torch.stack(losses).mean().to(device)
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        norm = self.engine.get_global_grad_norm()
        return StepResult(
            loss=float(mean) / self.info.dp_size,
            grad_norm=float(norm) if norm is not None else float("nan"),
        )

    def save(self, directory: Path) -> list[Path]:
        before = set(directory.rglob("*")) if directory.exists() else set()
        self.engine.save_checkpoint(str(directory), tag=TAG)
        return sorted(p for p in set(directory.rglob("*")) - before if p.is_file())

    def load(self, directory: Path) -> None:
        verify_weights_only(directory)
        path, _ = self.engine.load_checkpoint(
            str(directory), tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if path is None:
            raise RuntimeError(f"{directory}: DeepSpeed found no checkpoint tagged {TAG!r}")

    def local_tensors(self) -> Iterator[torch.Tensor]:
        for param in self.engine.module.parameters():
            # ZeRO-3 keeps this rank's partition in ds_tensor (param.data is empty).
            yield getattr(param, "ds_tensor", param)

    def extra_state(self) -> dict[str, Any]:
        return {"zero_stage": self.engine.zero_optimization_stage()}
