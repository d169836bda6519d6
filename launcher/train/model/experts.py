"""The routed experts of an MoE layer as grouped GEMMs: no Python loop over experts.

The experts keep their parameters as separate ``MLP`` modules (``moe.experts.<e>.w1.weight`` ...),
so checkpoints, export, ``train.init_from``, expert-parallel deletion and the tensor-parallel plan
see the same names and shapes as before. Per forward their weights are stacked into [E, out, in]
tensors in the compute dtype (one extra read and write of the expert weights per forward, the
price of keeping the checkpoint layout; autocast casts each weight per call anyway), and the
tokens, sorted by expert, go through one GEMM per projection for all experts:

- ``torch._grouped_mm`` (``torch.nn.functional.grouped_mm``: one kernel over jagged groups given
  by int32 end offsets, no host synchronisation) where the build runs it: CUDA bf16 on compute
  capability 8.0+ (the documented requirement in torch 2.13's ``grouped_mm`` docstring), and CPU in
  eager mode (torch 2.13 CPU runs it for fp32/bf16; its meta kernel, which torch.compile traces,
  accepts bf16 only). Every row stride must be a multiple of 16 bytes
  (``torch/_meta_registrations.py``, ``check_valid_strides``), so hidden and ffn sizes must be
  multiples of 16 bytes / element size;
- elsewhere a padded batched GEMM (``torch.bmm`` over [E, C, h], C the largest expert's token
  count: one host synchronisation, the padding computed and discarded).

Token permutation (both paths, and under expert parallel): ``argsort`` of the expert index
(stable), a gather of the token rows, and back by the inverse permutation; the k outputs of each
token are then weighted by their gates and summed (no atomics, deterministic).

Under tensor parallel the experts' w1/w3 are column-parallel and w2 row-parallel DTensors (the
engine's plan): the local shards are used directly, the input's gradient is summed over tp on the
way back and the routed output (weighted and combined first, so [T, h] travels, not [T*k, h]) is
summed over tp on the way out (Megatron-LM's f and g operators, Shoeybi et al. 2019). With a bias
on w2 the sum over tp comes before the combine ([T*k, h], as per-expert row-parallel layers do),
so that the replicated bias is added once where the expert lives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from launcher.train.parallel.expert_parallel import (
    ExpertParallel,
    dispatch_combine,
    inverse,
    sort_by_expert,
)

GROUPED_MM_MIN_CAPABILITY = (8, 0)
GROUPED_MM_ALIGN_BYTES = 16


@dataclass
class StackedExperts:
    """The local experts' weights stacked [E, out, in] in the compute dtype, biases [E, out] (or
    None), and the tensor-parallel group the weights are sharded over (None: not sharded)."""

    w1: torch.Tensor
    w2: torch.Tensor
    w3: torch.Tensor | None
    b1: torch.Tensor | None
    b2: torch.Tensor | None
    b3: torch.Tensor | None
    activation: str
    tp_group: Any = None

    @property
    def num(self) -> int:
        return int(self.w1.shape[0])


def _local(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The local shard of a (tensor-parallel) DTensor parameter, and its mesh's group."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.to_local(), t.device_mesh.get_group()
    return t, None


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the experts compute in: autocast's when it is on, else the input's."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


def stack(experts: Sequence[nn.Module], activation: str, dtype: torch.dtype) -> StackedExperts:
    """Stack the MLP experts (in order) into [E, out, in] weights of `dtype`."""
    group: Any = None

    def weights(name: str, part: str) -> torch.Tensor | None:
        nonlocal group
        tensors = []
        for expert in experts:
            linear = getattr(expert, name)
            if linear is None:
                return None
            tensor = getattr(linear, part)
            if tensor is None:
                return None
            local, g = _local(tensor)
            if part == "weight" and g is not None:
                group = g
            tensors.append(local.to(dtype))
        return torch.stack(tensors)

    w1, w2 = weights("w1", "weight"), weights("w2", "weight")
    assert w1 is not None and w2 is not None
    return StackedExperts(
        w1=w1,
        w2=w2,
        w3=weights("w3", "weight"),
        b1=weights("w1", "bias"),
        b2=weights("w2", "bias"),
        b3=weights("w3", "bias"),
        activation=activation,
        tp_group=group,
    )


def grouped_mm_applies(x: torch.Tensor, w: StackedExperts) -> bool:
    """Whether ``torch._grouped_mm`` runs these operands here (module docstring)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    size = x.element_size()
    dims = (x.shape[-1], w.w1.shape[1], w.w2.shape[1])
    if any((d * size) % GROUPED_MM_ALIGN_BYTES for d in dims):
        return False
    if x.device.type == "cuda":
        return (
            x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device) >= GROUPED_MM_MIN_CAPABILITY
        )
    if x.device.type == "cpu":  # fp32/bf16 only (float64 is refused: "Expected mat_a to be ...")
        return x.dtype == torch.bfloat16 or (
            x.dtype == torch.float32 and not torch.compiler.is_compiling()
        )
    return False


