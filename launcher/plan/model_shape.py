"""Parameter counts of the decoder-only transformer that `llmtrain run` builds.

This is the one place the architecture's parameter arithmetic is written. The training runtime's
model (``launcher.train.model.transformer``) must produce exactly these counts for every recipe
shape; a test builds each recipe's model on the meta device and compares.

Architecture (pre-norm decoder):
- token embedding V*h; learned positions add s*h (GPT style); RoPE has no parameters;
- per layer: norm, attention, norm, MLP (or MoE); a final norm; an output head V*h unless tied;
- norms: LayerNorm has weight and bias (2h), RMSNorm a weight only (h);
- attention: q has heads*d outputs, k and v kv_heads*d each (GQA), o maps heads*d back to h;
  with linear_bias, every projection has a bias;
- multi-head latent attention (DeepSeek-V2/V3, when kv_lora_rank is set): q through a
  q_lora_rank bottleneck with an RMSNorm (or one h x heads*(d+r) matrix when q_lora_rank is
  unset), k/v through a kv_lora_rank bottleneck with an RMSNorm plus a shared rope key of r dims;
  o maps heads*v_head_dim to h (DeepSeek-V2 paper, section 2.1);
- MLP: GELU has fc1 (h->f) and fc2 (f->h); SwiGLU has gate, up (h->f) and down (f->h);
- MoE layers (all but the first moe_dense_layers): a router h x E without bias, E routed experts and
  moe_shared_experts shared experts, each an MLP of moe_ffn_hidden_size.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.schema import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    """Dimensions derived from a ModelConfig, and the parameter counts built from them."""

    model: ModelConfig

    # --- dimensions -------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        m = self.model
        return m.head_dim if m.head_dim else m.hidden_size // max(1, m.num_attention_heads)

    @property
    def kv_heads(self) -> int:
        m = self.model
        return m.num_kv_heads if m.num_kv_heads else m.num_attention_heads

    @property
    def is_mla(self) -> bool:
        return self.model.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return (self.model.num_experts or 0) > 1

    @property
    def num_moe_layers(self) -> int:
        return self.model.num_layers - self.model.moe_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.model.num_layers - self.num_moe_layers

    @property
    def rope_dim(self) -> int:
        return self.model.qk_rope_head_dim or 0

    @property
    def v_dim(self) -> int:
        return self.model.v_head_dim or self.head_dim

    # --- parameter counts -------------------------------------------------------------------------
    def norm_params(self) -> int:
        h = self.model.hidden_size
        return 2 * h if self.model.norm == "layernorm" else h

    def attention_params(self) -> int:
        m = self.model
        h, heads, d = m.hidden_size, m.num_attention_heads, self.head_dim
        bias = m.linear_bias
        if self.is_mla:
            r, kv_rank, v = self.rope_dim, m.kv_lora_rank or 0, self.v_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * (d + r)
            else:
                q = h * heads * (d + r)
            kv = h * (kv_rank + r) + kv_rank + kv_rank * heads * (d + v)
            out = heads * v * h + (h if bias else 0)
            return q + kv + out
        q_out, kv_out = heads * d, self.kv_heads * d
        weights = h * q_out + 2 * h * kv_out + q_out * h
        biases = q_out + 2 * kv_out + h if bias else 0
        qk_norm = 2 * d if m.qk_norm else 0  # one RMSNorm weight of head_dim for q, one for k
        return weights + biases + qk_norm

    def mlp_params(self, ffn: int) -> int:
        h = self.model.hidden_size
        bias = self.model.linear_bias
        if self.model.activation == "swiglu":
            return 3 * h * ffn + (2 * ffn + h if bias else 0)
        return 2 * h * ffn + (ffn + h if bias else 0)

    def router_params(self) -> int:
        return self.model.hidden_size * (self.model.num_experts or 0)

    def expert_params(self) -> int:
        """One routed (or shared) expert."""
        return self.mlp_params(self.model.moe_ffn_hidden_size or self.model.ffn_hidden_size)

    def dense_layer_params(self) -> int:
        return (
            2 * self.norm_params()
            + self.attention_params()
            + self.mlp_params(self.model.ffn_hidden_size)
        )

    def moe_layer_params(self) -> int:
        experts = (self.model.num_experts or 0) + self.model.moe_shared_experts
        return (
            2 * self.norm_params()
            + self.attention_params()
            + self.router_params()
            + experts * self.expert_params()
        )

    def layer_params(self, index: int) -> int:
        """Parameters of transformer layer `index` (0-based)."""
        if self.is_moe and index >= self.model.moe_dense_layers:
            return self.moe_layer_params()
        return self.dense_layer_params()

    def embedding_params(self) -> int:
        """Token embedding plus learned position table, if any."""
        m = self.model
        positions = m.seq_length * m.hidden_size if m.position == "learned" else 0
        return m.vocab_size * m.hidden_size + positions

    def output_params(self) -> int:
        """Final norm and, unless tied to the embedding, the output projection."""
        m = self.model
        head = 0 if m.tie_embeddings else m.vocab_size * m.hidden_size
        return self.norm_params() + head

    @property
    def mtp_is_moe(self) -> bool:
        """A multi-token-prediction module's layer is of the model's last kind (Megatron-Core
        builds it from the decoder's last layer spec)."""
        return self.is_moe and self.model.num_layers > self.model.moe_dense_layers

    def mtp_module_params(self) -> int:
        """One multi-token-prediction module (DeepSeek-V3 section 2.2, Megatron-Core's
        MultiTokenPredictionLayer): its transformer layer, the projection of [hidden; embedding]
        (2h -> h) and three norms (hidden, embedding, final); the embedding and the output head
        are the main model's."""
        h = self.model.hidden_size
        layer = self.moe_layer_params() if self.mtp_is_moe else self.dense_layer_params()
        return layer + 2 * h * h + 3 * self.norm_params()

    def total_params(self) -> int:
        layers = (
            self.num_dense_layers * self.dense_layer_params()
            + self.num_moe_layers * self.moe_layer_params()
        )
        mtp = self.model.mtp_layers * self.mtp_module_params()
        return self.embedding_params() + layers + self.output_params() + mtp

    def active_params(self) -> int:
        """Parameters one token passes through: routed experts count top_k times, not E times."""
        if not self.is_moe:
            return self.total_params()
        idle = (self.model.num_experts or 0) - (self.model.moe_top_k or 0)
        moe_layers = self.num_moe_layers + (self.model.mtp_layers if self.mtp_is_moe else 0)
        return self.total_params() - moe_layers * idle * self.expert_params()


def human_count(n: float) -> str:
    """12_345_678_901 -> '12.3B'."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}" if n / scale < 100 else f"{n / scale:.0f}{unit}"
    return str(int(n))
