"""The epsilon of each normalization layer when ``model.norm_eps`` is not set: one place for the
defaults the model (launcher.train.model.transformer), the Hugging Face export and import
(launcher.export.hf_layout, launcher.config.composition.hf_model) and the Megatron-LM arguments
(launcher.render.megatron_args) share.
"""

from __future__ import annotations

# torch.nn.LayerNorm's default eps (PyTorch docs), also Hugging Face GPT2Config's
# layer_norm_epsilon default.
LAYERNORM_EPS = 1e-5
# Hugging Face LlamaConfig's rms_norm_eps default (torch.nn.RMSNorm's own default, eps=None, is
# the dtype's machine epsilon, which would differ between fp32 and bf16). DeepSeek-V2's modeling
# code builds the q and kv latent norms of its multi-head latent attention with its RMSNorm's
# default eps, also 1e-6.
RMSNORM_EPS = 1e-6


def norm_epsilon(norm: str, eps: float | None) -> float:
    """`eps` when given, else the default of `norm` (``rmsnorm``, else LayerNorm's)."""
    if eps is not None:
        return eps
    return RMSNORM_EPS if norm == "rmsnorm" else LAYERNORM_EPS
