"""FLOPs per token: model FLOPs (the MFU convention) and hardware FLOPs (with recomputation).

Conventions (each is the one place the formula is written):
- Matmul FLOPs: 2 per multiply-accumulate, forward 2*N, backward 4*N, so 6*N per token for the N
  parameters a token passes through as a matmul (Kaplan et al. 2020, Chinchilla: C = 6*N*D). N here
  is the active parameter count (MoE: top_k routed experts, not all of them) minus the input
  embedding lookup (a gather, not a matmul), plus the output projection even when tied.
- Attention core (QK^T and AV): 2*s*heads*(d_qk + d_v) FLOPs per token per layer forward; with
  d_qk = d_v = h/heads this is 4*s*h, i.e. 12*l*h*s per token over fwd+bwd: PaLM appendix B
  (Chowdhery et al. 2022) and Megatron (Narayanan et al. 2021) count the full s x s product and do
  NOT halve it for the causal mask. We follow that convention for model and hardware FLOPs (so MFU
  compares with published numbers) and halve it only for *executed* FLOPs with flash attention,
  whose causal kernels skip the masked blocks (used to predict time).
- Hardware FLOPs add recomputation: full = one more forward of every transformer layer (Narayanan et
  al. 2021: 96 B s l h^2 (1 + s/6h + V/16lh) = 4 forwards of the layers + 3 of the logits);
  the core mode (selective with eager attention, Megatron-Core's core_attn) = one more forward of
  the attention core (Korthikanti et al. 2022); the op mode (op-level selective checkpointing,
  PyTorch / torchtitan policy: every other matmul output is saved, the rest recomputed) = one more
  forward of half the layer matmuls (launcher/plan/recompute.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.common import recompute_mode
from launcher.config.schema import LLMTrainConfig, ModelConfig
from launcher.plan import finetune
from launcher.plan.model_shape import ModelShape
from launcher.plan.recompute import extra_forwards


def matmul_params(shape: ModelShape) -> int:
    """Parameters in a matmul per token (active experts only), output head included (once more
    for each multi-token-prediction module, which runs the shared head again)."""
    m = shape.model
    tied_head = m.vocab_size * m.hidden_size if m.tie_embeddings else 0
    mtp_heads = m.mtp_layers * m.vocab_size * m.hidden_size
    return shape.active_params() - shape.embedding_params() + tied_head + mtp_heads


def output_matmul_params(shape: ModelShape) -> int:
    """Parameters of the output projection (logits): V*h, tied or not."""
    return shape.model.vocab_size * shape.model.hidden_size


def layer_matmul_params(shape: ModelShape) -> int:
    """Matmul parameters of all transformer layers together (active experts only; a
    multi-token-prediction module's layer and projection included, its head not)."""
    heads = (1 + shape.model.mtp_layers) * output_matmul_params(shape)
    return matmul_params(shape) - heads - shape.norm_params()


def attention_core_flops_fwd(shape: ModelShape, seq_length: int) -> float:
    """Forward FLOPs of QK^T and AV for one token in one layer, full s x s (not halved)."""
    m = shape.model
    if shape.is_mla:
        d_qk = shape.head_dim + shape.rope_dim
        d_v = shape.v_dim
    else:
        d_qk = d_v = shape.head_dim
    return 2.0 * seq_length * m.num_attention_heads * (d_qk + d_v)


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs per token of one training step (forward + backward)."""

    # 6*N + attention (PaLM appendix B convention): the numerator of MFU.
    model: float
    # model + recomputation (Megatron's hardware FLOPs): the numerator of HFU.
    hardware: float
    # hardware, with causal attention halved under flash attention: what the GPU executes.
    executed: float
    # Parts, for the report.
    matmul: float
    attention: float
    recompute: float


def flops_per_token(model: ModelConfig, recompute: str) -> FlopsPerToken:
    shape = ModelShape(model)
    s = model.seq_length
    layers = model.num_layers + model.mtp_layers  # each MTP module attends once more
    matmul = 6.0 * matmul_params(shape)
    attn_fwd = layers * attention_core_flops_fwd(shape, s)
    attention = 3.0 * attn_fwd
    causal_factor = 0.5 if model.attention == "flash" else 1.0
    layer_fwd = 2.0 * layer_matmul_params(shape)
    # The forwards recomputed (launcher/plan/recompute.py); `recompute` is a mode or
    # train.recompute itself ("selective": op with flash attention, core with eager).
    x = extra_forwards(recompute, model.attention == "eager")
    extra = x.gemm * layer_fwd + x.attention * attn_fwd
    extra_exec = x.gemm * layer_fwd + x.attention * attn_fwd * causal_factor
    model_flops = matmul + attention
    return FlopsPerToken(
        model=model_flops,
        hardware=model_flops + extra,
        executed=matmul + attention * causal_factor + extra_exec,
        matmul=matmul,
        attention=attention,
        recompute=extra,
    )


def narayanan_flops_per_iteration(
    batch: int, seq: int, layers: int, hidden: int, vocab: int
) -> float:
    """Narayanan et al. 2021 (Megatron-LM, eq. 3): FLOPs of one iteration of a GPT model with full
    activation recomputation: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)). Used to turn the paper's
    TFLOP/s into step times for calibration, never to predict."""
    return (
        96.0
        * batch
        * seq
        * layers
        * hidden**2
        * (1.0 + seq / (6.0 * hidden) + vocab / (16.0 * layers * hidden))
    )


def config_flops(cfg: LLMTrainConfig, recompute: str | None = None) -> FlopsPerToken:
    """flops_per_token for a configuration, its recompute as the backend runs it on the model's
    main layer kind (MoE layers for an MoE model; backends.common.recompute_mode)."""
    moe = ModelShape(cfg.model).is_moe
    flops = flops_per_token(cfg.model, recompute_mode(cfg, moe, recompute))
    if not finetune.is_finetune(cfg):
        return flops
    # Frozen weights: forward 2N and input-gradient 2N FLOPs a token, no weight gradient (4N,
    # not 6N); the adapters 6 x their forward FLOPs (launcher/plan/finetune.py).
    adapters = 3.0 * cfg.model.num_layers * finetune.adapter_flops_per_token_layer(cfg)
    saved = flops.matmul / 3.0 - adapters
    return FlopsPerToken(
        model=flops.model - saved,
        hardware=flops.hardware - saved,
        executed=flops.executed - saved,
        matmul=flops.matmul - saved,
        attention=flops.attention,
        recompute=flops.recompute,
    )
