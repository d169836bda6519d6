"""The backward's timeline (plan/memory/grad_liveness.py) and where the plan applies it."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.plan.memory.grad_liveness import BackwardNode, backward_peak, layer_backward
from launcher.plan.planner import make_plan

pytestmark = pytest.mark.unit

MIB = 2**20


def test_activations_heavier_than_gradients_peak_at_the_start() -> None:
    # 4 layers each storing 10 and making 2 of gradients: 40 live at the start, then 40 - 8k + 2k.
    nodes = layer_backward(4, stored=40.0, layer_grads=8.0, copies=0.0, transient=0.0)
    assert backward_peak(40.0, nodes) == pytest.approx(40.0 + 2.0)  # first node's grads first


def test_gradients_heavier_than_activations_peak_at_the_end() -> None:
    nodes = layer_backward(4, stored=4.0, layer_grads=40.0, copies=0.0, transient=0.0)
    # Before the last layer: 4 - 3 x 1 + 3 x 10 = 31; it makes its 10 before freeing its 1: 41.
    assert backward_peak(4.0, nodes) == pytest.approx(41.0)


def test_a_transient_counts_only_while_its_node_runs() -> None:
    nodes = [BackwardNode(grads=0.0, freed=0.0, transient=30.0), BackwardNode(1.0, 10.0)]
    assert backward_peak(10.0, nodes) == pytest.approx(40.0)


LLAMA_1B = [
    "model=llama3-1b",
    "model.seq_length=2048",
    "precision=bf16",
    "cluster=h100-80gb",
    "cluster.gpus_per_node=1",
    "recipe=tiny",
    "backend=torch",
    "train.micro_batch_size=1",
    "train.global_batch_size=1",
    "train.chunked_loss=false",
    "train.recompute=none",
    "zero.stage=0",
]


def test_llama3_1b_one_gpu_peaks_without_its_gradients() -> None:
    """Measured on one H200 (bench/lora_memory.py --gpu): 23,135 MiB max_memory_allocated; the
    buckets' sum said 27,104. The activations (6,530 MiB with the 12-byte-a-logit loss) outweigh
    the fp32 gradients (4,714) and the bf16 copies (2,357) are freed with them, so the peak is at
    the start of the backward: fp32 params 4,714 + Adam m and v 9,429 + copies 2,357 + activations
    6,530 = 23,030 MiB (the head's gradient, 1,002 MiB, comes after the loss's peak). The
    activations count autocast's fp32 residual stream and its bf16 copy per projection
    (layer_activations.residual_stream: 10h a token a layer more than a bf16 stream, 16 x 2048
    x 20,480 B = 640 MiB; before it the plan said 22,390, 3.2% under)."""
    h = make_plan(compose_config(LLAMA_1B).config).memory.heaviest
    summed = h.weights + h.gradients + h.optimizer + h.activations + h.buffers
    assert h.allocated == pytest.approx(summed - h.gradients, rel=1e-6)
    assert h.allocated / MIB == pytest.approx(23_030, abs=5)
    assert h.reserved == pytest.approx(h.allocated * h.fragmentation)


def test_more_micro_batches_keep_the_sum() -> None:
    """With grad_accum 2 the first backward's gradients stay through the second forward."""
    cfg = compose_config([*LLAMA_1B, "train.global_batch_size=2"]).config
    h = make_plan(cfg).memory.heaviest
    assert h.not_coexisting == 0.0


def test_fsdp_reserves_the_sum_but_allocates_the_timeline() -> None:
    cfg = compose_config([*LLAMA_1B, "zero.stage=3", "cluster.gpus_per_node=8"]).config
    h = make_plan(cfg).memory.heaviest
    assert h.not_coexisting > 0.0
    summed = h.allocated + h.not_coexisting
    assert h.reserved == pytest.approx(summed * h.fragmentation)
