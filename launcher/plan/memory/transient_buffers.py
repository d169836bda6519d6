"""Working sets that exist once per stage, for the layer or the loss being computed, not per
layer: context parallel's K/V ring buffers, the MoE token dispatcher's buffers, and the output
logits and loss at their peak on the last stage."""

from __future__ import annotations

from launcher.backends.common import backend_of, moe_dispatcher
from launcher.backends.engine_choices import engine_choices, loss_chunk_tokens
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.model_shape import ModelShape

# The eager PyTorch loss on full logits (llmtrain's torch engine,
# launcher/train/model/transformer.py loss_fn; torchtitan's loss_fn, not compiled: "TODO: compiling
# loss function causes CUDA errors" in its train.py of 2024-25) is F.cross_entropy(logits.float()):
# log_softmax then nll_loss, each its own fp32 tensor. The caller drops the logits before the
# backward (torchtitan: "del pred ... need to free to before bwd to avoid peaking memory";
# llmtrain's model returns only the loss). The forward holds the logits, their fp32 copy and the
# fp32 log-softmax (dtype + 8 bytes a logit); the backward's peak is in log_softmax_backward: the
# saved fp32 log-softmax, nll_loss's fp32 gradient and the fp32 gradient it writes (aten
# _log_softmax_backward_data allocates its result): 12 bytes a logit, 4 more than Megatron's
# vocab-parallel cross-entropy, whose backward writes the gradient into its saved softmax in place
# (tensor_parallel/cross_entropy.py).
EAGER_LOSS_BACKWARD_BYTES = 12.0


# With tp > 1 the vocabulary-split loss of PyTorch (torch/distributed/tensor/parallel/loss.py,
# loss_parallel, torchtitan's default with TP) computes the backward of nll_loss and log_softmax
# together as (zeros_like(x) scattered + exp(x)) * grad: the saved fp32 log-softmax x, the zeros,
# exp(x) and their sum (then the product) are four fp32 tensors at once: 16 bytes a logit (its
# forward: the logits, the fp32 copy, the shifted logits and their exp, 14).
LOSS_PARALLEL_BACKWARD_BYTES = 16.0


def cp_ring_bytes(cfg: LLMTrainConfig, layout: Layout) -> float:
    """Context parallel's ring buffers on one GPU at their peak, for the one layer whose attention
    runs (0 without cp). The stored activations already split over cp (every rank keeps only its
    own tokens' q, k, v, output and log-sum-exp: ring attention saves no score matrix), and each
    ring step is one fused attention kernel call whose workspace is O(rows + keys), never a score
    matrix, like the whole-sequence flash kernel's, which is not counted either.

    Megatron-core (Transformer Engine's AttnFuncWithCPAndKVP2P): a double buffer of the rank's
    K/V chunk in the forward; in the backward the K/V chunk and its gradient dK/dV travel together
    in double buffers: the received K/V, the received dK/dV and the rank's own dK/dV, three local
    K/V sizes in the compute dtype beyond the saved K/V.
    llmtrain's torch engine (launcher/train/parallel/ring_attention.py, ring_backward) peaks at an
    exchange of its backward: the K/V it sends and the K/V it receives in the compute dtype, the
    fp32 dK/dV it sends and receives, and its fp32 dq accumulator: (2 x dtype + 2 x 4) bytes per
    local K/V element + 4 per local q element. (cp 2 holds one K/V copy fewer: the first send is
    the saved K/V itself. At each kernel call it holds one K/V copy, the fp32 dK/dV and dq, and
    the block's dq, dK, dV in the compute dtype: no more than at the exchange while dtype x q <=
    4 x (K and V), i.e. query heads at most 4 per kv head in bf16, 2 in fp32.) The forward holds
    less: two K/V copies in the compute dtype, the fp32 output accumulator, one block's output."""
    if layout.cp <= 1:
        return 0.0
    shape = ModelShape(cfg.model)
    m = cfg.model
    if shape.is_mla:
        kv_dim = m.num_attention_heads * (shape.head_dim + shape.rope_dim + shape.v_dim)
        q_dim = m.num_attention_heads * (shape.head_dim + shape.rope_dim)
    else:
        kv_dim = 2 * shape.kv_heads * shape.head_dim
        q_dim = m.num_attention_heads * shape.head_dim
    tokens = layout.micro_batch_size * m.seq_length / layout.cp / max(1, layout.tp)
    b = backend_of(cfg)
    dtype = DTYPE_BYTES[cfg.precision.compute_dtype]
    kv_bytes = b.cp_ring_kv_buffers * dtype + b.cp_ring_kv_fp32_buffers * 4
    return tokens * (kv_dim * kv_bytes + q_dim * b.cp_ring_q_fp32_buffers * 4)


