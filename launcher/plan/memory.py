"""Per-GPU memory of a training configuration, stage by stage; the heaviest rank decides.

Everything is in bytes. The buckets:
- weights, gradients, optimizer: bytes per parameter by precision and optimizer (ZeRO paper,
  Rajbhandari et al. 2020: mixed-precision Adam = 2 weight + 2 gradient + 12 optimizer bytes, the 12
  being the fp32 master copy and Adam's m and v), sharded by ZeRO stage over the data-parallel
  ranks;
- activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models"), generalised term by term to GQA, SwiGLU and MoE (see ``layer_activation_bytes``),
  times the micro-batches in flight for the pipeline schedule
  (``schedule.chunk_microbatches_in_flight``), plus
  the fp32 logits and loss on the last stage;
- buffers: gradient reduce / parameter all-gather buckets, ZeRO-3 gathered layers, pipeline p2p;
- liveness: the buckets are summed, except where the engine makes gradients during the backward
  as it frees the activations (plan/grad_liveness.py; ``stage_not_coexisting``);
- overhead: CUDA context and NCCL, from the hardware catalog. torch does not count it: `allocated`
  and `reserved` below are what torch.cuda.max_memory_allocated / max_memory_reserved report, and
  the  GPU must hold reserved + overhead.

Conventions stated once here (and in the plan's assumptions):
- ZeRO / FSDP shards over dp * cp (Megatron's distributed optimizer and torchtitan's FSDP both shard
  over the data and context parallel ranks together); expert parameters over dp * cp / ep.
- Expert weights are split over ep and, like the dense weights, over tp (Megatron-core's expert
  tensor parallel size defaults to tp), except where llmtrain renders
  --expert-tensor-parallel-size 1 (MoE parallel folding, backends.common.expert_tensor_parallel):
  then each expert is whole on its rank and its states shard over tp x cp x dp / ep.
- Transient working sets that exist once, for the layer being computed, not per layer: context
  parallel's key/value ring buffers (``cp_ring_bytes``) and the MoE token dispatcher's buffers
  (``dispatcher_bytes``).
- Dropout is on for GPT-style models (LayerNorm; Megatron's default 0.1) and off for Llama-style
  (RMSNorm) ones; it adds 1-byte masks (Korthikanti's 34 sbh + 5 as^2 b counts them).
- CPU offload moves the optimizer states (offload_optimizer) and the sharded weights
  (offload_params) to host memory, and the gradients as each engine does (plan/offload.py),
  reported per GPU and per node.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.common import (
    backend_of,
    expert_data_parallel,
    expert_tensor_parallel,
    moe_dispatcher,
    recompute_mode,
)
from launcher.backends.engine_choices import engine_choices, loss_chunk_tokens
from launcher.backends.moe_overlap import extra_warmup_microbatches
from launcher.config.layout import Layout
from launcher.config.pipeline_split import layers_in_flight, mtp_stage
from launcher.config.schema import LLMTrainConfig
from launcher.plan import finetune
from launcher.plan.dtypes import DTYPE_BYTES as DTYPE_BYTES  # re-exported
from launcher.plan.fitted import constants
from launcher.plan.grad_liveness import (
    BackwardNode,
    backward_peak,
    layer_backward,
    lazy_gradients,
    reserved_reuses_activations,
)
from launcher.plan.mcore_activations import applies as mcore_applies
from launcher.plan.mcore_activations import layer_activations as mcore_layer_activations
from launcher.plan.model_shape import ModelShape
from launcher.plan.offload import gradient_placement
from launcher.plan.profile import Rates
from launcher.plan.recompute import resolve as resolve_recompute
from launcher.plan.schedule import chunk_microbatches_in_flight

GIB = 1024**3

# torch's caching allocator reserves more than it allocates (block rounding, fragmentation across
# differently sized tensors): reserved = allocated x fragmentation, one fitted constant per GPU
# family (plan/fitted.py, fitted on the reserved-memory rows of bench/data/calibration.csv). When
# the allocator reaches the device's capacity it frees its cache and retries, so what torch reports
# as reserved never exceeds the capacity left after the CUDA context (`reserved_observed`).
FRAGMENTATION = constants("hopper").fragmentation


# Optimizer states in fp32 per parameter, besides the master copy: Adam keeps m and v (Kingma & Ba
# 2015), Lion one momentum (Chen et al. 2023), SGD with momentum one buffer.
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "lion": 4, "sgd": 4}


@dataclass(frozen=True)
class BytesPerParam:
    weights: float
    gradients: float
    optimizer: float


def fp8_weight_copy_bytes(cfg: LLMTrainConfig) -> float:
    """Bytes per parameter of the fp8 weight copies kept across a step's micro-batches.

    Transformer Engine (backend=megatron) keeps an fp8 copy of each weight and of its transpose
    (1 + 1 bytes); torchao's float8 training (backend=torch) casts each weight on the fly in
    every forward and backward and keeps no copy (torchao float8_linear.py saves the
    high-precision weight for the backward)."""
    return backend_of(cfg).fp8_copy_bytes(cfg)


def bytes_per_param(cfg: LLMTrainConfig) -> BytesPerParam:
    """Unsharded bytes per parameter of each model-state bucket (ZeRO paper, section 3)."""
    p = cfg.precision
    weights = float(DTYPE_BYTES[p.compute_dtype]) + fp8_weight_copy_bytes(cfg)
    if p.fp8 and p.fp8_param_gather:
        # --fp8-param-gather: the fp8 weight and its transpose are the only compute copy.
        weights = 2.0
    gradients = float(DTYPE_BYTES[p.grad_dtype])
    master = 4.0 if p.master_weights and p.compute_dtype != "fp32" else 0.0
    if master and backend_of(cfg).fp32_sharded_params(cfg):
        # torch FSDP2 with a MixedPrecisionPolicy stores the sharded parameters in fp32 (they are
        # the master copy) and casts to the compute dtype when it all-gathers them: 4 bytes of
        # weights and no separate master (the unsharded compute copy is a transient buffer); the
        # sharded gradients take the fp32 parameters' dtype (grad_dtype is the reduce dtype).
        # Still 16 bytes per parameter in all, as the ZeRO paper counts.
        weights += master - DTYPE_BYTES[p.compute_dtype]
        gradients = master
        master = 0.0
    optimizer = master + OPTIMIZER_STATE_BYTES[cfg.optim.name]
    return BytesPerParam(weights, gradients, optimizer)


def pipelined_fsdp_accumulates(cfg: LLMTrainConfig, layout: Layout) -> bool:
    """torch FSDP2 (zero.stage 2/3) under pipelining: gradients accumulate unsharded over the
    step's micro-batches and are reduce-scattered once, after the last backward. Without pp the
    torch engine reduce-scatters every micro-batch, as DeepSpeed's ZeRO-2/3 do."""
    return backend_of(cfg).pipelined_unsharded_grads(cfg, layout.pp)


