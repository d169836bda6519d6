"""The DeepSpeed engine: ZeRO 0-3 and CPU offload from the generated ds_config, pipeline
parallel (parallel.pp > 1) with DeepSpeed's PipelineModule and its 1F1B schedule (``train_batch``),
and tensor parallel (parallel.tp > 1) with DeepSpeed's training-time AutoTP.

Tensor parallel: the ds_config's "tensor_parallel" block (autotp_size, and a partition_config whose
patterns name the model's wq/wk/wv/w1/w3 as column-parallel and wo/w2 as row-parallel) makes
``deepspeed.initialize`` replace those nn.Linear layers with its sharded layers (all-reduce after
the row-parallel ones in forward, after the column-parallel ones in backward); embeddings, norms
and the head stay replicated. The model reads head counts from the projections' outputs, so each
rank attends over its own heads. DeepSpeed's (dp, tp) mesh puts tp innermost (rank = dp_rank * tp
+ tp_rank), as ``plan`` assumes; tp peers get the same rows, which DeepSpeed checks on the first
forward.

Pipeline: the model becomes a flat list of layers, [embedding, block 0 .. block L-1, final norm and
head], cut into pp stages with an equal number of transformer blocks each
(``partition_method="type:TransformerBlock"``); the loss is computed on the last stage. DeepSpeed's
topology puts pp outermost (rank = stage * dp + dp_rank), as ``plan`` assumes. Its pipeline engine
combines with ZeRO stage 0 or 1 only (``launcher.validate.rules``).

The ds_config comes from ``launcher.render.ds_config`` (the same file `llmtrain run` writes into
the run directory). DeepSpeed gets a torch AdamW rather than an optimizer named in the config, so
nothing JIT-builds a fused optimizer on CPU; llmtrain's own schedule sets the learning rate on
every step. Checkpoints are DeepSpeed's own (``save_checkpoint``/``load_checkpoint``).

DeepSpeed 0.19 reads its checkpoint files with ``torch.load(weights_only=False)``, which runs any
code pickled into them: ``load`` goes through ``launcher.train.checkpoint.safe_load`` (every file
read once, checked against the signed manifest, read weights-only, before and while DeepSpeed
loads).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from launcher import fsio
from launcher.backends import raw_refusals
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.health import nonfinite
from launcher.plan.preference import is_preference
from launcher.render.ds_config import runtime_ds_config
from launcher.train.checkpoint.safe_load import (
    CheckpointFiles,
    deepspeed_loading,
    read_json,
    verify_weights_only,
)
from launcher.train.deepspeed_import import import_deepspeed
from launcher.train.engines.base import Engine, RankInfo, StepResult
from launcher.train.engines.dist import engine_device
from launcher.train.finetune import adapters, lora
from launcher.train.finetune.masked_loss import (
    LossFn,
    is_chat_rows,
    loss_divisor,
    masked_loss,
    trained_tokens,
    trim_to_longest,
    unpack,
)
from launcher.train.finetune.preference import PreferenceObjective, response_tokens
from launcher.train.finetune.preference_loss import token_logps
from launcher.train.model.init_weights import skip_default_init
from launcher.train.model.transformer import Transformer, apply_recompute
from launcher.train.optim import build_optimizer, fused_on
from launcher.train.parallel import build
from launcher.validate import finetune_rules, preference_rules

# DeepSpeed 0.19.8 (ZeRO 1-3) calls torch.distributed.all_gather_into_tensor and
# reduce_scatter_tensor, which torch 2.13 deprecates with a FutureWarning per call: hundreds per run
# in the rank logs, none of them the user's to act on. Only those two messages are silenced.
for _name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
    warnings.filterwarnings(
        "ignore",
        message=rf"`torch\.distributed\.{_name}` is deprecated",
        category=FutureWarning,
    )

TAG = "engine"


class NonFiniteGuard:
    """ZeRO stage 0 in fp32: DeepSpeed calls the torch optimizer's ``step`` as is, after clipping
    with a norm it does not keep, and applies an update whatever its gradients hold. The guard
    takes the engine's place in clipping: it computes the global norm the same way (DeepSpeed's
    model-parallel aware ``clip_grad_norm_``, before clipping), clips, and withholds the update
    when the norm is NaN or infinite on any rank (every rank calls ``step`` once per optimizer
    step under stage 0, so the flag's all-reduce is matched everywhere)."""

    def __init__(self, engine: Any, optimizer: torch.optim.Optimizer, max_norm: float):
        self.norm: float | None = None
        self.skipped = False
        self.engine, self.optimizer = engine, optimizer
        self.max_norm = max_norm if max_norm > 0 else math.inf
        self.original_step = optimizer.step
        engine.clip_fp32_gradients = lambda: None  # the guard clips, with the norm it reports
        optimizer.step = self.step  # type: ignore[method-assign]

    def reset(self) -> None:
        self.norm, self.skipped = None, False

    def step(self, closure: Any = None) -> Any:
        from deepspeed.runtime.utils import clip_grad_norm_

        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = float(clip_grad_norm_(params, self.max_norm, mpu=self.engine.mpu))
        flag = torch.tensor([0.0 if math.isfinite(norm) else 1.0], device=self.engine.device)
        dist.all_reduce(flag)
        self.norm = norm if flag.item() == 0 else math.nan
        if flag.item() > 0:
            self.skipped = True
            return None
        return self.original_step(closure)


class PipelineEmbedding(nn.Module):
    """First pipeline layer: token (and learned position) embeddings of `model`."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.tok_embeddings = model.tok_embeddings
        self.pos_embeddings = model.pos_embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.tok_embeddings is not None
        h: torch.Tensor = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        return h


class PipelineHead(nn.Module):
    """Last pipeline layer: final norm and output projection of `model` (untied)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.norm = model.norm
        self.output = model.output

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        assert self.norm is not None and self.output is not None
        logits: torch.Tensor = self.output(self.norm(h))
        return logits


def _pipeline_batch(micro: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a micro-batch for the pipeline; packed rows cannot go through it
    (their document mask would not reach the later stages: data.packing=false is required)."""
    inputs, targets, segments = unpack(micro)
    if segments is not None:
        raise ValueError("packed chat rows cannot run through the pipeline: set data.packing=false")
    return inputs, targets


def pipeline_layers(model: Transformer) -> list[nn.Module]:
    """`model` as the sequence of layers a PipelineModule partitions."""
    return [PipelineEmbedding(model), *model.layers.values(), PipelineHead(model)]


def _refuse_unsupported(cfg: LLMTrainConfig) -> None:
    """What this engine runs is declared in launcher/backends/deepspeed.py: a ValueError listing
    every reason it cannot run `cfg`."""
    problems = [r.message for r in raw_refusals("deepspeed", cfg)]
    problems += finetune_rules.engine_refusals(cfg) + preference_rules.engine_refusals(cfg)
    if problems:
        raise ValueError(
            "backend=deepspeed cannot run this configuration:\n- " + "\n- ".join(problems)
        )


def _engine_ds_config(cfg: LLMTrainConfig) -> dict[str, Any]:
    """The run's ds_config (launcher.render.ds_config) plus what this process needs of it."""
    config: dict[str, Any] = runtime_ds_config(cfg)
    if cfg.zero.offload_optimizer != "none":
        # Keep the torch AdamW: DeepSpeedCPUAdam would JIT-compile (~1 min) on first use.
        config["zero_force_ds_cpu_optimizer"] = False
    if cfg.zero.stage > 0 and cfg.optim.name not in ("adam", "adamw"):
        # ZeRO partitions any element-wise optimizer correctly (SGD's and Lion's updates are
        # per element), but DeepSpeed asks for this flag for classes outside its own list.
        config["zero_allow_untested_optimizer"] = True
    return config


class DeepSpeedEngine(Engine):
    def __init__(self, cfg: LLMTrainConfig, seed: int, init_state: Any = None):
        deepspeed = import_deepspeed()

        # DeepSpeed's comm backend JIT-compiles a shared-memory all-reduce when it starts on CPU
        # (~42 s and a C++ compiler on a fresh machine, measured here). Only its
        # inference_all_reduce uses that op, training never does: marked unavailable, it is not
        # built. (deepspeed.ops keeps this dict for the process; on GPUs the op does not apply.)
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        _refuse_unsupported(cfg)
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
        self.cfg = cfg
        # finetune.objective=dpo|simpo|orpo: the loss of preference pairs (train/preference.py).
        self.objective = PreferenceObjective(cfg) if is_preference(cfg) else None
        self.base_digest: str | None = None  # of the frozen base, under finetune=lora|qlora
        self.dp_group: Any = None  # the default group (all ranks) unless tensor parallel
        # The (dp, tp) groups before the build: zero.Init partitions over the dp group.
        mpu = self._tensor_parallel_groups(layout.tp) if layout.tp > 1 else None
        model = self._build_model(cfg, seed, init_state, mpu)
        self.pipeline = layout.pp > 1
        # The pipeline's loss function is fixed at build time: its divisor is set per step.
        self.pipeline_loss = LossFn()
        module = self._pipeline_module(model, layout.pp) if self.pipeline else model
        # ZeRO-1/2 hand the client optimizer one flat fp32 partition per parameter group
        # (deepspeed/runtime/zero/stage_1_and_2.py: param_groups[i]["params"] =
        # [single_partition_of_fp32_groups[i]]): the fused Adam kernel updates it in one pass
        # where the default foreach implementation makes one pass per operation. On CUDA only,
        # so CPU runs keep their numerics (fused and foreach round differently).
        trainable = [p for p in module.parameters() if p.requires_grad]
        optimizer = build_optimizer(trainable, cfg.optim, fused=fused_on(engine_device()))
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module,
            optimizer=optimizer,
            config=_engine_ds_config(cfg),
            mpu=mpu,
            dist_init_required=False,
        )
        self.dynamic_scaling = cfg.precision.loss_scaling == "dynamic"
        # DeepSpeed's optimizer wrappers (ZeRO 1-3, bf16, fp16) skip an update whose gradient
        # norm is NaN or infinite and report the norm as inf. Only ZeRO stage 0 in fp32 steps
        # the torch optimizer as is: the guard does it there.
        self.guard = (
            NonFiniteGuard(self.engine, optimizer, cfg.optim.grad_clip)
            if self.engine.optimizer is optimizer
            else None
        )
        self.info = self._parallel_info(tensor_parallel=layout.tp > 1)
        self.reference_copy = self._reference_copy(cfg, seed, init_state)  # dpo, reference=copy

    def _build_model(
        self, cfg: LLMTrainConfig, seed: int, init_state: Any, mpu: Any
    ) -> Transformer:
        """This rank's model, built and filled by ``train.parallel.build``: under ZeRO-3 inside
        ``deepspeed.zero.Init`` (each module's parameters partitioned as it is constructed, then
        each rank's flat partition filled), elsewhere whole on the device as DeepSpeed keeps it;
        adapters and recomputation applied before DeepSpeed wraps anything."""
        # finetune=lora|qlora: the base's digest (each rank hashes its share of the whole
        # tensors while filling), the base frozen, the adapters added; the optimizer and
        # checkpoints hold the adapters alone (save_checkpoint(exclude_frozen_parameters)).
        digests: dict[str, str] = {}
        model = self._filled_base(cfg, seed, init_state, mpu, adapters.enabled(cfg), digests)
        if adapters.enabled(cfg):
            self.base_digest = lora.gathered_digest(digests)
            frozen = next(model.parameters()).dtype
            adapters.add_adapters(model, cfg, frozen)
            drawn = build.drawn(model, seed)
            filler = build.Filler(drawn)
            for name, param in build.named_params(model):
                if adapters.is_adapter(name):
                    filler.fill_param(name, param)
        apply_recompute(model, cfg.train.recompute)
        return model

    def _filled_base(
        self,
        cfg: LLMTrainConfig,
        seed: int,
        init_state: Any,
        mpu: Any,
        digested: bool = False,
        digests: dict[str, str] | None = None,
    ) -> Transformer:
        """The model without adapters: under ZeRO-3 built inside ``deepspeed.zero.Init``, else
        whole on the device; filled from train.init_from, else drawn from `seed`; with
        `digested`, this rank's share of the whole tensors hashed into `digests`."""
        with self._zero3_init(cfg, mpu), engine_device(), skip_default_init():
            model = Transformer(cfg.model)
        initial = build.drawn(model, seed)
        loaded = build.as_source(init_state)
        source: build.Source = initial if loaded is None else build.Chain(loaded, initial)
        share = None
        if digested:
            names = [n for n, _ in build.named_params(model)]
            share = build.base_share(names, self.info.world_size, self.info.rank)
        build.Filler(source, share, digests).fill_module(model)
        return model

    def _reference_copy(self, cfg: LLMTrainConfig, seed: int, init_state: Any) -> Any:
        """dpo with finetune.reference=copy (finetune=full): the frozen reference, built and
        filled as the policy (``_filled_base``: the policy's weights before step 1), no
        gradients, eval mode. Under ZeRO-3 partitioned by ``zero.Init`` and run by a second
        DeepSpeed engine without an optimizer (its hooks gather each module's weights for the
        forward, as TRL's ``prepare_deepspeed`` does for its ref_model); under ZeRO 0-2 whole
        on every rank, as the policy, in the policy's dtype. None for any other run."""
        if self.objective is None or self.objective.mode != "copy":
            return None
        model = self._filled_base(cfg, seed, init_state, None)
        model.requires_grad_(False)
        if cfg.zero.stage != 3:
            return model.to(next(self.engine.module.parameters()).dtype).eval()
        import deepspeed

        engine, *_ = deepspeed.initialize(
            model=model, config=_engine_ds_config(cfg), dist_init_required=False
        )
        engine.eval()
        return engine

    def _zero3_init(self, cfg: LLMTrainConfig, mpu: Any) -> contextlib.AbstractContextManager[Any]:
        """ZeRO-3: ``deepspeed.zero.Init`` with the run's ds_config (its dtype, its offload);
        the other stages keep the whole model on every rank anyway. Under AutoTP (`mpu`) the
        partitions, and the ds_config's batch check, span the data-parallel group only."""
        if cfg.zero.stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
        init: contextlib.AbstractContextManager[Any] = deepspeed.zero.Init(
            config_dict_or_path=_engine_ds_config(cfg),
            mpu=mpu,
            data_parallel_group=None if mpu is None else mpu.get_data_parallel_group(),
        )
        return init

    def _pipeline_module(self, model: Transformer, stages: int) -> nn.Module:
        """`model` as DeepSpeed's PipelineModule of `stages` stages."""
        import deepspeed
        from deepspeed.pipe import PipelineModule

        # PipelineModule builds its process groups through deepspeed.comm, which wraps the
        # torch process group already initialised (deepspeed.initialize would do it later).
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
        module: nn.Module = PipelineModule(
            layers=pipeline_layers(model),
            num_stages=stages,
            loss_fn=self.pipeline_loss,
            partition_method="type:TransformerBlock",
        )
        # DeepSpeed's gradient norm sums over the pipe x tensor "model parallel" group but
        # counts a parameter only on model-parallel rank 0 unless it is marked model-parallel:
        # unmarked, the stages after the first drop out of the norm and clipping differs
        # from one process (measured: 1.8e-3 loss drift in 6 steps). Every stage holds its
        # own parameters, so all are marked.
        for param in module.parameters():
            param.model_parallel = True  # type: ignore[attr-defined]
        return module

    def _tensor_parallel_groups(self, tp: int) -> Any:
        """The (dp, tp) groups of AutoTP, as the mpu deepspeed.initialize takes."""
        import deepspeed
        from deepspeed.utils import groups

        # AutoTP (ds_config "tensor_parallel", launcher/render/ds_config.py) shards the
        # projections inside deepspeed.initialize. Its (dp, tp) groups are made first and
        # passed as the mpu: without one, DeepSpeedConfig counts every rank as data parallel
        # and asserts train_batch_size == micro x grad_accum x world_size (tp ranks included).
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
        groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
        self.dp_group = groups.get_data_parallel_group()
        return groups

    def _parallel_info(self, *, tensor_parallel: bool) -> RankInfo:
        """This rank's place once DeepSpeed made its groups (data-parallel rank and size under
        tensor or pipeline parallelism)."""
        info = self.info
        if tensor_parallel:
            from deepspeed.utils import groups

            info = RankInfo(
                rank=info.rank,
                world_size=info.world_size,
                local_rank=info.local_rank,
                dp_rank=groups.get_data_parallel_rank(),
                dp_size=groups.get_data_parallel_world_size(),
                tp_rank=groups.get_tensor_model_parallel_rank(),
            )
        if self.pipeline:
            grid = self.engine.grid
            info = RankInfo(
                rank=info.rank,
                world_size=info.world_size,
                local_rank=info.local_rank,
                dp_rank=grid.data_parallel_id,
                dp_size=grid.data_parallel_size,
                pp_rank=grid.get_stage_id(),
            )
        return info

    def step(
        self, rows: torch.Tensor, lr: float, reference: torch.Tensor | None = None
    ) -> StepResult:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.guard is not None:
            self.guard.reset()
        trained, divisor = self._trained(rows)
        if self.pipeline:
            self.pipeline_loss.divisor = divisor
            loss = self._pipeline_step(rows)
        else:
            device = self.engine.device
            losses = []
            refs = torch.split(reference, self.micro_batch_size) if reference is not None else None
            for i, micro in enumerate(torch.split(rows, self.micro_batch_size)):
                out = self._micro_loss(micro.to(device), divisor, None if refs is None else refs[i])
                self.engine.backward(out)
                self.engine.step()
                losses.append(out.detach().float())
            mean = torch.stack(losses).mean().to(device)
            # Tensor-parallel peers hold the same loss: average over data parallel only.
            dist.all_reduce(mean, op=dist.ReduceOp.SUM, group=self.dp_group)
            loss = float(mean) / self.info.dp_size
        pairs = self.objective.finish(self.dp_group) if self.objective is not None else None
        return self._result(loss, trained, pairs)

    def _micro_loss(
        self, micro: torch.Tensor, divisor: float | None, reference: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One micro-batch's loss: the plain mean, or over trained targets / `divisor`, unpacked
        chat rows cut to their longest example first (masked_loss.trim_to_longest); of
        preference pairs, their mean pair loss (launcher.train.finetune.preference)."""
        if self.objective is not None:
            module = self.engine.module
            return self.objective.micro_loss(
                module, self.engine, token_logps, micro, reference, self.reference_copy
            )
        inputs, targets, segments = unpack(trim_to_longest(micro))
        logits = self.engine(inputs) if segments is None else self.engine(inputs, segments=segments)
        return masked_loss(logits, targets, divisor)

    def _trained(self, rows: torch.Tensor) -> tuple[int, float | None]:
        """(trained targets in the global batch, each micro-batch's loss divisor; None for
        pre-training rows), launcher.train.finetune.masked_loss's convention."""
        dp = self.info.dp_size
        if self.objective is not None:  # preference pairs: their response tokens
            count = response_tokens(rows).to(self.engine.device)
            if dp > 1:
                dist.all_reduce(count, group=self.dp_group)
            return int(count), None
        if not is_chat_rows(rows):
            return rows.shape[0] * (rows.shape[1] - 1) * dp, None
        count = trained_tokens(rows).to(self.engine.device)
        if dp > 1:  # tensor and pipeline peers hold the same rows: over data parallel only
            group = self.engine.grid.get_data_parallel_group() if self.pipeline else self.dp_group
            dist.all_reduce(count, group=group)
        total = int(count)
        return total, loss_divisor(total, dp, rows.shape[0] // self.micro_batch_size)

    def _result(
        self, loss: float, trained: int | None = None, pairs: dict[str, float] | None = None
    ) -> StepResult:
        """The step's outcome. DeepSpeed checks the gradient norm before the update (its
        wrappers, or the guard); a non-finite loss with finite gradients is only seen after it,
        so such an update was applied (the trainer then stops, never skips)."""
        if self.guard is not None:
            norm, skipped = self.guard.norm, self.guard.skipped
        else:
            reported = self.engine.get_global_grad_norm()
            norm = float(reported) if reported is not None else None
            skipped = not getattr(self.engine, "_step_applied", True)
        bad = nonfinite(loss, norm, self.dynamic_scaling)
        if self.dynamic_scaling and skipped and not bad:
            skipped = False  # the loss scaler's own overflow skip: normal under fp16
        return StepResult(
            loss=loss,
            grad_norm=norm,
            nonfinite=bad,
            applied=not skipped,
            trained_tokens=trained,
            preference=pairs,
        )

    def _pipeline_step(self, rows: torch.Tensor) -> float:
        """One optimizer step of DeepSpeed's 1F1B schedule over the grad_accum micro-batches.

        Its loss is the mean over micro-batches and dp, broadcast from the last stage."""
        device = self.engine.device
        micro = [m.to(device) for m in torch.split(rows, self.micro_batch_size)]
        batches = iter([_pipeline_batch(m) for m in micro])
        return float(self.engine.train_batch(data_iter=batches))

    def evaluate(self, rows: torch.Tensor) -> float:
        device = self.engine.device
        micro = [m.to(device) for m in torch.split(rows, self.micro_batch_size)]
        _, divisor = self._trained(rows)
        self.pipeline_loss.divisor = divisor
        if self.pipeline:
            # PipelineEngine.eval_batch runs the forward schedule in eval mode, no grad, and
            # broadcasts its pipeline's loss (mean over micro-batches) from the last stage to the
            # other stages, not over dp: the mean over the world is the mean over dp.
            batches = iter([_pipeline_batch(m) for m in micro])
            loss = self.engine.eval_batch(data_iter=batches, num_micro_batches=len(micro))
            total = loss.detach().float().reshape(1).to(device)
            dist.all_reduce(total)
            return float(total) / dist.get_world_size()
        self.engine.eval()
        try:
            with torch.no_grad():
                losses = [self._micro_loss(m, divisor).float() for m in micro]
        finally:
            self.engine.train()
            if self.objective is not None:  # evaluation pairs are not the step's metrics
                self.objective.sums = None
        mean = torch.stack(losses).mean().to(device)
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        return float(mean) / self.info.dp_size

    @torch.no_grad()
    def reference_logps(self, rows: torch.Tensor) -> torch.Tensor:
        """Summed response log-probs [n, 2] of preference pairs, the model as it is, in eval
        mode: the precomputed reference's pass (launcher.train.finetune.preference_reference)."""
        assert self.objective is not None
        self.engine.eval()
        try:
            pairs = rows.to(self.engine.device)
            return self.objective.logps(self.engine, token_logps, pairs, self.micro_batch_size)
        finally:
            self.engine.train()

    def save(self, directory: Path) -> list[Path]:
        before = set(directory.rglob("*")) if directory.exists() else set()
        full: OSError | None = None
        try:
            self.engine.save_checkpoint(
                str(directory), tag=TAG, exclude_frozen_parameters=self.base_digest is not None
            )
            if self.base_digest is not None and dist.get_rank() == 0:
                ft, init_from = self.cfg.finetune, self.cfg.train.init_from
                record = lora.base_record(ft, self.base_digest, init_from)
                (directory / lora.BASE_FILE).write_text(json.dumps(record, sort_keys=True) + "\n")
        except (OSError, RuntimeError) as exc:
            # torch.save reports a full disk as a RuntimeError with no errno: said plainly as
            # "disk full" by the checkpoint writer, as on the torch backend.
            full = fsio.disk_full_error(exc, directory)
            if full is None:
                raise
            if full.filename == str(directory):
                # torch.save's error names no file: name the one it was writing.
                full.filename = str(_newest_file(directory, before) or directory)
        if full is not None:
            # Out of the except block, the failed write's traceback (and its open file, holding
            # disk space on a file system that has none) is gone: the rank's error file fits.
            gc.collect()
            raise full
        return sorted(p for p in set(directory.rglob("*")) - before if p.is_file())

    def load(self, directory: Path, files: CheckpointFiles) -> None:
        verify_weights_only(directory, files)  # every *.pt weights-only, before DeepSpeed reads
        if self.base_digest is not None:  # adapters apply to the base they were trained on
            problem = lora.base_problem(
                read_json(files, directory / lora.BASE_FILE), self.base_digest
            )
            if problem is not None:
                raise ValueError(f"{directory}: {problem}")
        with deepspeed_loading(files):
            path, _ = self.engine.load_checkpoint(
                str(directory),
                tag=TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
                # finetune: the checkpoint holds the adapters; the frozen base is already here.
                load_module_strict=self.base_digest is None,
            )
        if path is None:
            raise RuntimeError(f"{directory}: DeepSpeed found no checkpoint tagged {TAG!r}")

    def local_tensors(self) -> Iterator[torch.Tensor]:
        for param in self.engine.module.parameters():
            # ZeRO-3 keeps this rank's partition in ds_tensor (param.data is empty).
            yield getattr(param, "ds_tensor", param)

    def extra_state(self) -> dict[str, Any]:
        return {
            "zero_stage": self.engine.zero_optimization_stage(),
            "pipeline_stages": self.engine.num_stages if self.pipeline else 1,
        }


def _newest_file(directory: Path, before: set[Path]) -> Path | None:
    """The file last written under `directory` since `before` was listed (None: none)."""
    written = []
    for path in set(directory.rglob("*")) - before:
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                written.append((path.stat().st_mtime_ns, str(path), path))
    return max(written)[2] if written else None
