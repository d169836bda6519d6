"""Megatron-FSDP's unsharded working buffers (backend=megatron, zero.stage=3: --use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads_params). Its sharded states are ZeRO-3's (model
weights, fp32 main weights, gradients and optimizer states all split over the data-parallel
ranks: plan/memory/model_states.py); what differs from the generic ZeRO-3 count (the layer being
computed, one prefetched, one layer's gradients) is how far it gathers ahead and how long it
keeps unsharded gradients.

Read in NVIDIA/Megatron-LM core_v0.16.1 (commit 55ac7082517c3878ae653c07c09c534b8aed49f6),
megatron/core/distributed/fsdp/src/megatron_fsdp/:
- megatron_fsdp.py: the communication unit is twice the mean FSDP unit (a transformer layer's
  parameters on this rank), and at least 1e9 elements ("Cap to 1B elements" takes the max); the
  reduce-scatter queue's capacity is one unit, the all-gather prefetch half of one.
- param_and_grad_buffer.py, AllGatherPipeline: after the unit it needs, it prefetches the next
  units until the prefetched elements reach the prefetch size, so ceil(prefetch / unit) units
  ahead; each unit's unsharded weights are freed after its forward (and again after its
  backward), so 1 + that many units are whole at once.
- param_and_grad_buffer.py, GradReducePipeline.wait_for_previous_grad_reduce: a unit's unsharded
  gradient bucket is freed only when it is popped from the reduce-scatter queue, which happens
  once the queued elements exceed the capacity; so floor(capacity / unit) queued units, the one
  just enqueued and the one whose backward is producing gradients are whole at once.
"""

from __future__ import annotations

import math

# megatron_fsdp.py: the communication unit's floor, in elements.
MIN_COMMUNICATION_UNIT = 1_000_000_000


def whole_units(unit: float, layers: int) -> tuple[int, int]:
    """(weight units, gradient units) unsharded at once at the backward's peak, for layers of
    `unit` parameters on this rank (module docstring), capped at the `layers` there are."""
    unit = max(1.0, unit)
    communication = max(MIN_COMMUNICATION_UNIT, 2.0 * unit)
    prefetch = communication // 2
    weights = 1 + math.ceil(prefetch / unit)
    grads = math.floor(communication / unit) + 2
    cap = max(1, layers)
    return min(weights, cap), min(grads, cap)


def megatron_fsdp_buffers(
    unit: float, layers: int, *, weight_bytes: float, grad_bytes: float
) -> float:
    """Bytes of Megatron-FSDP's unsharded weights and gradients at once on one GPU: `unit` the
    largest layer's parameters on this rank, `layers` the most layers a stage holds, the bytes
    per parameter of the compute weights and of the gradients."""
    w, g = whole_units(unit, layers)
    return unit * (w * weight_bytes + g * grad_bytes)


__all__ = ["MIN_COMMUNICATION_UNIT", "megatron_fsdp_buffers", "whole_units"]