def uses_dropout(cfg: LLMTrainConfig) -> bool:
    """Dropout masks are kept (1 byte each) and traffic paid when either dropout is on."""
    return cfg.model.attention_dropout > 0 or cfg.model.hidden_dropout > 0


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes per token of one layer: `replicated` is split over tp only with sequence parallelism,
    `sharded` always over tp; `scores` is the s^2 part per token and key, split over tp."""

    replicated: float
    sharded: float
    scores: float


def layer_activation_terms(
    shape: ModelShape,
    moe: bool,
    recompute: str,
    attention: str,
    dropout: bool,
    fp8: bool = False,
    compiled: bool = False,
) -> ActivationTerms:
    """Activation bytes per token stored by one transformer layer for its backward pass.

    Korthikanti et al. 2022, section 4.1, term by term (16-bit activations, 1-byte dropout masks),
    written for general head counts and MLPs. For GPT (MHA, GELU MLP of 4h, dropout) it gives
    34 s b h + 5 a s^2 b; with TP t: s b h (10 + 24/t + 5 a s/(h t)); with sequence parallel:
    s b h (34 + 5 a s/h) / t (their equations 1-3).

    `compiled`: the block runs under torch.compile (EngineChoices.compiled_blocks). AOTAutograd's
    min-cut partitioner (torch/_functorch/partitioners.py, min_cut_rematerialization_partition)
    saves the inputs of cheap point-wise chains and recomputes their outputs in the backward: the
    MLP's activation output (and SwiGLU's product, the FC2 input) are recomputed from the FC1
    outputs, which are kept, so the MLP keeps 2f (GELU) or 4f (SwiGLU) bytes per token, not 4f /
    8f. (On one H100 llama3-1b at seq 8192 peaked 4.06 GiB lower compiled than eager; this rule
    says 4.0 GiB: 16 layers x 8,192 tokens x 4 bytes x 8,192. A check, nothing fitted.)
    """
    m = shape.model
    h = m.hidden_size
    heads = m.num_attention_heads
    if shape.is_mla:
        q_dim = k_dim = heads * (shape.head_dim + shape.rope_dim)
        v_dim = o_dim = heads * shape.v_dim
    else:
        q_dim = o_dim = heads * shape.head_dim
        k_dim = v_dim = shape.kv_heads * shape.head_dim
    mask = 1.0 if dropout else 0.0
    # The MLP's stored intermediates per token: GELU keeps fc1's output and the GELU output (4f);
    # SwiGLU keeps gate, up, silu(gate) and their product (8f; measured by Megatron's
    # get_training_info for its fused bias_swiglu too).
    per_f = 8.0 if m.activation == "swiglu" else 4.0
    if compiled:
        per_f /= 2.0
    if moe:
        f_e = m.moe_ffn_hidden_size or m.ffn_hidden_size
        k = (m.moe_top_k or 1) + m.moe_shared_experts
        # Each of top_k + shared expert copies keeps its input (2h) and intermediates; the router
        # keeps fp32 logits and probabilities (2 * 4 E); the combine keeps the expert outputs (2h).
        mlp_shr = k * (2.0 * h + per_f * f_e + 2.0 * h) + 8.0 * (m.num_experts or 0)
        mlp_out = 2.0 * h
    else:
        mlp_shr = per_f * m.ffn_hidden_size
        mlp_out = 2.0 * h
    # Eager attention stores softmax output (2), dropout mask (1) and dropout output (2) per score.
    score_bytes = (5.0 if dropout else 2.0) * heads if attention == "eager" else 0.0
    lse = 4.0 * heads if attention == "flash" else 0.0  # flash keeps fp32 log-sum-exp per head
    # plan.recompute's modes ("selective": op with flash attention, core with eager).
    mode = resolve_recompute(recompute, attention == "eager")
    if mode == "full":
        # Only the layer input survives the forward (checkpoint boundary).
        return ActivationTerms(replicated=2.0 * h, sharded=0.0, scores=0.0)
    if mode == "op":
        # Op-level selective checkpointing (PyTorch SAC, torchtitan's "op" policy): the layer input,
        # the attention output (+lse) and every other matmul output are saved; norms, activation
        # functions and the other matmuls are recomputed.
        mlp_mm = 2.0 * (m.ffn_hidden_size * (2 if m.activation == "swiglu" else 1))
        if moe:
            mlp_mm = mlp_shr / 2.0
        half = 0.5 * (2.0 * (q_dim + k_dim + v_dim) + mlp_mm)
        return ActivationTerms(
            replicated=2.0 * h + 0.5 * (2.0 * h + mlp_out),
            sharded=2.0 * o_dim + lse + half,
            scores=0.0,
        )
    # Norm inputs (2 x 2h), QKV and MLP inputs (2 x 2h), dropout masks after attention and MLP.
    replicated = 4.0 * h + 4.0 * h + 2.0 * mask * h
    # Q, K, V for the score and value products, the attention output (projection input).
    sharded = 2.0 * (q_dim + k_dim + v_dim + o_dim) + lse + mlp_shr
    if mode == "core" and attention == "flash":
        # The attention core checkpointed: its inputs q, k, v are kept (by the checkpoint, as
        # the kernel kept them) and its output by the output projection; only the fp32
        # log-sum-exp is not (Megatron-Core's core_attn; llmtrain's MoE blocks).
        sharded -= lse
    if fp8:
        # fp8 training saves each linear layer's input in fp8 for its weight gradient
        # (Transformer Engine; torchao Float8Linear): QKV and FC1 inputs (h each), the output
        # projection's input (o_dim) and FC2's input (f per routed copy) at 1 byte, not 2.
        # Compiled, FC2's input is recomputed (above), so there is none to hold in fp8.
        f_in = 0 if compiled else m.ffn_hidden_size
        if moe and not compiled:
            f_in = (m.moe_ffn_hidden_size or m.ffn_hidden_size) * (
                (m.moe_top_k or 1) + m.moe_shared_experts
            )
        replicated -= 2.0 * h
        sharded -= o_dim + f_in
    scores = 0.0 if mode == "core" else score_bytes
    return ActivationTerms(replicated=replicated, sharded=sharded, scores=scores)


def layer_activation_bytes(
    shape: ModelShape,
    moe: bool,
    micro_batch: int,
    seq: int,
    tp: int,
    cp: int,
    sequence_parallel: bool,
    recompute: str,
    attention: str,
    dropout: bool,
    fp8: bool = False,
    compiled: bool = False,
) -> float:
    """Bytes one layer keeps for one micro-batch on one GPU (tokens split over cp)."""
    t = layer_activation_terms(shape, moe, recompute, attention, dropout, fp8, compiled)
    tokens = micro_batch * seq / max(1, cp)
    rep = t.replicated / (tp if sequence_parallel else 1)
    # Each local query token scores against all s keys (ring attention with cp).
    return tokens * (rep + t.sharded / tp + t.scores * seq / tp)


# The eager PyTorch loss on full logits (llmtrain's torch engine, launcher/train/model.py loss_fn;
# torchtitan's loss_fn, not compiled: "TODO: compiling loss function causes CUDA errors" in its
# train.py of 2024-25) is F.cross_entropy(logits.float()): log_softmax then nll_loss, each its own
# fp32 tensor. The caller drops the logits before the backward (torchtitan: "del pred ... need to
# free to before bwd to avoid peaking memory"; llmtrain's model returns only the loss). The
# forward holds the logits, their fp32 copy and the fp32 log-softmax (dtype + 8 bytes a logit);
# the backward's peak is in log_softmax_backward: the saved fp32 log-softmax, nll_loss's fp32
# gradient and the fp32 gradient it writes (aten _log_softmax_backward_data allocates its
# result): 12 bytes a logit, 4 more than Megatron's vocab-parallel cross-entropy, whose backward
# writes the gradient into its saved softmax in place (tensor_parallel/cross_entropy.py).
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
    llmtrain's torch engine (launcher/train/ring_attention.py, ring_backward) peaks at an
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
    alltoall, as llmtrain's torch engine runs it with ep > 1 (launcher/train/expert_parallel.py
    dispatch_combine): the all-to-all's send copy (flat[order // top_k]) and received rows beside
    the sorted expert input, and the same two on the way back: 2 x tokens x top_k x h. flex is
    counted the same (DeepEP's receive buffers hold at most every routed copy). Without ep the
    sorted copy is the experts' input (already counted)."""
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
        # launcher/train/chunked_loss.py: one chunk's logits at a time (the same 10 bytes per
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


