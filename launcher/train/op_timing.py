"""Operator timing: the engine's own operators, timed on this machine for `llmtrain calibrate`.

Each function builds the tensors of one operator class at the shapes ``launcher.plan.operators``
lists (the same list the planner looks up) and times it as the engine runs it:
- a GEMM through ``F.linear`` as the engine's nn.Linear calls it, with the engine's mixed
  precision (fp32 weights under torch.autocast to the compute dtype), forward and backward (data
  and weight gradients);
- the attention core (``model.attention_core``, the engine's SDPA call), forward and backward;
- the element-wise work of one layer (``model.norm_layer``, residual adds, ``model.apply_rope``,
  ``model.activate``, dropout), forward and backward;
- the loss over the vocabulary (``model.loss_fn``) with the embedding lookup;
- the optimizer step (``optim.build_optimizer``, gradient clipping, zero_grad).
Each figure is the median of repeats after one warm-up call (on a GPU: the median of three
batches of back-to-back calls, each synchronised once; ``Timer.measure``); repeats shrink to keep
the whole calibration within its time budget. The spread of the repeats is kept for
``launcher.plan.hardware.measurement_noise`` to judge.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from launcher.config.schema import LLMTrainConfig
from launcher.plan.hardware import measurement_noise as noise
from launcher.plan.operators import Gemm, Operators
from launcher.train.model.transformer import (
    activate,
    apply_rope,
    attention_core,
    loss_fn,
    norm_layer,
    rope_tables,
)
from launcher.train.optim import build_optimizer, fused_on

TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Seconds spent on one operator's repeats (after its warm-up call), and the repeat limits.
OP_BUDGET_S = 0.6
MIN_REPEATS, MAX_REPEATS = 3, 50


class Timer:
    def __init__(self, device: torch.device, deadline: float):
        self.device = device
        self.deadline = deadline
        self.spread = 0.0  # the widest relative spread of repeats since take_spread()

    def take_spread(self) -> float:
        """The widest spread of the repeats measured since the last call (measurement_noise)."""
        spread, self.spread = self.spread, 0.0
        return spread

    def _median(self, samples: list[float]) -> float:
        self.spread = max(self.spread, noise.relative_spread(samples))
        return float(statistics.median(samples))

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def measure(self, fn: Callable[[], Any]) -> float:
        """Median seconds of fn() after one warm-up call."""
        fn()
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        first = time.perf_counter() - start
        left = max(0.0, self.deadline - time.monotonic())
        budget = min(OP_BUDGET_S, left / 4)
        repeats = int(min(MAX_REPEATS, max(MIN_REPEATS, budget / max(first, 1e-6))))
        if self.device.type == "cuda":
            # Back to back, one synchronisation per batch: the host queues the next kernels while
            # the GPU runs these, as it does inside a training step. Synchronising after every
            # call would add the host's launch and dispatch time to each (Python, autograd,
            # autocast), which a step overlaps with the GPU's work: measured on one H100 80GB
            # (2026-11-25), one llama3-1b layer's element-wise work timed that way at 1.5 ms
            # forward for ~0.8 GB of traffic, about 5x what the memory moves in.
            batch = max(1, repeats // 3)
            means = []
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(batch):
                    fn()
                self.sync()
                means.append((time.perf_counter() - start) / batch)
            return self._median(means)
        times = [first]
        for _ in range(repeats - 1):
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        return self._median(times)


def fwd_bwd(
    timer: Timer,
    forward: Callable[[], list[torch.Tensor]],
    inputs: list[torch.Tensor],
) -> tuple[float, float]:
    """(forward, backward) seconds: forward alone, and forward + backward less it. `forward`
    returns its outputs; the backward starts from gradients of ones and computes the gradients of
    `inputs` (torch.autograd.grad: fresh tensors each time, as a training step's activation
    gradients are, not accumulated into .grad over the repeats)."""
    with torch.no_grad():
        outs = forward()
    seeds = [torch.ones_like(o) for o in outs]

    def fwd() -> None:
        forward()

    def both() -> None:
        torch.autograd.grad(forward(), inputs, seeds)

    f = timer.measure(fwd)
    fb = timer.measure(both)
    return f, max(1e-9, fb - f)


def autocast(device: torch.device, dtype: torch.dtype) -> Any:
    """torch.autocast to `dtype` (the engine's mixed precision); nothing for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def measure_gemm(
    g: Gemm, timer: Timer, device: torch.device, dtype: torch.dtype, bias: bool
) -> tuple[float, float]:
    x = torch.randn(g.m, g.k, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(g.n, g.k, device=device, dtype=torch.float32, requires_grad=True)
    b = torch.zeros(g.n, device=device, dtype=torch.float32, requires_grad=True) if bias else None

    def forward() -> list[torch.Tensor]:
        with autocast(device, dtype):
            return [F.linear(x, w, b)]

    return fwd_bwd(timer, forward, [x, w] + ([b] if b is not None else []))


def measure_attention(
    ops: Operators, timer: Timer, device: torch.device, dtype: torch.dtype, dropout: float
) -> tuple[float, float]:
    a = ops.attention
    q = torch.randn(a.batch, a.heads, a.seq, a.head_dim, device=device, dtype=dtype)
    k = torch.randn(a.batch, a.kv_heads, a.seq, a.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    for t in (q, k, v):
        t.requires_grad_(True)
    return fwd_bwd(timer, lambda: [attention_core(q, k, v, a.kind, dropout)], [q, k, v])


def measure_elementwise(
    cfg: LLMTrainConfig, ops: Operators, timer: Timer, device: torch.device, dtype: torch.dtype
) -> tuple[float, float]:
    """One layer's element-wise work (operators.elementwise_bytes counts the same ops)."""
    m = cfg.model
    a = ops.attention
    b, s = a.batch, max(1, ops.tokens // max(1, a.batch))
    h, f = ops.hidden, ops.ffn_local
    norm1 = norm_layer(m.norm, h).to(device)
    norm2 = norm_layer(m.norm, h).to(device)
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    branch = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    gate = torch.randn(b, s, f, device=device, dtype=dtype, requires_grad=True)
    up = torch.randn_like(gate).requires_grad_(True) if ops.gated else None
    q = torch.randn(b, s, a.heads, a.head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(b, s, a.kv_heads, a.head_dim, device=device, dtype=dtype, requires_grad=True)
    cos, sin = rope_tables(s, a.head_dim, device, None, m.rope_theta)
    p = m.hidden_dropout

    def forward() -> list[torch.Tensor]:
        with autocast(device, dtype):
            r = x + branch
            outs = [norm1(x), norm2(r), activate(m.activation, gate, up), r + branch]
            if ops.rope:
                outs += [apply_rope(q, cos, sin), apply_rope(k, cos, sin)]
            if ops.dropout and p > 0:
                outs += [F.dropout(r, p, training=True), F.dropout(outs[3], p, training=True)]
            return outs

    leaves = [x, branch, gate, *list(norm1.parameters()), *list(norm2.parameters())]
    leaves += ([up] if up is not None else []) + ([q, k] if ops.rope else [])
    return fwd_bwd(timer, forward, leaves)


def measure_loss(
    cfg: LLMTrainConfig, ops: Operators, timer: Timer, device: torch.device, dtype: torch.dtype
) -> tuple[float, float]:
    a = ops.attention
    b, s = a.batch, max(1, ops.tokens // max(1, a.batch))
    logits = torch.randn(b, s, ops.vocab_local, device=device, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, ops.vocab_local, (b, s), device=device)
    emb = torch.nn.Embedding(ops.vocab_local, ops.hidden).to(device)

    def forward() -> list[torch.Tensor]:
        return [loss_fn(logits, targets), emb(targets)]

    return fwd_bwd(timer, forward, [logits, emb.weight])


# Parameters the optimizer is timed on at most: on the CPU a bound on calibrate's time; on a GPU
# what fits in a share of the free memory at OPTIMIZER_BYTES_PER_PARAM (fp32 weight, gradient,
# two Adam states, the gradients' source copy and the foreach temporaries).
CPU_OPTIMIZER_PARAMS = 64_000_000
OPTIMIZER_BYTES_PER_PARAM = 28
OPTIMIZER_MEMORY_SHARE = 0.5


def optimizer_sizes(params: int, tensors: int, device: torch.device) -> tuple[int, int]:
    """(large, small) parameter counts to time the optimizer step at: the rank's own count when
    the device holds it, and a quarter of it, so that the step's fixed cost (a kernel launch per
    tensor and operation, clipping's norm, zero_grad) and its cost per parameter are told apart
    (plan.profile.Rates.optimizer_s fits the line through them)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cap = int(free * OPTIMIZER_MEMORY_SHARE / OPTIMIZER_BYTES_PER_PARAM)
    else:
        cap = CPU_OPTIMIZER_PARAMS
    large = max(tensors, min(params, cap))
    return large, max(tensors, large // 4)


def time_optimizer(
    cfg: LLMTrainConfig, size: int, tensors: int, fused: bool, timer: Timer, device: torch.device
) -> float:
    weights = [torch.nn.Parameter(torch.randn(size, device=device)) for _ in range(tensors)]
    grads = [torch.randn(size, device=device) * 1e-3 for _ in range(tensors)]
    optimizer = build_optimizer(weights, cfg.optim, fused=fused)
    clip = cfg.optim.grad_clip

    def step() -> None:
        for w, g in zip(weights, grads, strict=True):
            w.grad = g
        if clip and clip > 0:
            torch.nn.utils.clip_grad_norm_(weights, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timer.measure(step)


def measure_optimizer(
    cfg: LLMTrainConfig, params: int, tensors: int, timer: Timer, device: torch.device
) -> list[tuple[int, float]]:
    """[(parameters measured, seconds)] of clip + step + zero_grad as the engines run them (the
    fused Adam kernel on CUDA, train.optim.fused_on), at optimizer_sizes."""
    fused = fused_on(device)
    out: list[tuple[int, float]] = []
    for measured in optimizer_sizes(params, tensors, device):
        size = max(1, measured // tensors)
        out.append((size * tensors, time_optimizer(cfg, size, tensors, fused, timer, device)))
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the large size's tensors, freed on return
    return out


__all__ = [
    "TORCH_DTYPE",
    "Timer",
    "autocast",
    "fwd_bwd",
    "measure_attention",
    "measure_elementwise",
    "measure_gemm",
    "measure_loss",
    "measure_optimizer",
    "optimizer_sizes",
    "time_optimizer",
]
