"""What the memory buckets' sum counts twice on a stage where the engine creates gradients during
the backward as it frees the activations: the backward's timeline node by node
(plan/memory/grad_liveness.py)."""

from __future__ import annotations

from launcher.backends.common import backend_of
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan import finetune
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.memory.grad_liveness import (
    BackwardNode,
    backward_peak,
    layer_backward,
    lazy_gradients,
)
from launcher.plan.memory.model_states import StageStates
from launcher.plan.memory.stage_activations import ActivationParts, activation_parts
from launcher.plan.model_shape import ModelShape


def stage_not_coexisting(
    cfg: LLMTrainConfig,
    layout: Layout,
    stage: int,
    states: StageStates,
    buffers: float,
    parts: ActivationParts | None = None,
) -> float:
    """Bytes by which the buckets' sum exceeds the true peak where the engine creates gradients
    during the backward (plan/memory/grad_liveness.py; 0 where they live in preallocated buffers).

    The timeline of one step's backward (grad_liveness.backward_peak): what lives through it (the
    optimizer states with the fp32 master, the buffers, the weights unless they are autocast's
    copies), then the loss (its logits peak, ``logits_bytes``), the output layer (its gradient;
    the compute-dtype gradients of the logits and, under autocast, of the weight before its cast
    to fp32), the layers last to first (each frees its stored activations and its saved weight
    copies and creates its gradients), the embedding (its gradient; tied, a new gradient summed
    into the output layer's in place: AccumulateGrad adds to an existing .grad).

    `parts`: the stage's ``activation_parts``, when the caller has them."""
    if layout.pp > 1 or layout.num_microbatches != 1 or not lazy_gradients(cfg, layout):
        return 0.0
    if cfg.optim.in_backward:  # the gradient bucket is already the one alive (memory_savers)
        return 0.0
    if parts is None:
        parts = activation_parts(cfg, layout, stage)
    shape = ModelShape(cfg.model)
    m = cfg.model
    p = cfg.precision
    total = states.weights + states.gradients + states.optimizer + buffers
    total += parts.total
    params = max(1.0, states.params)
    grads_per_param = states.gradients / params
    tied = m.tie_embeddings
    vocab_tp = backend_of(cfg).vocab_split(max(1, layout.tp))
    vocab = m.vocab_size * m.hidden_size / vocab_tp
    embedding = shape.embedding_params() / vocab_tp
    head = shape.output_params() / vocab_tp + (vocab if tied else 0.0)
    finetuned = finetune.is_finetune(cfg)
    # torch.autocast (no FSDP): the parameters are fp32 and `weights` is the compute-dtype copies
    # autocast makes for each matmul, saved for its backward and freed with it (the cast cache is
    # cleared when the forward leaves autocast; the engine's backward runs outside it). The
    # embedding lookup runs on the fp32 table: no copy of it exists. FSDP's unsharded compute
    # copies are buffers; fp8 copies are kept.
    compute = float(DTYPE_BYTES[p.compute_dtype])
    autocast = cfg.zero.stage < 2 and compute < 4.0 and not p.fp8
    copies_in_weights = autocast and not finetuned and p.master_weights
    # LoRA with its frozen base stored in fp32 (finetune.frozen_bytes: on the CPU): `weights`
    # is that fp32 base, resident, and autocast's copies of it, which each frozen linear saves to
    # compute its input's gradient, come on top of the buckets.
    base_copies = autocast and finetuned and finetune.frozen_bytes(cfg) > compute
    copy_bytes = compute if copies_in_weights or base_copies else 0.0
    copies_head = copy_bytes * head
    copies_layers = copy_bytes * (params - embedding - (head if not tied else head - vocab))
    resident = states.optimizer + buffers + (0.0 if copies_in_weights else states.weights)
    if finetuned:
        grads_head = grads_embedding = 0.0
    else:
        grads_head = grads_per_param * head
        grads_embedding = grads_per_param * (embedding - (vocab if tied else 0.0))
    grads_layers = states.gradients - grads_head - grads_embedding
    tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp)
    logits_grad = tokens * m.vocab_size * compute / vocab_tp
    # A trained output layer's weight gradient in the compute dtype, before autocast's cast
    # back to the fp32 parameter's dtype (a frozen one makes none).
    head_weight_grad = compute * vocab if copies_in_weights else 0.0
    nodes = [
        BackwardNode(grads=0.0, freed=0.0, transient=parts.head),
        BackwardNode(
            grads=grads_head,
            freed=copies_head,
            transient=logits_grad + head_weight_grad,
        ),
        *layer_backward(
            layout.stage_layers[stage], parts.kept, grads_layers, copies_layers, parts.transient
        ),
        BackwardNode(
            grads=grads_embedding,
            freed=0.0,
            transient=grads_per_param * vocab if tied and not finetuned else 0.0,
        ),
    ]
    peak = resident + backward_peak(parts.kept + copies_head + copies_layers, nodes)
    return total - peak