def vocab_params(cfg: LLMTrainConfig, layout: Layout, stage: int) -> float:
    """Embedding and output-layer parameters one GPU of `stage` holds (as stage_params counts
    them)."""
    shape = ModelShape(cfg.model)
    m = cfg.model
    vocab_tp = backend_of(cfg).vocab_split(max(1, layout.tp))
    n = 0.0
    if stage == 0:
        n += shape.embedding_params() / vocab_tp
    if stage == layout.pp - 1:
        n += shape.output_params() / vocab_tp
        if m.tie_embeddings and layout.pp > 1:
            n += m.vocab_size * m.hidden_size / vocab_tp
    return n


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds before ZeRO sharding (after tp / ep splits)."""

    dense: float
    expert: float

    @property
    def total(self) -> float:
        return self.dense + self.expert


def stage_params(cfg: LLMTrainConfig, layout: Layout, stage: int) -> StageParams:
    shape = ModelShape(cfg.model)
    m = cfg.model
    tp, ep = max(1, layout.tp), max(1, layout.ep)
    etp = expert_tensor_parallel(cfg, layout)
    first_layer = sum(layout.stage_layers[:stage]) if layout.vpp == 1 else None
    dense = 0.0
    expert = 0.0
    # Which layers live on this stage: contiguous with vpp == 1, else chunks i % pp == stage.
    indices: list[int] = []
    if first_layer is not None:
        indices = list(range(first_layer, first_layer + layout.stage_layers[stage]))
    else:
        start = 0
        for c, n in enumerate(layout.chunk_layers):
            if c % layout.pp == stage:
                indices.extend(range(start, start + n))
            start += n
    routed = shape.expert_params() * (m.num_experts or 0)
    # Every dense layer has the same count, and so does every MoE layer (shape.layer_params).
    moe_layer = shape.moe_layer_params() if shape.is_moe else 0
    dense_layer = shape.dense_layer_params()
    for i in indices:
        is_moe_layer = shape.is_moe and i >= m.moe_dense_layers
        params = moe_layer if is_moe_layer else dense_layer
        if is_moe_layer:
            expert += routed / (ep * etp)
            dense += (params - routed) / tp
        else:
            dense += params / tp
    if stage == mtp_stage(cfg.parallel.pipeline_layout, layout.pp, m.mtp_layers):
        # The multi-token-prediction modules (ModelShape.mtp_module_params): their layer's
        # experts split like the others', the rest like a dense layer's.
        mtp_routed = routed if shape.mtp_is_moe else 0
        expert += m.mtp_layers * mtp_routed / (ep * etp)
        dense += m.mtp_layers * (shape.mtp_module_params() - mtp_routed) / tp
    vocab_tp = backend_of(cfg).vocab_split(tp)
    if stage == 0:
        dense += shape.embedding_params() / vocab_tp
    if stage == layout.pp - 1:
        dense += shape.output_params() / vocab_tp
        if m.tie_embeddings and layout.pp > 1:
            # The last stage keeps its own copy of the tied embedding for the output projection.
            dense += m.vocab_size * m.hidden_size / vocab_tp
    return StageParams(dense, expert)


@dataclass(frozen=True)
class HardwareView:
    """The figures of one GPU the planner uses, catalog values with cluster overrides applied."""

    key: str
    name: str
    memory_bytes: int
    overhead_bytes: int
    peak_flops: float  # dense FLOP/s of the compute dtype (tf32 for fp32): the MFU denominator
    matmul_peak_flops: float  # dense FLOP/s the linear layers run at (fp8 with precision.fp8)
    matmul_efficiency: float
    hbm_gbps: float
    intra_gbps: float
    inter_gbps: float
    gpus_per_node: int
    price_per_gpu_hour: float
    # GPU family (hardware.Arch), TDP and NVLink domain size; defaults keep old callers working.
    arch: str = "hopper"
    tdp_watts: float | None = None
    scale_up_domain: int = 0  # 0: the node (gpus_per_node)
    # Figures measured on this machine (llmtrain calibrate; launcher.plan.profile.Rates), or None:
    # every part priced from the catalog.
    profile: Rates | None = None


@dataclass(frozen=True)
class StageMemory:
    stage: int
    layers: int
    params: float
    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    overhead: float
    in_flight: int
    host_bytes: float
    fragmentation: float = FRAGMENTATION
    capacity: float = 0.0  # device memory (0: unknown, no cap on reserved_observed)
    # What the buckets' sum counts twice because they are never live together: gradients created
    # during the backward as the activations are freed (plan/grad_liveness.py; 0 elsewhere).
    not_coexisting: float = 0.0
    # The share of it the caching allocator can serve from the same cached blocks: all of it when
    # the gradients are allocated on the stream that freed the activations, none when they come
    # from another stream's pool (grad_liveness.reserved_reuses_activations).
    reused: float = 0.0

    @property
    def allocated(self) -> float:
        total = self.weights + self.gradients + self.optimizer + self.activations + self.buffers
        return total - self.not_coexisting

    @property
    def reserved(self) -> float:
        """What the caching allocator would reserve with no capacity limit (the fit verdict)."""
        return (self.allocated + self.not_coexisting - self.reused) * self.fragmentation

    @property
    def reserved_observed(self) -> float:
        """What torch.cuda.max_memory_reserved reports: reserved, capped at the capacity left
        after the CUDA context (the allocator frees its cache and retries before failing)."""
        if self.capacity <= 0:
            return self.reserved
        return min(self.reserved, max(self.allocated, self.capacity - self.overhead))

    @property
    def device_total(self) -> float:
        return self.reserved + self.overhead


@dataclass(frozen=True)
class MemoryPlan:
    stages: tuple[StageMemory, ...]
    capacity: float
    headroom: float
    # Typical |error| of the memory prediction in this regime (bands.py); 0: no band.
    band: float = 0.0

    @property
    def heaviest(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.device_total)

    @property
    def usable(self) -> float:
        return self.capacity * (1.0 - self.headroom)

    @property
    def fits(self) -> bool:
        """reserved + overhead of the heaviest GPU within capacity x (1 - headroom).

        Unchanged meaning: the layout fits with the headroom to spare. `verdict` refines the
        other case into "tight" and "does_not_fit".
        """
        return self.heaviest.device_total <= self.usable

    @property
    def verdict(self) -> str:
        """fits | tight | does_not_fit.

        fits: as `fits`. tight: it does not fit with headroom, but allocated + overhead (what
        must be resident; the caching allocator frees its cache before failing) is within the
        prediction's error band of the capacity: (allocated + overhead) x (1 - band) <= capacity,
        with the band's worst error (a refusal is said only when even the worst over-prediction
        cross-validation has seen could not make it fit).
        does_not_fit: even the band's optimistic end exceeds the capacity.
        """
        if self.fits:
            return "fits"
        h = self.heaviest
        if (h.allocated + h.overhead) * (1.0 - self.band) <= self.capacity:
            return "tight"
        return "does_not_fit"


def zero_shard(layout: Layout) -> int:
    return max(1, layout.dp * layout.cp)


@dataclass(frozen=True)
class StageStates:
    """Model states one GPU of a stage holds (after ZeRO sharding and CPU offload), in bytes."""

    params: float
    weights: float
    gradients: float
    optimizer: float
    host_bytes: float


# stage_memory is split in three parts so that the layout search (search.py) can reuse each part
# across the layouts that share its inputs. Each part reads only what its docstring lists.


def stage_states(
    cfg: LLMTrainConfig, layout: Layout, stage: int, params: StageParams | None = None
) -> StageStates:
    """Weights, gradients, optimizer states (and host bytes) of one GPU of `stage`.

    Reads the model, precision, optimizer and zero sections, and the layout's tp, pp, vpp, ep, dp,
    cp and chunk split. `params`: this stage's ``stage_params``, when the caller has them.
    """
    z = cfg.zero
    bpp = bytes_per_param(cfg)
    if params is None:
        params = stage_params(cfg, layout, stage)
    shard = zero_shard(layout)
    # Expert states shard over the expert-data-parallel ranks (MoE parallel folding).
    expert_shard = expert_data_parallel(cfg, layout)

    def sharded(per_param: float, on: bool) -> float:
        if not on:
            return per_param * params.total
        return per_param * (params.dense / shard + params.expert / expert_shard)

    if finetune.is_finetune(cfg):
        return _finetune_states(cfg, layout, stage, params)
    weights = sharded(bpp.weights, z.stage >= 3)
    copy = fp8_weight_copy_bytes(cfg)
    if copy and not cfg.precision.fp8_param_gather:
        # Transformer Engine keeps fp8 copies of its own linear layers' weights only: the
        # embedding (VocabParallelEmbedding) and the output layer (tensor_parallel's
        # ColumnParallelLinear) run in bf16 outside it (Megatron-Core gpt_model.py).
        weights -= copy * vocab_params(cfg, layout, stage) / (shard if z.stage >= 3 else 1)
    gradients = sharded(bpp.gradients, z.stage >= 2)
    # Offloading engines keep (part of) the gradients on the host (plan/offload.py).
    gradients, host = gradient_placement(cfg, gradients, sharded(4.0, True))
    if z.stage >= 2 and pipelined_fsdp_accumulates(cfg, layout):
        # torch FSDP2 under torch.distributed.pipelining: every backward but the schedule's last
        # runs with gradient sync and reshard-after-backward off (PipelineStage.
        # backward_maybe_with_nosync), so each stage keeps its parameters unsharded in the
        # compute dtype (ZeRO-3; ZeRO-2 keeps them anyway) and accumulates unsharded gradients
        # in the reduce dtype (FSDPParam.to_accumulated_grad_if_needed: grad_dtype with mixed
        # precision, fp32 without) until the one reduce-scatter (perform_reduce_grad).
        compute = cfg.precision.compute_dtype
        if z.stage >= 3:
            weights += DTYPE_BYTES[compute] * params.total
        reduce = cfg.precision.grad_dtype if compute != "fp32" else "fp32"
        gradients += DTYPE_BYTES[reduce] * params.total
    optimizer = sharded(bpp.optimizer, z.stage >= 1)
    if z.offload_optimizer == "cpu":
        host += optimizer
        optimizer = 0.0
    if z.offload_params == "cpu":
        host += weights
        weights = 0.0
    return StageStates(params.total, weights, gradients, optimizer, host)


def _finetune_states(
    cfg: LLMTrainConfig, layout: Layout, stage: int, params: StageParams
) -> StageStates:
    """finetune=lora|qlora (launcher/plan/finetune.py): the frozen base at its dtype (NF4 for
    qlora's targets), sharded by ZeRO-3 / FSDP like any weight, with no gradient or optimizer
    state; the adapters with fp32 weights, gradients and optimizer states, sharded by stage."""
    z = cfg.zero
    shard = zero_shard(layout)
    tp = max(1, layout.tp)
    layers = layout.stage_layers[stage]
    adapters = layers * finetune.adapter_params_per_layer(cfg, tp)
    frozen = finetune.frozen_weight_bytes(cfg, params.total, layers, tp)
    weights = frozen / (shard if z.stage >= 3 else 1)
    weights += finetune.ADAPTER_WEIGHT_BYTES * adapters / (shard if z.stage >= 3 else 1)
    gradients = finetune.ADAPTER_GRAD_BYTES * adapters / (shard if z.stage >= 2 else 1)
    optimizer = OPTIMIZER_STATE_BYTES[cfg.optim.name] * adapters / (shard if z.stage >= 1 else 1)
    host = 0.0
    if z.offload_optimizer == "cpu":
        host, optimizer = optimizer, 0.0
    return StageStates(params.total + adapters, weights, gradients, optimizer, host)


def stage_activations(cfg: LLMTrainConfig, layout: Layout, stage: int) -> tuple[float, int]:
    """(activation bytes, chunk-micro-batches in flight) of one GPU of `stage` at its peak."""
    parts = activation_parts(cfg, layout, stage)
    return parts.kept + parts.transient + parts.head, parts.in_flight


@dataclass(frozen=True)
class ActivationParts:
    """A stage's activations by how long they live: `kept` are stored by the layers until each
    one's backward; `transient` exists once, for the layer being computed (recompute, the cp ring,
    the MoE dispatcher); `head` is the logits and loss (and MTP modules') peak on the last stage."""

    kept: float
    transient: float
    head: float
    in_flight: int


def activation_parts(cfg: LLMTrainConfig, layout: Layout, stage: int) -> ActivationParts:
    """The parts of ``stage_activations``.

    Reads the model and precision sections, the backend, parallel.sequence_parallel and
    pp_schedule, train.recompute, and the layout's micro-batch size, micro-batches, tp, cp, pp,
    vpp, ep and chunk split.
    """
    shape = ModelShape(cfg.model)
    m = cfg.model
    # Activations: per chunk-micro-batch bytes x chunk-micro-batches in flight (schedule.py).
    chunk_layer_count = [
        n for c, n in enumerate(layout.chunk_layers) if c % max(1, layout.pp) == stage
    ]
    layers_here = layout.stage_layers[stage]
    # Layers per chunk (an explicit pp_layers split gives per-stage counts; chunks split it evenly).
    if len(layout.chunk_layers) == layout.pp * layout.vpp:
        per_chunk = float(max(chunk_layer_count))
    else:
        per_chunk = layers_here / max(1, layout.vpp)
    first_index = sum(layout.stage_layers[:stage]) if layout.vpp == 1 else 0
    moe_here = shape.is_moe and first_index + layers_here > m.moe_dense_layers
    dropout = uses_dropout(cfg)
    compiled = engine_choices(cfg).compiled_blocks
    # With cp > 1 attention is ring attention whatever model.attention says: it saves q, k, v, the
    # output and the fp32 log-sum-exp, never a score matrix (Transformer Engine's CP attention;
    # launcher/train/ring_attention.py save_for_backward(q, k, v, out, lse)).
    attention = "flash" if layout.cp > 1 else m.attention

    def per_layer(recompute: str, moe: bool = moe_here) -> float:
        return layer_activation_bytes(
            shape,
            moe,
            layout.micro_batch_size,
            m.seq_length,
            layout.tp,
            layout.cp,
            cfg.parallel.sequence_parallel,
            recompute,
            attention,
            dropout,
            cfg.precision.fp8,
            compiled,
        )

    extra = extra_warmup_microbatches(cfg)
    in_flight = chunk_microbatches_in_flight(
        cfg.parallel.pp_schedule,
        layout.pp,
        layout.num_microbatches,
        layout.vpp,
        stage,
        extra,
    )
    held = per_chunk * in_flight
    if len(chunk_layer_count) == max(1, layout.vpp) and layout.pp > 1:
        # The layer-forwards really alive at the peak, chunk by chunk (an uneven split's chunks
        # differ: config/pipeline_split.py layers_in_flight; the same as above when equal).
        held = layers_in_flight(
            cfg.parallel.pp_schedule,
            layout.pp,
            layout.num_microbatches,
            layout.vpp,
            stage,
            tuple(chunk_layer_count),
            extra,
        )
    mode = recompute_mode(cfg, moe_here)
    mcore = mcore_applies(cfg)
    if mcore:
        # Megatron-Core's layer tensor by tensor, with backend.recompute_modules and
        # backend.offload_modules (plan/mcore_activations.py): what is kept until the backward,
        # plus what recompute and offload bring back for the layer in its backward.
        layer = mcore_layer_activations(cfg, layout, moe_here)
        kept = layer.kept * held
        transient = layer.transient
    else:
        kept = per_layer(mode) * held
        transient = 0.0
        if finetune.is_finetune(cfg) and mode != "full":
            # The adapters' rank-r intermediates (and dropout copies), kept like the layer's own.
            tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp)
            act = DTYPE_BYTES[cfg.precision.compute_dtype]
            kept += held * finetune.adapter_activation_bytes(cfg, tokens, act)
        if mode in ("full", "op"):
            # While a layer is recomputed for its backward its full activations exist once.
            transient += per_layer("none")
        elif mode == "core":
            # Only the attention core is rebuilt: what it does not keep (the log-sum-exp, or
            # eager attention's scores) exists once.
            transient += per_layer("none") - per_layer("core")
    # One layer's transient buffers: cp's K/V ring, the MoE dispatcher's.
    transient += cp_ring_bytes(cfg, layout)
    if moe_here:
        transient += dispatcher_bytes(cfg, layout)
    head = 0.0
    if stage == layout.pp - 1:
        head += logits_bytes(cfg, layout)
    if stage == mtp_stage(cfg.parallel.pipeline_layout, layout.pp, m.mtp_layers):
        # Each multi-token-prediction module: one more layer's activations for every micro-batch
        # in flight in its virtual stage (the stage's chunks in flight / vpp), and its own logits
        # and loss, kept until its backward as the main head's are (Megatron's vocab-parallel
        # cross-entropy keeps its softmax).
        mtp_moe = shape.mtp_is_moe
        mtp_held = max(1, round(in_flight / max(1, layout.vpp)))
        mtp_layer = (
            mcore_layer_activations(cfg, layout, mtp_moe).kept
            if mcore
            else per_layer(recompute_mode(cfg, mtp_moe), mtp_moe)
        )
        head += m.mtp_layers * mtp_held * mtp_layer
        head += m.mtp_layers * logits_bytes(cfg, layout)
    return ActivationParts(kept, transient, head, in_flight)


