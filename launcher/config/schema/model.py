"""The model group (`model.*`): the transformer's shape."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import bounds, one_of
from launcher.config.schema.common import (
    ABOVE_0,
    AT_LEAST_0,
    AT_LEAST_1,
    HIDDEN_TYPO,
    LAYERS_TYPO,
    SEQUENCE_TYPO,
)


@dataclass
class ModelConfig:
    """Shape of a decoder-only transformer."""

    name: str = "tiny"
    """The model's name (the conf/model option it came from)."""
    num_layers: int = field(default=4, metadata=bounds(ge=1, typo_above=LAYERS_TYPO))
    """Transformer layers."""
    hidden_size: int = field(default=128, metadata=bounds(ge=1, typo_above=HIDDEN_TYPO))
    """Width of the residual stream."""
    ffn_hidden_size: int = field(default=512, metadata=AT_LEAST_1)
    """Width of the dense MLP's inner layer."""
    num_attention_heads: int = field(default=4, metadata=AT_LEAST_1)
    """Query heads."""
    num_kv_heads: int | None = field(default=None, metadata=AT_LEAST_1)
    """Key/value heads (grouped-query attention); None: multi-head attention (as many key/value
    heads as query heads)."""
    head_dim: int | None = field(default=None, metadata=AT_LEAST_1)
    """Width of one attention head; None: hidden_size // num_attention_heads."""
    qk_norm: bool = False
    """RMSNorm over each query and key head before RoPE (Qwen3's q_norm/k_norm). plan and
    validate price it (2 x head_dim weights a layer); the training model has none, so run/submit
    refuse it."""
    vocab_size: int = field(default=256, metadata=AT_LEAST_1)
    """Tokens of the vocabulary (embedding and output head rows)."""
    seq_length: int = field(default=256, metadata=bounds(ge=1, typo_above=SEQUENCE_TYPO))
    """Tokens per training sequence."""
    activation: str = field(default="gelu", metadata=one_of("gelu", "swiglu"))
    """The MLP's activation (swiglu: a gated MLP with three projections)."""
    norm: str = field(default="layernorm", metadata=one_of("layernorm", "rmsnorm"))
    """The normalization layers' kind."""
    position: str = field(default="learned", metadata=one_of("learned", "rope"))
    """Position encoding: learned absolute embeddings or rotary (RoPE)."""
    tie_embeddings: bool = True
    """The output head shares the input embedding's weights."""
    attention: str = field(default="flash", metadata=one_of("flash", "eager"))
    """Attention implementation: a fused flash kernel or the eager softmax(QK^T)V."""
    packed_attention: str = field(default="auto", metadata=one_of("auto", "sdpa", "flex"))
    """How packed rows (data.packing=true on chat data) keep attention within each example:
    flex (torch flex_attention with a document BlockMask, compiled: flash-class speed, CUDA
    only), sdpa (scaled_dot_product_attention with a dense [b, 1, s, s] mask: no flash kernel)
    or auto (flex on a GPU, sdpa on the CPU, with attention dropout or model.attention=eager;
    launcher/backends/engine_choices.py)."""
    linear_bias: bool = False
    """Bias terms on the linear layers (GPT-2/3 style) and on the norms (LayerNorm has one)."""
    num_experts: int | None = field(default=None, metadata=AT_LEAST_1)
    """Mixture of experts: routed experts per MoE layer; None: a dense model."""
    moe_top_k: int | None = field(default=None, metadata=AT_LEAST_1)
    """Routed experts active per token."""
    moe_ffn_hidden_size: int | None = field(default=None, metadata=AT_LEAST_1)
    """Inner width of each expert's MLP."""
    moe_shared_experts: int = field(default=0, metadata=AT_LEAST_0)
    """Always-on experts of moe_ffn_hidden_size beside the routed ones (DeepSeek-V3 style)."""
    moe_dense_layers: int = field(default=0, metadata=AT_LEAST_0)
    """The first layers use a dense MLP of ffn_hidden_size instead of experts (DeepSeek-V3
    style)."""
    moe_load_imbalance: float = 1.0
    """Planning only: tokens on the busiest expert-parallel rank over the mean (1.0 to 16.0). The
    busiest rank sets the pace of the experts' GEMMs and of the all-to-all. 1.0: balanced routing;
    with a capacity factor c and token dropping (GShard, Lepikhin et al. 2020; Switch Transformer,
    Fedus et al. 2022; Megatron-Core --moe-expert-capacity-factor) the busiest expert gets c."""
    mtp_layers: int = field(default=0, metadata=AT_LEAST_0)
    """Multi-token prediction depth (DeepSeek-V3 section 2.2; Megatron-Core --mtp-num-layers):
    each module adds one transformer layer of the model's last kind, a 2h -> h projection and
    three norms, and one more output head and loss over the shared vocabulary, after the last
    layer (an "m" in parallel.pipeline_layout). backend=megatron only."""
    q_lora_rank: int | None = field(default=None, metadata=AT_LEAST_1)
    """Multi-head latent attention (DeepSeek-V2/V3): rank of the query's low-rank projection;
    None: a full-rank query projection."""
    kv_lora_rank: int | None = field(default=None, metadata=AT_LEAST_1)
    """Multi-head latent attention (DeepSeek-V2/V3): rank of the compressed key/value latent;
    set it to enable MLA."""
    qk_rope_head_dim: int | None = field(default=None, metadata=AT_LEAST_1)
    """MLA: width of the rotary part of each query/key head."""
    v_head_dim: int | None = field(default=None, metadata=AT_LEAST_1)
    """MLA: width of each value head."""
    rope_theta: float = field(default=10000.0, metadata=ABOVE_0)
    """Rotary base frequency (theta). 10000 is RoFormer's and Llama 1/2's; Llama 3 uses 500000
    (Meta's Llama 3 model card / params.json "rope_theta")."""
    norm_eps: float | None = field(default=None, metadata=ABOVE_0)
    """Epsilon of every normalization layer; None: the norm's usual default (LayerNorm 1e-5,
    RMSNorm 1e-6). Llama 2 and 3 use 1e-5 (their params.json "norm_eps")."""
    attention_dropout: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    """Dropout on attention probabilities (0 for modern pre-training; Megatron-LM defaults it to
    0.1, so rendered jobs pass it explicitly)."""
    hidden_dropout: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    """Dropout on the residual branches (0 for modern pre-training; Megatron-LM defaults it to
    0.1, so rendered jobs pass it explicitly)."""
