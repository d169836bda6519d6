"""What the fine-tuners' memory savers save and cost (backend=torch; which engine runs them is
launcher/backends/memory_savers.py): one formula each, called from model_states.py,
stage_activations.py, stage_liveness.py and timing.py.

- Small optimizer states, bytes per parameter for Adam's m and v:
  adamw8bit: torchao OptimState8bit (torchao/optim/subclass_8bit.py, 0.18): a uint8 code per
  value and one fp32 scale per 256-value block: 2 x (1 + 4/256) = 2.031;
  adamw4bit: OptimState4bit (subclass_4bit.py): two 4-bit codes a byte and one fp32 scale per
  128 values: 2 x (0.5 + 4/128) = 1.0625. (torchao keeps tensors under 4096 values in plain
  states: norms and biases, a negligible share, priced at the quantized rate here.)
  optim.state_dtype=bf16, and torch's Adam over pure bf16 weights (states take the weights'
  dtype, torch/optim/adamw.py ``torch.zeros_like(param)``): 2 x 2 = 4.
- Pure bf16 (precision=bf16-pure): weights 2 bytes, gradients 2 (autograd gives a parameter's
  gradient its dtype), no master copy.
- optim.in_backward: a parameter's gradient is stepped and freed in its post-accumulate-grad
  hook, so the gradient bucket is the largest single trainable tensor's gradient (the output
  layer or the embedding for a Llama, vocab x hidden), not all of them; the step's fp32 working
  copies are fused away on a GPU (torchao's compiled update, torch's fused AdamW).
- train.activation_offload: every saved activation leaves the device for pinned host memory as
  the forward produces it and comes back for its layer's backward (torchtune's
  OffloadActivations). On the device: the layer being computed and the one whose copy is in
  flight (OFFLOAD_LAYERS_ON_DEVICE) of the kept activations; the logits and loss (the head) are
  used at once and priced on the device. Time: every layer's kept activations cross PCIe twice
  (out in the forward, back in the backward; the two layers on the device are copies in flight,
  not tensors left behind) at timing.PCIE_GBPS, on a side stream beside the compute: only what
  exceeds the forward's share of the compute (out) and the backward's (back) is exposed. On the
  CPU engine nothing moves (no other memory): no saving, no time.
"""

from __future__ import annotations

from launcher.backends.common import backend_of
from launcher.backends.memory_savers import pure_bf16
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan import finetune
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.model_shape import ModelShape

# Adam's two moments per parameter (module docstring).
QUANTIZED_STATE_BYTES = {"adamw8bit": 2 * (1 + 4 / 256), "adamw4bit": 2 * (0.5 + 4 / 128)}
# Layers' kept activations on the device under train.activation_offload (module docstring).
OFFLOAD_LAYERS_ON_DEVICE = 2


def state_dtype(cfg: LLMTrainConfig) -> str:
    """The dtype Adam's moments are stored in: optim.state_dtype, or bf16 when torch's Adam
    steps pure bf16 weights (its states take the weights' dtype)."""
    if backend_of(cfg).name == "torch" and pure_bf16(cfg):
        return "bf16"
    return cfg.optim.state_dtype


def quantized_state_bytes(cfg: LLMTrainConfig) -> float | None:
    """Bytes per parameter of a block-quantized optimizer's states, None for the others."""
    return QUANTIZED_STATE_BYTES.get(cfg.optim.name)


def pure_bf16_gradient_bytes(cfg: LLMTrainConfig) -> float | None:
    """A pure-bf16 run's gradient bytes per parameter (its dtype), None otherwise."""
    return float(DTYPE_BYTES["bf16"]) if pure_bf16(cfg) else None


def largest_trainable_tensor(cfg: LLMTrainConfig, layout: Layout) -> float:
    """Elements of the largest trainable tensor on one rank: the one whose gradient optim.
    in_backward holds at a time (the adapters' largest matrix under LoRA)."""
    m = cfg.model
    if finetune.is_finetune(cfg):
        r = cfg.finetune.rank
        return float(max((r * max(p.fan_in, p.fan_out) for p in finetune.targets(cfg)), default=0))
    shape = ModelShape(m)
    tp = max(1, layout.tp)
    vocab = m.vocab_size * m.hidden_size / backend_of(cfg).vocab_split(tp)
    q = m.hidden_size * m.num_attention_heads * shape.head_dim / tp
    ffn = m.hidden_size * m.ffn_hidden_size / tp
    experts = 0.0
    if shape.is_moe:
        # The routed experts' grouped-GEMM weight: one tensor for all of a rank's experts.
        experts = shape.expert_params() * (m.num_experts or 0) / max(1, layout.ep) / 3
    return max(vocab, q, ffn, experts)


def in_backward_gradients(cfg: LLMTrainConfig, layout: Layout, grad_bytes: float) -> float:
    """The gradient bucket under optim.in_backward: one tensor's gradient at a time."""
    return grad_bytes * largest_trainable_tensor(cfg, layout)


def offloads(cfg: LLMTrainConfig) -> bool:
    """Whether train.activation_offload moves anything (on a GPU, on the torch engine)."""
    return (
        cfg.train.activation_offload
        and backend_of(cfg).name == "torch"
        and cfg.cluster.gpu != "cpu"
    )


def device_kept(cfg: LLMTrainConfig, kept: float, held: float) -> float:
    """The kept activations left on the device: all, or OFFLOAD_LAYERS_ON_DEVICE layers'."""
    if not offloads(cfg) or held <= 0:
        return kept
    return kept * min(1.0, OFFLOAD_LAYERS_ON_DEVICE / held)


def offload_exposed_s(
    offloaded_bytes: float, compute_s: float, recompute: str, pcie_gbps: float
) -> float:
    """PCIe time train.activation_offload cannot hide in one micro-batch: out during the
    forward, back during the backward, each beyond its share of `compute_s` (the forward is 1 of
    3 matmul passes, 1 of 4 with full recompute, whose re-forward runs in the backward)."""
    if offloaded_bytes <= 0:
        return 0.0
    one_way = offloaded_bytes / (pcie_gbps * 1e9)
    forward = compute_s / (4.0 if recompute == "full" else 3.0)
    return max(0.0, one_way - forward) + max(0.0, one_way - (compute_s - forward))


def saver_notes(cfg: LLMTrainConfig, layout: Layout, offloaded_bytes: float) -> list[str]:
    """One line per saver in force, for the plan's memory lines."""
    notes = []
    if pure_bf16(cfg):
        notes.append("weights bf16 with no fp32 master (precision=bf16-pure), bf16 gradients")
    q = quantized_state_bytes(cfg)
    if q is not None:
        notes.append(f"optimizer {cfg.optim.name}: m and v block-quantized, {q:.3g} B/param")
    elif state_dtype(cfg) != "fp32" and cfg.optim.name in ("adam", "adamw"):
        notes.append(f"optimizer states {state_dtype(cfg)}, 4 B/param")
    if cfg.optim.in_backward:
        n = largest_trainable_tensor(cfg, layout)
        notes.append(
            f"optimizer in backward: one gradient alive at a time (largest {n / 1e6:.1f}M values)"
        )
    if cfg.train.activation_offload:
        if offloads(cfg):
            notes.append(
                f"activations offloaded to host: {offloaded_bytes / 2**30:.2f} GiB a micro-batch "
                f"over PCIe each way, {OFFLOAD_LAYERS_ON_DEVICE} layers kept on the device"
            )
        else:
            notes.append("activation offload: runs on the CPU with nothing to move (no saving)")
    return notes