def stage_buffers(cfg: LLMTrainConfig, layout: Layout) -> float:
    """Communication and gathering buffers, the same on every stage.

    Reads the model, precision and backend sections, zero.stage, parallel.sequence_parallel, and
    the layout's micro-batch size, tp, cp and pp.
    """
    shape = ModelShape(cfg.model)
    m = cfg.model
    z = cfg.zero
    bpp = bytes_per_param(cfg)
    tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp)
    act_dtype = DTYPE_BYTES[cfg.precision.compute_dtype]
    # A bucket never holds more than the parameters of one model-parallel rank (a small model's
    # gradients fill less than one 500M-element DeepSpeed bucket).
    rank_params = shape.total_params() / max(1, layout.tp * layout.pp)
    if finetune.is_finetune(cfg):
        # Only the adapters' gradients are reduced; ZeRO-3 gathers the frozen layer and the
        # layer's adapters (the two layers in flight) and holds one layer's adapter gradients.
        adapters = finetune.adapter_params_per_layer(cfg, max(1, layout.tp))
        rank_adapters = adapters * m.num_layers / max(1, layout.pp)
        buffers = min(cfg.backend.reduce_bucket_size, rank_adapters) * finetune.ADAPTER_GRAD_BYTES
        if z.stage >= 3:
            layer = shape.dense_layer_params() / max(1, layout.tp)
            frozen = finetune.frozen_weight_bytes(cfg, layer, 1, max(1, layout.tp))
            buffers += 2 * (frozen + adapters * finetune.ADAPTER_WEIGHT_BYTES) + adapters * 4.0
        if layout.pp > 1:
            sp = layout.tp if cfg.parallel.sequence_parallel else 1
            buffers += 4.0 * tokens * m.hidden_size * act_dtype / sp
        return buffers
    buffers = min(cfg.backend.reduce_bucket_size, rank_params) * bpp.gradients
    if backend_of(cfg).bucket_needs_replicas and layout.dp * layout.cp == 1:
        # One replica: the torch engine wraps nothing in DDP, so no gradient bucket exists
        # (torch_parallelize.apply_dp; measured by bench/lora_memory.py on the CPU).
        buffers = 0.0
    if z.stage in (1, 2):
        allgather = min(cfg.backend.allgather_bucket_size, rank_params)
        gathered = 1 if cfg.precision.fp8 and cfg.precision.fp8_param_gather else None
        buffers += allgather * (gathered or DTYPE_BYTES[cfg.precision.compute_dtype])
    if z.stage >= 3:
        # ZeRO-3 / FSDP: the layer being computed and the prefetched next one, unsharded, plus one
        # layer's unsharded gradients before its reduce-scatter.
        # Expert weights are gathered only within their expert-parallel shard (1/ep of them).
        routed = shape.expert_params() * (m.num_experts or 0) if shape.is_moe else 0
        layer = max(
            shape.layer_params(i)
            - (
                routed * (1.0 - 1.0 / max(1, layout.ep))
                if shape.is_moe and i >= m.moe_dense_layers
                else 0.0
            )
            for i in range(m.num_layers)
        ) / max(1, layout.tp)
        buffers += layer * (2 * bpp.weights + bpp.gradients)
    if layout.pp > 1:
        # Send and receive buffers for activations (forward) and their gradients (backward).
        sp = layout.tp if cfg.parallel.sequence_parallel else 1
        buffers += 4.0 * tokens * m.hidden_size * act_dtype / sp
    return buffers