def dispatcher_bytes(cfg: LLMTrainConfig, layout: Layout) -> float:
    """The MoE token dispatcher's buffers on one GPU for the one MoE layer being computed, beyond
    what the layer stores (each routed copy's expert input and output: layer_activation_terms).

    The dispatcher is backends.common.moe_dispatcher's. allgather (Megatron-core's default,
    --moe-token-dispatcher-type allgather): MoEAllGatherTokenDispatcher all-gathers the hidden
    states of the tp x ep group's tokens (the rank's s/tp tokens with sequence parallel, x tp x
    ep) into a global buffer and unpermutes the expert outputs into one of the same size before
    the reduce-scatter: 2 x gathered tokens x h in the compute dtype (when tp x ep > 1).
    alltoall, as llmtrain's torch engine runs it with ep > 1
    (launcher/train/parallel/expert_parallel.py dispatch_combine): the all-to-all's send copy
    (flat[order // top_k]) and received rows beside the sorted expert input, and the same two on the
    way back: 2 x tokens x top_k x h. flex is counted the same (DeepEP's receive buffers hold at
    most every routed copy). Without ep the sorted copy is the experts' input (already counted)."""
    m = cfg.model
    if not (m.num_experts or 0) > 1:
        return 0.0
    dtype = DTYPE_BYTES[cfg.precision.compute_dtype]
    tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp)
    if moe_dispatcher(cfg) == "allgather":
        if layout.tp * layout.ep <= 1:
            return 0.0
        sp = layout.tp if cfg.parallel.sequence_parallel else 1
        gathered = tokens / sp * layout.tp * layout.ep
        return 2.0 * gathered * m.hidden_size * dtype
    if layout.ep <= 1:
        return 0.0
    # Shared experts run on the rank's own tokens, outside the dispatcher.
    return 2.0 * tokens * (m.moe_top_k or 1) * m.hidden_size * dtype


def logits_bytes(cfg: LLMTrainConfig, layout: Layout) -> float:
    """Output logits and loss on the last stage for one micro-batch, at their peak.

    Megatron: the logits in the compute dtype plus an fp32 copy for the loss and fp32 softmax
    (its gradient reuses that buffer): s b V (dtype + 4 + 4) / tp / cp. The eager PyTorch loss
    (backend torch / deepspeed): the larger of its forward (dtype + 8) and its backward per logit
    (EAGER_LOSS_BACKWARD_BYTES; LOSS_PARALLEL_BACKWARD_BYTES with the vocabulary split over tp,
    which DeepSpeed's AutoTP does not split: Backend.tp_splits_vocab)."""
    m = cfg.model
    tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp)
    dtype = DTYPE_BYTES[cfg.precision.compute_dtype]
    per = dtype + 8.0
    if engine_choices(cfg).chunked_loss:
        # launcher/train/model/chunked_loss.py: one chunk's logits at a time (the same 10 bytes per
        # logit), plus the gradients it computes in forward and keeps for backward: the input's
        # [tokens, h] in the compute dtype and the head weight's [V, h] in fp32.
        chunk = min(tokens, loss_chunk_tokens(m.vocab_size))
        held = tokens * m.hidden_size * dtype + m.vocab_size * m.hidden_size * 4.0
        return chunk * m.vocab_size * per + held
    b = backend_of(cfg)
    vocab_tp = b.vocab_split(layout.tp)
    if cfg.backend.cross_entropy_fusion:
        # backend.cross_entropy_fusion (Megatron-Core, Transformer Engine's parallel cross-entropy,
        # NVIDIA/TransformerEngine d0067d0 transformer_engine/pytorch/triton/cross_entropy.py):
        # the forward writes the fp32 gradient (torch.empty_like(input, dtype=float32)) and saves
        # only it; the logits in the compute dtype and that gradient are the peak.
        per = dtype + 4.0
    if b.eager_loss:
        split = vocab_tp > 1
        per = max(per, LOSS_PARALLEL_BACKWARD_BYTES if split else EAGER_LOSS_BACKWARD_BYTES)
    return tokens * m.vocab_size * per / vocab_tp
