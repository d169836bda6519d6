"""The PyTorch-native engine (``backend=torch``): DDP, FSDP2, DTensor tensor/sequence parallel and
``torch.distributed.pipelining`` on one DeviceMesh.

The mesh (``torch_mesh``): dims ("pp", "dp", "cp", "tp"), tp innermost and pp outermost; expert
parallel adds a second mesh ("pp", "edp", "ep", "cp", "tp") over the same ranks.

How each piece is applied, in order, to every model part (the whole model, or each pipeline chunk):
1. Build on the meta device and delete what this pipeline chunk does not hold (layers outside its
   range, the embeddings off the first chunk, norm and head off the last). finetune=lora|qlora:
   the target projections wrapped in ``finetune.lora.LoRALinear`` (``finetune.adapters``; under
   tp sharded like the weight they adapt, ``torch_parallelize.adapter_plan``); the optimizer and
   checkpoints hold the adapters alone (``torch_state.TRAINABLE_OPTIONS``). Steps 2-6 run on
   meta too; only then is this rank's shard materialised and filled (``train.parallel.build``):
   each parameter drawn whole from a generator seeded by its name (or read by slice from
   train.init_from) and sliced, so every layout holds the same weights; qlora's bases to NF4
   block by block; the frozen base's digest from each rank's share of the tensors.
2. Tensor parallel (tp > 1), the torchtitan plan (``torch_parallelize``: which projections are
   Colwise, Rowwise or replicated in dense, MoE and multi-head latent attention blocks).
   Expert parallel (ep > 1): each rank keeps E/ep routed experts of every MoE layer (deleted on
   the meta device, before materialising) and exchanges tokens by all-to-all over "ep"
   (``launcher.train.parallel.expert_parallel``).
3. Context parallel (cp > 1): each cp rank takes its two load-balanced chunks of the rows and the
   attention runs as ring attention over the "cp" group
   (``launcher.train.parallel.ring_attention``), on the rank's heads under tp (sequence parallel
   then shards the cp-local sequence). Gradients are averaged over dp x cp together (the "dp_cp"
   mesh), as Megatron-LM does.
4. Recompute per train.recompute (``model.apply_recompute``; module names are unchanged).
5. Data parallel over the "dp" mesh dim (dp x cp with context parallel): zero.stage=0 -> DDP
   (with tp > 1 or pp > 1: gradients all-reduced over dp by the engine after the last
   micro-batch, since DDP would turn DTensor parameters into local tensors, breaking clipping
   and checkpoints, and its reducer asserts under the pipeline schedules); zero.stage=1 -> DDP
   with ``ZeroRedundancyOptimizer`` (each dp rank keeps and updates the optimizer states of its
   share of the parameters, then broadcasts them: ZeRO stage 1, Rajbhandari et al. 2020);
   zero.stage=2 -> FSDP2 ``fully_shard(reshard_after_forward=False)``; zero.stage=3 ->
   ``fully_shard`` (full shard), with CPUOffloadPolicy for zero.offload_params=cpu. On the CPU,
   glibc's mmap threshold is pinned so that freed gathered weights leave the resident set
   (``launcher.train.host_malloc``).
   Mixed precision: FSDP2's MixedPrecisionPolicy (compute dtype for params, grad dtype for the
   reduction); without FSDP, ``torch.autocast`` to the compute dtype. Parameters stay fp32
   (bf16 under precision=bf16-pure: no master copy).
   precision.loss_scaling=dynamic (precision=fp16): ``ShardedGradScaler`` (Micikevicius et al.
   2018: scale the loss, skip the step and halve the scale on inf/NaN gradients, double it after
   2000 clean steps); its state is saved with the checkpoint.
   precision=fp8: between steps 1 and 2 (after init, before tp and FSDP) the block projections
   that gain from fp8 become torchao ``Float8Linear`` (``launcher.train.model.fp8``; the
   precision.fp8_recipe scaling, the parameters unchanged), computed under the same bf16 policy;
   under tp the tensorwise ones take torchao's Float8Colwise/RowwiseParallel, under FSDP2 their
   weights are all-gathered in fp8 (tensorwise) and their scales precomputed after each optimizer
   step. The device must have CUDA capability 8.9+ unless precision.fp8_emulate.
6. Compilation (``engine_choices.compile_in_force``: backend.compile, or its default on a GPU: on
   for fp8 and for dense runs of 1,000+ steps): each transformer block is compiled on its own,
   after recompute and before data parallel.
Loss: with tp = pp = 1 the model's forward computes the loss over chunks of tokens
(``launcher.train.model.chunked_loss``, train.chunked_loss); with tp > 1 over logits left split on
the vocabulary (torch's loss_parallel, as torchtitan under tp); otherwise from full logits.
MoE experts: grouped GEMMs (``launcher.train.model.experts``), under ep and tp too.

Optimizer: AdamW (or Adam), GPT-style weight decay: on parameters with >= 2 dimensions (matmul
weights and embeddings), none on biases and norm weights. Gradient clipping is on the global norm:
``clip_grad_norm_`` (DTensor- and FSDP-aware) and, with pipeline parallel, the squared norms of all
stages all-reduced over the "pp" group.

Where the code lives: the meshes in ``torch_mesh``, steps 2 and 5 (the tensor-parallel plan,
FSDP2/DDP) in ``torch_parallelize``, the pipeline chunks and schedules in ``torch_pipeline``, the
gradients' averaging and clipping in ``torch_grads``, the checkpoint state (DCP, ZeRO-1 shards, the
loss scaler) in ``torch_state``; this module builds the parts in order and runs the steps.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import (
    DTensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
)
from torch.nn.parallel import DistributedDataParallel

from launcher.backends import memory_savers, raw_refusals
from launcher.backends.common import precision_of
from launcher.backends.engine_choices import engine_choices
from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.health import nonfinite
from launcher.plan.preference import is_preference
from launcher.train.checkpoint.safe_load import CheckpointFiles, read_json
from launcher.train.engines import torch_grads
from launcher.train.engines.base import Engine, StepResult
from launcher.train.engines.dist import engine_device
from launcher.train.engines.torch_grads import full
from launcher.train.engines.torch_loss import (
    cp_micro_batches,
    cp_unpacked,
    full_logits_loss,
    loss_context,
    vocab_parallel_loss,
)
from launcher.train.engines.torch_mesh import build_meshes
from launcher.train.engines.torch_optimizer import engine_optimizer
from launcher.train.engines.torch_pairs import PairSteps
from launcher.train.engines.torch_parallelize import (
    TorchEngineError,
    apply_dp,
    apply_tp,
    map_gathered_weights,
)
from launcher.train.engines.torch_pipeline import build_schedule, keep_chunk, run_schedule
from launcher.train.engines.torch_state import load_state, save_state
from launcher.train.engines.torch_summary import engine_summary
from launcher.train.finetune import adapters, lora
from launcher.train.finetune.masked_loss import (
    LossFn,
    is_chat_rows,
    loss_divisor,
    trained_tokens,
)
from launcher.train.finetune.preference import PreferenceObjective
from launcher.train.model import fp8
from launcher.train.model.activation_offload import ActivationOffload
from launcher.train.model.transformer import (
    apply_context_parallel,
    apply_expert_parallel,
    apply_recompute,
    build_model,
)
from launcher.train.optim_in_backward import InBackwardOptimizer
from launcher.train.parallel import build
from launcher.train.parallel.expert_parallel import ExpertParallel
from launcher.train.parallel.ring_attention import ContextParallel
from launcher.validate import finetune_rules, preference_rules

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TorchEngine(PairSteps, Engine):
    def __init__(
        self, cfg: LLMTrainConfig, seed: int, init_state: dict[str, torch.Tensor] | None = None
    ):
        problems = [r.message for r in raw_refusals("torch", cfg)]
        problems += finetune_rules.engine_refusals(cfg) + preference_rules.engine_refusals(cfg)
        if problems:
            raise TorchEngineError(
                "backend=torch cannot run this configuration:\n- " + "\n- ".join(problems)
            )
        if not dist.is_initialized():
            raise RuntimeError("TorchEngine needs an initialised process group (see engines.dist)")
        self.cfg = cfg
        self.layout: Layout = derive_layout(cfg)
        lay = self.layout
        self.device = engine_device()
        meshes = build_meshes(lay, self.device)
        self.mesh, self.dp_mesh, self.ep_mesh = meshes.mesh, meshes.dp_mesh, meshes.ep_mesh
        self.info = meshes.info
        self.cp_rank, self.pp_rank = self.info.cp_rank, self.info.pp_rank
        self._set_precision(cfg)
        self.zero = cfg.zero.stage
        self.fsdp = self.zero in (2, 3)
        # zero 0 with tp or pp: the engine all-reduces the gradients over dp itself, after the
        # last micro-batch (DDP would turn DTensor parameters into local tensors, and its reducer
        # does not follow the pipeline schedules' interleaved forwards and backwards).
        # With expert parallel too: each rank holds other experts, so DDP's all-reduce of every
        # parameter over dp does not apply; expert gradients are reduced over "edp" instead.
        self.manual_dp_sync = (
            not self.fsdp and lay.dp * lay.cp > 1 and (lay.tp > 1 or lay.pp > 1 or lay.ep > 1)
        )
        self._set_loss(cfg)
        self.objective = PreferenceObjective(cfg) if is_preference(cfg) else None  # dpo, ...
        self.chunk_ids = list(range(self.pp_rank, lay.pp * lay.vpp, lay.pp))
        self.init_state = init_state  # train.init_from: each rank reads its shards (build)
        # finetune=lora|qlora: base frozen, adapters trained (launcher.train.finetune.lora); the
        # base weights' digest is computed before sharding, from this rank's share of them.
        self.finetune = cfg.finetune.name != "full"
        self.base_digests: dict[str, str] = {}
        # Memory savers (train.activation_offload, optim.in_backward, precision=bf16-pure).
        self.pure_bf16 = memory_savers.pure_bf16(cfg)
        self.offload = ActivationOffload() if cfg.train.activation_offload else None
        self.parts: list[nn.Module] = [self._build_part(c, seed) for c in self.chunk_ids]
        if self.offload is not None:  # the head and the loss keep what they save on the device
            self.offload.keep_after_blocks(self.parts[-1])
        self.reference_copy = self._reference_copy(seed)  # dpo, finetune.reference=copy
        self.init_state = None
        self.base_digest = lora.gathered_digest(self.base_digests) if self.finetune else None
        self.optimizer = engine_optimizer(self)
        self.schedule: Any = None
        if lay.pp > 1:
            self.schedule = build_schedule(
                self.parts,
                self.chunk_ids,
                lay,
                self.device,
                group=self.mesh["pp"].get_group(),
                kind=cfg.parallel.pp_schedule,
                loss_fn=self.pipeline_loss,
            )

    def _set_precision(self, cfg: LLMTrainConfig) -> None:
        """Compute and gradient dtypes, fp8 (its device checked) and the loss scaler."""
        self.compute_dtype = DTYPES[cfg.precision.compute_dtype]
        # precision=fp8: the block projections become torchao Float8Linear
        # (launcher.train.model.fp8).
        self.fp8 = precision_of(cfg) == "fp8"
        if self.fp8:
            problem = fp8.device_problem(self.device, cfg.precision.fp8_emulate)
            if problem is not None:
                raise TorchEngineError(problem)
        # The tensor-parallel styles of the block projections (torchao's float8 ones for fp8).
        self.tp_styles: tuple[type[Any], type[Any]] = (
            fp8.tp_styles(cfg.precision.fp8_recipe)
            if self.fp8
            else (ColwiseParallel, RowwiseParallel)
        )
        self.grad_dtype = DTYPES[cfg.precision.grad_dtype]
        self.scaler: torch.amp.GradScaler | None = None
        if cfg.precision.loss_scaling == "dynamic":
            # Shard-aware (FSDP2, DTensor, expert shards): inf/NaN found on any rank is
            # all-reduced over the world, so every rank skips the same steps.
            self.scaler = ShardedGradScaler(self.device.type)

    def _set_loss(self, cfg: LLMTrainConfig) -> None:
        """How the loss is computed (launcher.backends.engine_choices)."""
        # The loss over chunks of tokens, never the full logits (launcher.train.model.chunked_loss),
        # where the whole head is on this rank inside the model's forward: not under tp (the
        # head is column-parallel with its logits gathered) nor pp (the schedule computes the
        # loss from the last stage's output); train.chunked_loss=false turns it off.
        self.choices = engine_choices(cfg)  # compile, fp8 layers, loss (launcher.backends)
        self.chunked_loss = self.choices.chunked_loss
        # tp > 1: the loss over vocabulary-split logits (torch_loss.vocab_parallel_loss),
        # forward and backward inside torch's loss_parallel() context (_loss_context).
        self.vocab_parallel = self.choices.vocab_parallel_loss
        self._loss_of = vocab_parallel_loss if self.vocab_parallel else full_logits_loss
        # The pipeline schedules take a loss function at build time: its divisor is set per step.
        self.pipeline_loss = LossFn(self._loss_of)

    # --- model construction ---------------------------------------------------------------------
    def _build_part(self, chunk: int, seed: int) -> nn.Module:
        """One model part, built in ``train.parallel.build``'s order: on meta, split, adapted,
        parallelized, then only this rank's shard materialised and filled."""
        lay, cfg = self.layout, self.cfg
        model = build_model(cfg.model, "meta")
        if self.ep_mesh is not None:
            ep = ExpertParallel(
                self.ep_mesh["ep"].get_group(), lay.ep, self.ep_mesh.get_local_rank("ep")
            )
            apply_expert_parallel(model, ep)
        if lay.pp > 1:
            keep_chunk(model, lay, chunk)
        if self.pure_bf16:  # no fp32 master: the weights themselves bf16 (cast on meta)
            model.to(torch.bfloat16)
        if self.finetune:
            # Frozen weights in the compute dtype on a GPU, fp32 on the CPU (no native bf16).
            frozen = self.compute_dtype if self.device.type == "cuda" else torch.float32
            adapters.add_adapters(model, cfg, frozen)
        if self.fp8:
            # Before tp and FSDP, as torchao documents: the parameters stay the same tensors.
            fp8.convert_as_configured(model, cfg.precision, self.fsdp)
        if lay.cp > 1:
            cp = ContextParallel(self.mesh["cp"].get_group(), lay.cp, self.cp_rank, lay.seq_length)
            apply_context_parallel(model, cp)
        if lay.tp > 1:
            apply_tp(model, self.mesh["tp"], cfg, self.tp_styles, first_chunk=chunk == 0)
        apply_recompute(model, cfg.train.recompute)
        model.chunked_loss = self.chunked_loss
        if self.choices.compile:
            # Per block: compile time grows with the distinct blocks, not the depth (the blocks
            # share one compiled graph when their shapes and guards agree).
            for name, block in list(model.layers.items()):
                model.layers[name] = cast(nn.Module, torch.compile(block))
        dtypes = (self.compute_dtype, self.grad_dtype)
        if self.fsdp:  # qlora: NF4 before FSDP2, which shards it as NF4
            build.nf4_before_sharding(model, cfg)
        if self.fsdp:  # sharded on meta: each rank materialises its shards alone
            sharded = apply_dp(model, cfg, self.dp_mesh, self.device, dtypes, self.manual_dp_sync)
            if self.device.type == "cpu":  # freed gathered weights leave the resident set
                map_gathered_weights(sharded, self.compute_dtype)
            self._materialise(sharded, seed)
            return sharded
        self._materialise(model, seed)
        return apply_dp(model, cfg, self.dp_mesh, self.device, dtypes, self.manual_dp_sync)

    def _materialise(self, model: nn.Module, seed: int) -> None:
        """This rank's shard on the device, filled from train.init_from (the adapters drawn) or
        drawn; qlora's bases to NF4 block by block; the frozen base's digest of this rank's
        share of the tensors (i % ranks-per-stage == its place in the stage)."""
        lay, cfg = self.layout, self.cfg
        initial = build.drawn(model, seed)
        loaded = build.as_source(self.init_state)
        source: build.Source = initial if loaded is None else build.Chain(loaded, initial)
        share = None
        if self.finetune:
            per_stage = lay.dp * lay.cp * lay.tp
            place = dist.get_rank() - self.pp_rank * per_stage
            names = [n for n, _ in build.named_params(model)]
            share = build.base_share(names, per_stage, place)
        filler = build.Filler(source, share, self.base_digests)
        # CPUOffloadPolicy keeps the sharded parameters on the host.
        offload = self.fsdp and cfg.zero.offload_params == "cpu"
        device = torch.device("cpu") if offload else self.device

        def quantize(unit: nn.Module, in_block: bool) -> None:
            adapters.quantize(unit, cfg, in_block)

        build.materialise(model, device, filler, quantize, whole=self.fsdp)

    def local_tensors(self) -> Iterator[torch.Tensor]:
        for part in self.parts:
            for param in part.parameters():
                yield param.to_local() if isinstance(param, DTensor) else param

    # --- training -------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.fsdp or self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _params(self) -> Iterator[nn.Parameter]:
        for part in self.parts:
            yield from part.parameters()

    def _grad_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP's gradient all-reduce on (last micro-batch) or off (the others).

        FSDP2 (zero.stage 2/3) reduce-scatters every micro-batch's gradients into the sharded
        gradient, as DeepSpeed's ZeRO-2/3 do: switching its sync off would accumulate unsharded
        gradients in the reduce dtype (FSDPParam.to_accumulated_grad_if_needed), 4 bytes a
        parameter on every rank, more than the ZeRO-1 layout this stage is meant to beat, and
        more than `plan` counts. Under pipelining, torch's schedules turn FSDP's sync off
        themselves and reduce once (PipelineStage.perform_reduce_grad); `plan` models that."""
        stack = contextlib.ExitStack()
        for part in self.parts:
            if isinstance(part, DistributedDataParallel) and not enabled:
                stack.enter_context(part.no_sync())
        return stack

    def _expert_params(self) -> list[nn.Parameter]:
        """This rank's routed-expert parameters under expert parallel (else none)."""
        if self.ep_mesh is None:
            return []
        return [p for part in self.parts for n, p in part.named_parameters() if ".experts." in n]

    def _allreduce_grads_over_dp(self) -> None:
        experts = {id(p) for p in self._expert_params()}
        params, ranks = list(self._params()), self.layout.dp * self.layout.cp
        # Over dp x cp together with context parallel (the "dp_cp" mesh), as DDP does.
        grads = torch_grads.local_grads(params, chosen=experts, inside=False)
        torch_grads.average(grads, self.dp_mesh.get_group(), ranks)
        if experts:
            # An expert's gradient already sums its ep group's tokens (the all-to-all's
            # backward); add the other ep groups' (edp) and divide by dp for the batch mean
            # (expert parallel runs with cp = 1).
            assert self.ep_mesh is not None
            edp = self.ep_mesh["edp"]
            grads = torch_grads.local_grads(params, chosen=experts, inside=True)
            torch_grads.average(grads, edp.get_group() if edp.size() > 1 else None, ranks)

    def _clip(self) -> float:
        max_norm = self.cfg.optim.grad_clip
        params = [p for p in self._params() if p.grad is not None]
        if self.ep_mesh is not None:
            experts = {id(p) for p in self._expert_params()}
            ep_group = self.ep_mesh["ep"].get_group()
            return torch_grads.clip_with_experts(params, experts, max_norm, ep_group)
        if self.layout.pp == 1:
            total = torch.nn.utils.clip_grad_norm_(
                params, max_norm if max_norm > 0 else float("inf")
            )
            return float(full(total))
        return torch_grads.clip_over_stages(params, max_norm, self.mesh["pp"].get_group())

    def step(
        self, rows: torch.Tensor, lr: float, reference: torch.Tensor | None = None
    ) -> StepResult:
        lay = self.layout
        expected = lay.grad_accum * lay.micro_batch_size
        if rows.dim() not in (2, 3, 4) or rows.shape[0] != expected:
            raise ValueError(
                f"step() expects rows [grad_accum*micro_batch_size={expected}, seq+1], "
                f"got {tuple(rows.shape)}"
            )
        rows = rows.to(self.device, non_blocking=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.objective is not None:  # preference pairs [n, 2, 3, seq + 1] (torch_pairs)
            loss, trained = self._pairs_step(rows, reference)
        else:
            trained, divisor = self._trained(rows)
            if lay.pp > 1:
                inputs, targets, segments = cp_unpacked(rows, self.layout.cp, self.cp_rank)
                if segments is not None:  # the later stages would attend across examples
                    raise ValueError("packed chat rows need parallel.pp=1: set data.packing=false")
                self.pipeline_loss.divisor = divisor
                with self._autocast(), self._loss_context():
                    loss = self._pipeline(inputs, targets, train=True)
            else:
                model = self.parts[0]
                loss = self._forward_backward(
                    [
                        functools.partial(self._model_loss, model, i, t, s, divisor)
                        for i, t, s in cp_micro_batches(rows, self.layout, self.cp_rank)
                    ]
                )
        if self.manual_dp_sync:
            self._allreduce_grads_over_dp()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if isinstance(self.optimizer, InBackwardOptimizer):  # stepped already; nothing to clip
            grad_norm = self.optimizer.take_grad_norm()
        else:
            grad_norm = self._clip()
        # Mean over the global batch: the loss lives on the last pipeline stage (zero elsewhere);
        # every tp peer holds the same value and each cp rank the mean over an equal share of the
        # tokens, so sum over the world and divide by dp * cp * tp. Reduced before the update,
        # with a count of the ranks whose gradient norm is NaN or infinite: every rank then
        # withholds the update of a non-finite step together (launcher.health).
        dynamic = self.scaler is not None
        total = loss.detach().float().reshape(1) / (lay.dp * lay.cp * lay.tp)
        bad_norm = 0.0 if math.isfinite(grad_norm) else 1.0
        packed = torch.cat([total, torch.tensor([bad_norm], device=total.device)])
        dist.all_reduce(packed)
        loss_value, bad_ranks = float(packed[0]), float(packed[1])
        bad = nonfinite(loss_value, grad_norm if bad_ranks == 0 else math.nan, dynamic)
        if self.scaler is not None:
            if not bad:  # an infinite gradient: the scaler skips the step itself
                self.scaler.step(self.optimizer)
            self.scaler.update()
        elif not bad:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.fp8 and self.fsdp and not bad and self.cfg.precision.fp8_recipe == "tensorwise":
            # fp8 all-gather: the new weights' scales, all layers in one all-reduce (torchao).
            for part in self.parts:
                fp8.precompute_fsdp_scales(part)
        return StepResult(
            loss=loss_value,
            grad_norm=grad_norm,
            nonfinite=bad,
            applied=not bad,
            trained_tokens=trained,
            preference=self.objective.metrics if self.objective is not None else None,
        )

    def _trained(self, rows: torch.Tensor) -> tuple[int, float | None]:
        """(trained targets in the global batch, each micro-batch's loss divisor), the divisor
        None for pre-training rows (launcher.train.finetune.masked_loss: a global token-weighted
        mean). Counted over dp: tp, cp and pp peers hold the same rows."""
        lay = self.layout
        count = trained_tokens(rows).to(torch.int64)
        if not is_chat_rows(rows):
            return int(count) * lay.dp, None
        if lay.dp > 1:
            dist.all_reduce(count, group=self.mesh["dp"].get_group())
        total = int(count)
        return total, loss_divisor(total, lay.dp * lay.cp, rows.shape[0] // lay.micro_batch_size)

    def evaluate(self, rows: torch.Tensor) -> float:
        lay = self.layout
        rows = rows.to(self.device, non_blocking=True)
        if self.objective is not None:  # preference pairs: their mean loss, no update
            return self._evaluate_pairs(rows)
        inputs, targets, segments = cp_unpacked(rows, self.layout.cp, self.cp_rank)
        _, divisor = self._trained(rows)
        self.pipeline_loss.divisor = divisor
        if lay.pp > 1 and segments is not None:  # the later stages would attend across examples
            raise ValueError("packed chat rows need parallel.pp=1: set data.packing=false")
        for part in self.parts:
            part.eval()
        try:
            with torch.no_grad(), self._autocast(), self._loss_context():
                if lay.pp > 1:
                    loss = self._pipeline(inputs, targets, train=False)
                else:
                    parts = [
                        self._model_loss(self.parts[0], i, t, seg, divisor).float()
                        for i, t, seg in cp_micro_batches(rows, self.layout, self.cp_rank)
                    ]
                    loss = torch.stack(parts).mean()
        finally:
            for part in self.parts:
                part.train()
        # The same reduction as step(): the loss lives on the last stage, tp peers agree.
        total = loss.detach().float().reshape(1) / (lay.dp * lay.cp * lay.tp)
        dist.all_reduce(total)
        return float(total)

    def _model_loss(
        self,
        model: nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        segments: torch.Tensor | None = None,
        divisor: float | None = None,
    ) -> torch.Tensor:
        """The loss of one micro-batch: chunked inside the model's forward where it applies.
        `segments`: packed examples' ids; `divisor`: the masked loss's (masked_loss)."""
        if self.chunked_loss:
            if segments is None and divisor is None:
                return cast(torch.Tensor, model(inputs, targets))
            return cast(
                torch.Tensor, model(inputs, targets, segments=segments, loss_divisor=divisor)
            )
        output = model(inputs) if segments is None else model(inputs, segments=segments)
        return self._loss_of(output, targets, divisor)

    def _loss_context(self) -> contextlib.AbstractContextManager[None]:
        return loss_context(self.vocab_parallel)

    def _forward_backward(
        self, micro_losses: list[Callable[[], torch.Tensor]], train: bool = True
    ) -> torch.Tensor:
        """The mean of each micro-batch's loss (`micro_losses`, in order), each backward right
        after (`train`), saved activations offloaded where train.activation_offload asks."""
        accum = len(micro_losses)
        loss_sum = torch.zeros((), device=self.device)
        for i, micro_loss in enumerate(micro_losses):
            with self._grad_sync(i == accum - 1), self._loss_context():
                with self._autocast(), self._offloaded():
                    loss = micro_loss()
                scaled = loss / accum
                if train:
                    torch.autograd.backward(
                        self.scaler.scale(scaled) if self.scaler is not None else scaled
                    )
            loss_sum += loss.detach().float()
        return loss_sum / accum

    def _offloaded(self) -> contextlib.AbstractContextManager[Any]:
        """train.activation_offload: the forward's saved tensors to host memory."""
        return self.offload.hooks() if self.offload is not None else contextlib.nullcontext()

    def _pipeline(
        self, inputs: torch.Tensor, targets: torch.Tensor, *, train: bool
    ) -> torch.Tensor:
        first, last = self.pp_rank == 0, self.pp_rank == self.layout.pp - 1
        return run_schedule(
            self.schedule, inputs, targets, first=first, last=last, train=train, device=self.device
        )

    # --- checkpoints (launcher.train.engines.torch_state) -----------------------------------------
    def save(self, directory: Path) -> list[Path]:
        directory = Path(directory)
        written = save_state(
            directory, self.parts, self.optimizer, self.scaler, self.fp8 and self.fsdp
        )
        if self.base_digest is not None and dist.get_rank() == 0:
            path = directory / lora.BASE_FILE
            record = lora.base_record(self.cfg.finetune, self.base_digest, self.cfg.train.init_from)
            path.write_text(json.dumps(record, sort_keys=True) + "\n")
            written = sorted([*written, path])
        return written

    def load(self, directory: Path, files: CheckpointFiles) -> None:
        """Restore from `directory`, every file read once through `files` (checked against the
        manifest); never unpickles code (see ``safe_load``; the ZeRO-1 shard and the scaler are
        read weights-only and as JSON)."""
        directory = Path(directory)
        if self.base_digest is not None:  # adapters apply to the base they were trained on
            problem = lora.base_problem(
                read_json(files, directory / lora.BASE_FILE), self.base_digest
            )
            if problem is not None:
                raise TorchEngineError(f"{directory}: {problem}")
        load_state(
            directory, files, self.parts, self.optimizer, self.scaler, self.fp8 and self.fsdp
        )

    def extra_state(self) -> dict[str, Any]:
        return engine_summary(self)

    def close(self) -> None:
        self.schedule = None