def assemble_stage(
    stage: int,
    layers: int,
    hw: HardwareView,
    states: StageStates,
    activations: tuple[float, int],
    buffers: float,
    not_coexisting: float = 0.0,
    reused: bool = True,
) -> StageMemory:
    """The StageMemory of `stage` (holding `layers` layers) from its three parts (and
    ``stage_not_coexisting``'s correction of their sum)."""
    return StageMemory(
        stage=stage,
        layers=layers,
        params=states.params,
        weights=states.weights,
        gradients=states.gradients,
        optimizer=states.optimizer,
        activations=activations[0],
        buffers=buffers,
        overhead=float(hw.overhead_bytes),
        in_flight=activations[1],
        host_bytes=states.host_bytes,
        fragmentation=constants(hw.arch).fragmentation,
        capacity=float(hw.memory_bytes),
        not_coexisting=not_coexisting,
        reused=not_coexisting if reused else 0.0,
    )


def stage_not_coexisting(
    cfg: LLMTrainConfig, layout: Layout, stage: int, states: StageStates, buffers: float
) -> float:
    """Bytes by which the buckets' sum exceeds the true peak where the engine creates gradients
    during the backward (plan/grad_liveness.py; 0 where they live in preallocated buffers).

    The timeline of one step's backward (grad_liveness.backward_peak): what lives through it (the
    optimizer states with the fp32 master, the buffers, the weights unless they are autocast's
    copies), then the loss (its logits peak, ``logits_bytes``), the output layer (its gradient;
    the compute-dtype gradients of the logits and, under autocast, of the weight before its cast
    to fp32), the layers last to first (each frees its stored activations and its saved weight
    copies and creates its gradients), the embedding (its gradient; tied, a new gradient summed
    into the output layer's in place: AccumulateGrad adds to an existing .grad)."""
    if layout.pp > 1 or layout.num_microbatches != 1 or not lazy_gradients(cfg, layout):
        return 0.0
    parts = activation_parts(cfg, layout, stage)
    shape = ModelShape(cfg.model)
    m = cfg.model
    p = cfg.precision
    total = states.weights + states.gradients + states.optimizer + buffers
    total += parts.kept + parts.transient + parts.head
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


def stage_memory(cfg: LLMTrainConfig, layout: Layout, hw: HardwareView, stage: int) -> StageMemory:
    states = stage_states(cfg, layout, stage)
    buffers = stage_buffers(cfg, layout)
    return assemble_stage(
        stage,
        layout.stage_layers[stage],
        hw,
        states,
        stage_activations(cfg, layout, stage),
        buffers,
        stage_not_coexisting(cfg, layout, stage, states, buffers),
        reserved_reuses_activations(cfg),
    )


def estimate_memory(
    cfg: LLMTrainConfig, layout: Layout, hw: HardwareView, headroom: float = 0.10
) -> MemoryPlan:
    from launcher.plan.bands import error_band

    stages = tuple(stage_memory(cfg, layout, hw, s) for s in range(max(1, layout.pp)))
    band = error_band("memory", cfg, hw.arch).worst
    return MemoryPlan(stages=stages, capacity=float(hw.memory_bytes), headroom=headroom, band=band)
