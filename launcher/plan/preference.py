"""What preference training (finetune.objective=dpo|simpo|orpo) costs: pure arithmetic, no torch.

The one place for these prices (``planner.make_plan`` calls them):
- Both sequences of a pair: a micro-batch of ``train.micro_batch_size`` pairs runs its chosen and
  rejected sequences in one forward (``finetune.preference``), so activations, logits and
  the step's compute are those of 2 x micro_batch_size sequences: the plan prices a configuration
  whose micro- and global batch are doubled (``priced_config``), and tokens a step are
  2 x pairs x seq_length.
- The loss needs each response token's log-probability, so it runs on full logits (the chunked
  loss does not apply: ``launcher.backends.engine_choices.chunked_loss_problem``); the full
  logits of the 2 x micro-batch sequences are priced as for any full-logits loss.
- The reference (dpo): adapters-off (LoRA) is one more forward of the same model on the same
  sequences, under no_grad, each micro-batch: no weights, no saved activations, its compute
  the policy's forward FLOPs of the frozen model (2N a token plus attention, a third of a full
  training step's: ``reference_forward_s``). copy (finetune=full) is the same forward on a second,
  frozen model: the same time, plus its weights (``reference_copy_bytes``: every parameter in
  the frozen dtype of ``plan.finetune.frozen_bytes``, sharded as the policy's: over dp under
  FSDP2 (zero.stage 2/3) or DeepSpeed ZeRO-3, over tp; on the host with zero.offload_params=cpu),
  added to each stage's weights (``with_reference_copy``). Its sharded forward all-gathers those
  weights once a micro-batch (not priced: a fraction of the policy's own traffic). precomputed
  (one pass over the data before step 1, ``finetune.preference_reference``) costs nothing a
  step: the pass is one forward per pair, stated, not in the step time. simpo and orpo have no
  reference. ``auto`` picks adapters-off with adapters and precomputed with finetune=full; the
  plan's line names what it picked.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from launcher.config.schema import LLMTrainConfig

if TYPE_CHECKING:
    from launcher.plan.memory.estimate import MemoryPlan

PREFERENCE_OBJECTIVES = ("dpo", "simpo", "orpo")
SEQUENCES_PER_PAIR = 2
LIVE_REFERENCES = ("adapters-off", "copy")  # a forward each micro-batch


def is_preference(cfg: LLMTrainConfig) -> bool:
    return cfg.finetune.objective in PREFERENCE_OBJECTIVES


def reference_mode(cfg: LLMTrainConfig) -> str | None:
    """How dpo gets its reference: adapters-off, precomputed, copy, or None (no reference)."""
    ft = cfg.finetune
    if ft.objective != "dpo":
        return None
    if ft.reference != "auto":
        return ft.reference
    return "adapters-off" if ft.name != "full" else "precomputed"


def priced_config(cfg: LLMTrainConfig) -> LLMTrainConfig:
    """The configuration the memory and time arithmetic price: for preference objectives the
    micro- and global batch in sequences (2 a pair), else `cfg` itself."""
    if not is_preference(cfg):
        return cfg
    from launcher.config.layout import derive_layout

    lay = derive_layout(cfg)
    train = dataclasses.replace(
        cfg.train,
        micro_batch_size=lay.micro_batch_size * SEQUENCES_PER_PAIR,
        global_batch_size=lay.global_batch_size * SEQUENCES_PER_PAIR,
        grad_accum=lay.grad_accum,
        steps=lay.steps,  # the pairs' step count, whatever train.tokens says
        tokens=None,
    )
    return dataclasses.replace(cfg, train=train)


def reference_forward_s(cfg: LLMTrainConfig, compute_s: float, executed_per_token: float) -> float:
    """Seconds a step spends in the live reference's forward (adapters-off, copy): the step's
    compute `compute_s` scaled by the forward's share of its FLOPs a token (the frozen model's
    forward, a third of full training's FLOPs, over the step's `executed_per_token`)."""
    if reference_mode(cfg) not in LIVE_REFERENCES or executed_per_token <= 0:
        return 0.0
    from launcher.backends.common import recompute_mode
    from launcher.plan.flops import flops_per_token
    from launcher.plan.model_shape import ModelShape

    moe = ModelShape(cfg.model).is_moe
    full = flops_per_token(cfg.model, recompute_mode(cfg, moe, "none"))
    return compute_s * (full.executed / 3.0) / executed_per_token


def reference_copy_bytes(cfg: LLMTrainConfig) -> tuple[float, float]:
    """(device, host) bytes a rank holds of the frozen reference copy (finetune.reference=copy;
    module docstring), (0, 0) for any other reference."""
    if reference_mode(cfg) != "copy":
        return 0.0, 0.0
    from launcher.backends.common import backend_of
    from launcher.config.layout import derive_layout
    from launcher.plan.finetune import frozen_bytes
    from launcher.plan.model_shape import ModelShape

    lay, z = derive_layout(cfg), cfg.zero
    torch_fsdp = backend_of(cfg).name == "torch" and z.stage >= 2
    shards = lay.tp * (lay.dp if torch_fsdp or z.stage == 3 else 1)
    held = ModelShape(cfg.model).total_params() * frozen_bytes(cfg) / shards
    return (0.0, held) if z.offload_params == "cpu" and z.stage >= 2 else (held, 0.0)


def with_reference_copy(cfg: LLMTrainConfig, memory: MemoryPlan) -> MemoryPlan:
    """`memory` with the reference copy's weights added to every stage (pp is refused)."""
    device, host = reference_copy_bytes(cfg)
    if device == 0 and host == 0:
        return memory
    stages = tuple(
        dataclasses.replace(s, weights=s.weights + device, host_bytes=s.host_bytes + host)
        for s in memory.stages
    )
    return dataclasses.replace(memory, stages=stages)


def summary(cfg: LLMTrainConfig, reference_s: float = 0.0) -> str | None:
    """One line for the plan's header (None for sft)."""
    if not is_preference(cfg):
        return None
    ft = cfg.finetune
    what = {
        "dpo": f"beta {ft.beta:g}, {ft.loss_type}",
        "simpo": f"beta {ft.beta:g}, gamma {ft.simpo_gamma:g}",
        "orpo": f"lambda {ft.beta:g}",
    }[ft.objective]
    mode = reference_mode(cfg)
    copy_gib = sum(reference_copy_bytes(cfg)) / 2**30
    ref = {
        None: "no reference",
        "adapters-off": f"reference: adapters off, +1 forward ({reference_s:.3g} s a step)",
        "precomputed": "reference: precomputed in one pass before step 1",
        "copy": f"reference: a frozen copy ({copy_gib:.3g} GiB a rank), +1 forward "
        f"({reference_s:.3g} s a step)",
    }[mode]
    if ft.objective == "dpo" and ft.reference == "auto":
        ref += " (finetune.reference=auto)"
    return (
        f"finetune.objective={ft.objective} ({what}): chosen + rejected = 2 sequences a pair, "
        f"priced as micro-batch x 2; {ref}"
    )
