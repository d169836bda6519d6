"""The torch engine's steps over preference pairs (finetune.objective=dpo|simpo|orpo): one
concatenated forward per micro-batch through ``finetune.preference``, with the engine's
micro-batch loop, autocast, loss context (vocabulary-parallel logits under tp) and gradient sync;
and dpo's frozen reference copy (finetune.reference=copy), built as the policy is.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from launcher.train.engines.torch_loss import token_log_probs
from launcher.train.engines.torch_parallelize import apply_dp, apply_tp
from launcher.train.finetune.preference import PreferenceObjective, response_tokens
from launcher.train.model import fp8
from launcher.train.model.transformer import build_model


class PairSteps:
    """Mixed into ``TorchEngine``: what it does with preference rows [n, 2, 3, seq + 1]."""

    objective: PreferenceObjective | None
    cfg: Any
    layout: Any
    mesh: Any
    dp_mesh: Any
    parts: list[nn.Module]
    reference_copy: nn.Module | None
    vocab_parallel: bool
    device: torch.device
    compute_dtype: torch.dtype
    grad_dtype: torch.dtype
    pure_bf16: bool
    fp8: bool
    fsdp: bool
    tp_styles: tuple[type[Any], type[Any]]
    _materialise: Callable[[nn.Module, int], None]
    _forward_backward: Callable[..., torch.Tensor]
    _autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    _loss_context: Callable[[], contextlib.AbstractContextManager[None]]

    def _pairs_step(
        self, rows: torch.Tensor, reference: torch.Tensor | None, train: bool = True
    ) -> tuple[torch.Tensor, int]:
        """(loss, response tokens of the global batch) of preference pairs: one concatenated
        forward per micro-batch (launcher.train.finetune.preference)."""
        assert self.objective is not None
        count = response_tokens(rows).to(torch.int64)
        if self.layout.dp > 1:
            dist.all_reduce(count, group=self.mesh["dp"].get_group())
        model, objective = self.parts[0], self.objective

        copy = self.reference_copy

        def micro(chunk: slice) -> torch.Tensor:
            ref = None if reference is None else reference[chunk]
            return objective.micro_loss(model, model, self._token_logps, rows[chunk], ref, copy)

        mbs, accum = self.layout.micro_batch_size, self.layout.grad_accum
        chunks = [slice(i * mbs, (i + 1) * mbs) for i in range(accum)]
        loss = self._forward_backward([functools.partial(micro, c) for c in chunks], train)
        if train:  # the step's reward metrics over data parallel (a collective)
            objective.finish(self.mesh["dp"].get_group())
        return loss, int(count)

    def _token_logps(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_log_probs(output, targets, self.vocab_parallel)

    def _evaluate_pairs(self, rows: torch.Tensor) -> float:
        assert self.objective is not None
        for part in self.parts:
            part.eval()
        try:
            with torch.no_grad():
                loss, _ = self._pairs_step(rows, None, train=False)
        finally:
            for part in self.parts:
                part.train()
        self.objective.sums = None  # evaluation pairs are not the step's metrics
        total = loss.detach().float().reshape(1) / (self.layout.dp * self.layout.tp)
        dist.all_reduce(total)
        return float(total)

    @torch.no_grad()
    def reference_logps(self, rows: torch.Tensor) -> torch.Tensor:
        """Summed response log-probs [n, 2] of preference pairs, the model as it is, in eval
        mode: the precomputed reference's pass (launcher.train.finetune.preference_reference)."""
        assert self.objective is not None
        model = self.parts[0]
        model.eval()
        try:
            with self._autocast(), self._loss_context():
                pairs = rows.to(self.device)
                micro = self.layout.micro_batch_size
                return self.objective.logps(model, self._token_logps, pairs, micro)
        finally:
            model.train()

    def _reference_copy(self, seed: int) -> nn.Module | None:
        """dpo with finetune.reference=copy (finetune=full): the frozen reference, built in the
        policy's order (``TorchEngine._build_part``, ``train.parallel.build``): on meta, its
        weights in the frozen dtype (the compute dtype on a GPU, fp32 on the CPU, as LoRA's
        frozen base), fp8 layers and tensor parallel as the policy's, then its own FSDP2 over
        dp (zero.stage 2/3; resharded after every forward) and this rank's shard filled from
        train.init_from, else drawn from the policy's seed: the policy's weights before step 1.
        No adapters, no recompute, no DDP, no gradients, eval mode. None for any other run."""
        if self.objective is None or self.objective.mode != "copy":
            return None
        cfg, lay = self.cfg, self.layout
        model = build_model(cfg.model, "meta")
        frozen = self.compute_dtype if self.device.type == "cuda" else torch.float32
        model.to(torch.bfloat16 if self.pure_bf16 else frozen)
        if self.fp8:
            fp8.convert_as_configured(model, cfg.precision, self.fsdp)
        if lay.tp > 1:
            apply_tp(model, self.mesh["tp"], cfg, self.tp_styles, first_chunk=True)
        model.chunked_loss = False  # the reference's log-probs come from full logits
        model.requires_grad_(False)
        dtypes = (self.compute_dtype, self.grad_dtype)
        # FSDP2 shards in place (fully_shard returns the same module); elsewhere no wrapper.
        apply_dp(model, cfg, self.dp_mesh, self.device, dtypes, False, frozen=True)
        self._materialise(model, seed)
        return model.eval()
