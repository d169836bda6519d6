"""What fine-tuning with adapters costs (finetune=lora|qlora): pure arithmetic, never torch.

The one place for these formulas (memory/estimate.py, timing/kernels.py and flops.py call them):
- Adapter parameters: each target projection W [out, in] gets A [r, in] and B [out, r]:
  r * (in + out) parameters (Hu et al. 2021, arXiv:2106.09685, section 4). Under tensor
  parallel they are split like the weight they adapt (launcher/train/engines/torch_parallelize.py
  adapter_plan): a column-parallel W (q, k, v, gate, up) keeps A whole and B split,
  r * (in + out / tp) per rank; a row-parallel W (o, down) A split and B whole, r * (in / tp + out).
- Adapters train in fp32 with the optimizer's states: 4 (weight) + 4 (gradient) + the optimizer's
  state bytes per adapter parameter (Adam: 8), as full training's model states without the
  separate master copy (the adapters are the master).
- Frozen weights: no gradient, no optimizer state; stored in the compute dtype on a GPU (fp32 on
  the CPU, where the engine keeps them fp32). QLoRA's target weights in NF4: torchao NF4Tensor
  (torchao/quantization/quantize_/workflows/nf4/nf4_tensor.py; Dettmers et al. 2023,
  arXiv:2305.14314, section 3 "Double Quantization"): 4 bits a weight, one int8 absmax scaler per
  64-weight block, one bf16 factor per 256 scalers: 0.5 + 1/64 + 2/(64*256) bytes a weight
  (4.127 bits; the paper's fp32 second-level constants give 4.127 bits too: 4 + 8/64 + 32/16384).
- Activations: the base linears' saved inputs are Korthikanti's terms unchanged (x is also the
  adapter's input, the same tensor); each adapter adds its rank-r intermediate A x (saved for B's
  gradient), r values a token in the compute dtype, and with dropout its input's dropped copy
  (in values) and 1-byte mask.
- Time: a frozen linear skips its weight-gradient GEMM, so its backward is one GEMM (the input
  gradient) instead of two: 2 passes of its forward FLOPs instead of 3 (forward 2N, backward 2N
  FLOPs a token instead of 4N); each adapter runs its two small GEMMs 3 times (forward, input and
  weight gradients), 6 * r * (in + out) FLOPs a token.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.adapters import (
    ALL_LINEAR,
    COLUMN_PARALLEL,
    NF4_BLOCK,
    NF4_SCALER_BLOCK,
    target_modules,
)
from launcher.config.schema import LLMTrainConfig, ModelConfig
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.model_shape import ModelShape

# NF4 bytes per weight (module docstring): 4-bit codes, int8 scaler per 64, bf16 factor per 256.
NF4_BYTES_PER_WEIGHT = 0.5 + 1.0 / NF4_BLOCK + 2.0 / (NF4_BLOCK * NF4_SCALER_BLOCK)
ADAPTER_WEIGHT_BYTES = 4.0  # fp32 adapters (the master copy)
ADAPTER_GRAD_BYTES = 4.0


@dataclass(frozen=True)
class Projection:
    target: str
    fan_in: int
    fan_out: int

    @property
    def colwise(self) -> bool:
        return self.target in COLUMN_PARALLEL


def is_finetune(cfg: LLMTrainConfig) -> bool:
    return cfg.finetune.name != "full"


def projections(m: ModelConfig) -> dict[str, Projection]:
    """The adaptable projections of a dense block (launcher/config/adapters.py's table), each
    with its (in, out)."""
    s = ModelShape(m)
    h, d, ffn = m.hidden_size, s.head_dim, m.ffn_hidden_size
    q, kv = m.num_attention_heads * d, s.kv_heads * d
    dims = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h)}
    dims |= {"up": (h, ffn), "down": (ffn, h), "gate": (h, ffn)}  # (in, out), in plan.json's order
    has = target_modules(m.activation)
    return {t: Projection(t, i, o) for t, (i, o) in dims.items() if t in has}


def targets(cfg: LLMTrainConfig) -> list[Projection]:
    """The projections finetune.targets adapts in each block (all-linear: every one)."""
    known = projections(cfg.model)
    words = [str(t) for t in cfg.finetune.targets]
    if ALL_LINEAR in words:
        return list(known.values())
    return [known[t] for t in words if t in known]


def adapter_params_per_layer(cfg: LLMTrainConfig, tp: int = 1) -> float:
    """Adapter parameters of one block on one tensor-parallel rank (module docstring)."""
    r = cfg.finetune.rank
    return sum(
        r * (p.fan_in + p.fan_out / tp) if p.colwise else r * (p.fan_in / tp + p.fan_out)
        for p in targets(cfg)
    )


def adapter_params(cfg: LLMTrainConfig) -> int:
    """All adapter parameters of the model (0 for finetune=full)."""
    if not is_finetune(cfg):
        return 0
    return round(cfg.model.num_layers * adapter_params_per_layer(cfg))


def trainable_params(cfg: LLMTrainConfig) -> int:
    """The parameters the optimizer updates: the adapters, or every parameter."""
    return adapter_params(cfg) if is_finetune(cfg) else ModelShape(cfg.model).total_params()


def target_weights_per_layer(cfg: LLMTrainConfig, tp: int = 1) -> float:
    """Elements of the adapted (frozen) weights in one block on one tp rank (NF4 under qlora)."""
    return sum(p.fan_in * p.fan_out for p in targets(cfg)) / tp


def frozen_bytes(cfg: LLMTrainConfig) -> float:
    """Bytes of a frozen weight: the compute dtype on a GPU, fp32 on the CPU."""
    return 4.0 if cfg.cluster.gpu == "cpu" else float(DTYPE_BYTES[cfg.precision.compute_dtype])


def frozen_weight_bytes(cfg: LLMTrainConfig, base_params: float, layers: int, tp: int) -> float:
    """Bytes of `base_params` frozen parameters of a rank holding `layers` blocks: all in
    ``frozen_bytes``, but qlora's target weights in NF4."""
    nf4 = layers * target_weights_per_layer(cfg, tp) if cfg.finetune.name == "qlora" else 0.0
    nf4 = min(nf4, base_params)
    return (base_params - nf4) * frozen_bytes(cfg) + nf4 * NF4_BYTES_PER_WEIGHT


def adapter_activation_bytes(cfg: LLMTrainConfig, tokens: float, act_bytes: int) -> float:
    """One block's adapter activations for `tokens` tokens: each target's rank-r intermediate
    (whole on every tp rank: A's output is replicated or all-reduced), and with dropout the
    dropped input and its mask."""
    ft = cfg.finetune
    per_token = 0.0
    for p in targets(cfg):
        per_token += ft.rank * act_bytes
        if ft.dropout > 0:
            per_token += p.fan_in * (act_bytes + 1)
    return tokens * per_token


def adapter_flops_per_token_layer(cfg: LLMTrainConfig) -> float:
    """Forward FLOPs of one block's adapters for one token: 2 * r * (in + out) each."""
    return sum(2.0 * cfg.finetune.rank * (p.fan_in + p.fan_out) for p in targets(cfg))


def summary(cfg: LLMTrainConfig) -> str | None:
    """One line for the plan's header: the method, the trainable parameters and their share,
    what the frozen base is stored in (None for finetune=full)."""
    if not is_finetune(cfg):
        return None
    ft = cfg.finetune
    total = ModelShape(cfg.model).total_params()
    trainable = adapter_params(cfg)
    words = ",".join(p.target for p in targets(cfg))
    base = "NF4 targets" if ft.name == "qlora" else ("fp32" if frozen_bytes(cfg) == 4 else "bf16")
    if ft.name == "qlora" and frozen_bytes(cfg) == 2:
        base += ", rest bf16"
    return (
        f"finetune={ft.name} rank {ft.rank} alpha {ft.alpha:g} on {words}: "
        f"{_count(trainable)} trainable of {_count(total)} ({trainable / total:.2%}); "
        f"base frozen ({base})"
    )


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"
