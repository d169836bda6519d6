"""When gradients come to exist during the backward, and the peak that follows.

The memory plan's buckets (plan/memory/estimate.py) are each at their own peak; summing them is
right when every bucket is live at one moment. That holds where gradients live in buffers allocated
before the step: DDP's reducer allocates its buckets' gradient storage when the wrapper is built
(torch/nn/parallel/distributed.py hands the parameters to the C++ ``Reducer``, whose
``initialize_buckets`` allocates each bucket's flat gradient tensor), DeepSpeed's ZeRO keeps a
contiguous gradient partition and its IPG bucket from initialisation, and Megatron's
DistributedDataParallel allocates its grad buffer at init (``_ParamAndGradBuffer``). It also
holds whenever a step has more than one micro-batch: the first backward's gradients stay while
the next forward stores its activations.

It does not hold where PyTorch's autograd creates each gradient lazily: a leaf's ``AccumulateGrad``
node assigns ``.grad`` the first time it runs in a backward (torch/csrc/autograd/functions/
accumulate_grad.h: a new tensor when ``.grad`` is undefined; ``optimizer.zero_grad(set_to_none=
True)``, the engines' default, leaves it undefined between steps), and each node's saved tensors
are released when that node's backward has run (``retain_graph=False``: ``SavedVariable`` data
freed by ``Node::release_variables``). The backward walks the layers from the last to the first,
so the stored activations (and, under ``torch.autocast``, the compute-dtype weight copies the
matmuls saved) shrink layer by layer while the gradients grow layer by layer: their sum is never
live. Engines where this holds (llmtrain's torch engine, ``lazy_gradients``):
- one replica without FSDP: no DDP wrapper (torch_parallelize.apply_dp), plain ``.grad``;
- FSDP2 (zero.stage 2/3): ``foreach_reduce`` (torch/distributed/fsdp/_fully_shard/
  _fsdp_collectives.py) allocates each layer group's reduce-scatter output during that group's
  post-backward and sets the sharded parameters' ``.grad`` as views of it; the unsharded
  gradients are freed after the reduce-scatter (the plan's buffers hold one layer of them).
Not under pipelining (gradients accumulate over the schedule's micro-batches), nor with
``manual_dp_sync`` or DDP (dp x cp > 1 without FSDP), nor with CPU offload (plan/memory/offload.py
places the gradients).

The peak is then the bytes that live through the whole step plus the largest value, over the
backward, of (activations not yet freed + gradients already allocated + the running node's
working tensors): ``backward_peak``. Everything here is arithmetic on the plan's own buckets;
nothing is fitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.backends.common import backend_of
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig


@dataclass(frozen=True)
class BackwardNode:
    """One step of the backward, in the order it runs.

    grads: gradient bytes its AccumulateGrad nodes allocate; freed: saved bytes released once it
    has run; transient: working tensors alive only while it runs."""

    grads: float
    freed: float
    transient: float = 0.0


def backward_peak(at_start: float, nodes: Sequence[BackwardNode]) -> float:
    """The most bytes live at once from the end of the forward to the end of the backward, beyond
    what lives through the whole step: `at_start` is what the forward left for the backward
    (stored activations, saved weight copies); each node first allocates its gradients and
    working tensors, then releases what it saved."""
    live = peak = at_start
    for node in nodes:
        peak = max(peak, live + node.grads + node.transient)
        live += node.grads - node.freed
    return max(peak, live)


def lazy_gradients(cfg: LLMTrainConfig, layout: Layout) -> bool:
    """Whether the engine's gradients are created during the backward (module docstring), so that
    activations and gradients are not live at their peaks together."""
    if backend_of(cfg).name != "torch":
        return False
    z = cfg.zero
    if layout.pp > 1 or layout.num_microbatches != 1:
        return False
    if z.offload_optimizer != "none" or z.offload_params != "none":
        return False
    fsdp = z.stage >= 2
    return fsdp or layout.dp * layout.cp == 1


def layer_backward(
    layers: int,
    stored: float,
    layer_grads: float,
    copies: float,
    transient: float,
) -> list[BackwardNode]:
    """The transformer layers' backward, last layer first: each frees its share of the `stored`
    activations and of the saved compute-dtype weight `copies`, allocates its share of
    `layer_grads`, and holds `transient` (one layer's working set: recompute, cp ring, MoE
    dispatch) while it runs. The layers of a stage are alike, so the shares are equal."""
    n = max(1, layers)
    node = BackwardNode(grads=layer_grads / n, freed=(stored + copies) / n, transient=transient)
    return [node] * n


def reserved_reuses_activations(cfg: LLMTrainConfig) -> bool:
    """Whether the caching allocator can give the gradients the blocks the freed activations
    leave, so that `reserved` follows the backward's timeline as `allocated` does.

    torch's CUDA caching allocator hands a cached block only to an allocation on the stream it
    was allocated on (c10/cuda/CUDACachingAllocator.cpp: a free block is looked up by size *and*
    stream; torch.Tensor.record_stream's documentation states the rule). Without FSDP the
    gradients are made by the backward's kernels on the stream of the forward that freed the
    activations: the blocks are reused. FSDP2's sharded gradients are views of the reduce-scatter
    output that ``foreach_reduce`` allocates under ``torch.cuda.stream(reduce_scatter_stream)``:
    another stream's pool, which the default stream's cached activation blocks never serve, so the
    reserved memory holds both, as the buckets' sum counts them. (Consistent with torchtitan's
    FSDP2 llama3-8B and -70B runs of plan/calibration/reference_runs.py: their measured reserved
    memory is in 3% (median) of the sum x fragmentation and 10% above the allocated timeline x
    fragmentation.)"""
    return cfg.zero.stage < 2