class _CopyToTP(torch.autograd.Function):
    """Identity forward; the gradient summed over the tensor-parallel group backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        total = grad.contiguous().clone()  # autograd's buffer is not ours to modify
        dist.all_reduce(total, group=ctx.group)
        return total, None


class _ReduceFromTP(torch.autograd.Function):
    """Sum over the tensor-parallel group forward; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None


def copy_to_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return cast(torch.Tensor, _CopyToTP.apply(x, group))  # type: ignore[no-untyped-call]


def reduce_from_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return cast(torch.Tensor, _ReduceFromTP.apply(x, group))  # type: ignore[no-untyped-call]


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x [N, in] (rows grouped by expert, group ends `offs`) times each group's w [out, in]^T."""
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)


def _padded(x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, capacity: int) -> torch.Tensor:
    """The same product by ``torch.bmm`` over [E, capacity, in] (zero rows padded): row i of `x`
    goes to padded row ``rows[i]`` = expert * capacity + its place within the expert."""
    experts = w.shape[0]
    padded = x.new_zeros((experts * capacity, x.shape[-1])).index_copy(0, rows, x)
    out = torch.bmm(padded.view(experts, capacity, -1), w.transpose(-2, -1))
    return out.reshape(experts * capacity, -1).index_select(0, rows)


def run_sorted(x: torch.Tensor, counts: torch.Tensor, w: StackedExperts) -> torch.Tensor:
    """Every expert's MLP on its rows: x [N, h] sorted by expert, counts [E] rows per expert
    (summing to N); returns [N, h]. Under tp: this rank's partial sum of w2's output, or, when w2
    has a bias, the sum over tp plus the bias."""
    x = x.to(w.w1.dtype)
    n = x.shape[0]
    expert = torch.repeat_interleave(
        torch.arange(w.num, device=x.device), counts.to(x.device), output_size=n
    )
    if grouped_mm_applies(x, w):
        offs = counts.cumsum(0).to(device=x.device, dtype=torch.int32)

        def mm(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return _grouped(a, weight, offs)
    else:
        starts = counts.cumsum(0) - counts
        slot = torch.arange(n, device=x.device) - starts.to(x.device)[expert]
        capacity = int(counts.max()) if n else 0
        rows = expert * capacity + slot

        def mm(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return _padded(a, weight, rows, capacity)

    if n == 0:  # no rows: keep every weight in the graph (zero gradients), shapes intact
        used = [t for t in (w.w1, w.w2, w.w3, w.b1, w.b2, w.b3) if t is not None]
        return x.new_zeros((0, w.w2.shape[1])) + sum(t.sum() * 0 for t in used)
    a = mm(x, w.w1)
    if w.b1 is not None:
        a = a + w.b1[expert]
    if w.activation == "swiglu":
        assert w.w3 is not None
        up = mm(x, w.w3)
        if w.b3 is not None:
            up = up + w.b3[expert]
        hidden = F.silu(a) * up
    else:
        hidden = F.gelu(a, approximate="tanh")
    out = mm(hidden, w.w2)
    if w.b2 is not None:
        if w.tp_group is not None:  # the whole sum first, then the (replicated) bias once
            out = reduce_from_tp(out, w.tp_group)
        out = out + w.b2[expert]
    return out


def routed(
    flat: torch.Tensor,
    top_index: torch.Tensor,
    gates: torch.Tensor,
    w: StackedExperts,
    ep: ExpertParallel | None = None,
    num_experts: int | None = None,
) -> torch.Tensor:
    """The routed experts' output [T, h] for tokens `flat` [T, h] routed to `top_index` [T, k]
    with weights `gates` [T, k]: all experts local, or under expert parallel `ep` (`w` then holds
    this rank's E/ep experts of `num_experts`; tokens travel by all-to-all)."""
    t, k = top_index.shape
    if w.tp_group is not None:
        flat = copy_to_tp(flat, w.tp_group)
    if ep is None:
        order, counts = sort_by_expert(top_index.reshape(-1), w.num)
        y = run_sorted(flat[order // k], counts, w)[inverse(order)]
    else:
        assert num_experts is not None
        y = dispatch_combine(flat, top_index, lambda x, c: run_sorted(x, c, w), num_experts, ep)
    out = combine(y.view(t, k, -1), gates, flat.dtype)
    if w.tp_group is not None and w.b2 is None:
        out = reduce_from_tp(out, w.tp_group)
    return out


def combine(y: torch.Tensor, gates: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_k gates[t, k] * y[t, k, :] in the compute dtype of y, returned as `dtype`."""
    return (y * gates.to(y.dtype).unsqueeze(-1)).sum(1).to(dtype)
